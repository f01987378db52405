"""scripts/step_trace.py on a synthetic trace in scripts/kernel_trace.so's format, and scripts/gpu_clocks.py
on synthetic nvidia-smi samples, against answers worked out here: the busy and idle time by counting
100 ns ticks, the gaps and their neighbours by hand from the intervals below. And the lines the
library writes for records made up on the host (test/kernel_trace_records, where CUPTI is), read back."""
import os
import re
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEP_TRACE = os.path.join(ROOT, "scripts", "step_trace.py")
GPU_CLOCKS = os.path.join(ROOT, "scripts", "gpu_clocks.py")

T0 = 1_000_000_000  # CUPTI's clock is far from 0
WINDOW = (0, 10_000_000)  # 10 ms
# (kind, start, end, stream or thread, name), times in ns from T0
RECORDS = [
    ("kernel", -2_000_000, -1_000_000, 7, "void early()"),  # before the window: not counted
    ("kernel", 1_000_000, 3_000_000, 7, "void attention_forward<64>(float const*, int)"),
    ("kernel", 3_500_000, 5_000_000, 7, "void gemm<1>(float*)"),
    ("kernel", 4_000_000, 6_000_000, 8, "layernorm_kernel"),  # another stream, overlapping gemm
    ("memset", 6_000_500, 6_001_200, 7, "memset 256 B"),
    ("kernel", 8_000_000, 9_000_000, 7, "void attention_forward<64>(float const*, int)"),
    ("kernel", 9_500_000, 10_500_000, 7, "void gemm<2>(float*)"),  # past the window's end: clipped
    ("kernel", 12_000_000, 13_000_000, 7, "void late()"),  # after the window: not counted
    ("api", 6_100_000, 7_900_000, 99, "cudaStreamSynchronize_v3020"),
    ("api", 7_950_000, 7_960_000, 99, "cudaLaunchKernel_v7000"),
]


def trace_text(records, windows=(WINDOW,), extra=""):
    lines = ["# kernel_trace: kind start_ns end_ns stream|thread name"]
    lines += [f"{k}\t{T0 + s}\t{T0 + e}\t{w}\t{n}" for k, s, e, w, n in records]
    lines += [f"window\t{i + 1}\t{T0 + s}\t{T0 + e}" for i, (s, e) in enumerate(windows)]
    return "\n".join(lines) + "\n" + extra


def run_script(script, text, *args):
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(text)
    try:
        return subprocess.run([sys.executable, script, f.name, *args], capture_output=True, text=True, timeout=60)
    finally:
        os.unlink(f.name)


