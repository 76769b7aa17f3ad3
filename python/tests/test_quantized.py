"""N:M weights with 8-bit values from Python: nmkit.prune / compress with dtype fp8 (e4m3), e5m2 or int8, the
QuantizedWeight they give, save_file / load_file, the refusals (other formats, SparseLinear of 8-bit weights other
than 2:4, spmm) and nmkit.torch.prune_model with dtype (skipped without PyTorch, as the other torch tests).

The quantization is checked against a numpy reimplementation of docs/formats.md's absmax round-to-nearest: scale =
absmax / max in fp32, code = round(x / scale) to the code type's grid (ties to even, saturating), value = code * scale.
"""
import json
import os
import struct
import subprocess
import tempfile
import unittest

import numpy as np

import nmkit
from helpers import read_safetensors, torch_missing, write_safetensors

try:
    import torch

    import nmkit.torch as nmt
    WHY_NO_TORCH = None
except ImportError as e:
    WHY_NO_TORCH = torch_missing(e)

if not WHY_NO_TORCH:
    from test_prune_model import TinyLM, calibration
    from test_torch import no_device_reached

TYPES = ("e4m3", "e5m2", "int8")
LARGEST = {"e4m3": 448.0, "e5m2": 57344.0, "int8": 127.0}
MANTISSA_BITS = {"e4m3": 3, "e5m2": 2}
SMALLEST_NORMAL_EXPONENT = {"e4m3": -6, "e5m2": -14}
PART_DTYPES = {"e4m3": "F8_E4M3", "e5m2": "F8_E5M2", "int8": "I8"}


def random_weight(rows, cols, seed=0):
    return np.random.default_rng(seed).standard_normal((rows, cols), dtype=np.float32)


def round_to_code(x, type):
    """x (float32) rounded to the nearest value of the code type, ties to even, saturating at its largest."""
    x = x.astype(np.float64)
    if type == "int8":
        return np.clip(np.rint(x), -127, 127)
    _, exponent = np.frexp(np.abs(x))  # |x| = f * 2^exponent, f in [0.5, 1)
    step = np.exp2(np.maximum(exponent - 1, SMALLEST_NORMAL_EXPONENT[type]) - MANTISSA_BITS[type])
    return np.clip(np.rint(x / step) * step, -LARGEST[type], LARGEST[type])


def quantize_rows(kept, type):
    """(scales, dequantized values) of the pruned weight `kept` (zeros where pruned), per row, as nmkit does."""
    absmax = np.abs(kept).max(axis=1)
    scales = (absmax / np.float32(LARGEST[type])).astype(np.float32)
    safe = np.where(scales > 0, scales, np.float32(1))[:, None]
    codes = round_to_code((kept / safe).astype(np.float32), type)
    return scales, (codes.astype(np.float32) * scales[:, None]).astype(np.float32)


