// The sum of a run's batch mean losses, kept in backend memory.
#pragma once
#include <cstddef>

// A sum of batch mean losses kept in backend memory, so that a training step reads the device
// once (take()); each evaluation and the training loss keep their own, so none leaks into another.
template <class Backend>
class LossSum {
public:
    LossSum() : sum_((double*)Backend::alloc(kBytes)) {}
    ~LossSum() { Backend::release(sum_); }
    LossSum(const LossSum&) = delete;
    LossSum& operator=(const LossSum&) = delete;
    static constexpr size_t kBytes = sizeof(double);  // of backend memory
    // adds the mean of the N per-position losses (in backend memory)
    void add_batch_mean(const float* losses, int N) { Backend::mean_loss_add(sum_, losses, N); }
    // the sum since the last take(), which starts it again from zero
    double take() {
        double sum = 0.0;
        Backend::to_host(&sum, sum_, sizeof(double));
        Backend::zero(sum_, sizeof(double));
        return sum;
    }

private:
    double* sum_;
};
