"""nmkit.torch: its host side on the CPU, and SparseLinear on the GPU.

On any machine with PyTorch (CPU-only included): every check of a layer's arguments and of a call's tensors with
its message, sparsify and load_sparse on CPU models (files written by `nmkit prune` with NMKIT_CLI), and a call's
own work (reshapes, copies of unaligned or strided x, out=, the fp32 bias) with nmkit's CPU reference product
standing in for the GPU kernel: `nmkit.torch._device_layer`, the one function that needs CUDA, is replaced by a CPU
layer with the same run(). On a GPU: the layers against the same pruned weight through torch (skipped without
PyTorch+CUDA, with the reason). NMKIT_REQUIRE_TORCH=1 (set by CTest where scripts/setup.sh installed PyTorch)
turns a missing PyTorch into a failure instead of a skip.
"""
import contextlib
import copy
import ctypes
import os
import pathlib
import subprocess
import tempfile
import unittest
from unittest import mock

import numpy as np

import nmkit
from helpers import graph_replay_and_eager, torch_missing, write_safetensors

try:
    import torch
    import torch.nn.functional as F

    import nmkit.torch as nmt
    WHY_NO_TORCH = None
except ImportError as e:
    WHY_NO_TORCH = torch_missing(e)

if WHY_NO_TORCH:
    WHY_NO_GPU = WHY_NO_TORCH
elif not hasattr(nmkit._nmkit, "_SparseLinear"):
    WHY_NO_GPU = "nmkit was built without CUDA"
elif not (torch.cuda.is_available() and nmkit.cuda_available()):
    WHY_NO_GPU = "no CUDA device for PyTorch and nmkit"
else:
    WHY_NO_GPU = None

TOLERANCE = {"float16": 2e-3, "bfloat16": 1e-2}  # relative Frobenius error, as the C++ GPU tests
QUANT_MAX = {"e4m3": 448.0, "e5m2": 57344.0, "int8": 127.0}


def relative_error(got, want):
    return ((got.float() - want.float()).norm() / want.float().norm()).item()


def quantize_per_token(x, type):
    """x (tokens, K) quantized per token as nmkit does it (docs/formats.md: scale = absmax / the type's largest
    value in fp32, code = x / scale rounded to nearest even on the type's grid), in torch on x's device: returns the
    dequantized x (code * scale, float32)."""
    x = x.float()
    scale = x.abs().amax(dim=-1, keepdim=True) / QUANT_MAX[type]
    v = x / torch.where(scale > 0, scale, torch.ones_like(scale))
    if type == "int8":
        codes = torch.round(v).clamp(-127, 127)
    else:
        codes = v.to(torch.float8_e4m3fn if type == "e4m3" else torch.float8_e5m2).float()
    return codes * scale


def tensor_at(address, shape, dtype):
    """A tensor over the memory at a raw CPU address (what the C++ layer's run() is given)."""
    count = int(np.prod(shape))
    itemsize = torch.empty(0, dtype=dtype).element_size()
    return torch.frombuffer((ctypes.c_byte * (count * itemsize)).from_address(address), dtype=dtype).view(shape)


