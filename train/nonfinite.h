// A run that diverges must not destroy its good checkpoints. A step whose loss or gradient norm
// is NaN or infinite never reaches the weights, the optimizer state or the outlier windows: its
// update is skipped, and the step line says so (with -sl/-sg off too). While the last step was
// such a one no checkpoint is written: its weights are the ones that just gave non-finite values,
// and -nk would retire a good checkpoint for them. After --nonfinite-limit such steps in a row,
// or when the run's last step is one, the run stops with one line and exit code kExitNonFinite,
// which scripts/resume_loop.sh does not restart: a restart from the same state diverges again.
// Every rank sees the same loss and norm (both are reduced over the ranks), so all ranks skip
// and stop together.
#pragma once
#include <cmath>
#include <cstdio>
#include <string>

constexpr int kExitNonFinite = 3;

// why a step's update was skipped (StepRecord::skipped)
enum SkipReason { kNotSkipped = 0, kSkipOutlier = 1, kSkipNonFinite = 2 };

class NonFiniteSteps {
public:
    explicit NonFiniteSteps(int limit) : limit_(limit) {}

    // counts the step: true when its loss and gradient norm are both finite (it may update)
    bool record(double loss, double norm) {
        const bool finite = std::isfinite(loss) && std::isfinite(norm);
        in_a_row_ = finite ? 0 : in_a_row_ + 1;
        return finite;
    }
    int in_a_row() const { return in_a_row_; }
    int limit() const { return limit_; }
    bool limit_reached() const { return in_a_row_ >= limit_; }

    // the one line of a run that stops after `step` updates; kept: what is left (run_dir.h's checkpoint_kept)
    void print_stop(int step, const std::string& kept) const {
        const std::string why = limit_reached() ? "--nonfinite-limit " + std::to_string(limit_) : "the run's last steps";
        fprintf(stderr, "error: step %d: %d step(s) in a row with a non-finite loss or gradient norm (%s); stopping with exit code %d and no checkpoint of this state: %s\n",
                step, in_a_row_, why.c_str(), kExitNonFinite, kept.c_str());
    }

private:
    int limit_, in_a_row_ = 0;
};