class Quantization(unittest.TestCase):
    def test_each_type_agrees_with_numpy_absmax_round_to_nearest(self):
        w = random_weight(48, 70, seed=3)  # K = 70: a tail group
        w[5] *= 1e-3  # rows of very different scales
        w[9] *= 1e4
        w[7] *= np.logspace(-7, 0, 70, dtype=np.float32)  # a row over 7 decades: subnormal codes, and zeros
        kept = nmkit.prune(w, "2:4", dtype="f32").to_dense()
        for type, name in [("e4m3", "fp8"), ("e4m3", "e4m3"), ("e5m2", "e5m2"), ("int8", "int8")]:
            with self.subTest(name):
                q = nmkit.prune(w, "2:4", dtype=name)
                self.assertIsInstance(q, nmkit.QuantizedWeight)
                q.validate()
                self.assertEqual((q.format, q.shape, q.dtype, q.density), ("2:4", (48, 70), type, 36 / 70))  # tail: 2 of 2
                self.assertAlmostEqual(q.energy, nmkit.prune(w, "2:4", dtype="f32").energy)
                scales, want = quantize_rows(kept, type)
                self.assertEqual(q.scales.dtype, np.float32)
                np.testing.assert_array_equal(q.scales, scales)
                got = q.to_dense()
                self.assertEqual(got.dtype, np.float32)
                np.testing.assert_array_equal(got, want)
                # Within the code's rounding: half a step of the grid at each value (scaled), the row's largest kept.
                if type == "int8":
                    bound = 0.5 * scales[:, None] * np.ones_like(kept)
                else:
                    bound = np.abs(kept) * 2.0 ** -(MANTISSA_BITS[type] + 1) + 1e-30
                    bound = np.maximum(bound, 0.5 * scales[:, None] * 2.0 ** (SMALLEST_NORMAL_EXPONENT[type] -
                                                                            MANTISSA_BITS[type]))
                self.assertTrue((np.abs(got - kept) <= bound * (1 + 1e-6)).all())
                # A row's largest |value| maps to the code type's largest: back to itself within fp32's rounding.
                np.testing.assert_allclose(np.abs(got).max(axis=1), np.abs(kept).max(axis=1), rtol=2e-7)
                np.testing.assert_array_equal(got[kept == 0], 0)  # the pattern stays
                # Storage: codes + 2-bit indices + fp32 scales, against the weight dense at 8 bits with its scales.
                values = 48 * 18 * 2
                self.assertEqual(q.storage_bytes, values + values * 2 // 8 + 4 * 48)
                self.assertEqual(q.dense_bytes, 48 * 70 + 4 * 48)

    def test_compress_quantizes_a_weight_already_in_the_pattern(self):
        kept = nmkit.prune(random_weight(16, 32, seed=4), "1:4", dtype="f32").to_dense()
        for type in TYPES:
            q = nmkit.compress(kept, "1:4", dtype=type)
            self.assertEqual((q.format, q.dtype, q.energy), ("1:4", type, None))
            np.testing.assert_array_equal(q.to_dense(), quantize_rows(kept, type)[1])
            np.testing.assert_array_equal(q.to_dense(), nmkit.prune(kept, "1:4", dtype=type).to_dense())

    def test_zero_rows_get_scale_zero_and_dequantize_to_zeros(self):
        w = random_weight(6, 16, seed=5)
        w[2] = 0.0
        w[4] = -0.0
        w[5] = 1e-44  # a scale that would underflow: the smallest subnormal instead, never 0 for a non-zero row
        for type in TYPES:
            with self.subTest(type):
                q = nmkit.prune(w, "2:4", dtype=type)
                q.validate()
                scales, dense = q.scales, q.to_dense()
                self.assertEqual((scales[2], scales[4]), (0.0, 0.0))
                np.testing.assert_array_equal(dense[[2, 4]], 0.0)
                self.assertEqual(scales[5], np.float32(2.0 ** -149))
                self.assertTrue((dense[5] != 0).any() and np.isfinite(dense[5]).all())
                np.testing.assert_array_equal(dense[:2], quantize_rows(nmkit.prune(w[:2], "2:4").to_dense(), type)[1])
        q = nmkit.prune(np.zeros((3, 8), np.float32), "2:4", dtype="fp8")
        np.testing.assert_array_equal(q.scales, 0.0)
        np.testing.assert_array_equal(q.to_dense(), 0.0)

    def test_refusals_name_what_is_supported(self):
        w = random_weight(64, 64, seed=6)
        for format in ("vnm:64:2:8", "tile:16x16:0.5"):
            for type in ("fp8", "e5m2", "int8"):
                with self.subTest(format=format, type=type):
                    name = {"fp8": "e4m3"}.get(type, type)
                    message = (rf"8-bit values \({name}\) are supported for N:M formats only \(2:4, N:M\), "
                               rf"not {format}")
                    with self.assertRaisesRegex(NotImplementedError, message):
                        nmkit.prune(w, format, dtype=type)
                    with self.assertRaisesRegex(NotImplementedError, message):
                        nmkit.compress(w, format, dtype=type)
        with self.assertRaisesRegex(ValueError, r"unknown dtype 'int4' \(expected f32, f16, bf16, or 8-bit: fp8 "
                                                r"\(= e4m3\), e5m2, int8\)"):
            nmkit.prune(w, "2:4", dtype="int4")
        bad = w.copy()
        bad[3, 7] = np.nan
        with self.assertRaisesRegex(ValueError, "NaN"):
            nmkit.prune(bad, "2:4", dtype="int8")
        with self.assertRaisesRegex(ValueError, "break|pattern|group"):
            nmkit.compress(w, "2:4", dtype="fp8")  # dense: not 2:4
        q = nmkit.prune(w, "2:4", dtype="fp8")
        with self.assertRaisesRegex(TypeError, "8-bit QuantizedWeight \\(e4m3\\).*to_dense"):
            nmkit.spmm(q, np.ones((64, 2), np.float32))
        self.assertFalse(hasattr(q, "astype"))


def write_parts(path, parts, description):
    """A file holding one compressed weight 'w' from its raw parts (name, dtype, shape, bytes), by hand."""
    header, offset = {}, 0
    for name, dtype, shape, blob in parts:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
    header["__metadata__"] = {"nmkit.format_version": "1", "nmkit:w": json.dumps(description)}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(p[3] for p in parts))


