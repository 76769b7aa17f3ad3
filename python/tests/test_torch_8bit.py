"""nmkit.torch.SparseLinear with 8-bit 2:4 weights (QuantizedWeight: e4m3, e5m2, int8), x quantized per token.

On any machine with PyTorch: every refusal before the device (patterns other than 2:4, the dtype of x and y, K not
a multiple of 16, from_linear's and sparsify's `quantize`), and a call's own work (shapes, out=, the fp32 bias,
load_sparse of an 8-bit file) with test_torch.CpuLayer standing in for the kernel. On a GPU: the layer against
`x_q @ W_deq^T` in torch (x quantized per token by quantize_per_token, the weight dequantized), each code type the
C++ layer takes (int8 is reported and skipped where the 8-bit plan refuses it), CUDA graphs and load_sparse.
"""
import os
import tempfile
import unittest
from unittest import mock

import numpy as np

import nmkit
from helpers import graph_replay_and_eager, torch_missing

try:
    import torch
    import torch.nn.functional as F

    import nmkit.torch as nmt
    from test_torch import (TOLERANCE, WHY_NO_GPU, layers_on_the_cpu, no_device_reached, quantize_per_token,
                            relative_error)
    WHY_NO_TORCH = None
except ImportError as e:
    WHY_NO_TORCH = torch_missing(e)
    WHY_NO_GPU = WHY_NO_TORCH

TYPES = {"fp8": "e4m3", "e4m3": "e4m3", "e5m2": "e5m2", "int8": "int8"}  # quantize= -> the code type


def random_weight(rows, cols, seed=0):
    return np.random.default_rng(seed).standard_normal((rows, cols), dtype=np.float32)


def linear(rows, cols, dtype=None, bias=True, seed=0, device=None):
    torch.manual_seed(seed)
    return torch.nn.Linear(cols, rows, bias=bias, dtype=dtype or torch.float16, device=device)


def tokens_of_many_scales(shape, cols, dtype, device=None):
    """x [*shape, cols] whose tokens span four decades of magnitude: a per-tensor scale would lose the small ones."""
    tokens = int(np.prod(shape))
    x = torch.randn(tokens, cols, device=device) * torch.logspace(-2, 2, max(tokens, 1), device=device)[:tokens, None]
    return x.to(dtype).view(*shape, cols)


def reference(x, weight, bias, activation, type):
    """act(x_q W_deq^T + bias) in fp32: x quantized per token to `type`, the weight's codes times its scales."""
    w = torch.from_numpy(weight.to_dense()).to(x.device)
    y = F.linear(quantize_per_token(x.reshape(-1, x.shape[-1]), type), w, None if bias is None else bias.float())
    return {"none": y, "relu": F.relu(y), "gelu": F.gelu(y)}[activation]