def busy_ns_by_ticks(records, start, end, tick=100):
    """The reference: each 100 ns tick of the window that some device activity covers."""
    busy = [False] * ((end - start) // tick)
    for kind, s, e, _, _ in records:
        if kind == "api":
            continue
        for t in range(max(s, start) // tick, min(e, end) // tick):
            busy[t - start // tick] = True
    return sum(busy) * tick


class StepTraceTest(unittest.TestCase):
    def setUp(self):
        self.r = run_script(STEP_TRACE, trace_text(RECORDS), "--top", "3")
        self.assertEqual(self.r.returncode, 0, self.r.stderr)
        self.lines = self.r.stdout.splitlines()

    def test_busy_and_idle_time_of_the_window(self):
        busy = busy_ns_by_ticks(RECORDS, *WINDOW)  # 6,000,700 ns
        idle = WINDOW[1] - WINDOW[0] - busy
        # 5 kernels in the window: 2 + 1.5 + 2 + 1 + 0.5 (clipped) ms
        self.assertEqual(self.lines[0], f"step trace, window 1 of 1: 10.000 ms, busy {busy / 1e6:.3f} ms ({busy / 1e5:.1f}%), "
                                        f"idle {idle / 1e6:.3f} ms ({idle / 1e5:.1f}%); 5 kernels (7.000 ms summed), 0 copies, 1 memsets")
        # idle from the window's start to the first kernel: 1 ms; none at its end (gemm<2> runs past it);
        # between: 0.5 ms (attention -> gemm), 0.5 us (layernorm -> memset), 1998.8 us (memset ->
        # attention), 0.5 ms (attention -> gemm)
        self.assertEqual(self.lines[1], "  idle before the first activity 1.000 ms, after the last 0.000 ms, "
                                        "between activities 2.999 ms in 4 gaps")

    def test_gaps_by_length(self):
        line = next(l for l in self.lines if l.startswith("  gaps by length"))
        counts = dict(re.findall(r"(under 2 us|2-10 us|10-100 us|100-1000 us|1000 us and over): (\d+)", line))
        self.assertEqual(counts, {"under 2 us": "1", "2-10 us": "0", "10-100 us": "0", "100-1000 us": "2", "1000 us and over": "2"})
        self.assertIn("100-1000 us: 2 (1.000 ms)", line)
        self.assertIn("1000 us and over: 2 (2.999 ms)", line)  # 1000 + 1998.8 us

    def test_largest_gaps_name_their_neighbours_and_the_host_call(self):
        start = self.lines.index("  largest gaps (of 5):")
        largest = [l.split() for l in self.lines[start + 1:start + 4]]
        # the sync covers 1.8 of the gap's 1.9988 ms: 90%; the launch after it only 10 us of it
        self.assertEqual(largest[0], ["1998.8", "us", "memset", "->", "attention_forward", "host:", "cudaStreamSynchronize", "(90%", "of", "it)"])
        self.assertEqual(largest[1], ["1000.0", "us", "(window", "edge)", "->", "attention_forward", "host:", "no", "CUDA", "call",
                                      "(host", "code)"])
        self.assertEqual(largest[2][:5], ["500.0", "us", "attention_forward", "->", "gemm"])

    def test_idle_summed_by_kernel_pair(self):
        start = self.lines.index("  idle by the pair of activities around it (total, gaps, mean):")
        pairs = {l.split("mean")[1].strip(): l.split()[:6] for l in self.lines[start + 1:]}
        # gemm<1> and gemm<2> are one kernel by name: two gaps of 0.5 ms after attention
        self.assertEqual(pairs["attention_forward -> gemm"], ["1.000", "ms", "2", "gaps", "500.0", "us"])
        self.assertEqual(pairs["memset -> attention_forward"], ["1.999", "ms", "1", "gaps", "1998.8", "us"])
        self.assertEqual(self.lines[start + 1].split()[0], "1.999")  # the largest total first

    def test_trace_without_window_is_read_whole(self):
        records = [("kernel", 0, 1_000, 1, "void (anonymous namespace)::k1<3>(int)"), ("kernel", 3_000, 4_000, 1, "k2"),
                   ("memcpy", 4_500, 5_000, 2, "memcpy HtoD 4096 B")]
        r = run_script(STEP_TRACE, trace_text(records, windows=()))
        self.assertEqual(r.returncode, 0, r.stderr)
        # from 0 to 5000 ns: busy 1000 + 1000 + 500, idle 2000 + 500
        self.assertIn("whole trace (no cudaProfilerStart/Stop window): 0.005 ms, busy 0.003 ms (50.0%), idle 0.003 ms (50.0%); "
                      "2 kernels (0.002 ms summed), 1 copies, 0 memsets", r.stdout)
        self.assertRegex(r.stdout, r"2\.0 us  k1 -> k2 ")
        self.assertRegex(r.stdout, r"0\.5 us  k2 -> memcpy HtoD ")

    def test_dropped_records_are_said(self):
        r = run_script(STEP_TRACE, trace_text(RECORDS, extra="dropped\t12\n"))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("CUPTI dropped 12 records", r.stdout.splitlines()[0])

    def test_a_line_that_is_no_record_is_refused_by_number(self):
        r = run_script(STEP_TRACE, trace_text(RECORDS) + "kernel\t12\tnot-a-time\t1\tk\n")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn(f"line {len(RECORDS) + 3}: 'kernel", r.stderr)
        self.assertEqual(len(r.stderr.strip().splitlines()), 1)


RECORDS_BIN = os.path.join(ROOT, "test", "kernel_trace_records")


@unittest.skipUnless(os.access(RECORDS_BIN, os.X_OK), "test/kernel_trace_records not built (make test builds it where CUPTI is)")
class KernelTraceLinesTest(unittest.TestCase):
    def test_what_the_library_writes_is_what_step_trace_reads(self):
        r = subprocess.run([RECORDS_BIN], capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        # the records test/kernel_trace_records.cpp makes, as scripts/kernel_trace.cpp's header says they are written
        self.assertEqual(r.stdout.splitlines(), ["kernel\t1000\t5000\t7\tvoid attention_kernel<64>(float const*, int)",
                                                 "kernel\t9000\t9500\t8\tnvjet_sm90_tst_256x128_64x4_2x1_v_bz_coopB_TNT",
                                                 "memcpy\t5500\t6000\t7\tmemcpy HtoD 4096 B",
                                                 "memset\t6000\t6100\t7\tmemset 256 B",
                                                 "api\t6200\t8900\t42\tcudaStreamSynchronize_v3020"])
        read = run_script(STEP_TRACE, r.stdout + "window\t1\t0\t10000\n")
        self.assertEqual(read.returncode, 0, read.stderr)
        # idle: 1000 before the kernel, 500 before the copy, 2900 from the memset to nvjet (the sync,
        # 6200-8900, covers 2700 of it: 93%), 500 after nvjet: 4900 of 10000 ns
        self.assertIn("busy 0.005 ms (51.0%), idle 0.005 ms (49.0%); 2 kernels", read.stdout)
        self.assertRegex(read.stdout, r"\n +2\.9 us  memset -> nvjet_sm90_tst_256x128_64x4_2x1_v_bz_coopB_TNT  "
                                      r"host: cudaStreamSynchronize \(93% of it\)\n")
        self.assertRegex(read.stdout, r"\n +0\.5 us  attention_kernel -> memcpy HtoD  ")


SAMPLES = """clocks.current.sm [MHz], clocks.max.sm [MHz], power.draw [W], utilization.gpu [%], clocks_event_reasons.active
345 MHz, 1980 MHz, 75.20 W, 0 %, 0x0000000000000001
1980 MHz, 1980 MHz, 650.00 W, 100 %, 0x0000000000000000
1755 MHz, 1980 MHz, 700.00 W, 100 %, 0x0000000000000004
clocks.current.sm [MHz], clocks.max.sm [MHz], power.draw [W], utilization.gpu [%], clocks_event_reasons.active
1830 MHz, 1980 MHz, [N/A], 97 %, 0x0000000000000044
1900 MHz, 1980 MHz, 690.50 W, 60 %, 0x0000000000000000
1200 MHz, 1980 MHz, 300.00 W, 40 %, 0x0000000000000000
1650 MHz, 19"""


class GpuClocksTest(unittest.TestCase):
    def test_clock_power_and_reasons_under_load(self):
        r = run_script(GPU_CLOCKS, SAMPLES, "d12")
        self.assertEqual(r.returncode, 0, r.stderr)
        # under load (utilization >= 50%): 1980, 1755, 1830, 1900 MHz; median (1830 + 1900) / 2 = 1865,
        # (1980 - 1865) / 1980 = 5.8% below the max; power 650, 700, 690.5 (one N/A); reasons 0, 0x4,
        # 0x44 (SW power cap + HW thermal slowdown), 0; the idle samples' GPU idle bit not counted
        self.assertEqual(r.stdout.strip(), "clocks d12: 6 samples (1 malformed lines skipped), 4 under load (GPU utilization >= 50%): "
                                           "SM clock min 1755, median 1865, max 1980 MHz; the median 5.8% below the GPU's max SM clock "
                                           "1980 MHz; power min 650.0, median 690.5, max 700.0 W; clock event reasons under load: "
                                           "none in 2 samples, SW power cap in 2, HW thermal slowdown in 1")

    def test_no_sample_under_load(self):
        r = run_script(GPU_CLOCKS, SAMPLES.splitlines()[0] + "\n345 MHz, 1980 MHz, 75.20 W, 0 %, 0x0000000000000001\n")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), "clocks: 1 samples, none under load (GPU utilization >= 50%)")

    def test_output_that_is_not_nvidia_smi_csv_says_so(self):
        r = run_script(GPU_CLOCKS, 'Field "clocks_event_reasons.active" is not a valid field to query.\n')
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("no nvidia-smi CSV header", r.stderr)
        self.assertIn("is not a valid field", r.stderr)


if __name__ == "__main__":
    unittest.main()
