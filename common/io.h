// Errors and files, for every folder: the one way this program reports a fatal error (a single
// line naming what was wrong and what was expected, then a non-zero exit; under MPI a hook makes
// every rank stop, so an error on one rank never leaves the others waiting in a collective),
// checked file I/O, and the 256-int header that each of llm.c's binary files begins with.
#pragma once
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

inline void (*g_fatal_hook)(int code) = nullptr;

// "error: " and the line, in one write: under mpirun, separate writes of several ranks can
// interleave mid-line
inline void say_error_v(const char* fmt, va_list args) {
    char line[1024];
    vsnprintf(line, sizeof(line), fmt, args);
    fprintf(stderr, "error: %s\n", line);
    fflush(stdout);
    fflush(stderr);
}
inline void say_error(const char* fmt, ...) {
    va_list args;
    va_start(args, fmt);
    say_error_v(fmt, args);
    va_end(args);
}
// the process ends, after its error was said: under MPI the hook ends every rank
[[noreturn]] inline void end_process(int code) {
    if (g_fatal_hook) g_fatal_hook(code);
    exit(code);
}
[[noreturn]] inline void fatal(int code, const char* fmt, ...) {
    va_list args;
    va_start(args, fmt);
    say_error_v(fmt, args);
    va_end(args);
    end_process(code);
}

// this machine's name, for messages that say where a rank runs
inline std::string host_name() {
    char host[256] = {0};
    if (gethostname(host, sizeof(host) - 1) != 0) return "an unnamed host";
    return host;
}

inline FILE* open_file(const std::string& path, const char* mode) {
    FILE* f = fopen(path.c_str(), mode);
    if (f == nullptr) fatal(1, "cannot open %s (mode %s)", path.c_str(), mode);
    return f;
}

inline size_t file_size(FILE* f) {
    long here = ftell(f);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, here, SEEK_SET);
    return (size_t)size;
}

inline void read_exact(void* buf, size_t bytes, FILE* f, const std::string& path, const char* what) {
    if (fread(buf, 1, bytes, f) != bytes)
        fatal(1, "%s: truncated while reading %s (%zu bytes expected)", path.c_str(), what, bytes);
}

// `bytes` at `offset` of the open file fd (not its position: ranks read their own parts of one file)
inline void pread_exact(int fd, void* buf, size_t bytes, size_t offset, const std::string& path, const char* what) {
    for (size_t done = 0; done < bytes;) {
        const ssize_t n = pread(fd, (char*)buf + done, bytes - done, (off_t)(offset + done));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) fatal(1, "%s: cannot read %s: %s", path.c_str(), what, strerror(errno));
        if (n == 0) fatal(1, "%s: truncated while reading %s (%zu bytes expected at byte %zu)", path.c_str(), what, bytes, offset);
        done += (size_t)n;
    }
}

// a whole number in [lo, hi] written in decimal (strtol's syntax, nothing after it) into *out, or false
inline bool parse_whole_number(const std::string& v, long lo, long hi, long* out) {
    char* end = nullptr;
    errno = 0;
    const long x = strtol(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0' || errno != 0 || x < lo || x > hi) return false;
    *out = x;
    return true;
}

// whether `count` items of `item_bytes` each fit in `bytes`, for any count (no product overflows)
inline bool fits_in(uint64_t count, size_t item_bytes, size_t bytes) { return count <= bytes / item_bytes; }

inline void write_exact(const void* buf, size_t bytes, FILE* f, const std::string& path) {
    if (fwrite(buf, 1, bytes, f) != bytes) fatal(1, "%s: write failed: %s", path.c_str(), strerror(errno));
}

// Makes a rename or a new file in dir survive a crash of the machine (the entry is in the
// directory, which has its own data to sync). A file system that cannot sync a directory says
// EINVAL: there is nothing more to do on it.
inline void sync_dir(const std::string& dir, const std::string& kept) {
    const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY);
    if (fd < 0 || (fsync(fd) != 0 && errno != EINVAL))
        fatal(1, "%s: cannot sync the directory: %s; %s", dir.c_str(), strerror(errno), kept.c_str());
    close(fd);
}

// the directory a path's file is in
inline std::string dir_of(const std::string& path) {
    const size_t slash = path.rfind('/');
    return slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
}

// Writes go to path.tmp; commit() syncs its data to the disk, renames it into place and syncs the
// directory, so once commit() returns the file is durable whole, and a crash before that (of the
// process or of the machine) leaves the file at path as it was. A failed write, sync or rename
// says what the system said and what is intact: `kept` ("the checkpoint of step 20 is intact"),
// or by default that path is unchanged; the .tmp is removed, giving its space back.
class AtomicFile {
public:
    explicit AtomicFile(std::string path, std::string kept = "")
        : path_(std::move(path)), tmp_(path_ + ".tmp"), kept_(kept.empty() ? path_ + " is unchanged" : std::move(kept)) {
        f_ = fopen(tmp_.c_str(), "wb");
        if (f_ == nullptr) fatal(1, "cannot create %s: %s; %s", tmp_.c_str(), strerror(errno), kept_.c_str());
    }
    AtomicFile(const AtomicFile&) = delete;
    AtomicFile& operator=(const AtomicFile&) = delete;
    void write(const void* buf, size_t bytes) {
        if (fwrite(buf, 1, bytes, f_) != bytes) fail("write");
    }
    void commit() {
        if (fflush(f_) != 0) fail("write");
        if (fsync(fileno(f_)) != 0) fail("fsync");
        const int closed = fclose(f_);
        f_ = nullptr;
        if (closed != 0) fail("write");
        if (rename(tmp_.c_str(), path_.c_str()) != 0) fail("rename");
        sync_dir(dir_of(path_), kept_);
    }

private:
    [[noreturn]] void fail(const char* what) {
        const int error = errno;
        if (f_) fclose(f_);
        remove(tmp_.c_str());
        fatal(1, "%s: %s failed: %s; %s", tmp_.c_str(), what, strerror(error), kept_.c_str());
    }

    std::string path_, tmp_, kept_;
    FILE* f_;
};

// ----------------------------------------------------------------------------
// llm.c's binary files (checkpoint, state, token shard, tokenizer, eval set) begin with 256
// int32: magic, version, then the format's own fields.

constexpr int kHeaderInts = 256;
constexpr size_t kHeaderBytes = kHeaderInts * sizeof(int32_t);

// what a reader knows of one such format
struct FileFormat {
    const char* name;        // as messages call the file ("bad magic 7 in token shard")
    const char* header;      // as they call its header ("truncated while reading the shard header")
    int32_t magic, version;  // version 0: the reader checks it (a format with several)
};

struct FileHeader {
    int32_t field[kHeaderInts];
    int32_t operator[](int i) const { return field[i]; }
};

// The header of an open file, its magic and version checked: one line naming the file when it is
// shorter than a header or another format or version.
inline FileHeader read_header(FILE* f, const std::string& path, const FileFormat& format) {
    FileHeader h;
    read_exact(h.field, kHeaderBytes, f, path, format.header);
    if (h[0] != format.magic) fatal(1, "%s: bad magic %d in %s (expected %d)", path.c_str(), h[0], format.name, format.magic);
    if (format.version != 0 && h[1] != format.version)
        fatal(1, "%s: unsupported %s version %d (expected %d)", path.c_str(), format.name, h[1], format.version);
    return h;
}