@unittest.skipIf(WHY_NO_TORCH, WHY_NO_TORCH or "")
class QuantizedLayerArgumentsOnTheCpu(unittest.TestCase):
    """Every refusal of an 8-bit SparseLinear, from_linear(quantize=) and sparsify(quantize=), before the device."""

    def test_the_constructor_refuses_with_a_reason(self):
        q = nmkit.prune(random_weight(64, 128), "2:4", dtype="fp8")
        with no_device_reached(self):
            for args, kwargs, error, message in [
                ((q,), {}, TypeError, "8-bit weight \\(e4m3 2:4\\) needs dtype=torch.float16 or torch.bfloat16"),
                ((q,), dict(dtype=torch.float32), TypeError, "float16 or bfloat16, got torch.float32"),
                ((q,), dict(dtype="bf16"), TypeError, "float16 or bfloat16, got bf16"),
                ((nmkit.prune(random_weight(64, 128), "2:8", dtype="int8"),), dict(dtype=torch.float16),
                 NotImplementedError, "8-bit weights run on the GPU as 2:4 only, this one is int8 2:8"),
                ((nmkit.prune(random_weight(64, 72), "2:4", dtype="e5m2"),), dict(dtype=torch.bfloat16),
                 NotImplementedError, "in_features a multiple of 16 .*got 72"),
                ((q,), dict(dtype=torch.float16, activation="tanh"), ValueError, "unknown activation 'tanh'"),
                ((q, torch.zeros(63)), dict(dtype=torch.float16), ValueError, "bias must have shape \\(64,\\)"),
                ((q,), dict(dtype=torch.float16, device="cpu"), ValueError, "runs on a CUDA device, got cpu"),
            ]:
                with self.subTest(message), self.assertRaisesRegex(error, message):
                    nmt.SparseLinear(*args, **kwargs)

    def test_from_linear_and_sparsify_refuse_before_pruning(self):
        with no_device_reached(self), mock.patch.object(nmt, "prune", side_effect=AssertionError("pruned")):
            for args, kwargs, error, message in [
                ((linear(64, 128), "2:4"), dict(quantize="int4"), ValueError,
                 "quantize must be None or one of fp8, e4m3, e5m2, int8, got 'int4'"),
                ((linear(64, 128), "2:4"), dict(quantize=torch.float8_e4m3fn), ValueError, "quantize must be None"),
                ((linear(64, 128), "2:8"), dict(quantize="fp8"), NotImplementedError,
                 "2:4 only, got format '2:8' with quantize='fp8'"),
                ((linear(64, 128), "vnm:64:2:8"), dict(quantize="int8"), NotImplementedError, "2:4 only"),
                ((linear(64, 72), "2:4"), dict(quantize="e5m2"), NotImplementedError,
                 "in_features a multiple of 16 .*got 72"),
                ((linear(64, 128, torch.float32), "2:4"), dict(quantize="fp8"), TypeError,
                 "float16 or bfloat16, got torch.float32"),
            ]:
                with self.subTest(message), self.assertRaisesRegex(error, message):
                    nmt.SparseLinear.from_linear(*args, **kwargs)
            model = torch.nn.Sequential(linear(64, 128), torch.nn.ReLU(), linear(32, 64))
            with self.assertRaisesRegex(NotImplementedError, "2:4 only"):
                nmt.sparsify(model, "2:8", quantize="fp8")
            with self.assertRaisesRegex(ValueError, "quantize must be None"):
                nmt.sparsify(model, quantize="fp16")
            self.assertEqual([type(m) for m in (model[0], model[2])], [torch.nn.Linear] * 2)

    @unittest.skipUnless(WHY_NO_GPU, "a CUDA device is present")
    def test_without_a_gpu_an_8_bit_layer_that_would_work_says_why_it_cannot(self):
        with self.assertRaisesRegex(RuntimeError, "SparseLinear needs .*CUDA"):
            nmt.SparseLinear.from_linear(linear(128, 64), "2:4", quantize="fp8")
        with self.assertRaisesRegex(RuntimeError, "SparseLinear needs .*CUDA"):
            nmt.SparseLinear(nmkit.prune(random_weight(64, 128), "2:4", dtype="int8"), dtype=torch.bfloat16)