class Files(unittest.TestCase):
    def test_save_and_load_round_trip_exactly(self):
        w = random_weight(40, 52, seed=7)
        w[3] = 0.0
        weights = {f"{t}.weight": nmkit.prune(w * (i + 1), "2:4", dtype=t) for i, t in enumerate(TYPES)}
        weights["one_of_eight.weight"] = nmkit.prune(w, "1:8", dtype="int8")
        weights["f16.weight"] = nmkit.prune(w, "2:4", dtype="f16")
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "q.safetensors")
            nmkit.save_file(path, {**weights, "bias": np.arange(4, dtype=np.float32)})
            loaded = nmkit.load_file(path)
            header, tensors = read_safetensors(path)
        self.assertEqual(list(loaded), list(weights))
        for name, q in weights.items():
            with self.subTest(name):
                got = loaded[name]
                self.assertIs(type(got), type(q))
                self.assertEqual((got.format, got.shape, got.dtype, got.storage_bytes),
                                 (q.format, q.shape, q.dtype, q.storage_bytes))
                np.testing.assert_array_equal(got.to_dense(), q.to_dense())
                if isinstance(q, nmkit.QuantizedWeight):
                    np.testing.assert_array_equal(got.scales, q.scales)
                    self.assertIsNone(got.energy)
                    base = name[:-len(".weight")]
                    self.assertEqual(header[f"{name}.values"]["dtype"], PART_DTYPES[q.dtype])
                    self.assertEqual((header[f"{name}.scales"]["dtype"], header[f"{name}.scales"]["shape"]),
                                     ("F32", [40]))
                    np.testing.assert_array_equal(tensors[f"{name}.scales"], q.scales)
                    description = json.loads(header["__metadata__"][f"nmkit:{name}"])
                    self.assertEqual(description["dtype"], q.dtype, base)
        # int8 codes are plain integers: code * scale, in stored order, are the kept values.
        int8 = weights["int8.weight"]
        codes = tensors["int8.weight.values"].astype(np.float32) * int8.scales[:, None]
        dense = int8.to_dense()
        np.testing.assert_array_equal(codes[codes != 0], dense[dense != 0])

    def test_a_file_written_by_hand_loads_and_broken_ones_are_refused(self):
        # A 1 x 4 e4m3 2:4 weight as `nmkit prune --dtype fp8` writes it: codes 1.0 and 2.0 at indices 0 and 1.
        description = {"format": "nm", "shape": [1, 4], "dtype": "e4m3", "n": 2, "m": 4}
        scales = ("w.scales", "F32", [1], struct.pack("<f", 0.5))
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "fp8.safetensors")
            write_parts(path, [("w.values", "F8_E4M3", [1, 2], bytes([0x38, 0x40])),
                               ("w.indices", "U8", [1], bytes([0x04])), scales], description)
            q = nmkit.load_file(path)["w"]
            self.assertEqual((q.format, q.shape, q.dtype), ("2:4", (1, 4), "e4m3"))
            np.testing.assert_array_equal(q.to_dense(), [[0.5, 1.0, 0.0, 0.0]])
            np.testing.assert_array_equal(q.scales, [0.5])
            # A malformed file is an OSError (as every file the loader refuses), naming the weight and the fault.
            for values, scale, message in [(bytes([0x38, 0x7F]), 0.5, "row 0, group 0, slot 1: e4m3 code 0x7f is a NaN"),
                                           (bytes([0x38, 0x40]), -1.0, "scale of row 0 is -1")]:
                with self.subTest(message):
                    write_parts(path, [("w.values", "F8_E4M3", [1, 2], values), ("w.indices", "U8", [1], bytes([4])),
                                       ("w.scales", "F32", [1], struct.pack("<f", scale))], description)
                    with self.assertRaisesRegex(OSError, "tensor 'w': .*" + message):
                        nmkit.load_file(path)
            write_parts(path, [("w.values", "I8", [1, 2], bytes([0x01, 0x80])), ("w.indices", "U8", [1], bytes([4])),
                               scales], {**description, "dtype": "int8"})
            with self.assertRaisesRegex(OSError, "tensor 'w': .*int8 code 0x80 is -128"):
                nmkit.load_file(path)

    @unittest.skipUnless(os.environ.get("NMKIT_CLI"), "NMKIT_CLI (the nmkit tool) is not set")
    def test_a_file_quantized_by_the_cli_loads_as_the_same_weights(self):
        w = random_weight(96, 200, seed=8)
        with tempfile.TemporaryDirectory() as tmp:
            dense_path = os.path.join(tmp, "dense.safetensors")
            write_safetensors(dense_path, {"layer.weight": w})
            for type in ("fp8", "e5m2", "int8"):
                with self.subTest(type):
                    path = os.path.join(tmp, f"{type}.safetensors")
                    subprocess.run([os.environ["NMKIT_CLI"], "prune", dense_path, "-o", path, "--format", "2:4",
                                    "--dtype", type], check=True, capture_output=True)
                    loaded = nmkit.load_file(path)["layer.weight"]
                    want = nmkit.prune(w, "2:4", dtype=type)
                    self.assertEqual((loaded.format, loaded.dtype), (want.format, want.dtype))
                    np.testing.assert_array_equal(loaded.scales, want.scales)
                    np.testing.assert_array_equal(loaded.to_dense(), want.to_dense())
                    # and what Python writes, the CLI reads
                    again = os.path.join(tmp, f"{type}.python.safetensors")
                    nmkit.save_file(again, {"layer.weight": want})
                    text = subprocess.run([os.environ["NMKIT_CLI"], "inspect", again], check=True,
                                          capture_output=True, text=True).stdout
                    self.assertIn(want.dtype, text)


