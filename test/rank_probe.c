// LD_PRELOAD shim for test/test_sharded_checkpoints.sh: what one rank's checkpoint save and load
// cost it, seen from outside the trainer, and a kill at a chosen call of a save.
//   $RANK_PROBE_DIR: this rank ($OMPI_COMM_WORLD_RANK) writes rank_R there, at its exit: "exit
//     PEAK_KB READ_BYTES" (its peak resident memory, Linux's VmHWM, and the bytes its read calls
//     took, /proc/self/io's rchar). With $RANK_PROBE_PHASES=1 the peak is taken by phase instead
//     (reset through clear_refs): "load EXTRA_KB READ_BYTES" from opening model_N.bin to read
//     until it closes the state file (the peak beyond what it held before, and the bytes read
//     meanwhile), and "save EXTRA_KB" from the first checkpoint file it opens to write until it
//     exits.
//   $KILL_AT "CALL TEXT N" with $KILL_RANK: that rank kills itself (SIGKILL) at its Nth pwrite,
//     fsync or rename (CALL) of a path containing TEXT, before the call.
//   $FAIL_AT "CALL TEXT N" with $FAIL_RANK: that call fails instead, with EIO (a disk that fails).
//   At its exit each rank also writes "wrote BYTES": what its pwrite calls wrote.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

static long field_of(const char* file, const char* name) {  // "name: value" in a /proc file
    const int fd = ((int (*)(const char*, int, ...))dlsym(RTLD_NEXT, "open"))(file, O_RDONLY);
    if (fd < 0) return -1;
    char text[8192];
    const ssize_t n = read(fd, text, sizeof(text) - 1);
    close(fd);
    if (n <= 0) return -1;
    text[n] = '\0';
    const char* at = strstr(text, name);
    return at ? atol(at + strlen(name) + 1) : -1;
}
static void reset_peak(void) {
    const int fd = ((int (*)(const char*, int, ...))dlsym(RTLD_NEXT, "open"))("/proc/self/clear_refs", O_WRONLY);
    if (fd >= 0 && write(fd, "5", 1) != 1) abort();
    if (fd >= 0) close(fd);
}
static void note(const char* line) {
    const char *dir = getenv("RANK_PROBE_DIR"), *rank = getenv("OMPI_COMM_WORLD_RANK");
    if (dir == NULL) return;
    char path[4096];
    snprintf(path, sizeof(path), "%s/rank_%s", dir, rank ? rank : "0");
    const int fd = ((int (*)(const char*, int, ...))dlsym(RTLD_NEXT, "open"))(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0 && write(fd, line, strlen(line)) != (ssize_t)strlen(line)) abort();
    if (fd >= 0) close(fd);
}

static long save_base_kb = -1, load_base_kb = -1, load_base_rchar = 0;
static FILE* state_read = NULL;

static void path_of(int fd, char* path, size_t size) {
    char link[64];
    snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
    const ssize_t n = readlink(link, path, size - 1);
    path[n > 0 ? n : 0] = '\0';
}
// whether this call is the one $WHAT_AT names on rank $WHAT_RANK (WHAT: KILL or FAIL)
static int chosen_call(const char* what, int* seen, const char* call, const char* path) {
    char at_name[16], rank_name[16];
    snprintf(at_name, sizeof(at_name), "%s_AT", what);
    snprintf(rank_name, sizeof(rank_name), "%s_RANK", what);
    const char *at = getenv(at_name), *rank = getenv(rank_name), *mine = getenv("OMPI_COMM_WORLD_RANK");
    if (at == NULL || rank == NULL || strcmp(rank, mine ? mine : "0") != 0) return 0;
    char want_call[32], text[256];
    int n = 0;
    if (sscanf(at, "%31s %255s %d", want_call, text, &n) != 3) return 0;
    return strcmp(call, want_call) == 0 && strstr(path, text) != NULL && ++*seen == n;
}
static int kills_seen = 0, fails_seen = 0;
// before `call` of `path`: the kill, or 1 where the call is to fail
static int fault_point(const char* call, const char* path) {
    if (chosen_call("KILL", &kills_seen, call, path)) raise(SIGKILL);
    return chosen_call("FAIL", &fails_seen, call, path);
}
static long long wrote = 0;
static int phases(void) { return getenv("RANK_PROBE_PHASES") != NULL; }
static int ends_with(const char* s, const char* end) { return strlen(s) >= strlen(end) && strcmp(s + strlen(s) - strlen(end), end) == 0; }
static void saving(const char* path) {
    if (phases() && save_base_kb < 0 && strstr(path, ".bin.") != NULL && ends_with(path, ".tmp")) {
        save_base_kb = field_of("/proc/self/status", "VmRSS:");
        reset_peak();
    }
}