@unittest.skipIf(WHY_NO_TORCH, WHY_NO_TORCH or "")
class QuantizedCallsOnTheCpu(unittest.TestCase):
    """A call's own work for an 8-bit layer, with the CPU stand-in (test_torch.CpuLayer) computing the product."""

    def test_a_call_gives_the_quantized_product(self):
        for quantize, dtype, bias, activation in [("fp8", torch.float16, True, "none"),
                                                  ("e5m2", torch.bfloat16, False, "relu"),
                                                  ("int8", torch.bfloat16, True, "gelu")]:
            type = TYPES[quantize]
            dense = linear(100, 48, dtype, bias, seed=3)
            with self.subTest(quantize), layers_on_the_cpu() as made:
                layer = nmt.SparseLinear.from_linear(dense, "2:4", activation=activation, quantize=quantize)
                self.assertEqual((layer.format, layer.quantized, layer.dtype, layer.in_features, layer.out_features),
                                 (f"2:4 {type}", type, dtype, 48, 100))
                self.assertEqual((made[0].quantized, made[0].dtype), (type, dtype))  # what the C++ layer was given
                self.assertIsInstance(made[0].weight, nmkit.QuantizedWeight)
                self.assertEqual(layer.bias is not None, bias)
                weight = made[0].weight
                np.testing.assert_array_equal(
                    weight.to_dense(), nmkit.prune(dense.weight.detach().float().numpy(), "2:4", type).to_dense())
                for shape in [(1,), (7,), (3, 5), (0,)]:
                    x = tokens_of_many_scales(shape, 48, dtype)
                    out = torch.full((int(np.prod(shape)), 100), float("nan"), dtype=dtype)
                    with torch.no_grad():
                        y = layer(x)
                        layer(x, out=out)
                    self.assertEqual((tuple(y.shape), y.dtype), ((*shape, 100), dtype))
                    if x.numel():
                        want = reference(x, weight, dense.bias, activation, type).view(*shape, 100)
                        self.assertLess(relative_error(y, want), TOLERANCE[str(dtype).split(".")[1]])
                    torch.testing.assert_close(out.view_as(y), y, rtol=0, atol=0)

    def test_the_reference_quantizer_is_nmkits(self):
        # Rows with a 2:4 pattern compressed with 8-bit values are quantized per row by nmkit's own rule (zeros do
        # not move the absmax): quantize_per_token, the GPU tests' reference, must give them bit for bit.
        x = tokens_of_many_scales((37,), 64, torch.bfloat16).float()
        x.view(37, 16, 4)[:, :, 1:3] = 0
        for type in ("e4m3", "e5m2", "int8"):
            with self.subTest(type):
                want = nmkit.compress(x.numpy(), "2:4", dtype=type).to_dense()
                np.testing.assert_array_equal(quantize_per_token(x, type).numpy(), want)

    def test_load_sparse_takes_8_bit_2_4_weights_in_the_linears_dtype(self):
        for model_dtype, layer_dtype in [(torch.bfloat16, torch.bfloat16), (torch.float32, torch.float16)]:
            torch.manual_seed(5)
            model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.GELU(), torch.nn.Linear(96, 32))
            model.to(model_dtype)
            q = nmkit.prune(model[0].weight.detach().float().numpy(), "2:4", dtype="int8")
            s = nmkit.prune(model[2].weight.detach().float().numpy(), "2:4", dtype="f32")
            bias = model[0].bias.detach().float().clone()
            with tempfile.TemporaryDirectory() as tmp, layers_on_the_cpu() as made, self.subTest(model_dtype):
                path = os.path.join(tmp, "mixed.safetensors")
                nmkit.save_file(path, {"0.weight": q, "2.weight": s})
                self.assertEqual(nmt.load_sparse(model, path), ["0", "2"])
                self.assertEqual((model[0].format, model[0].quantized, model[0].dtype),
                                 ("2:4 int8", "int8", layer_dtype))
                self.assertEqual((model[2].format, model[2].quantized, model[2].dtype), ("2:4", None, layer_dtype))
                self.assertEqual([m.dtype for m in made], [layer_dtype] * 2)
                torch.testing.assert_close(model[0].bias, bias, rtol=0, atol=0)
                x = tokens_of_many_scales((9,), 64, layer_dtype)
                with torch.no_grad():
                    got = model[0](x)
                self.assertLess(relative_error(got, reference(x, q, bias, "none", "int8")),
                                TOLERANCE[str(layer_dtype).split(".")[1]])