class CpuLayer:
    """The C++ GPU layer's stand-in on the CPU: the same run(x, y, tokens, bias, stream) on raw pointers, computed by
    nmkit.spmm (the oracle the GPU kernels are tested against), with the C++ run()'s own refusals; for an 8-bit
    weight, by torch on x quantized per token (quantize_per_token) and the dequantized weight."""

    def __init__(self, weight, activation, has_bias, dtype):
        self.weight, self.activation, self.has_bias = weight, activation, has_bias
        self.rows, self.cols = weight.shape
        self.quantized = weight.dtype if isinstance(weight, nmkit.QuantizedWeight) else None
        self.dtype = dtype if self.quantized else {"f16": torch.float16, "bf16": torch.bfloat16}[weight.dtype]
        self.runs = self.scratch_runs = 0
        self.layouts = []  # (x_features, y_features) of each run
        # gpu::SparseLinear::reads_feature_major_in_place: the row gather (taken here for every V:N:M weight).
        self.reads_feature_major_in_place = weight.format.startswith("vnm:")

    def workspace_bytes(self, tokens, x_features=False, ldx=0):
        # What the C++ layer asks for: x's codes and scales (8-bit); for the row gather, x^T with its rows padded to a
        # multiple of 8 tokens (token-major x, or feature-major x whose rows are not 16-byte pieces); for the others,
        # feature-major x transposed to x.
        if self.quantized:
            return tokens * self.cols + 4 * tokens
        padded = 2 * -(-tokens // 8) * 8 * self.cols
        if not x_features:
            return padded if self.reads_feature_major_in_place else 0
        if not self.reads_feature_major_in_place:
            return 2 * tokens * self.cols
        return padded if (ldx or tokens) % 8 else 0

    def run_on(self, x, y, tokens, bias, stream, workspace, workspace_bytes, x_features=False, ldx=0,
               y_features=False):
        needed = self.workspace_bytes(tokens, x_features, ldx)
        if workspace_bytes < needed or (needed and (not workspace or workspace % 16)):
            raise ValueError(f"a workspace of {workspace_bytes} bytes at {workspace:#x} for {tokens} tokens")
        if x_features and self.quantized:
            raise ValueError("an 8-bit weight quantizes token-major x only")
        if x_features and ldx and ldx < tokens:
            raise ValueError(f"feature-major x needs ldx >= tokens ({tokens}), got {ldx}")
        self.scratch_runs += needed > 0
        self.run(x, y, tokens, bias, stream, x_features, ldx or tokens, y_features)

    def run(self, x, y, tokens, bias, stream, x_features=False, ldx=0, y_features=False):
        if tokens < 0:
            raise ValueError(f"tokens must be >= 0, got {tokens}")
        if tokens == 0:
            return
        if not x or not y:
            raise ValueError("x and y must not be null")
        if self.has_bias != bool(bias):
            raise ValueError("a bias given to a layer without one, or none to a layer with one")
        if x % 16 or y % 16:  # what nmkit.torch promises the Hopper kernels
            raise ValueError(f"x at {x:#x} or y at {y:#x} is not 16-byte aligned")
        self.runs += 1
        self.layouts.append((x_features, y_features))
        if x_features:  # x^T [K, T] with rows ldx apart
            xs = tensor_at(x, (self.cols, ldx), self.dtype)[:, :tokens].t()
        else:
            xs = tensor_at(x, (tokens, self.cols), self.dtype)
        ys = tensor_at(y, (self.rows, tokens), self.dtype).t() if y_features else tensor_at(y, (tokens, self.rows),
                                                                                          self.dtype)
        if self.quantized:
            b = tensor_at(bias, (self.rows,), torch.float32) if bias else None
            d = F.linear(quantize_per_token(xs, self.quantized), torch.from_numpy(self.weight.to_dense()), b)
            d = {"none": d, "relu": F.relu(d), "gelu": F.gelu(d)}[self.activation]
            ys.copy_(d)
            return
        b = tensor_at(bias, (self.rows,), torch.float32).numpy() if bias else None
        d = nmkit.spmm(self.weight, np.ascontiguousarray(xs.float().numpy().T), bias=b, activation=self.activation)
        ys.copy_(torch.from_numpy(d.T))


@contextlib.contextmanager
def layers_on_the_cpu():
    """nmkit.torch with its GPU layers made on the CPU (CpuLayer); yields the list of those made."""
    made = []

    def device_layer(weight, activation, has_bias, device, dtype):
        assert device.type == "cuda", device  # what SparseLinear would have asked the GPU for
        made.append(CpuLayer(weight, activation, has_bias, dtype))
        return torch.device("cpu"), made[-1]

    with mock.patch.object(nmt, "_device_layer", device_layer), mock.patch.object(nmt, "_current_stream", lambda i: 0):
        yield made


@contextlib.contextmanager
def no_device_reached(test):
    """Fails `test` if a layer gets as far as the device: what is wrong must be found before."""
    def device_layer(*args):
        test.fail("the layer reached the device before its arguments were refused")
    with mock.patch.object(nmt, "_device_layer", device_layer):
        yield


def pruned_reference(model, weights):
    """A float32 copy of `model` whose Linears named in `weights` hold those SparseWeights, dense."""
    reference = copy.deepcopy(model).float()
    with torch.no_grad():
        for name, weight in weights.items():
            reference.get_submodule(name).weight.copy_(torch.from_numpy(weight.to_dense()))
    return reference


def linear(rows, cols, dtype=None, bias=True, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Linear(cols, rows, bias=bias, dtype=dtype or torch.float16)


@unittest.skipIf(WHY_NO_TORCH, WHY_NO_TORCH or "")
class LayerArgumentsOnTheCpu(unittest.TestCase):
    """Every refusal of SparseLinear(...) and from_linear(...), each before the device is needed."""

    def test_the_constructor_refuses_with_a_reason(self):
        w = nmkit.prune(np.random.default_rng(0).standard_normal((64, 128), dtype=np.float32), "2:4", dtype="f16")
        with no_device_reached(self):
            for args, kwargs, error, message in [
                ((w.to_dense(),), {}, TypeError, "weight must be an nmkit.SparseWeight .*got ndarray"),
                ((w.astype("f32"),), {}, TypeError, "f16 or bf16 weight, got f32"),
                ((w,), dict(dtype=torch.bfloat16), TypeError,
                 "in its f16 weight's dtype torch.float16, got dtype=torch.bfloat16"),
                ((w,), dict(activation="tanh"), ValueError, "unknown activation 'tanh' \\(expected none, relu or gelu\\)"),
                ((w,), dict(activation=None), TypeError, "activation must be a string"),
                ((w,), dict(device="cpu"), ValueError, "runs on a CUDA device, got cpu"),
                ((w,), dict(device="meta"), ValueError, "runs on a CUDA device, got meta"),
                ((w, [0.0] * 64), {}, TypeError, "bias must be a torch.Tensor or None, got list"),
                ((w, torch.zeros(64, dtype=torch.int32)), {}, TypeError, "floating-point values, got torch.int32"),
                ((w, torch.zeros(63)), {}, ValueError, "bias must have shape \\(64,\\), got \\(63,\\)"),
                ((w, torch.zeros(1, 64)), {}, ValueError, "bias must have shape \\(64,\\), got \\(1, 64\\)"),
            ]:
                with self.subTest(message), self.assertRaisesRegex(error, message):
                    nmt.SparseLinear(*args, **kwargs)

    def test_from_linear_refuses_before_pruning(self):
        dense = linear(128, 64)
        with no_device_reached(self), mock.patch.object(nmt, "prune", side_effect=AssertionError("pruned")):
            with self.assertRaisesRegex(TypeError, "takes a torch.nn.Linear, got Conv1d"):
                nmt.SparseLinear.from_linear(torch.nn.Conv1d(4, 4, 1))
            with self.assertRaisesRegex(TypeError, "float16 or bfloat16, got torch.float32 \\(pass dtype"):
                nmt.SparseLinear.from_linear(linear(128, 64, torch.float32), "2:4")  # fp32 module, no dtype given
            with self.assertRaisesRegex(TypeError, "got torch.float64"):
                nmt.SparseLinear.from_linear(dense, "2:4", dtype=torch.float64)
            with self.assertRaisesRegex(ValueError, "unknown activation 'swish'"):
                nmt.SparseLinear.from_linear(dense, "2:4", activation="swish")
        with no_device_reached(self):  # pruning itself refuses a format it cannot make
            with self.assertRaisesRegex(ValueError, "N < M, got 3:2"):
                nmt.SparseLinear.from_linear(dense, "3:2")
            with self.assertRaisesRegex(ValueError, "tile"):
                nmt.SparseLinear.from_linear(dense, "tile:64x64:1.5")

    @unittest.skipUnless(WHY_NO_GPU, "a CUDA device is present")
    def test_without_a_gpu_a_layer_that_would_work_says_why_it_cannot(self):
        with self.assertRaisesRegex(RuntimeError, "SparseLinear needs .*CUDA"):
            nmt.SparseLinear.from_linear(linear(128, 64), "2:4")
        model = torch.nn.Sequential(linear(128, 64), torch.nn.ReLU())
        with self.assertRaisesRegex(RuntimeError, "CUDA"):
            nmt.sparsify(model)
        self.assertIsInstance(model[0], torch.nn.Linear)


@unittest.skipIf(WHY_NO_TORCH, WHY_NO_TORCH or "")
class CallsOnTheCpu(unittest.TestCase):
    """A call's checks and its own work, with the CPU stand-in for the kernel (layers_on_the_cpu)."""

    def check(self, spec, rows, cols, token_shapes, dtype, bias=True, activation="none"):
        dense = linear(rows, cols, dtype, bias, seed=rows + cols)
        with layers_on_the_cpu() as made:
            layer = nmt.SparseLinear.from_linear(dense, spec, activation=activation)
            self.assertEqual((layer.device, layer.dtype, layer.format, layer.in_features, layer.out_features),
                             (torch.device("cpu"), dtype, spec.rsplit(":", 1)[0] if spec.startswith("tile") else spec,
                              cols, rows))
            weight = made[0].weight  # the reference: the same pruned weight through torch, in fp32
            w = torch.from_numpy(weight.to_dense())
            for shape in token_shapes:
                tokens = int(np.prod(shape))
                x = torch.randn(*shape, cols, dtype=dtype)
                out = torch.full((tokens, rows), float("nan"), dtype=dtype)  # poisoned
                with torch.no_grad():
                    y = layer(x)
                    layer(x, out=out)
                want = F.linear(x.float(), w, None if dense.bias is None else dense.bias.float())
                want = {"none": want, "relu": F.relu(want), "gelu": F.gelu(want)}[activation]
                label = f"{spec} {rows}x{cols} x{tuple(shape)} {dtype} bias={bias} {activation}"
                self.assertEqual((tuple(y.shape), y.dtype), ((*shape, rows), dtype), label)
                if tokens:
                    self.assertFalse(torch.isnan(out).any().item(), label)
                    self.assertLess(relative_error(y, want), TOLERANCE[str(dtype).split(".")[1]], label)
                torch.testing.assert_close(out.view_as(y), y, rtol=0, atol=0)

    def test_a_call_gives_the_pruned_weights_product(self):
        for dtype in (torch.float16, torch.bfloat16):
            self.check("2:4", 100, 52, [(1,), (7,), (3, 5), (0,)], dtype)
            self.check("vnm:64:2:10", 96, 60, [(9,)], dtype, bias=False, activation="relu")
            self.check("tile:16x16:0.5", 40, 48, [(2, 3)], dtype, activation="gelu")

    def test_layers_that_need_scratch_take_it_from_torch_per_call(self):
        with layers_on_the_cpu() as made:
            layers = [nmt.SparseLinear.from_linear(linear(128, 64), spec, quantize=quantize)
                      for spec, quantize in (("vnm:64:2:8", None), ("2:4", None), ("2:4", "fp8"))]
            with torch.no_grad():
                for layer in layers:
                    for tokens in (70, 3):
                        layer(torch.randn(tokens, 64, dtype=torch.float16))
        # V:N:M transposes x and an 8-bit layer quantizes it at every call, 2:4 needs nothing.
        self.assertEqual([(m.runs, m.scratch_runs) for m in made], [(2, 2), (2, 0), (2, 2)])

    def test_strided_and_unaligned_inputs_are_copied_not_misread(self):
        with layers_on_the_cpu():
            layer = nmt.SparseLinear.from_linear(linear(256, 128), "2:4")
            with torch.no_grad():
                x = torch.randn(128, 40, dtype=torch.float16).t()  # a transposed view
                torch.testing.assert_close(layer(x), layer(x.contiguous()), rtol=0, atol=0)
                offset = torch.randn(40 * 128 + 1, dtype=torch.float16)[1:].view(40, 128)  # 2-byte aligned
                torch.testing.assert_close(layer(offset), layer(offset.clone()), rtol=0, atol=0)
                batch = torch.randn(2, 128, 3, dtype=torch.float16).transpose(1, 2)  # [2, 3, 128], strided
                torch.testing.assert_close(layer(batch), layer(batch.contiguous()), rtol=0, atol=0)

    def test_feature_major_outputs_feed_the_next_layer_in_place(self):
        # gate/up write y^T, the elementwise glue keeps that layout, and a V:N:M down reads it as it is (the others
        # copy it to x): the chain's result equals the token-major chain's.
        for down_spec in ("vnm:64:2:8", "2:4", "tile:16x16:0.5"):
            with self.subTest(down_spec), layers_on_the_cpu() as made:
                gate = nmt.SparseLinear.from_linear(linear(96, 64, seed=1), "2:4")
                up = nmt.SparseLinear.from_linear(linear(96, 64, seed=2), "vnm:64:2:8")
                down = nmt.SparseLinear.from_linear(linear(64, 96, seed=3), down_spec)
                x = torch.randn(2, 12, 64, dtype=torch.float16)
                with torch.no_grad():
                    want = down(F.silu(gate(x)) * up(x))
                    gate.feature_major_output = up.feature_major_output = True
                    h = F.silu(gate(x)) * up(x)
                    self.assertEqual((tuple(h.shape), h.stride()), ((2, 12, 96), (12, 1, 24)))
                    got = down(h)
                torch.testing.assert_close(got, want, rtol=0, atol=0)
                self.assertTrue(got.is_contiguous())
                reads = down_spec.startswith("vnm:")
                self.assertEqual([m.layouts[-1] for m in made], [(False, True), (False, True), (reads, False)])
                # 12 tokens are not whole 16-byte rows of y^T: the layers stay token-major.
                x12 = torch.randn(12, 64, dtype=torch.float16)
                with torch.no_grad():
                    got12 = down(F.silu(gate(x12)) * up(x12))
                    gate.feature_major_output = up.feature_major_output = False
                    want12 = down(F.silu(gate(x12)) * up(x12))
                torch.testing.assert_close(got12, want12, rtol=0, atol=0)
                self.assertEqual(made[0].layouts[-2], (False, False))

    def test_the_bias_is_added_in_fp32_after_module_half(self):
        with layers_on_the_cpu():
            layer = nmt.SparseLinear.from_linear(linear(64, 32), "2:4")
            x = torch.randn(5, 32, dtype=torch.float16)
            with torch.no_grad():
                want = layer(x)
                layer.half()  # casts the bias buffer to f16; the call takes it back to fp32
                self.assertEqual(layer.bias.dtype, torch.float16)
                got = layer(x)
            self.assertEqual(layer.bias.dtype, torch.float32)
            torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)

    def test_bad_calls_are_refused_with_a_reason(self):
        with layers_on_the_cpu() as made:
            layer = nmt.SparseLinear.from_linear(linear(128, 64), "2:4")
            x = torch.randn(4, 64, dtype=torch.float16)
            with torch.no_grad():
                for args, kwargs, error, message in [
                    (("x",), {}, TypeError, "x must be a torch.Tensor, got str"),
                    ((x.bfloat16(),), {}, TypeError, "x is torch.bfloat16, the layer computes in torch.float16"),
                    ((x[:, :63],), {}, ValueError, "64 features in its last dimension, got shape \\(4, 63\\)"),
                    ((torch.tensor(1.0, dtype=torch.float16),), {}, ValueError, "64 features .*got shape \\(\\)"),
                    ((x,), dict(out="y"), TypeError, "out must be a torch.Tensor, got str"),
                    ((x,), dict(out=torch.empty(4, 128)), TypeError, "out must be torch.float16 on cpu, got torch.float32"),
                    ((x,), dict(out=torch.empty(4, 128, dtype=torch.float16, device="meta")), TypeError,
                     "out must be torch.float16 on cpu, got torch.float16 on meta"),
                    ((x,), dict(out=torch.empty(3, 128, dtype=torch.float16)), ValueError, "hold 4 x 128 values"),
                    ((x,), dict(out=torch.empty(4, 129, dtype=torch.float16)), ValueError, "hold 4 x 128 values"),
                    ((x,), dict(out=torch.empty(128, 4, dtype=torch.float16).t()), ValueError, "contiguous"),
                    ((x,), dict(out=torch.empty(4 * 128 + 1, dtype=torch.float16)[1:].view(4, 128)), ValueError,
                     "16-byte aligned"),
                ]:
                    with self.subTest(message), self.assertRaisesRegex(error, message):
                        layer(*args, **kwargs)
                # Here x's device is checked as a call checks it when its cheap test fails: the stand-in's CPU and
                # meta tensors share get_device() -1, so that test passes a meta x (a CUDA layer's index differs;
                # SparseLinearOnTheGpu calls one with a CPU x).
                with self.assertRaisesRegex(ValueError, "x is on meta, the layer on cpu"):
                    nmt._check_input(x.to("meta"), layer.device, layer.dtype, layer.in_features)
            with self.assertRaisesRegex(RuntimeError, "inference-only .*torch.no_grad"):
                layer(torch.randn(4, 64, dtype=torch.float16, requires_grad=True))
            self.assertEqual(made[0].runs, 0)  # none of them reached the kernel


def block(dtype=None):
    """A model with nested names: encoder.0 and encoder.2 (no bias), and heads.score in a ModuleDict."""
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(7)
            self.encoder = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(),
                                               torch.nn.Linear(512, 200, bias=False), torch.nn.ReLU())
            self.heads = torch.nn.ModuleDict({"score": torch.nn.Linear(200, 64)})

        def forward(self, x):
            return self.heads["score"](self.encoder(x))

    return Block().to(dtype or torch.float16)


