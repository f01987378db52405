// Checked file I/O and the one way this program reports a fatal error: a single line naming what
// was wrong and what was expected, then a non-zero exit. Under MPI a hook makes every rank stop,
// so an error on one rank never leaves the others waiting in a collective.
#pragma once
#include <cstdarg>
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