@unittest.skipIf(WHY_NO_GPU, WHY_NO_GPU or "")
class QuantizedSparseLinearOnTheGpu(unittest.TestCase):
    """The GPU product of 8-bit layers against x_q @ W_deq^T in torch. Not yet run on a GPU."""

    def layer_or_none(self, make, quantize):
        """make(), or None where the C++ layer refuses int8 (the 8-bit plan without its int8 kernel)."""
        try:
            return make()
        except NotImplementedError as e:
            if TYPES[quantize] != "int8":
                raise
            print(f"\n  int8 not run: {e}")
            return None

    def check(self, quantize, rows, cols, token_shapes, dtype, bias=True, activation="none"):
        type = TYPES[quantize]
        dense = linear(rows, cols, dtype, bias, seed=rows + cols, device="cuda")
        layer = self.layer_or_none(
            lambda: nmt.SparseLinear.from_linear(dense, "2:4", activation=activation, quantize=quantize), quantize)
        if layer is None:
            return
        weight = nmkit.prune(dense.weight.detach().float().cpu().numpy(), "2:4", type)
        for shape in token_shapes:
            tokens = int(np.prod(shape))
            x = tokens_of_many_scales(shape, cols, dtype, device="cuda")
            out = torch.full((tokens, rows), float("nan"), device="cuda", dtype=dtype)  # poisoned
            with torch.no_grad():
                y = layer(x)
                layer(x, out=out)
            torch.cuda.synchronize()
            want = reference(x, weight, dense.bias, activation, type).view(*shape, rows)
            label = (f"{quantize} {rows}x{cols} x{tuple(shape)} {dtype} bias={bias} {activation} "
                     f"({layer.kernel(tokens)})")
            self.assertEqual((tuple(y.shape), y.dtype), ((*shape, rows), dtype), label)
            self.assertIn(f"x quantized per token to {type}", layer.kernel(tokens), label)
            self.assertFalse(torch.isnan(out).any().item(), label)
            self.assertLess(relative_error(y, want), TOLERANCE[str(dtype).split(".")[1]], label)
            torch.testing.assert_close(out.view_as(y), y, rtol=0, atol=0)

    def test_each_type_with_tails_bias_and_activations(self):
        for quantize in ("fp8", "e5m2", "int8"):
            for dtype in (torch.float16, torch.bfloat16):
                self.check(quantize, 1000, 528, [(1,), (7,), (3, 43), (2, 129)], dtype)
                self.check(quantize, 77, 144, [(33,)], dtype, bias=False, activation="relu")
                self.check(quantize, 384, 256, [(5, 33)], dtype, activation="gelu")

    def test_from_a_quantized_weight_and_an_empty_batch(self):
        q = nmkit.prune(random_weight(256, 512, seed=4), "2:4", dtype="fp8")
        layer = nmt.SparseLinear(q, dtype=torch.bfloat16, device="cuda")
        self.assertEqual((layer.format, layer.quantized, layer.dtype), ("2:4 e4m3", "e4m3", torch.bfloat16))
        with torch.no_grad():
            self.assertEqual(tuple(layer(torch.empty(0, 512, device="cuda", dtype=torch.bfloat16)).shape), (0, 256))
            x = torch.randn(512, 40, device="cuda", dtype=torch.bfloat16).t()  # a transposed view
            torch.testing.assert_close(layer(x), layer(x.contiguous()), rtol=0, atol=0)
            self.assertLess(relative_error(layer(x), reference(x, q, None, "none", "e4m3")), TOLERANCE["bfloat16"])
            with self.assertRaisesRegex(TypeError, "the layer computes in torch.bfloat16"):
                layer(x.half())

    def test_captured_in_a_cuda_graph(self):
        # After a warm-up call at the captured T (its plan, and the workspace x is quantized into), a call is two
        # launches on the current stream: capturable.
        for quantize in ("fp8", "int8"):
            dense = linear(384, 512, torch.float16, seed=9, device="cuda")
            layer = self.layer_or_none(
                lambda: nmt.SparseLinear.from_linear(dense, "2:4", activation="relu", quantize=quantize), quantize)
            if layer is None:
                continue
            x = torch.randn(96, 512, device="cuda", dtype=torch.float16)
            y, want = graph_replay_and_eager(layer, x)
            torch.testing.assert_close(y, want, rtol=0, atol=0,
                                       msg=f"{quantize}: a replayed graph gives the eager result")

    def test_load_sparse_and_sparsify(self):
        torch.manual_seed(7)
        model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 128)).to(
            "cuda", torch.bfloat16)
        q = nmkit.prune(model[0].weight.detach().float().cpu().numpy(), "2:4", dtype="fp8")
        x = torch.randn(50, 256, device="cuda", dtype=torch.bfloat16)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "fp8.safetensors")
            nmkit.save_file(path, {"0.weight": q})
            bias = model[0].bias.detach().clone()
            self.assertEqual(nmt.load_sparse(model, path), ["0"])
        self.assertEqual((model[0].quantized, model[0].dtype), ("e4m3", torch.bfloat16))
        with torch.no_grad():
            got = model[0](x)
        self.assertLess(relative_error(got, reference(x, q, bias, "none", "e4m3")), TOLERANCE["bfloat16"])
        self.assertEqual(nmt.sparsify(model, "2:4", quantize="fp8"), ["2"])  # what is left
        self.assertEqual(model[2].format, "2:4 e4m3")
        with torch.no_grad():
            self.assertEqual(tuple(model(x).shape), (50, 128))


if __name__ == "__main__":
    unittest.main()