@unittest.skipIf(WHY_NO_TORCH, WHY_NO_TORCH or "")
class Torch(unittest.TestCase):
    def test_sparse_linear_refuses_8_bit_weights_other_than_2_4(self):
        # 8-bit 2:4 weights run (python/tests/test_torch_8bit.py); other N:M patterns have no 8-bit kernel.
        q = nmkit.prune(random_weight(64, 128), "2:8", dtype="fp8")
        with no_device_reached(self):
            with self.assertRaisesRegex(NotImplementedError, "8-bit weights run on the GPU as 2:4 only, this one is "
                                                             "e4m3 2:8"):
                nmt.SparseLinear(q, dtype=torch.float16)
            model = torch.nn.Sequential(torch.nn.Linear(128, 64, dtype=torch.float16))
            with tempfile.TemporaryDirectory() as tmp:
                path = os.path.join(tmp, "q.safetensors")
                nmkit.save_file(path, {"0.weight": q})
                with self.assertRaisesRegex(NotImplementedError, "8-bit"):
                    nmt.load_sparse(model, path)
            self.assertIsInstance(model[0], torch.nn.Linear)  # left as it was

    def test_prune_model_quantizes_each_pruned_linear(self):
        for method, type in [("magnitude", "int8"), ("obs", "fp8")]:
            with self.subTest(method):
                model = TinyLM(blocks=2)
                before = {name: m.weight.detach().clone() for name, m in model.named_modules()
                          if isinstance(m, torch.nn.Linear)}
                with tempfile.TemporaryDirectory() as tmp:
                    path = os.path.join(tmp, "model.safetensors")
                    weights = nmt.prune_model(model, calibration(2) if method == "obs" else None, "2:4",
                                              method=method, dtype=type, out=path, progress=False)
                    loaded = nmkit.load_file(path)
                self.assertEqual(len(weights), 6)
                for name, q in weights.items():
                    self.assertIsInstance(q, nmkit.QuantizedWeight)
                    self.assertEqual((q.format, q.dtype), ("2:4", {"fp8": "e4m3"}.get(type, type)))
                    dense = q.to_dense()
                    # The Linear holds the dequantized weight; the file the same codes and scales.
                    np.testing.assert_array_equal(model.get_submodule(name).weight.detach().numpy(), dense)
                    np.testing.assert_array_equal(loaded[f"{name}.weight"].to_dense(), dense)
                    np.testing.assert_array_equal(loaded[f"{name}.weight"].scales, q.scales)
                    if method == "magnitude":
                        np.testing.assert_array_equal(dense, nmkit.prune(before[name].numpy(), "2:4",
                                                                         dtype=type).to_dense())
                np.testing.assert_array_equal(model.head.weight.detach(), before["head"])  # outside the blocks

    def test_prune_model_refuses_8_bit_values_outside_n_m_before_pruning(self):
        model = TinyLM(blocks=2)
        before = [p.detach().clone() for p in model.parameters()]
        with self.assertRaisesRegex(NotImplementedError, r"8-bit values \(int8\) are supported for N:M formats only "
                                                         r"\(2:4, N:M\), not vnm:64:2:8"):
            nmt.prune_model(model, None, "vnm:64:2:8", method="magnitude", dtype="int8", progress=False)
        with self.assertRaisesRegex(ValueError, "unknown dtype 'fp4'"):
            nmt.prune_model(model, None, "2:4", method="magnitude", dtype="fp4", progress=False)
        with self.assertRaisesRegex(TypeError, "dtype must be a string"):
            nmt.prune_model(model, None, "2:4", method="magnitude", dtype=torch.float8_e4m3fn, progress=False)
        for p, b in zip(model.parameters(), before):
            self.assertTrue(torch.equal(p.detach(), b))


if __name__ == "__main__":
    unittest.main()
