// Outlier detection for -sl / -sg (llm.c's): the z-score of each step's loss or gradient norm
// against the window of the last 128 values, so a spike can be kept out of the update.
//
// The window holds the new value too (as in llm.c), and the mean and variance are summed afresh
// each time, in double, so nothing drifts over a long run and the state is just the window.
// While the window fills the z-score is NaN, which never skips. Only finite values join. A value whose z-score is over
// the threshold is taken back out of the window, so outliers do not make the detector more
// tolerant; the third outlier in a row stays in, so a lasting shift cannot stall training.
#pragma once
#include <cmath>
#include <cstdint>

class OutlierDetector {
public:
    static constexpr int kWindow = 128;

    // z-score of value against the window it then joins; threshold 0: never taken back out. A
    // NaN or infinite value never joins (it would make every later z-score NaN): its z-score is NaN.
    double update(double value, double threshold) {
        if (!std::isfinite(value)) return NAN;
        if (count_ < kWindow) {
            values_[count_++] = value;
            skipped_in_a_row_ = 0;
            return NAN;
        }
        const double replaced = values_[next_];
        values_[next_] = value;
        double mean = 0.0, var = 0.0;
        for (double v : values_) mean += v;
        mean /= kWindow;
        for (double v : values_) var += (v - mean) * (v - mean);
        const double std = std::sqrt(var / kWindow);
        const double z = std == 0.0 ? 0.0 : (value - mean) / std;
        const bool outlier = threshold != 0.0 && z > threshold;
        skipped_in_a_row_ = outlier ? skipped_in_a_row_ + 1 : 0;
        if (outlier && skipped_in_a_row_ < 3) values_[next_] = replaced;  // as if it had not happened
        else next_ = (next_ + 1) % kWindow;
        return z;
    }

    // the whole state, for the state file: the window, how full it is, where the next value
    // goes, and the outliers just seen
    struct State {
        double values[kWindow];
        int32_t count, next, skipped_in_a_row, unused;
    };
    State state() const {
        State s{};
        for (int i = 0; i < kWindow; i++) s.values[i] = values_[i];
        s.count = count_, s.next = next_, s.skipped_in_a_row = skipped_in_a_row_;
        return s;
    }
    // false when s is not a state this class could have been in
    bool restore(const State& s) {
        if (s.count < 0 || s.count > kWindow || s.next < 0 || s.next >= kWindow || s.skipped_in_a_row < 0) return false;
        for (double v : s.values)
            if (!std::isfinite(v)) return false;
        for (int i = 0; i < kWindow; i++) values_[i] = s.values[i];
        count_ = s.count, next_ = s.next, skipped_in_a_row_ = s.skipped_in_a_row;
        return true;
    }

private:
    double values_[kWindow] = {};
    int count_ = 0, next_ = 0, skipped_in_a_row_ = 0;
};