@unittest.skipIf(WHY_NO_TORCH, WHY_NO_TORCH or "")
class ModelsOnTheCpu(unittest.TestCase):
    """sparsify and load_sparse on CPU models, the layers made with the CPU stand-in (layers_on_the_cpu)."""

    def test_sparsify_replaces_the_chosen_linears(self):
        model, x = block(), torch.randn(3, 37, 256, dtype=torch.float16)
        weights = {name: nmkit.prune(model.get_submodule(name).weight.detach().float().numpy(), "vnm:64:2:8", dtype="f16")
                   for name in ("encoder.0", "encoder.2")}
        reference = pruned_reference(model, weights)
        bias = model.encoder[0].bias.detach().clone()
        with layers_on_the_cpu():
            self.assertEqual(nmt.sparsify(model, "vnm:64:2:8", include="^encoder\\.", exclude="heads"),
                             ["encoder.0", "encoder.2"])
            self.assertIsInstance(model.encoder[0], nmt.SparseLinear)
            self.assertIsInstance(model.encoder[2], nmt.SparseLinear)
            self.assertIsInstance(model.heads["score"], torch.nn.Linear)
            self.assertIsNone(model.encoder[2].bias)
            torch.testing.assert_close(model.encoder[0].bias, bias.float(), rtol=0, atol=0)
            with torch.no_grad():
                got, want = model(x), reference(x.float())
            self.assertLess(relative_error(got, want), 5 * TOLERANCE["float16"])  # three layers, f16 between them
            self.assertEqual(nmt.sparsify(model, include="^nothing$"), [])
            self.assertEqual(nmt.sparsify(model, "2:4", dtype=torch.bfloat16), ["heads.score"])  # what is left
            self.assertEqual(model.heads["score"].dtype, torch.bfloat16)

    def test_sparsify_refuses_before_it_replaces_anything(self):
        with layers_on_the_cpu():
            model = block()
            model.heads["score"].float()  # the last Linear is fp32: the first two would work
            with self.assertRaisesRegex(TypeError, "got torch.float32") as caught:
                nmt.sparsify(model, "2:4")
            if hasattr(caught.exception, "__notes__"):
                self.assertIn("'heads.score'", caught.exception.__notes__[0])
            for args, kwargs, error, message in [
                ((model, "3:2"), {}, ValueError, "N < M, got 3:2"),
                ((model,), dict(include="(encoder"), ValueError, "include must be a regular expression, got '\\(encoder'"),
                ((model,), dict(exclude="[head"), ValueError, "exclude must be a regular expression"),
                ((model.state_dict(),), {}, TypeError, "model must be a torch.nn.Module, got OrderedDict"),
            ]:
                with self.subTest(message), self.assertRaisesRegex(error, message):
                    nmt.sparsify(*args, **kwargs)
            self.assertEqual([type(m) for m in (model.encoder[0], model.encoder[2], model.heads["score"])],
                             [torch.nn.Linear] * 3)

    @unittest.skipUnless(os.environ.get("NMKIT_CLI"), "NMKIT_CLI (the nmkit tool) is not set")
    def test_load_sparse_takes_the_weights_the_cli_pruned(self):
        model = block(torch.bfloat16)
        with tempfile.TemporaryDirectory() as tmp:
            dense_path, sparse_path = os.path.join(tmp, "dense.safetensors"), os.path.join(tmp, "sparse.safetensors")
            write_safetensors(dense_path, {k: v.float().numpy() for k, v in model.state_dict().items()})
            subprocess.run([os.environ["NMKIT_CLI"], "prune", dense_path, "-o", sparse_path, "--format", "2:4",
                            "--include", "^encoder\\."], check=True, capture_output=True)
            weights = nmkit.load_file(sparse_path)
            self.assertEqual(sorted(weights), ["encoder.0.weight", "encoder.2.weight"])
            reference = pruned_reference(model, {k[:-len(".weight")]: w for k, w in weights.items()})
            x = torch.randn(50, 256, dtype=torch.bfloat16)
            with layers_on_the_cpu():
                # Refused, each before any layer is replaced: another model's shapes, a weight without its Linear.
                other = torch.nn.Module()
                other.encoder = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.GELU(), torch.nn.Linear(512, 200))
                with self.assertRaisesRegex(ValueError, "'encoder.0.weight' is 512x256, the model's Linear 'encoder.0' 512x64"):
                    nmt.load_sparse(other, sparse_path)
                partial = torch.nn.Module()
                partial.encoder = torch.nn.Sequential(torch.nn.Linear(256, 512))
                with self.assertRaisesRegex(KeyError, "'encoder.2.weight' has no nn.Linear 'encoder.2'"):
                    nmt.load_sparse(partial, sparse_path)
                self.assertIsInstance(partial.encoder[0], torch.nn.Linear)
                with self.assertRaisesRegex(IsADirectoryError, "is a directory"):
                    nmt.load_sparse(model, tmp)
                self.assertEqual(nmt.load_sparse(partial.to(torch.float16), sparse_path, strict=False), ["encoder.0"])
                self.assertEqual(partial.encoder[0].dtype, torch.float16)  # the f32 file rounded to the Linear's
                # The model itself, its path as a pathlib.Path.
                self.assertEqual(nmt.load_sparse(model, pathlib.Path(sparse_path)), ["encoder.0", "encoder.2"])
            self.assertEqual([model.encoder[0].dtype, model.encoder[2].dtype], [torch.bfloat16] * 2)
            self.assertIsInstance(model.heads["score"], torch.nn.Linear)
            with layers_on_the_cpu(), torch.no_grad():
                got, want = model(x), reference(x.float())
            self.assertLess(relative_error(got, want), 5 * TOLERANCE["bfloat16"])


