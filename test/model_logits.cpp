// The logits train_gpt's model (CPU backend) gives for the first T tokens of a token shard, for
// the Hugging Face tests (test/test_hf.py) to compare with transformers' GPT-2.
//   test/model_logits CHECKPOINT SHARD T OUT: writes T rows of V fp32 logits to OUT
#define TESTING
#include "train_gpt.cu"
#include "zero/comm_single.h"

int main(int argc, char** argv) {
    if (argc != 5) fatal(2, "usage: model_logits CHECKPOINT SHARD T OUT");
    GPT2Config c;
    std::vector<float> params = load_checkpoint(argv[1], &c);
    const int T = atoi(argv[3]);
    if (T <= 0 || T > c.max_seq_len) fatal(2, "T=%s: expected 1..%d (the model's maxT)", argv[3], c.max_seq_len);
    DataLoader data(argv[2], 1, T, 0, 1, c.vocab_size);
    std::vector<int> inputs(T), targets(T);
    data.next_batch(inputs.data(), targets.data());

    SingleComm comm(CpuBackend::copy);
    Zero<CpuBackend> zero(0, param_groups(c), comm);
    zero.load(params.data());
    GPT2<CpuBackend> model(c, 1, T, 0, zero);
    model.forward(inputs.data(), nullptr, 1, T, 0.0f);
    std::vector<float> logits((size_t)T * c.vocab_size);
    for (int t = 0; t < T; t++) model.logits_at(t, logits.data() + (size_t)t * c.vocab_size);
    AtomicFile out(argv[4]);
    out.write(logits.data(), logits.size() * sizeof(float));
    out.commit();
    return 0;
}
