// LD_PRELOAD shim for test/test_durable_checkpoints.sh: writes one line per fopen, open that
// creates, fsync, fdatasync and rename of a path under $SYNC_TRACE_DIR to $SYNC_TRACE_LOG, in the
// order of the calls ("fopen PATH MODE", "create PATH", "fsync PATH [SIZE]", "rename FROM TO"; an
// fsync names its file or directory as /proc/self/fd shows it, and a file's size then), then
// does the call.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdarg.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void note(const char* call, const char* a, const char* b) {
    const char* dir = getenv("SYNC_TRACE_DIR");
    const char* log = getenv("SYNC_TRACE_LOG");
    if (dir == NULL || log == NULL || strncmp(a, dir, strlen(dir)) != 0) return;
    char line[2 * 4096 + 64];
    const int n = snprintf(line, sizeof(line), "%s %s%s%s\n", call, a, b ? " " : "", b ? b : "");
    const int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);  // not stdio: fopen is traced
    if (fd < 0) return;
    if (write(fd, line, (size_t)n) != n) abort();
    close(fd);
}

// "CALL PATH SIZE" for a file (what it holds at the call), "CALL PATH" for a directory
static void note_fd(const char* call, int fd) {
    char link[64], path[4096], size[32] = "";
    snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
    const ssize_t n = readlink(link, path, sizeof(path) - 1);
    if (n <= 0) return;
    path[n] = '\0';
    struct stat st;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) snprintf(size, sizeof(size), "%lld", (long long)st.st_size);
    note(call, path, size[0] ? size : NULL);
}

typedef FILE* (*fopen_fn)(const char*, const char*);
typedef int (*open_fn)(const char*, int, ...);
typedef int (*sync_fn)(int);
typedef int (*rename_fn)(const char*, const char*);

FILE* fopen(const char* path, const char* mode) {
    note("fopen", path, mode);
    return ((fopen_fn)dlsym(RTLD_NEXT, "fopen"))(path, mode);
}

FILE* fopen64(const char* path, const char* mode) {
    note("fopen", path, mode);
    return ((fopen_fn)dlsym(RTLD_NEXT, "fopen64"))(path, mode);
}

// open's mode is there only with O_CREAT
static int traced_open(const char* name, const char* path, int flags, va_list args) {
    const mode_t mode = (flags & O_CREAT) ? va_arg(args, mode_t) : 0;
    if (flags & O_CREAT) note("create", path, NULL);
    return ((open_fn)dlsym(RTLD_NEXT, name))(path, flags, mode);
}
int open(const char* path, int flags, ...) {
    va_list args;
    va_start(args, flags);
    const int fd = traced_open("open", path, flags, args);
    va_end(args);
    return fd;
}
int open64(const char* path, int flags, ...) {
    va_list args;
    va_start(args, flags);
    const int fd = traced_open("open64", path, flags, args);
    va_end(args);
    return fd;
}

int fsync(int fd) {
    note_fd("fsync", fd);
    return ((sync_fn)dlsym(RTLD_NEXT, "fsync"))(fd);
}

int fdatasync(int fd) {
    note_fd("fdatasync", fd);
    return ((sync_fn)dlsym(RTLD_NEXT, "fdatasync"))(fd);
}

int rename(const char* from, const char* to) {
    note("rename", from, to);
    return ((rename_fn)dlsym(RTLD_NEXT, "rename"))(from, to);
}