@unittest.skipIf(WHY_NO_GPU, WHY_NO_GPU or "")
class SparseLinearOnTheGpu(unittest.TestCase):
    """The GPU product itself: the layers, sparsify and load_sparse on CUDA models against torch."""

    def reference(self, layer, weight, x, bias, activation):
        """The same pruned weight through torch, in fp32."""
        w = torch.from_numpy(weight.to_dense()).to(x.device)
        y = F.linear(x.float(), w, None if bias is None else bias.float())
        return {"none": y, "relu": F.relu(y), "gelu": F.gelu(y)}[activation]

    def check(self, spec, rows, cols, token_shapes, dtype, bias=True, activation="none"):
        torch.manual_seed(rows + cols)
        dense = torch.nn.Linear(cols, rows, bias=bias, device="cuda", dtype=dtype)
        layer = nmt.SparseLinear.from_linear(dense, spec, activation=activation)
        weight = nmkit.prune(dense.weight.detach().float().cpu().numpy(), spec, {torch.float16: "f16", torch.bfloat16: "bf16"}[dtype])
        for shape in token_shapes:
            x = torch.randn(*shape, cols, device="cuda", dtype=dtype)
            out = torch.full((int(np.prod(shape)), rows), float("nan"), device="cuda", dtype=dtype)  # poisoned
            with torch.no_grad():
                y = layer(x)
                layer(x, out=out)
            torch.cuda.synchronize()
            want = self.reference(layer, weight, x, dense.bias, activation)
            label = f"{spec} {rows}x{cols} x{tuple(shape)} {dtype} bias={bias} {activation} ({layer.kernel(int(np.prod(shape)))})"
            self.assertEqual(tuple(y.shape), (*shape, rows), label)
            self.assertEqual(y.dtype, dtype, label)
            self.assertFalse(torch.isnan(out).any().item(), label)
            self.assertLess(relative_error(y, want), TOLERANCE[str(dtype).split(".")[1]], label)
            torch.testing.assert_close(out.view_as(y), y, rtol=0, atol=0)

    def test_2_4_with_tails_bias_and_activations(self):
        for dtype in (torch.float16, torch.bfloat16):
            self.check("2:4", 1000, 520, [(1,), (7,), (3, 43), (2, 129)], dtype)
            self.check("2:4", 256, 1024, [(64,)], dtype, bias=False, activation="relu")
            self.check("2:4", 384, 256, [(5, 33)], dtype, activation="gelu")

    def test_vnm_both_forms(self):
        for dtype in (torch.float16, torch.bfloat16):
            self.check("vnm:128:2:8", 512, 1024, [(17,), (256,)], dtype)   # full 2:4 form for x[T, K]
            self.check("vnm:64:2:10", 300, 520, [(9,), (40,)], dtype)      # condensed (M % 4 != 0)

    def test_tiles_at_few_and_many_tokens(self):
        for dtype in (torch.float16, torch.bfloat16):
            self.check("tile:64x64:0.25", 1024, 1024, [(32,), (300,)], dtype)
            self.check("tile:32x32:0.5", 200, 96, [(3,), (70,)], dtype, activation="relu")

    def test_feature_major_chains(self):
        # gate and up write y^T at 24 and 32 tokens (whole 16-byte rows; y at 13); the glue keeps it; a V:N:M down
        # reads it as it is (gathering or full 2:4), 2:4 and tiles copy it to x. Against torch on the same pruned
        # weights, with every layout and kernel named on failure.
        to_name = {torch.float16: "f16", torch.bfloat16: "bf16"}
        for dtype in (torch.float16, torch.bfloat16):
            for down_spec in ("vnm:128:2:8", "vnm:64:2:10", "vnm:64:2:8", "2:4", "tile:32x32:0.5"):
                torch.manual_seed(5)
                linears = [torch.nn.Linear(a, b, device="cuda", dtype=dtype) for a, b in ((520, 384), (520, 384), (384, 520))]
                specs = ("2:4", "vnm:128:2:8", down_spec)
                layers = [nmt.SparseLinear.from_linear(lin, spec) for lin, spec in zip(linears, specs)]
                weights = [torch.from_numpy(nmkit.prune(lin.weight.detach().float().cpu().numpy(), spec,
                                                        to_name[dtype]).to_dense()).cuda()
                           for lin, spec in zip(linears, specs)]
                layers[0].feature_major_output = layers[1].feature_major_output = True
                for shape in ((24,), (13,), (2, 16)):
                    x = torch.randn(*shape, 520, device="cuda", dtype=dtype)
                    with torch.no_grad():
                        h = F.silu(layers[0](x)) * layers[1](x)
                        y = layers[2](h)
                    tokens = int(np.prod(shape))
                    label = f"{dtype} {down_spec} x{shape}: {layers[2].kernel(tokens, feature_major_x=True)}"
                    self.assertEqual(h.stride()[-1], tokens if tokens % 8 == 0 else 1, label)  # y^T's view, or y
                    hf = F.silu(F.linear(x.float(), weights[0], linears[0].bias.float())) * F.linear(
                        x.float(), weights[1], linears[1].bias.float())
                    want = F.linear(h.float(), weights[2], linears[2].bias.float())
                    self.assertLess(relative_error(h, hf), 2 * TOLERANCE[str(dtype).split(".")[1]], label)
                    self.assertLess(relative_error(y, want), TOLERANCE[str(dtype).split(".")[1]], label)
                    self.assertTrue(y.is_contiguous(), label)
                    # The row gather (condensed V:N:M) reads x^T in place; the other kernels take x.
                    gathers = layers[2]._layer.reads_feature_major_in_place
                    self.assertEqual(gathers, down_spec in ("vnm:128:2:8", "vnm:64:2:10"), label)
                    self.assertEqual("x feature-major" in layers[2].kernel(tokens, feature_major_x=True),
                                     gathers and tokens % 8 == 0, label)

    def test_empty_batch_and_non_contiguous_input(self):
        dense = torch.nn.Linear(128, 256, device="cuda", dtype=torch.float16)
        layer = nmt.SparseLinear.from_linear(dense, "2:4")
        with torch.no_grad():
            self.assertEqual(tuple(layer(torch.empty(0, 128, device="cuda", dtype=torch.float16)).shape), (0, 256))
            x = torch.randn(128, 40, device="cuda", dtype=torch.float16).t()  # a transposed view
            torch.testing.assert_close(layer(x), layer(x.contiguous()), rtol=0, atol=0)
            offset = torch.randn(40 * 128 + 1, device="cuda", dtype=torch.float16)[1:].view(40, 128)  # 2-byte aligned
            torch.testing.assert_close(layer(offset), layer(offset.clone()), rtol=0, atol=0)

    def test_captured_in_a_cuda_graph(self):
        # After a warm-up call (which makes the plan), a call is one launch on the current stream: capturable.
        for spec in ("2:4", "vnm:128:2:8", "tile:64x64:0.5"):
            dense = torch.nn.Linear(512, 384, device="cuda", dtype=torch.float16)
            layer = nmt.SparseLinear.from_linear(dense, spec, activation="relu")
            x = torch.randn(96, 512, device="cuda", dtype=torch.float16)
            y, want = graph_replay_and_eager(layer, x)
            torch.testing.assert_close(y, want, rtol=0, atol=0, msg=f"{spec}: a replayed graph gives the eager result")

    def model(self, dtype=None):
        torch.manual_seed(7)
        dtype = dtype or torch.float16
        return torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 200, bias=False),
                                   torch.nn.ReLU(), torch.nn.Linear(200, 64)).to("cuda", dtype)

    def test_sparsify_replaces_the_chosen_linears(self):
        model, x = self.model(), torch.randn(3, 37, 256, device="cuda", dtype=torch.float16)
        reference = self.model()
        with torch.no_grad():  # the reference: the same weights pruned in place, run densely by torch
            for name in ("0", "2"):
                linear = reference.get_submodule(name)
                pruned = nmkit.prune(linear.weight.float().cpu().numpy(), "vnm:64:2:8", dtype="f16")
                linear.weight.copy_(torch.from_numpy(pruned.to_dense()))
        self.assertEqual(nmt.sparsify(model, "vnm:64:2:8", exclude="^4$"), ["0", "2"])
        self.assertIsInstance(model[0], nmt.SparseLinear)
        self.assertIsInstance(model[4], torch.nn.Linear)
        with torch.no_grad():
            got, want = model(x), reference(x)
        self.assertLess(relative_error(got, want), 5 * TOLERANCE["float16"])  # three layers, f16 between them

    @unittest.skipUnless(os.environ.get("NMKIT_CLI"), "NMKIT_CLI (the nmkit tool) is not set")
    def test_load_sparse_takes_the_weights_the_cli_pruned(self):
        model = self.model(torch.bfloat16)
        with tempfile.TemporaryDirectory() as tmp:
            dense_path, sparse_path = os.path.join(tmp, "dense.safetensors"), os.path.join(tmp, "sparse.safetensors")
            write_safetensors(dense_path, {k: v.float().cpu().numpy() for k, v in model.state_dict().items()})
            subprocess.run([os.environ["NMKIT_CLI"], "prune", dense_path, "-o", sparse_path, "--format", "2:4",
                            "--include", "^(0|2)\\."], check=True, capture_output=True)
            x = torch.randn(50, 256, device="cuda", dtype=torch.bfloat16)
            weights = nmkit.load_file(sparse_path)
            with torch.no_grad():
                for name in ("0", "2"):  # the reference: the file's pruned weights, run densely by torch
                    model.get_submodule(name).weight.copy_(torch.from_numpy(weights[name + ".weight"].to_dense()))
                want = model(x)
            self.assertEqual(nmt.load_sparse(model, sparse_path), ["0", "2"])
            with torch.no_grad():
                got = model(x)
            self.assertIsInstance(model[2], nmt.SparseLinear)
            self.assertLess(relative_error(got, want), 5 * TOLERANCE["bfloat16"])
            with self.assertRaisesRegex(ValueError, "512x256, the model's Linear '0' 512x64"):  # another model
                nmt.load_sparse(torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.GELU(),
                                                    torch.nn.Linear(200, 64)), sparse_path)
            with self.assertRaisesRegex(KeyError, "no nn.Linear"):
                nmt.load_sparse(torch.nn.Sequential(torch.nn.Linear(256, 512)), sparse_path)

    def test_bad_inputs_are_refused_with_a_reason(self):
        dense = torch.nn.Linear(64, 128, device="cuda", dtype=torch.float16)
        layer = nmt.SparseLinear.from_linear(dense, "2:4")
        with torch.no_grad():
            with self.assertRaisesRegex(TypeError, "float16"):
                layer(torch.randn(4, 64, device="cuda", dtype=torch.bfloat16))
            with self.assertRaisesRegex(ValueError, "64 features"):
                layer(torch.randn(4, 63, device="cuda", dtype=torch.float16))
            with self.assertRaisesRegex(ValueError, "cuda"):
                layer(torch.randn(4, 64, dtype=torch.float16))
            with self.assertRaisesRegex(ValueError, "hold"):
                layer(torch.randn(4, 64, device="cuda", dtype=torch.float16),
                      out=torch.empty(3, 128, device="cuda", dtype=torch.float16))
        with self.assertRaisesRegex(RuntimeError, "inference-only"):
            layer(torch.randn(4, 64, device="cuda", dtype=torch.float16, requires_grad=True))
        layer.bias = layer.bias.cpu()
        with self.assertRaisesRegex(RuntimeError, "its bias was moved to cpu"), torch.no_grad():
            layer(torch.randn(4, 64, device="cuda", dtype=torch.float16))
        with self.assertRaisesRegex(NotImplementedError, "2:4"):
            nmt.SparseLinear.from_linear(dense, "2:8")  # N:M other than 2:4 has no GPU kernel
        with self.assertRaisesRegex(TypeError, "float16"):
            nmt.SparseLinear.from_linear(torch.nn.Linear(64, 128), "2:4")  # fp32 module, no dtype given


if __name__ == "__main__":
    unittest.main()
