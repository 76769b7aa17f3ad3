"""The nmkit package on numpy arrays: pruning, compression, the CPU reference and its errors (no GPU needed)."""
import os
import pathlib
import subprocess
import tempfile
import unittest

import numpy as np

import nmkit
from helpers import write_safetensors


def random_weight(rows, cols, seed=0):
    return np.random.default_rng(seed).standard_normal((rows, cols), dtype=np.float32)


def relative_error(got, want):
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


class Pruning(unittest.TestCase):
    def test_2_4_keeps_the_two_largest_of_every_four(self):
        w = random_weight(64, 96)  # K = 96: 24 groups
        sw = nmkit.prune(w, "2:4", dtype="f32")
        self.assertEqual((sw.format, sw.shape, sw.dtype, sw.density), ("2:4", (64, 96), "f32", 0.5))
        dense = sw.to_dense()
        groups = np.abs(w).reshape(64, 24, 4)
        kept = np.sort(np.argsort(-groups, axis=2)[:, :, :2], axis=2)
        expected = np.zeros_like(w).reshape(64, 24, 4)
        np.put_along_axis(expected, kept, np.take_along_axis(w.reshape(64, 24, 4), kept, axis=2), axis=2)
        np.testing.assert_array_equal(dense, expected.reshape(64, 96))
        kept_l1 = np.abs(dense).sum() / np.abs(w).sum()
        self.assertAlmostEqual(sw.energy, kept_l1, places=5)

    def test_every_format_with_tails_round_trips(self):
        w = random_weight(200, 333, seed=1)  # tails in R and K for every format below
        for spec, density in [("2:4", 0.5), ("1:4", 0.25), ("vnm:64:2:8", 0.25), ("vnm:128:2:10", 0.2),
                              ("vnm:32:1:8", 0.125), ("tile:32x32:0.25", None), ("tile:64x16:0.5", None)]:
            with self.subTest(spec=spec):
                sw = nmkit.prune(w, spec, dtype="f16")
                sw.validate()
                self.assertEqual(sw.shape, (200, 333))
                self.assertEqual(sw.dtype, "f16")
                dense = sw.to_dense()
                # The entries kept inside the matrix over all of them: a tail group or an edge tile counts only
                # its entries inside (N/M or the tile fraction, off by the tails').
                self.assertAlmostEqual(sw.density, np.count_nonzero(dense) / dense.size)
                if density is not None:
                    self.assertAlmostEqual(sw.density, density, delta=0.005)
                nonzero = dense != 0
                # Every kept value is the weight's own, rounded to f16.
                np.testing.assert_array_equal(dense[nonzero], w[nonzero].astype(np.float16).astype(np.float32))
                self.assertLess(sw.storage_bytes, sw.dense_bytes)
                # Compressing the pruned matrix again gives the same weight.
                again = nmkit.compress(dense, spec if not spec.startswith("tile") else spec.rsplit(":", 1)[0] + ":1")
                np.testing.assert_array_equal(again.to_dense(), dense)

    def test_astype_rounds_the_values_and_keeps_the_pattern(self):
        w = random_weight(64, 80, seed=5)
        for spec in ["2:4", "vnm:64:2:8", "tile:16x16:0.5"]:
            sw = nmkit.prune(w, spec, dtype="f32")
            half = sw.astype("bf16")
            half.validate()
            self.assertEqual((half.format, half.shape, half.dtype), (sw.format, sw.shape, "bf16"))
            dense, rounded = sw.to_dense(), half.to_dense()
            np.testing.assert_array_equal(rounded != 0, dense != 0)
            self.assertLess(relative_error(rounded, dense), 4e-3)  # bf16's 8-bit mantissa
        with self.assertRaisesRegex(ValueError, "dtype"):
            sw.astype("int8")

    def test_accepts_float16_and_integer_arrays(self):
        w16 = random_weight(8, 16).astype(np.float16)
        self.assertEqual(nmkit.prune(w16, "2:4").shape, (8, 16))
        self.assertEqual(nmkit.prune(np.arange(32).reshape(4, 8), "2:4").to_dense()[0, 6], 6.0)
        # A non-contiguous view is copied, not misread.
        w = random_weight(16, 32)
        np.testing.assert_array_equal(nmkit.prune(w.T, "2:4").to_dense(), nmkit.prune(w.T.copy(), "2:4").to_dense())


