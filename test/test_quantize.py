"""The CPU backend's block-wise int8 quantization (kernels/cpu/quantize.h, run through
test/quantize_rows) against a NumPy reference written here from kernels/quantize_blocks.h's
description: the same bytes, dequantized values and fp32 sums, bit for bit, and the round trip
within half a scale per block (max|block| / 254)."""
import os
import subprocess
import tempfile
import unittest

import numpy as np

TOOL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "quantize_rows")
BLOCK = 256
f32 = np.float32


def blocks_of(pieces):
    """(offset, n) of each block: at most BLOCK values of one piece (tensor)"""
    out, at = [], 0
    for length in pieces:
        out += [(at + i, min(BLOCK, length - i)) for i in range(0, length, BLOCK)]
        at += length
    return out


def quantize_row(row, pieces):
    """scales (float32, NaN for a block with a non-finite value) and int8 values"""
    scales, q = [], np.zeros(len(row), np.int8)
    for offset, n in blocks_of(pieces):
        block = row[offset:offset + n]
        scale = f32(np.max(np.abs(block)) / f32(127)) if np.all(np.isfinite(block)) else f32(np.nan)
        scales.append(scale)
        if scale > 0:
            q[offset:offset + n] = np.clip(np.rint(block / scale), -127, 127).astype(np.int8)
    return np.array(scales, f32), q


def row_bytes(scales, q):
    padding = (-len(q)) % 4
    return scales.tobytes() + q.tobytes() + bytes(padding)


def dequantize_row(scales, q, pieces):
    out = np.empty(len(q), f32)
    for (offset, n), scale in zip(blocks_of(pieces), scales):
        out[offset:offset + n] = q[offset:offset + n].astype(f32) * scale
    return out


def run_tool(x, pieces):
    rows, values = x.shape
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = os.path.join(tmp, "in"), os.path.join(tmp, "out")
        with open(src, "wb") as f:
            f.write(np.array([rows, len(pieces)] + list(pieces), np.int32).tobytes())
            f.write(x.astype(f32).tobytes())
        subprocess.run([TOOL, src, dst], check=True)
        with open(dst, "rb") as f:
            data = f.read()
    quantized_bytes = len(data) - 4 * (rows * values + values)
    back = np.frombuffer(data, f32, rows * values, quantized_bytes).reshape(rows, values)
    total = np.frombuffer(data, f32, values, quantized_bytes + 4 * rows * values)
    return data[:quantized_bytes], back, total


class QuantizerAgainstNumPy(unittest.TestCase):
    def check(self, x, pieces):
        x = np.asarray(x, f32)
        got_bytes, got_back, got_sum = run_tool(x, pieces)
        want_bytes, total = b"", np.zeros(x.shape[1], f32)
        for row in x:
            scales, q = quantize_row(row, pieces)
            want_bytes += row_bytes(scales, q)
            back = dequantize_row(scales, q, pieces)
            total = total + back  # fp32, row after row
            for (offset, n), scale in zip(blocks_of(pieces), scales):
                err = np.abs(row[offset:offset + n].astype(np.float64) - back[offset:offset + n])
                if np.isfinite(scale):
                    self.assertTrue(np.all(err <= 0.5 * float(scale) * (1 + 1e-4)), f"block at {offset}: error {err.max()} > scale {scale} / 2")
                else:
                    self.assertTrue(np.all(np.isnan(back[offset:offset + n])), f"block at {offset} has a non-finite value but dequantizes to numbers")
        self.assertEqual(got_bytes, want_bytes)
        np.testing.assert_array_equal(got_back, np.stack([dequantize_row(*quantize_row(r, pieces), pieces) for r in x]))
        np.testing.assert_array_equal(got_sum, total)

    def test_tensor_pieces_of_every_magnitude(self):
        # a layer's shard piece: layernorm weights near 1, matrices near 0.02, biases near 0,
        # lengths that end blocks short of 256 and pieces longer than a block
        rng = np.random.default_rng(0)
        pieces = [16, 16, 1536, 48, 513, 16, 1, 256, 2048, 300]
        scale = [1.0, 0.01, 0.02, 0.001, 0.02, 0.01, 1.0, 0.5, 0.02, 0.001]
        x = np.concatenate([rng.normal(0, s, (4, n)) for s, n in zip(scale, pieces)], axis=1)
        x[:, :16] += 1.0
        self.check(x, pieces)

    def test_outliers_zeros_ties_and_non_finite_values(self):
        rng = np.random.default_rng(1)
        x = rng.normal(0, 0.02, (3, 1024)).astype(f32)
        x[0, 5] = 1000.0             # an outlier coarsens its own block only
        x[1, 256:512] = 0.0          # a block of zeros: scale 0, values 0
        x[2, 512:516] = [127.0, 2.5, 3.5, -2.5]  # scale 1: ties go to even (2, 4, -2)
        x[2, 516:768] = 0.0
        x[0, 800] = np.nan           # a block with a NaN or an infinity dequantizes to NaN
        x[1, 900] = -np.inf
        self.check(x, [1024])
        _, q = quantize_row(x[2], [1024])
        self.assertEqual(list(q[512:516]), [127, 2, 4, -2])

    def test_one_row_and_tiny_pieces(self):
        rng = np.random.default_rng(2)
        self.check(rng.normal(0, 3.0, (1, 7)), [3, 4])
        self.check(rng.uniform(-1e-30, 1e-30, (2, 600)), [600])  # tiny values keep their relative precision


if __name__ == "__main__":
    unittest.main()
