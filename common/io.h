// Errors and files, for every folder: the one way this program reports a fatal error (a single
// line naming what was wrong and what was expected, then a non-zero exit; under MPI a hook makes
// every rank stop, so an error on one rank never leaves the others waiting in a collective),
// checked file I/O, and the 256-int header that each of llm.c's binary files begins with.
#pragma once
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

inline void (*g_fatal_hook)(int code) = nullptr;

[[noreturn]] inline void fatal(int code, const char* fmt, ...) {
    // one write: under mpirun, separate writes of several ranks can interleave mid-line
    char line[1024];
    va_list args;
    va_start(args, fmt);
    vsnprintf(line, sizeof(line), fmt, args);
    va_end(args);
    fprintf(stderr, "error: %s\n", line);
    fflush(stdout);
    fflush(stderr);
    if (g_fatal_hook) g_fatal_hook(code);
    exit(code);
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

inline void write_exact(const void* buf, size_t bytes, FILE* f, const std::string& path) {
    if (fwrite(buf, 1, bytes, f) != bytes) fatal(1, "%s: write failed", path.c_str());
}

// Writes go to path.tmp and are renamed into place, so a crash never leaves a partial file.
class AtomicFile {
public:
    explicit AtomicFile(std::string path) : path_(std::move(path)), f_(open_file(path_ + ".tmp", "wb")) {}
    void write(const void* buf, size_t bytes) { write_exact(buf, bytes, f_, path_ + ".tmp"); }
    void commit() {
        if (fclose(f_) != 0) fatal(1, "%s: write failed", path_.c_str());
        if (rename((path_ + ".tmp").c_str(), path_.c_str()) != 0) fatal(1, "cannot rename %s.tmp", path_.c_str());
    }

private:
    std::string path_;
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