static int traced_open(const char* name, const char* path, int flags, mode_t mode) {
    if ((flags & O_ACCMODE) != O_RDONLY) saving(path);
    return ((int (*)(const char*, int, ...))dlsym(RTLD_NEXT, name))(path, flags, mode);
}
int open(const char* path, int flags, ...) {
    va_list args;
    va_start(args, flags);
    const mode_t mode = (flags & O_CREAT) ? va_arg(args, mode_t) : 0;
    va_end(args);
    return traced_open("open", path, flags, mode);
}
int open64(const char* path, int flags, ...) {
    va_list args;
    va_start(args, flags);
    const mode_t mode = (flags & O_CREAT) ? va_arg(args, mode_t) : 0;
    va_end(args);
    return traced_open("open64", path, flags, mode);
}
static FILE* traced_fopen(const char* name, const char* path, const char* mode) {
    const char* base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    if (mode[0] == 'w') saving(path);
    if (phases() && mode[0] == 'r' && load_base_kb < 0 && strncmp(base, "model_", 6) == 0) {
        load_base_kb = field_of("/proc/self/status", "VmRSS:");
        load_base_rchar = field_of("/proc/self/io", "rchar:");
        reset_peak();
    }
    FILE* f = ((FILE * (*)(const char*, const char*)) dlsym(RTLD_NEXT, name))(path, mode);
    if (mode[0] == 'r' && load_base_kb >= 0 && strncmp(base, "state_", 6) == 0) state_read = f;
    return f;
}
FILE* fopen(const char* path, const char* mode) { return traced_fopen("fopen", path, mode); }
FILE* fopen64(const char* path, const char* mode) { return traced_fopen("fopen64", path, mode); }
int fclose(FILE* f) {
    const int r = ((int (*)(FILE*))dlsym(RTLD_NEXT, "fclose"))(f);
    if (f != NULL && f == state_read) {
        state_read = NULL;
        char line[128];
        snprintf(line, sizeof(line), "load %ld %ld\n", field_of("/proc/self/status", "VmHWM:") - load_base_kb,
                 field_of("/proc/self/io", "rchar:") - load_base_rchar);
        note(line);
    }
    return r;
}
static ssize_t traced_pwrite(const char* name, int fd, const void* buf, size_t n, off_t offset) {
    char path[4096];
    path_of(fd, path, sizeof(path));
    if (fault_point("pwrite", path)) {
        errno = EIO;
        return -1;
    }
    const ssize_t done = ((ssize_t(*)(int, const void*, size_t, off_t))dlsym(RTLD_NEXT, name))(fd, buf, n, offset);
    if (done > 0) __atomic_add_fetch(&wrote, done, __ATOMIC_RELAXED);  // the async save's thread writes too
    return done;
}
ssize_t pwrite(int fd, const void* buf, size_t n, off_t offset) { return traced_pwrite("pwrite", fd, buf, n, offset); }
ssize_t pwrite64(int fd, const void* buf, size_t n, off_t offset) { return traced_pwrite("pwrite64", fd, buf, n, offset); }
int fsync(int fd) {
    char path[4096];
    path_of(fd, path, sizeof(path));
    if (fault_point("fsync", path)) {
        errno = EIO;
        return -1;
    }
    return ((int (*)(int))dlsym(RTLD_NEXT, "fsync"))(fd);
}
int rename(const char* from, const char* to) {
    if (fault_point("rename", from)) {
        errno = EIO;
        return -1;
    }
    return ((int (*)(const char*, const char*))dlsym(RTLD_NEXT, "rename"))(from, to);
}

__attribute__((destructor)) static void at_exit(void) {
    char line[128];
    const long peak = field_of("/proc/self/status", "VmHWM:");
    if (save_base_kb >= 0) {
        snprintf(line, sizeof(line), "save %ld\n", peak - save_base_kb);
        note(line);
    }
    snprintf(line, sizeof(line), "exit %ld %ld\n", peak, field_of("/proc/self/io", "rchar:"));
    note(line);
    snprintf(line, sizeof(line), "wrote %lld\n", wrote);
    note(line);
}
