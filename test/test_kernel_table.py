"""scripts/kernel_table.py on Nsight Compute's CSV as `ncu --csv --page raw` writes it (lines from ncu and the
program before the header, a row of units, thousands separators), against sums worked out by hand."""
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "kernel_table.py")

CSV = """==PROF== Connected to process 1234 (/work/train_gpt)
step    1/2 | loss 10.98
"ID","Process ID","Process Name","Kernel Name","Block Size","gpu__time_duration.sum"
"","","","","","usecond"
"0","1234","train_gpt","flash_forward_kernel","(128, 1, 1)","1,000.5"
"1","1234","train_gpt","nvjet_sm90_tst_128x256","(384, 1, 1)","250"
"2","1234","train_gpt","layernorm_backward_kernel","(256, 1, 1)","125.25"
"3","1234","train_gpt","flash_forward_kernel","(128, 1, 1)","999.5"
"4","1234","train_gpt","attention_backward_delta_kernel","(256, 1, 1)","60"
"""


def table(csv_text, steps, *more):
    with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as f:
        f.write(csv_text)
    try:
        return subprocess.run([sys.executable, SCRIPT, f.name, str(steps), *more], capture_output=True, text=True)
    finally:
        os.unlink(f.name)


class KernelTableTest(unittest.TestCase):
    def test_sums_by_name_and_group_per_step(self):
        r = table(CSV, 2)
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.splitlines()
        # 2435.25 us over 2 steps, 5 launches over 2 steps
        self.assertIn("2 kernels per step, 1.22 ms of kernel time per step", lines[0])
        groups = {l.split()[0]: l for l in lines[1:4]}
        self.assertIn(" 1.03 ms/step", groups["attention"])  # flash 2000 + delta 60 us, halved
        self.assertIn(" 0.12 ms/step", groups["matmul"])
        self.assertIn(" 0.06 ms/step", groups["other"])
        flash = next(l for l in lines if l.strip().startswith("flash_forward_kernel"))
        self.assertIn("1.0/step", flash)
        self.assertIn("1.000 ms/step", flash)
        self.assertIn("82.1%", flash)  # 2000 / 2435.25

    def test_step_time_beside_kernel_time_gives_the_gap(self):
        r = table(CSV, 1, "2.5")
        self.assertEqual(r.returncode, 0, r.stderr)
        # 2435.25 us of kernels in a 2.5 ms step: 0.06475 ms, 2.59% of it, outside kernels
        self.assertIn("a step takes 2.50 ms, 0.06 ms (2.6%) more than its kernels", r.stdout.splitlines()[1])

    def test_output_that_is_not_ncu_csv_says_so(self):
        r = table("==ERROR== The application returned an error code (9).\n", 3)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("no 'Kernel Name' header", r.stderr)

    def test_unknown_time_unit_is_refused(self):
        r = table(CSV.replace('"usecond"', '"furlong"'), 1)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("unknown time unit 'furlong'", r.stderr)


if __name__ == "__main__":
    unittest.main()
