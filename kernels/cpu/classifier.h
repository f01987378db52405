// Fused softmax + cross-entropy + its gradient. logits (N, Vp) are replaced in place by dlogits,
// so no second vocabulary-sized buffer exists. Columns V..Vp-1 are padding: they take no part in
// the softmax and get zero gradient. dloss is d(mean loss)/d(loss of one position).
#pragma once
#include <cmath>
#include <cstddef>

namespace cpu {

inline void fused_classifier(float* logits, float* losses, const int* targets, float dloss, int N,
                             int V, int Vp) {
    #pragma omp parallel for
    for (int i = 0; i < N; i++) {
        float* row = logits + (size_t)i * Vp;
        const int target = targets[i];
        float maxval = -INFINITY;
        for (int j = 0; j < V; j++) maxval = fmaxf(maxval, row[j]);
        const float target_logit = row[target];
        if (dloss == 0.0f) {  // inference: keep the logits, only the loss is wanted
            float sum = 0.0f;
            for (int j = 0; j < V; j++) sum += expf(row[j] - maxval);
            losses[i] = logf(sum) + maxval - target_logit;
            continue;
        }
        // one exp per logit: the row holds exp(logit - max) until it is scaled into dlogits
        float sum = 0.0f;
        for (int j = 0; j < V; j++) sum += (row[j] = expf(row[j] - maxval));
        // log-sum-exp form keeps the loss finite even when the target's probability underflows
        losses[i] = logf(sum) + maxval - target_logit;
        const float scale = dloss / sum;
        for (int j = 0; j < V; j++) row[j] *= scale;
        row[target] -= dloss;
        for (int j = V; j < Vp; j++) row[j] = 0.0f;
    }
}

// *acc += the mean of losses[0..N), rounded to float: the batch's loss, added up over a step
// where it stays until read
inline void mean_loss_add(double* acc, const float* losses, int N) {
    double sum = 0.0;
    for (int i = 0; i < N; i++) sum += losses[i];
    *acc += (float)(sum / N);
}

}  // namespace cpu
