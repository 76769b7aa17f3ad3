"""nmkit.torch.prune_model on the CPU: block discovery, the hooks' statistics, sequential pruning, the patterns, the
methods' ordering, the file it writes and its refusals, on tiny models built here (no transformers needed).

The models: an embedding whose rows share a few directions and whose features differ in scale (correlated inputs,
as a real model's are), then blocks of Linear layers 64 -> 64 and 64 -> 128 -> 64 with a LayerNorm and a mask
passed by keyword (as an attention mask is), in a ModuleList named `layers`, `encoder.layer` or `transformer.h`.
"""
import copy
import os
import pathlib
import re
import subprocess
import tempfile
import unittest
from unittest import mock

import numpy as np

import nmkit
from helpers import read_safetensors, torch_missing

try:
    import torch

    import nmkit.torch as nmt
    import nmkit.prune_model as pm
    WHY_NO_TORCH = None
except ImportError as e:
    WHY_NO_TORCH = torch_missing(e)

if not WHY_NO_TORCH:
    from test_torch import layers_on_the_cpu

    class Block(torch.nn.Module):
        def __init__(self, d=64, f=128):
            super().__init__()
            self.q = torch.nn.Linear(d, d)
            self.norm = torch.nn.LayerNorm(d)
            self.up = torch.nn.Linear(d, f)
            self.down = torch.nn.Linear(f, d)

        def forward(self, hidden_states, mask=None, scale=1.0):
            x = hidden_states
            a = self.q(x)
            if mask is not None:
                a = a * mask[..., None]
            h = self.norm(x + scale * a)
            return (h + self.down(torch.relu(self.up(h))),)

    def correlated_embedding(vocab, d, generator):
        rank = 6
        table = torch.randn(vocab, rank, generator=generator) @ torch.randn(rank, d, generator=generator)
        table += 0.05 * torch.randn(vocab, d, generator=generator)
        return table * torch.exp(torch.randn(d, generator=generator))  # features of different scales

    class TinyLM(torch.nn.Module):
        """embed -> layers[0..2] -> head; blocks called as block(x, mask=..., scale=...)."""

        def __init__(self, blocks=3, seed=0, vocab=100, d=64):
            super().__init__()
            generator = torch.Generator().manual_seed(seed)
            torch.manual_seed(seed)
            self.embed = torch.nn.Embedding(vocab, d)
            with torch.no_grad():
                self.embed.weight.copy_(correlated_embedding(vocab, d, generator))
            self.layers = torch.nn.ModuleList(Block(d) for _ in range(blocks))
            self.head = torch.nn.Linear(d, vocab)

        def forward(self, ids, mask=None):
            x = self.embed(ids)
            for block in self.layers:
                x = block(x, mask=mask, scale=0.5)[0]
            return self.head(x)

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.ModuleList(Block() for _ in range(2))

    class TinyBert(torch.nn.Module):
        """embeddings -> encoder.layer[0..1] -> pooler (a Linear outside the blocks); blocks called with x alone."""

        def __init__(self):
            super().__init__()
            torch.manual_seed(1)
            self.embeddings = torch.nn.Embedding(100, 64)
            self.encoder = Encoder()
            self.pooler = torch.nn.Linear(64, 64)

        def forward(self, ids):
            x = self.embeddings(ids)
            for block in self.encoder.layer:
                x = block(x)[0]
            return self.pooler(x[:, 0])

    class Transformer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = torch.nn.Embedding(100, 64)
            self.h = torch.nn.ModuleList(Block() for _ in range(2))

    class TinyGpt(torch.nn.Module):
        """transformer.h, each block called with its hidden state by keyword."""

        def __init__(self):
            super().__init__()
            torch.manual_seed(2)
            self.transformer = Transformer()

        def forward(self, ids):
            x = self.transformer.wte(ids)
            for block in self.transformer.h:
                x = block(hidden_states=x)[0]
            return x


def calibration(batches=8, batch=2, tokens=16, seed=0):
    generator = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(batches):
        ids = torch.randint(0, 100, (batch, tokens), generator=generator)
        mask = (torch.rand(batch, tokens, generator=generator) > 0.2).float()
        out.append({"ids": ids, "mask": mask})
    return out


def block_inputs(model, batches):
    """The hidden state entering each block of a TinyLM, per batch, by running it by hand."""
    per_block = [[] for _ in model.layers]
    with torch.no_grad():
        for b in batches:
            x = model.embed(b["ids"])
            for i, block in enumerate(model.layers):
                per_block[i].append(x)
                x = block(x, mask=b["mask"], scale=0.5)[0]
    return per_block