class StorageDtype(unittest.TestCase):
    def test_the_default_keeps_the_weights_own_precision(self):
        w = random_weight(8, 16, seed=9)
        self.assertEqual(nmkit.prune(w, "2:4").dtype, "f32")
        self.assertEqual(nmkit.prune(w.astype(np.float64), "2:4").dtype, "f32")
        self.assertEqual(nmkit.prune(w.astype(np.float16), "2:4").dtype, "f16")
        self.assertEqual(nmkit.compress(nmkit.prune(w, "2:4").to_dense(), "2:4").dtype, "f32")
        self.assertEqual(nmkit.prune(w, "2:4", dtype="bf16").dtype, "bf16")

    def test_large_weights_are_kept_or_refused_never_stored_as_infinity(self):
        w = random_weight(64, 64, seed=10) * 1e6
        sw = nmkit.prune(w, "2:4")  # f32 holds them
        self.assertTrue(np.isfinite(sw.to_dense()).all())
        self.assertGreater(sw.energy, 0.5)
        with self.assertRaisesRegex(ValueError, r"overflows f16.*row \d+, column \d+|row \d+, column \d+ overflows f16"):
            nmkit.prune(w, "2:4", dtype="f16")
        with self.assertRaisesRegex(ValueError, "overflows f16"):
            sw.astype("f16")

    def test_tiny_weights_are_kept_or_reported_never_silently_zeroed(self):
        w = random_weight(64, 64, seed=11) * 1e-9
        sw = nmkit.prune(w, "2:4")
        self.assertEqual(np.count_nonzero(sw.to_dense()), 64 * 32)
        with self.assertRaisesRegex(ValueError, "round to zero: nothing would be kept"):
            nmkit.prune(w, "2:4", dtype="f16")
        mixed = random_weight(8, 16, seed=12)
        mixed[0, 0] = 1e-9
        with self.assertWarnsRegex(RuntimeWarning, "1 of the weight's 128 non-zero values .* round to zero"):
            nmkit.prune(mixed, "2:4", dtype="f16")

    def test_non_finite_weights_are_refused_with_their_position(self):
        w = random_weight(8, 16, seed=13)
        w[3, 5] = np.nan
        with self.assertRaisesRegex(ValueError, "weight row 3, column 5 is NaN"):
            nmkit.prune(w, "2:4")
        w[3, 5] = -np.inf
        with self.assertRaisesRegex(ValueError, "weight row 3, column 5 is -inf"):
            nmkit.prune(w, "2:4")


class ReferenceProduct(unittest.TestCase):
    def test_spmm_matches_the_dense_product_with_bias_and_activations(self):
        rng = np.random.default_rng(2)
        w = random_weight(130, 70, seed=3)
        b = rng.standard_normal((70, 33), dtype=np.float32)
        bias = rng.standard_normal(130, dtype=np.float32)
        for spec in ["2:4", "vnm:64:2:8", "tile:16x16:0.5"]:
            sw = nmkit.prune(w, spec, dtype="f32")
            want = sw.to_dense().astype(np.float64) @ b
            with self.subTest(spec=spec):
                self.assertLess(relative_error(nmkit.spmm(sw, b), want), 1e-5)
                got = nmkit.spmm(sw, b, bias=bias, alpha=0.5, activation="relu")
                self.assertLess(relative_error(got, np.maximum(0.5 * want + bias[:, None], 0)), 1e-5)


