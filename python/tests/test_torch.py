"""nmkit.torch.SparseLinear on the GPU against the same pruned weight through torch (skipped without PyTorch+CUDA)."""
import os
import subprocess
import tempfile
import unittest

import numpy as np

import nmkit
from helpers import write_safetensors

try:
    import torch
    import torch.nn.functional as F

    import nmkit.torch as nmt
    WHY_SKIP = None if torch.cuda.is_available() and nmkit.cuda_available() else "no CUDA device for PyTorch and nmkit"
    if WHY_SKIP is None and not hasattr(nmkit._nmkit, "_SparseLinear"):
        WHY_SKIP = "nmkit was built without CUDA"
except ImportError as e:
    WHY_SKIP = f"PyTorch is not installed ({e})"

TOLERANCE = {"float16": 2e-3, "bfloat16": 1e-2}  # relative Frobenius error, as the C++ GPU tests


def relative_error(got, want):
    return ((got.float() - want.float()).norm() / want.float().norm()).item()


@unittest.skipIf(WHY_SKIP, WHY_SKIP or "")
class SparseLinearOnTheGpu(unittest.TestCase):
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
            with torch.no_grad():
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    layer(x)  # the plan for 96 tokens, outside the capture
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    y = layer(x)
                x.copy_(torch.randn_like(x))
                y.fill_(float("nan"))
                graph.replay()
                torch.cuda.synchronize()
                want = layer(x)
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
                pruned = nmkit.prune(linear.weight.float().cpu().numpy(), "vnm:64:2:8")
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
        with self.assertRaisesRegex(NotImplementedError, "2:4"):
            nmt.SparseLinear.from_linear(dense, "2:8")  # N:M other than 2:4 has no GPU kernel
        with self.assertRaisesRegex(TypeError, "float16"):
            nmt.SparseLinear.from_linear(torch.nn.Linear(64, 128), "2:4")  # fp32 module, no dtype given


if __name__ == "__main__":
    unittest.main()