def linear_inputs(block, xs, masks):
    """The inputs of q, up and down of `block` for hidden states xs, as (tokens, features) matrices."""
    q, up, down = [], [], []
    with torch.no_grad():
        for x, mask in zip(xs, masks):
            a = block.q(x) * mask[..., None]
            h = block.norm(x + 0.5 * a)
            q.append(x.reshape(-1, x.shape[-1]))
            up.append(h.reshape(-1, h.shape[-1]))
            down.append(torch.relu(block.up(h)).reshape(-1, block.up.out_features))
    return {"q": torch.cat(q), "up": torch.cat(up), "down": torch.cat(down)}


def recording_statistics():
    """Patches prune_model's per-Linear pruning to record each Linear's X^T X and token count."""
    recorded = {}
    original = pm._prune_linear

    def spy(name, linear, stats, *args):
        if stats is not None:
            recorded[name] = (stats.xtx.clone().double(), stats.tokens)
        return original(name, linear, stats, *args)
    return recorded, mock.patch.object(pm, "_prune_linear", spy)


def assert_pattern(test, dense, format):
    """Every entry outside `format`'s pattern is zero in the (R, K) array `dense`."""
    rows, cols = dense.shape
    nz = dense != 0
    if re.fullmatch(r"\d+:\d+", format):
        n, m = map(int, format.split(":"))
        test.assertTrue((nz.reshape(rows, cols // m, m).sum(axis=2) <= n).all(), f"{format}: a group keeps more than {n}")
    elif format.startswith("vnm:"):
        v, n, m = map(int, format.split(":")[1:])
        blocks = nz.reshape(rows // v, v, cols // m, m)
        test.assertTrue((blocks.any(axis=1).sum(axis=2) <= 4).all(), f"{format}: a block uses more than 4 columns")
        test.assertTrue((blocks.sum(axis=3) <= n).all(), f"{format}: a row keeps more than {n} of a group")
    else:
        shape, density = format.split(":")[1:]
        tr, tc = map(int, shape.split("x"))
        tiles = nz.reshape(rows // tr, tr, cols // tc, tc).any(axis=(1, 3))
        test.assertLessEqual(tiles.sum(), max(1, round(float(density) * tiles.size)), f"{format}: too many tiles")


def layer_error(linear_weight, pruned_weight, x):
    return ((x @ (linear_weight - pruned_weight).T).norm() / (x @ linear_weight.T).norm()).item()


@unittest.skipIf(WHY_NO_TORCH, WHY_NO_TORCH or "")
class FindingBlocks(unittest.TestCase):
    def test_each_naming_convention(self):
        for model, names in [(TinyLM(), ["layers.0", "layers.1", "layers.2"]),
                             (TinyBert(), ["encoder.layer.0", "encoder.layer.1"]),
                             (TinyGpt(), ["transformer.h.0", "transformer.h.1"])]:
            with self.subTest(type(model).__name__):
                self.assertEqual([name for name, _ in pm.find_blocks(model)], names)

    def test_explicit_blocks(self):
        model = TinyLM()
        for blocks in ("layers", model.layers, list(model.layers)):
            self.assertEqual([b for _, b in pm.find_blocks(model, blocks)], list(model.layers))
        self.assertEqual([n for n, _ in pm.find_blocks(model, [model.layers[1]])], ["layers.1"])

    def test_none_found_or_not_in_the_model(self):
        for model, blocks, error, message in [
            (torch.nn.Sequential(torch.nn.Linear(4, 4)), None, ValueError,
             "found no blocks in Sequential: expected a torch.nn.ModuleList named 'layers', 'layer', 'h'.*pass blocks="),
            (TinyLM(), "encoder.layer", ValueError, "blocks='encoder.layer' names no submodule of TinyLM"),
            (TinyLM(), [torch.nn.Linear(4, 4)], ValueError, r"blocks\[0\] \(Linear\) is not a submodule of the model"),
            (TinyLM(), [], ValueError, "blocks is empty"),
            (TinyLM(), ["layers.0"], TypeError, r"blocks\[0\] must be a torch.nn.Module, got str"),
            (TinyLM(), "embed", TypeError, "blocks must be a module list, its name or a sequence of modules, got Embedding"),
            ("model", None, TypeError, "model must be a torch.nn.Module, got str"),
        ]:
            with self.subTest(message):
                with self.assertRaisesRegex(error, message):
                    nmt.prune_model(model, calibration(1), "2:4", blocks=blocks)


@unittest.skipIf(WHY_NO_TORCH, WHY_NO_TORCH or "")
class Statistics(unittest.TestCase):
    def test_the_hooks_sum_the_inputs_x_t_x_and_block_2_sees_block_1_pruned(self):
        dense, batches = TinyLM(), calibration()
        masks = [b["mask"] for b in batches]
        model = copy.deepcopy(dense)
        recorded, spy = recording_statistics()
        with spy:
            weights = nmt.prune_model(model, batches, "2:4", method="obs", progress=False)
        self.assertEqual(list(weights), [f"layers.{i}.{n}" for i in range(3) for n in ("q", "up", "down")])
        # The reference: each block's inputs computed by hand with the blocks before it pruned (and itself dense).
        reference = copy.deepcopy(dense)
        for i in range(3):
            xs = block_inputs(reference, batches)[i]
            for n, x in linear_inputs(reference.layers[i], xs, masks).items():
                xtx, tokens = recorded[f"layers.{i}.{n}"]
                want = x.double().T @ x.double()
                self.assertEqual(tokens, x.shape[0])
                self.assertLess(((xtx - want).norm() / want.norm()).item(), 1e-5, f"layers.{i}.{n}")
            with torch.no_grad():
                for n in ("q", "up", "down"):
                    reference.layers[i].get_submodule(n).weight.copy_(torch.from_numpy(weights[f"layers.{i}.{n}"].to_dense()))
        # ... which differ from the dense model's own inputs of block 2 (so the pruned outputs were fed forward).
        x_dense = linear_inputs(dense.layers[2], block_inputs(dense, batches)[2], masks)["q"].double()
        gap = (recorded["layers.2.q"][0] - x_dense.T @ x_dense).norm() / (x_dense.T @ x_dense).norm()
        self.assertGreater(gap.item(), 1e-3)
        # The model holds the pruned weights (written back in place) and computes what the reference computes.
        with torch.no_grad():
            for name, weight in weights.items():
                np.testing.assert_array_equal(model.get_submodule(name).weight.numpy(), weight.to_dense())
            b = batches[0]
            torch.testing.assert_close(model(b["ids"], b["mask"]), reference(b["ids"], b["mask"]))

    def test_linears_on_one_input_share_its_product(self):
        class Shared(torch.nn.Module):  # a decoder layer's pattern: q, k, v on x; gate, up on h
            def __init__(self, d=64, f=128):
                super().__init__()
                self.q, self.k, self.v, self.o = (torch.nn.Linear(d, d) for _ in range(4))
                self.gate, self.up, self.down = torch.nn.Linear(d, f), torch.nn.Linear(d, f), torch.nn.Linear(f, d)

            def forward(self, x):
                h = x + self.o(torch.tanh(self.q(x)) * self.k(x) + self.v(x))
                return (h + self.down(torch.relu(self.gate(h)) * self.up(h)),)

        class Model(torch.nn.Module):
            def __init__(self):
                super().__init__()
                torch.manual_seed(3)
                self.embed = torch.nn.Embedding(100, 64)
                self.layers = torch.nn.ModuleList(Shared() for _ in range(2))

            def forward(self, ids):
                x = self.embed(ids)
                for block in self.layers:
                    x = block(x)[0]
                return x

        model, batches = Model(), [b["ids"] for b in calibration(3)]
        made = []
        real = pm._BlockStatistics

        def keep(*args):
            made.append(real(*args))
            return made[-1]
        recorded, spy = recording_statistics()
        with spy, mock.patch.object(pm, "_BlockStatistics", keep):
            nmt.prune_model(model, batches, "2:4", method="wanda", progress=False)
        self.assertEqual([h.products for h in made], [4 * len(batches)] * 2)  # x, the attention's mix, h, act
        self.assertEqual(made[0].leaders, {"layers.0.q", "layers.0.gate"})  # k and v take q's product
        with torch.no_grad():  # block 0 sees the dense embedding: its inputs by hand
            x = torch.cat([Model().embed(ids).reshape(-1, 64) for ids in batches]).double()
        for name in ("q", "k", "v"):
            xtx, tokens = recorded[f"layers.0.{name}"]
            self.assertEqual(tokens, x.shape[0])
            self.assertLess(((xtx - x.T @ x).norm() / (x.T @ x).norm()).item(), 1e-6, name)
        torch.testing.assert_close(recorded["layers.0.gate"][0], recorded["layers.0.up"][0], rtol=0, atol=0)

    def test_blocks_called_by_keyword_and_a_linear_outside_the_blocks(self):
        for model, left in [(TinyGpt(), None), (TinyBert(), "pooler")]:
            with self.subTest(type(model).__name__):
                before = None if left is None else model.get_submodule(left).weight.clone()
                batches = [b["ids"] for b in calibration(4)]
                weights = nmt.prune_model(model, batches, "2:4", method="wanda", progress=False)
                self.assertEqual(len(weights), 6)
                if left:
                    torch.testing.assert_close(model.get_submodule(left).weight, before, rtol=0, atol=0)

    def test_progress_block_by_block(self):
        calls = []
        nmt.prune_model(TinyLM(blocks=2), calibration(2), "2:4", method="wanda",
                        progress=lambda *a: calls.append(a))
        stages = [(i, name, stage) for i, total, name, stage in calls]
        self.assertEqual(stages[0], (0, "layers.0", "calibration up to the first block"))
        self.assertIn((0, "layers.0", "pruning layers.0.down"), stages)
        self.assertLess(stages.index((0, "layers.0", "outputs of the pruned block")), stages.index((1, "layers.1", "statistics")))
        self.assertEqual(stages[-1], (2, "", "done"))
        self.assertTrue(all(total == 2 for _, total, _, _ in calls))


@unittest.skipIf(WHY_NO_TORCH, WHY_NO_TORCH or "")
class Pruning(unittest.TestCase):
    def test_every_linear_in_the_exact_pattern(self):
        batches = calibration(4)
        for format in ("2:4", "vnm:64:2:8", "vnm:32:2:16", "tile:32x32:0.5"):
            for method in ("obs", "wanda", "magnitude"):
                with self.subTest(format=format, method=method):
                    model = TinyLM(blocks=2)
                    weights = nmt.prune_model(model, batches, format, method=method, progress=False)
                    self.assertEqual(len(weights), 6)
                    for name, weight in weights.items():
                        weight.validate()
                        self.assertEqual(weight.dtype, "f32")
                        dense = model.get_submodule(name).weight.detach().numpy()
                        np.testing.assert_array_equal(dense, weight.to_dense())
                        assert_pattern(self, dense, format)

    def test_magnitude_needs_no_calibration_and_equals_nmkit_prune(self):
        model, dense = TinyLM(), TinyLM()
        weights = nmt.prune_model(model, None, "vnm:64:2:8", method="magnitude", progress=False)
        for name, weight in weights.items():
            want = nmkit.prune(dense.get_submodule(name).weight.detach().numpy(), "vnm:64:2:8")
            np.testing.assert_array_equal(weight.to_dense(), want.to_dense())

    def test_obs_beats_wanda_beats_magnitude_on_correlated_inputs(self):
        batches = calibration()
        masks = [b["mask"] for b in batches]
        dense = TinyLM()
        x0 = block_inputs(dense, batches)[0]
        inputs = linear_inputs(dense.layers[0], x0, masks)
        errors, outputs = {}, {}
        for method in ("obs", "wanda", "magnitude"):
            model = copy.deepcopy(dense)
            weights = nmt.prune_model(model, batches, "2:4", method=method, progress=False)
            errors[method] = sum(layer_error(dense.layers[0].get_submodule(n).weight.detach(),
                                             torch.from_numpy(weights[f"layers.0.{n}"].to_dense()), x)
                                 for n, x in inputs.items())
            with torch.no_grad():
                outputs[method] = sum(((model(b["ids"], b["mask"]) - dense(b["ids"], b["mask"])).norm() /
                                       dense(b["ids"], b["mask"]).norm()).item() for b in batches)
        self.assertLess(errors["obs"], errors["wanda"])
        self.assertLess(errors["wanda"], errors["magnitude"])
        self.assertLess(outputs["obs"], outputs["wanda"])
        self.assertLess(outputs["wanda"], outputs["magnitude"])

    def test_include_exclude_blocks_and_dtype(self):
        model = TinyLM().to(torch.bfloat16)
        batches = [{"ids": b["ids"], "mask": b["mask"].to(torch.bfloat16)} for b in calibration(2)]
        weights = nmt.prune_model(model, batches, "2:4", blocks=list(model.layers)[:2], include=r"\.(up|down)$",
                                  exclude=r"^layers\.1\.down", progress=False)
        self.assertEqual(list(weights), ["layers.0.up", "layers.0.down", "layers.1.up"])
        self.assertTrue(all(w.dtype == "bf16" for w in weights.values()))
        self.assertEqual(model.layers[0].up.weight.dtype, torch.bfloat16)
        self.assertTrue((model.layers[2].up.weight != 0).all())
        self.assertTrue((model.layers[0].q.weight != 0).all())

    def test_the_model_state_is_restored(self):
        model = TinyLM(blocks=2)
        model.config = type("Config", (), {"use_cache": True})()
        model.train()
        seen = []
        model.layers[0].register_forward_pre_hook(lambda m, a: seen.append((m.training, model.config.use_cache)))
        nmt.prune_model(model, calibration(1), "2:4", method="wanda", progress=False, device="cpu")
        self.assertTrue(seen and all(s == (False, False) for s in seen))
        self.assertTrue(model.training and model.config.use_cache)

    def test_a_linear_never_run_is_kept_dense_with_a_warning(self):
        model = TinyLM(blocks=2)
        model.layers[1].unused = torch.nn.Linear(64, 64)
        with self.assertWarnsRegex(RuntimeWarning, "layers.1.unused: the calibration never ran it; kept dense"):
            weights = nmt.prune_model(model, calibration(1), "2:4", method="obs", progress=False)
        self.assertNotIn("layers.1.unused", weights)
        self.assertIn("layers.1.down", weights)


@unittest.skipIf(WHY_NO_TORCH, WHY_NO_TORCH or "")
class Files(unittest.TestCase):
    def test_the_written_file_reads_back(self):
        model = TinyBert().to(torch.float16)
        batches = [b["ids"] for b in calibration(4)]
        with tempfile.TemporaryDirectory() as tmp:
            path = pathlib.Path(tmp) / "pruned.safetensors"
            weights = nmt.prune_model(model, batches, "vnm:64:2:8", method="obs", out=path, progress=False)
            loaded = nmkit.load_file(path)
            self.assertEqual(sorted(loaded), sorted(f"{n}.weight" for n in weights))
            for name, weight in weights.items():
                self.assertEqual(loaded[f"{name}.weight"].format, "vnm:64:2:8")
                self.assertEqual(loaded[f"{name}.weight"].dtype, "f16")
                np.testing.assert_array_equal(loaded[f"{name}.weight"].to_dense(), weight.to_dense())
            header, tensors = read_safetensors(path)
            self.assertEqual(header["__metadata__"]["method"], "obs")
            for key, tensor in model.state_dict().items():
                if key[:-len(".weight")] not in weights:
                    np.testing.assert_array_equal(tensors[key], tensor.numpy(), err_msg=key)
            # load_sparse on a fresh model: the pruned Linears become SparseLinears (on the CPU stand-in).
            fresh = TinyBert().to(torch.float16)
            with layers_on_the_cpu():
                replaced = nmt.load_sparse(fresh, path)
                self.assertEqual(sorted(replaced), sorted(weights))
                x = torch.randn(5, 64, dtype=torch.float16)
                with torch.no_grad():
                    got = fresh.encoder.layer[0].up(x)
                    want = model.encoder.layer[0].up(x.float().half())
                torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
            cli = os.environ.get("NMKIT_CLI")
            if cli:
                text = subprocess.run([cli, "inspect", str(path)], check=True, capture_output=True, text=True).stdout
                self.assertIn("encoder.layer.1.down.weight", text)
                self.assertIn("vnm:64:2:8", text)
                self.assertIn("pooler.weight", text)

    def test_save_file(self):
        sw = nmkit.prune(np.arange(1, 65, dtype=np.float32).reshape(4, 16), "2:4")
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "f.safetensors")
            nmkit.save_file(path, {"a.weight": sw, "b": np.arange(6, dtype=np.int64).reshape(2, 3)}, {"note": "x"})
            np.testing.assert_array_equal(nmkit.load_file(path)["a.weight"].to_dense(), sw.to_dense())
            header, tensors = read_safetensors(path)
            np.testing.assert_array_equal(tensors["b"], np.arange(6).reshape(2, 3))
            self.assertEqual(header["__metadata__"]["note"], "x")
            weights, metadata = nmkit.load_file(path, metadata=True)
            self.assertEqual((sorted(weights), metadata), (["a.weight"], {"note": "x"}))
            for args, error, message in [
                (({"a": [1.0]},), TypeError, "tensor 'a' must be a numpy array or an nmkit.SparseWeight, got list"),
                (({"a": np.zeros(2, dtype=np.complex64)},), TypeError, "tensor 'a' has dtype complex64"),
                (({1: np.zeros(2)},), TypeError, "tensor names must be non-empty strings, got 1"),
                (({"a": sw, "a.values": np.zeros(2)},), ValueError, "duplicate tensor name 'a.values'"),
                (({"a": sw}, {"nmkit:a": "{}"}), ValueError, "metadata key 'nmkit:a': keys starting with 'nmkit'"),
                (([sw],), TypeError, "tensors must be a dict"),
            ]:
                with self.subTest(message):
                    with self.assertRaisesRegex(error, message):
                        nmkit.save_file(path, *args)
            with self.assertRaises(OSError):
                nmkit.save_file(os.path.join(tmp, "no", "such", "dir.safetensors"), {"a": sw})


@unittest.skipIf(WHY_NO_TORCH, WHY_NO_TORCH or "")
class TorchSolver(unittest.TestCase):
    """solver="torch" (N:M OBS in PyTorch, float64) against nmkit's C++ solver: the same algorithm, the same bits."""

    def test_it_gives_the_cpu_solvers_weights_bit_for_bit(self):
        batches = calibration(4)
        for format, dtype in (("2:4", None), ("2:8", None), ("1:4", "bf16"), ("2:4", "fp8")):
            with self.subTest(format=format, dtype=dtype):
                want = nmt.prune_model(TinyLM(blocks=2), batches, format, solver="cpu", dtype=dtype, progress=False)
                model = TinyLM(blocks=2)
                got = nmt.prune_model(model, batches, format, solver="torch", dtype=dtype, progress=False)
                self.assertEqual(list(got), list(want))
                for name, weight in want.items():
                    np.testing.assert_array_equal(got[name].to_dense(), weight.to_dense(), err_msg=name)
                    self.assertEqual(got[name].energy, weight.energy, name)
                    np.testing.assert_array_equal(model.get_submodule(name).weight.detach().numpy(),
                                                  weight.to_dense(), err_msg=name)

    def test_one_weight_with_tails_and_several_lazy_blocks(self):
        rng = np.random.default_rng(5)
        for rows, cols, format in ((33, 70, "1:4"), (64, 300, "2:4"), (40, 96, "2:8")):
            x = rng.standard_normal((4 * cols, cols)) @ (0.3 * rng.standard_normal((cols, cols)) + 3 * np.eye(cols))
            xtx = x.T @ x
            w = rng.standard_normal((rows, cols)).astype(np.float32)
            want = nmkit._nmkit.prune_with_statistics(w, xtx, x.shape[0], format, "obs", 0.01, "diagonal", "f32")
            n, m = map(int, format.split(":"))
            values, kept = pm._obs_nm_torch(torch.from_numpy(w), torch.from_numpy(xtx), n, m, 0.01)
            got = nmkit._nmkit.compress_selected(w, values.numpy(), kept.numpy(), format, "f32")
            np.testing.assert_array_equal(got.to_dense(), want.to_dense(), err_msg=f"{rows}x{cols} {format}")

    def test_which_solver_and_refusals(self):
        self.assertEqual(pm._resolve_solver("auto", "obs", "2:4", "diagonal", torch.device("cuda")), "torch")
        self.assertEqual(pm._resolve_solver("auto", "obs", "2:4", "diagonal", torch.device("cpu")), "cpu")
        self.assertEqual(pm._resolve_solver("auto", "obs", "vnm:64:2:8", "diagonal", torch.device("cuda")), "cpu")
        self.assertEqual(pm._resolve_solver("auto", "wanda", "2:4", "diagonal", torch.device("cuda")), "cpu")
        for kwargs, error, message in [
            (dict(solver="gpu"), ValueError, "unknown solver 'gpu'"),
            (dict(solver="torch", method="wanda"), NotImplementedError, "solver 'torch' runs OBS"),
            (dict(solver="torch", format="vnm:64:2:8"), NotImplementedError, "format 'vnm:64:2:8'"),
            (dict(solver="torch", candidates="pairwise"), NotImplementedError, "candidates 'pairwise'"),
        ]:
            with self.subTest(message):
                model = TinyLM(blocks=1)
                before = copy.deepcopy(model.state_dict())
                with self.assertRaisesRegex(error, message):
                    nmt.prune_model(model, calibration(1), **{"format": "2:4", "progress": False, **kwargs})
                for key, tensor in model.state_dict().items():
                    torch.testing.assert_close(tensor, before[key], rtol=0, atol=0, msg=key)
        ones, kept = np.ones((4, 8), np.float32), np.tile(np.array([1, 1, 0, 0], bool), (4, 2))
        for args, error, message in [
            ((ones, ones, np.ones((4, 8), bool), "2:4"), ValueError, "violated at row 0"),
            ((ones, np.ones((4, 4), np.float32), kept, "2:4"), ValueError, "differ in shape"),
            ((ones, ones, kept, "tile:2x2:0.5"), NotImplementedError, "N:M and V:N:M masks"),
            ((ones, np.full((4, 8), np.nan, np.float32), kept, "2:4"), ValueError, "values"),
        ]:
            with self.subTest(message):
                with self.assertRaisesRegex(error, message):
                    nmkit._nmkit.compress_selected(*args, "f32")
        got = nmkit._nmkit.compress_selected(ones, 2 * ones, kept, "2:4", "f32")
        np.testing.assert_array_equal(got.to_dense(), 2 * kept)
        self.assertEqual(got.energy, 0.5)


class _Stop(Exception):
    pass


def stop_before(block_index):
    """A progress callback that interrupts prune_model as block `block_index` starts collecting statistics."""
    def progress(done, total, name, stage):
        if done == block_index and stage == "statistics":
            raise _Stop
    return progress


@unittest.skipIf(WHY_NO_TORCH, WHY_NO_TORCH or "")
class Checkpoints(unittest.TestCase):
    def test_an_interrupted_run_resumes_to_what_one_run_gives(self):
        batches = calibration(4)
        want = nmt.prune_model(TinyLM(blocks=3), batches, "2:4", method="obs", progress=False)
        with tempfile.TemporaryDirectory() as tmp:
            with self.assertRaises(_Stop):
                nmt.prune_model(TinyLM(blocks=3), batches, "2:4", checkpoint=tmp, progress=stop_before(2))
            self.assertEqual(sorted(os.listdir(tmp)), ["block-00000.safetensors", "block-00001.safetensors"])
            for run in ("resumed", "all from the checkpoint"):
                with self.subTest(run):
                    calls, model = [], TinyLM(blocks=3)
                    got = nmt.prune_model(model, batches, "2:4", checkpoint=pathlib.Path(tmp),
                                          progress=lambda *a: calls.append(a))
                    stages = [(i, stage) for i, _, _, stage in calls]
                    pruned_blocks = {i for i, stage in stages if stage.startswith("pruning ")}
                    self.assertEqual(pruned_blocks, {2} if run == "resumed" else set())
                    self.assertIn((1, "restored from the checkpoint"), stages)
                    self.assertEqual(list(got), list(want))
                    for name, weight in want.items():
                        np.testing.assert_array_equal(got[name].to_dense(), weight.to_dense(), err_msg=name)
                        np.testing.assert_array_equal(model.get_submodule(name).weight.detach().numpy(),
                                                      weight.to_dense(), err_msg=name)
            self.assertEqual(len(os.listdir(tmp)), 3)
            block0 = nmkit.load_file(os.path.join(tmp, "block-00000.safetensors"))
            self.assertEqual(sorted(block0), ["layers.0.down.weight", "layers.0.q.weight", "layers.0.up.weight"])

    def test_a_block_interrupted_part_way_is_put_back_for_the_next_call(self):
        batches = calibration(4)
        want = nmt.prune_model(TinyLM(blocks=3), batches, "2:4", method="obs", progress=False)

        def stop_in_block_1(done, total, name, stage):  # after q is pruned, before up
            if stage == "pruning layers.1.up":
                raise _Stop
        with tempfile.TemporaryDirectory() as tmp:
            model = TinyLM(blocks=3)
            dense_q = model.layers[1].q.weight.detach().clone()
            with self.assertRaises(_Stop):
                nmt.prune_model(model, batches, "2:4", checkpoint=tmp, progress=stop_in_block_1)
            torch.testing.assert_close(model.layers[1].q.weight, dense_q, rtol=0, atol=0)
            got = nmt.prune_model(model, batches, "2:4", checkpoint=tmp, progress=False)  # the same model object
            for name, weight in want.items():
                np.testing.assert_array_equal(got[name].to_dense(), weight.to_dense(), err_msg=name)

    def test_files_of_another_run_are_refused_before_anything_is_pruned(self):
        batches = calibration(3)
        with tempfile.TemporaryDirectory() as tmp:
            nmt.prune_model(TinyLM(blocks=2), batches, "2:4", method="wanda", checkpoint=tmp, progress=False)
            for calib, kwargs, message in [
                (batches, dict(method="obs"), "method: 'wanda' there, 'obs' here"),
                (batches, dict(method="wanda", format="vnm:64:2:8"), "format: '2:4' there, 'vnm:64:2:8' here"),
                (calibration(2), dict(method="wanda"), "calibration_batches: 3 there, 2 here"),
                (batches, dict(method="wanda", exclude="down"), "exclude: None there, 'down' here"),
                (batches, dict(method="wanda", dtype="e5m2"), "dtype: None there, 'e5m2' here"),
            ]:
                with self.subTest(message):
                    model = TinyLM(blocks=2)
                    before = copy.deepcopy(model.state_dict())
                    kwargs = {"format": "2:4", **kwargs}
                    with self.assertRaisesRegex(ValueError, r"checkpoint file '.*block-00000\.safetensors' was "
                                                r"written by another prune_model run \(.*" + re.escape(message)):
                        nmt.prune_model(model, calib, checkpoint=tmp, progress=False, **kwargs)
                    for key, tensor in model.state_dict().items():
                        torch.testing.assert_close(tensor, before[key], rtol=0, atol=0, msg=key)
            # Block 1's file in block 0's place: the right settings, Linears of another block.
            weights, metadata = nmkit.load_file(os.path.join(tmp, "block-00001.safetensors"), metadata=True)
            nmkit.save_file(os.path.join(tmp, "block-00000.safetensors"), weights, metadata)
            with self.assertRaisesRegex(ValueError, "holds 'layers.1.(q|up|down).weight', which is not a pruned "
                                                    "Linear of block 0"):
                nmt.prune_model(TinyLM(blocks=2), batches, "2:4", method="wanda", checkpoint=tmp, progress=False)
            with self.assertRaisesRegex(ValueError, "exists and is not a directory"):
                nmt.prune_model(TinyLM(blocks=2), batches, "2:4", checkpoint=os.path.join(tmp, "block-00001.safetensors"),
                                progress=False)
        with self.assertRaisesRegex(TypeError, "checkpoint must be a str, bytes or os.PathLike"):
            nmt.prune_model(TinyLM(blocks=2), batches, "2:4", checkpoint=3.5, progress=False)


@unittest.skipIf(WHY_NO_TORCH, WHY_NO_TORCH or "")
class Refusals(unittest.TestCase):
    def test_every_refusal_names_what_is_wrong_before_anything_is_pruned(self):
        nan_model = TinyLM(blocks=2)
        with torch.no_grad():
            nan_model.layers[1].up.weight[3, 5] = float("nan")
        for model, calib, kwargs, error, message in [
            (TinyLM(), [], {}, ValueError, "the calibration is empty: method 'obs' needs at least one batch"),
            (TinyLM(), None, dict(method="wanda"), ValueError, "method 'wanda' needs calibration batches, got None"),
            (TinyLM(), calibration(1), dict(format="3:2"), ValueError, "3:2"),
            (TinyLM(), calibration(1), dict(format="bogus"), ValueError, "bogus"),
            (TinyLM(), calibration(1), dict(format=24), TypeError, "format must be a string"),
            (TinyLM(), calibration(1), dict(method="sparsegpt"), ValueError,
             "unknown pruning method 'sparsegpt' \\(expected magnitude, wanda or obs\\)"),
            (TinyLM(), calibration(1), dict(candidates="all"), ValueError, "unknown OBS candidates 'all'"),
            (TinyLM(), calibration(1), dict(damp=0), ValueError, "damp must be a finite number > 0"),
            (TinyLM(), calibration(1), dict(damp=float("nan")), ValueError, "damp must be a finite number > 0"),
            (TinyLM(), calibration(1), dict(include="attention"), ValueError, "no nn.Linear inside the blocks matches"),
            (TinyLM(), calibration(1), dict(exclude="("), ValueError, "exclude must be a regular expression"),
            (TinyLM(), calibration(1), dict(out=3.5), TypeError, "out must be a str, bytes or os.PathLike"),
            (nan_model, calibration(1), {}, ValueError, r"^layers\.1\.up: .*NaN"),
        ]:
            with self.subTest(message):
                before = copy.deepcopy(model.state_dict())
                kwargs = {"format": "2:4", **kwargs}
                with self.assertRaisesRegex(error, message):
                    nmt.prune_model(model, calib, progress=False, **kwargs)
                for key, tensor in model.state_dict().items():
                    torch.testing.assert_close(tensor, before[key], rtol=0, atol=0, equal_nan=True, msg=key)

    def test_calibration_that_never_reaches_the_blocks(self):
        class Stops(TinyLM):
            def forward(self, ids, mask=None):
                return self.embed(ids)
        with self.assertRaisesRegex(RuntimeError, "calibration batch 0 ran through the model without reaching its first block"):
            nmt.prune_model(Stops(), calibration(1), "2:4", progress=False)

    def test_a_hessian_that_cannot_be_factored_names_the_layer(self):
        model = TinyLM(blocks=1)
        with torch.no_grad():
            model.embed.weight.zero_()  # q and up see only zeros, and damp 1e-12 of nothing leaves H singular
        with self.assertRaisesRegex(ValueError, r"^layers\.0\.(q|up): .*not positive definite"):
            nmt.prune_model(model, calibration(1), "2:4", damp=1e-12, progress=False)


if __name__ == "__main__":
    unittest.main()