class Errors(unittest.TestCase):
    def test_bad_input_raises_an_error_that_names_it(self):
        w = random_weight(8, 16)
        with self.assertRaisesRegex(ValueError, "N < M, got 3:2"):
            nmkit.prune(w, "3:2")
        with self.assertRaisesRegex(ValueError, "tile"):
            nmkit.prune(w, "tile:64x64:1.5")
        with self.assertRaisesRegex(ValueError, "dtype"):
            nmkit.prune(w, "2:4", dtype="f8")
        with self.assertRaisesRegex(TypeError, "2-D"):
            nmkit.prune(w[0], "2:4")
        with self.assertRaisesRegex(TypeError, "real numbers"):
            nmkit.prune(w.astype(np.complex64), "2:4")
        with self.assertRaisesRegex(ValueError, "row 0"):
            nmkit.compress(np.ones((4, 8), np.float32), "2:4")  # four non-zeros per group
        sw = nmkit.prune(w, "2:4")
        with self.assertRaisesRegex(ValueError, "rows"):
            nmkit.spmm(sw, np.ones((15, 4), np.float32))
        with self.assertRaisesRegex(ValueError, "bias"):
            nmkit.spmm(sw, np.ones((16, 4), np.float32), bias=np.ones(7, np.float32))
        with self.assertRaisesRegex(ValueError, "activation"):
            nmkit.spmm(sw, np.ones((16, 4), np.float32), activation="tanh")

    def test_spmm_refuses_what_is_not_a_real_matrix_or_vector(self):
        # Each of these used to run: a complex bias lost its imaginary part, strings were parsed as numbers,
        # [None] * R gave an all-NaN output, bool and durations counted as numbers, a (2, 4) bias was flattened.
        sw = nmkit.prune(random_weight(8, 16), "2:4")
        b = np.ones((16, 4), np.float32)
        refused_types = {
            "complex bias": dict(bias=np.full(8, 1 + 2j)),
            "string bias": dict(bias=["1"] * 8),
            "a bias of None": dict(bias=[None] * 8),
            "bool bias": dict(bias=np.ones(8, bool)),
            "object bias": dict(bias=np.array([1.0] * 8, dtype=object)),
            "bias (8, 1)": dict(bias=np.ones((8, 1), np.float32)),
            "bias (2, 4)": dict(bias=np.ones((2, 4), np.float32)),
            "scalar bias": dict(bias=1.0),
            "complex b": dict(b=b.astype(np.complex64)),
            "bool b": dict(b=b.astype(bool)),
            "object b": dict(b=b.astype(object)),
            "string b": dict(b=b.astype(str)),
            "duration b": dict(b=b.astype("timedelta64[s]")),
            "b 1-D": dict(b=np.ones(16, np.float32)),
            "b 3-D": dict(b=np.ones((16, 4, 1), np.float32)),
            "ragged b": dict(b=[[1.0] * 4] * 15 + [[1.0]]),
            "string alpha": dict(alpha="2"),
            "complex alpha": dict(alpha=1j),
            "array alpha": dict(alpha=np.ones(2)),
            "activation None": dict(activation=None),
        }
        for label, kwargs in refused_types.items():
            what = next(iter(kwargs))
            with self.subTest(label), self.assertRaisesRegex(TypeError, what):
                nmkit.spmm(sw, **{"b": b, **kwargs})
        with self.assertRaisesRegex(TypeError, "SparseWeight"):
            nmkit.spmm(random_weight(8, 16), b)
        with self.assertRaisesRegex(ValueError, r"b\[3, 1\] = 1e\+300 is beyond float32's range"):
            big = b.astype(np.float64)
            big[3, 1] = 1e300
            nmkit.spmm(sw, big)
        with self.assertRaisesRegex(ValueError, r"bias\[5\] = -1e\+39"):
            nmkit.spmm(sw, b, bias=[0.0] * 5 + [-1e39] + [0.0] * 2)
        with self.assertRaisesRegex(ValueError, r"alpha = 1e\+300 is not a finite float32"):
            nmkit.spmm(sw, b, alpha=1e300)
        # What is real is still taken: integer arrays, nested lists, float64 within range, numpy scalars.
        want = nmkit.spmm(sw, b, bias=np.arange(8, dtype=np.float32), alpha=2.0)
        got = nmkit.spmm(sw, b.astype(np.int64).tolist(), bias=list(range(8)), alpha=np.float64(2))
        np.testing.assert_array_equal(got, want)

    def test_load_file_takes_path_likes_and_names_a_directory(self):
        with tempfile.TemporaryDirectory() as tmp:
            # A directory used to come back as MemoryError (std::bad_alloc from the reader).
            for path in (tmp, pathlib.Path(tmp)):
                with self.assertRaisesRegex(IsADirectoryError, "is a directory") as caught:
                    nmkit.load_file(path)
                self.assertEqual(caught.exception.filename, tmp)
            with self.assertRaisesRegex(OSError, "is a directory"):
                nmkit._nmkit.load_file(tmp)  # the extension itself, for callers that bypass the wrapper
            # pathlib.Path (any os.PathLike) and bytes are paths like str: a missing file is an OSError naming it.
            missing = os.path.join(tmp, "missing.safetensors")
            for path in (pathlib.Path(missing), missing.encode()):
                with self.subTest(type(path).__name__), self.assertRaisesRegex(OSError, "missing.safetensors"):
                    nmkit.load_file(path)
            with self.assertRaisesRegex(TypeError, "os.PathLike, got int"):
                nmkit.load_file(3)

    def test_files_are_validated_before_they_are_trusted(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "broken.safetensors")
            with open(path, "wb") as f:
                f.write(b"\xff" * 8 + b"{not json")
            with self.assertRaises(OSError):
                nmkit.load_file(path)
            with self.assertRaises(OSError):
                nmkit.load_file(os.path.join(tmp, "missing.safetensors"))


@unittest.skipUnless(os.environ.get("NMKIT_CLI"), "NMKIT_CLI (the nmkit tool) is not set")
class FilesFromTheCommandLine(unittest.TestCase):
    def test_a_file_pruned_by_the_cli_loads_as_the_same_weights(self):
        w = random_weight(96, 200, seed=4)
        with tempfile.TemporaryDirectory() as tmp:
            dense_path, sparse_path = os.path.join(tmp, "dense.safetensors"), os.path.join(tmp, "sparse.safetensors")
            write_safetensors(dense_path, {"layer.weight": w, "embeddings.weight": w[:4]})
            subprocess.run([os.environ["NMKIT_CLI"], "prune", dense_path, "-o", sparse_path, "--format", "vnm:32:2:8"],
                           check=True, capture_output=True)
            weights = nmkit.load_file(sparse_path)
            self.assertEqual(list(nmkit.load_file(pathlib.Path(sparse_path))), ["layer.weight"])
        self.assertEqual(list(weights), ["layer.weight"])  # embeddings are excluded by default and stay dense
        loaded = weights["layer.weight"]
        self.assertEqual((loaded.format, loaded.shape), ("vnm:32:2:8", (96, 200)))
        np.testing.assert_array_equal(loaded.to_dense(), nmkit.prune(w, "vnm:32:2:8", dtype="f32").to_dense())


class Build(unittest.TestCase):
    def test_build_info_and_devices(self):
        info = nmkit.build_info()
        self.assertEqual(nmkit.__version__, info["version"])
        devices, why_none = nmkit.cuda_devices()
        self.assertEqual(nmkit.cuda_available(), bool(devices))
        if not devices:
            self.assertTrue(why_none)  # says why there is none


if __name__ == "__main__":
    unittest.main()
