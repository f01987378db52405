// A run's output directory (-o), as llm.c lays it out: main.log, and per checkpoint at step N
// model_N.bin (parameters), state_N.bin (optimizer and loader state) and an empty DONE_N,
// written last, once the checkpoint is complete. A run killed at any point leaves either a
// complete checkpoint with its DONE file or one -y 1 does not use; files being written are
// name.tmp until renamed (common/io.h's AtomicFile), and leftovers are removed at the next start.
#pragma once
#include <glob.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "../common/io.h"

// dir/model_00000020.bin etc.; kind "DONE" has no extension
inline std::string checkpoint_path(const std::string& dir, const char* kind, int step) {
    char name[64];
    snprintf(name, sizeof(name), "/%s_%08d%s", kind, step, strcmp(kind, "DONE") == 0 ? "" : ".bin");
    return dir + name;
}

inline bool file_exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

// the highest N with DONE_N, model_N.bin and state_N.bin in dir; 0 if none
inline int latest_checkpoint(const std::string& dir) {
    glob_t g;
    int best = 0;
    if (glob((dir + "/DONE_*").c_str(), 0, nullptr, &g) == 0) {
        for (size_t i = 0; i < g.gl_pathc; i++) {
            const char* digits = strrchr(g.gl_pathv[i], '_') + 1;
            if (strspn(digits, "0123456789") != strlen(digits)) continue;  // DONE_N.tmp: not yet written
            const int n = atoi(digits);
            if (n > best && file_exists(checkpoint_path(dir, "model", n)) && file_exists(checkpoint_path(dir, "state", n)))
                best = n;
        }
        globfree(&g);
    }
    return best;
}

// what a failed write or a stopped run leaves: "the checkpoint of step 20 is intact", or that
// there is no complete checkpoint in dir
inline std::string checkpoint_kept(const std::string& dir) {
    if (dir.empty()) return "no checkpoints are kept (-o '')";
    const int step = latest_checkpoint(dir);
    return step > 0 ? "the checkpoint of step " + std::to_string(step) + " is intact" : "no complete checkpoint in " + dir;
}

// marks the checkpoint at step complete, durably (AtomicFile): called once model_N.bin and
// state_N.bin are durable, so DONE_N never points at files a crash could still take away
inline void write_done(const std::string& dir, int step, const std::string& kept = "") {
    AtomicFile(checkpoint_path(dir, "DONE", step), kept).commit();
}

// DONE first, so a checkpoint half removed is never taken for a complete one
inline void remove_checkpoint(const std::string& dir, int step) {
    for (const char* kind : {"DONE", "model", "state"}) remove(checkpoint_path(dir, kind, step).c_str());
}

// -nk / -nm as llm.c: after the checkpoint at `step`, the one `keep` checkpoints back goes,
// unless it is a major one (a multiple of `major`). 0: nothing to delete.
inline int checkpoint_to_delete(int step, int checkpoint_every, int keep, int major) {
    const int old = step - keep * checkpoint_every;
    if (checkpoint_every <= 0 || keep <= 0 || old <= 0 || (major > 0 && old % major == 0)) return 0;
    return old;
}

// *.tmp files a killed run was writing
inline void remove_partial_writes(const std::string& dir) {
    glob_t g;
    if (glob((dir + "/*.tmp").c_str(), 0, nullptr, &g) == 0) {
        for (size_t i = 0; i < g.gl_pathc; i++) remove(g.gl_pathv[i]);
        globfree(&g);
    }
}

// A run resumed at `step` appends to main.log; first the lines the killed run wrote for steps
// from `step` on are dropped (they will be written again). Lines are "s:<step> ...". The log is
// flushed at checkpoints only, so a kill can leave a last line cut short ("s:5"): it goes too,
// or the first line appended would join it.
inline void truncate_log(const std::string& path, int step) {
    FILE* in = fopen(path.c_str(), "r");
    if (in == nullptr) return;  // no log yet
    AtomicFile out(path);
    char* line = nullptr;
    size_t capacity = 0;
    for (ssize_t n; (n = getline(&line, &capacity, in)) > 0;) {
        const bool complete = line[n - 1] == '\n';
        if (!complete || (strncmp(line, "s:", 2) == 0 && atoi(line + 2) >= step)) continue;
        out.write(line, (size_t)n);
    }
    free(line);
    fclose(in);
    out.commit();
}
