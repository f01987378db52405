"""PyTorch's scaled_dot_product_attention at the shapes scripts/bench_attention times (causal, bf16,
forward and backward of one layer), per backend (FlashAttention-2, cuDNN), timed the same way: CUDA
events, median of 20 after 3 warm-ups, TFLOP/s counting causal work (forward 2*B*NH*T^2*hs, backward
2.5 times that). One line per shape and backend; a backend this PyTorch or GPU lacks says so.
Run by scripts/bench_gpu.sh where python3 has torch with CUDA."""
import sys

try:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
except ImportError as e:
    print(f"bench sdpa: skipped ({e})")
    sys.exit(0)

SHAPES = [(64, 12, 1024, 64), (16, 25, 1024, 64), (8, 12, 1024, 128)]
BACKENDS = [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)]


def median_ms(fn):
    for _ in range(3):
        fn()
    times = []
    for _ in range(20):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return sorted(times)[len(times) // 2]


def main():
    if not torch.cuda.is_available():
        print("bench sdpa: skipped (no GPU visible to torch)")
        return
    for B, NH, T, hs in SHAPES:
        fwd_flop = 2.0 * B * NH * T * T * hs
        q, k, v = (torch.randn(B, NH, T, hs, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        dout = torch.randn(B, NH, T, hs, device="cuda", dtype=torch.bfloat16)
        for name, backend in BACKENDS:
            try:
                with sdpa_kernel([backend]):
                    def forward():
                        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

                    out = forward()

                    def backward():
                        torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)

                    fwd, bwd = median_ms(forward), median_ms(backward)
            except RuntimeError as e:
                print(f"bench sdpa {name} B={B} NH={NH} T={T} hs={hs}: not available ({str(e).splitlines()[0][:100]})")
                continue
            print(f"bench sdpa {name} B={B} NH={NH} T={T} hs={hs} bf16: forward {fwd:.3f} ms "
                  f"({fwd_flop / fwd / 1e9:.0f} TFLOP/s), backward {bwd:.3f} ms ({2.5 * fwd_flop / bwd / 1e9:.0f}), "
                  f"forward+backward {fwd + bwd:.3f} ms")


if __name__ == "__main__":
    main()
