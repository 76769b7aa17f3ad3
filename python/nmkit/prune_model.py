"""nmkit.torch.prune_model: calibrated pruning of a whole PyTorch model, block by block (SparseGPT-style).

    import nmkit.torch
    weights = nmkit.torch.prune_model(model, batches, "2:4", method="obs", out="model.nmkit.safetensors")

The model's blocks (a ModuleList named `layers`, `layer` or `h`: Llama's model.layers, BERT's encoder.layer, GPT-2's
transformer.h; or `blocks=`) are pruned one after the other. The calibration batches run once through everything
before the first block, whose inputs (positional and keyword: attention masks, position embeddings) are captured.
Then, per block: hooks on its nn.Linear layers sum X^T X (fp32, on the device the block runs on) and count tokens
over all batches; each Linear is pruned by nmkit's C++ solver (OBS, Wanda or magnitude) and its weight replaced in
place by the pruned one (dense, pruned entries zero, OBS's update applied); the block runs again on the same inputs
and its outputs, now those of the pruned block, become the next block's inputs. Linear layers outside the blocks
(BERT's pooler, an LM head) are left as they are. With checkpoint=DIR each finished block's weights are written
there, and a later call with the same arguments resumes from them.
"""
from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import re
import sys
import warnings
from typing import Optional

import numpy as np
import torch

from . import QuantizedWeight, SparseWeight, _dense_entry, _nmkit, _storage_dtype, load_file

__all__ = ["prune_model", "find_blocks"]

METHODS = ("magnitude", "wanda", "obs")
CANDIDATES = ("diagonal", "pairwise", "combinatorial")
BLOCK_LIST_NAMES = ("layers", "layer", "h")  # Llama/Mistral/Qwen/OPT, BERT/RoBERTa, GPT-2/GPT-J/Falcon

_TORCH_ST_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
                    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
                    torch.bool: "BOOL"}


class _FirstBlockReached(Exception):
    """Raised by the hook on the first block once its inputs are captured: nothing after it needs to run."""


def find_blocks(model: torch.nn.Module, blocks=None) -> list:
    """The (qualified name, module) of each block of `model`, in order. blocks: None (the shallowest non-empty
    torch.nn.ModuleList named 'layers', 'layer' or 'h' in the module tree), the qualified name of a module list,
    or a sequence of submodules of `model`. ValueError when none is found or a given module is not in the model."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    names = {id(m): name for name, m in model.named_modules(remove_duplicate=False)}
    if blocks is None:
        found = [(name.count("."), name, m) for name, m in model.named_modules()
                 if isinstance(m, torch.nn.ModuleList) and len(m) > 0 and name.rpartition(".")[2] in BLOCK_LIST_NAMES]
        if not found:
            raise ValueError(f"found no blocks in {type(model).__name__}: expected a torch.nn.ModuleList named "
                             f"{', '.join(repr(n) for n in BLOCK_LIST_NAMES)} (model.layers, encoder.layer, "
                             "transformer.h); pass blocks= (the list's name or the modules)")
        _, name, blocks = min(found, key=lambda f: f[0])
        return [(f"{name}.{i}", block) for i, block in enumerate(blocks)]
    if isinstance(blocks, str):
        try:
            blocks = model.get_submodule(blocks)
        except AttributeError as e:
            raise ValueError(f"blocks='{blocks}' names no submodule of {type(model).__name__} ({e})") from None
    if isinstance(blocks, torch.nn.Module) and not isinstance(blocks, (torch.nn.ModuleList, torch.nn.Sequential)):
        raise TypeError(f"blocks must be a module list, its name or a sequence of modules, got {type(blocks).__name__}")
    try:
        blocks = list(blocks)
    except TypeError:
        raise TypeError(f"blocks must be a module list, its name or a sequence of modules, got "
                        f"{type(blocks).__name__}") from None
    if not blocks:
        raise ValueError("blocks is empty")
    out = []
    for i, block in enumerate(blocks):
        if not isinstance(block, torch.nn.Module):
            raise TypeError(f"blocks[{i}] must be a torch.nn.Module, got {type(block).__name__}")
        if id(block) not in names or block is model:
            raise ValueError(f"blocks[{i}] ({type(block).__name__}) is not a submodule of the model")
        out.append((names[id(block)], block))
    return out


def _compile(what: str, pattern):
    if pattern is None:
        return None
    try:
        return re.compile(pattern)
    except (re.error, TypeError) as e:
        raise ValueError(f"{what} must be a regular expression, got {pattern!r} ({e})") from None


def _check_format(format, dtype=None) -> str:
    if not isinstance(format, str):
        raise TypeError(f"format must be a string ('2:4', 'vnm:128:2:8', 'tile:64x64:0.25'), got {type(format).__name__}")
    if dtype is not None and not isinstance(dtype, str):
        raise TypeError(f"dtype must be a string (f32, f16, bf16, or 8-bit: fp8, e5m2, int8) or None, got "
                        f"{type(dtype).__name__}")
    # Parses both, and refuses 8-bit values for formats other than N:M.
    _nmkit.prune_with_statistics(np.zeros((1, 8), dtype=np.float32), None, 0, format, "magnitude", dtype=dtype or "f32")
    return format


def _pattern_text(pattern) -> Optional[str]:
    """A compiled include/exclude filter as the checkpoint's settings record it: its source and flags."""
    if pattern is None:
        return None
    return pattern.pattern if not pattern.flags & ~re.UNICODE else f"(?{pattern.flags}){pattern.pattern}"


def _check_options(method, damp, candidates) -> None:
    if method not in METHODS:
        raise ValueError(f"unknown pruning method {method!r} (expected magnitude, wanda or obs)")
    if candidates not in CANDIDATES:
        raise ValueError(f"unknown OBS candidates {candidates!r} (expected diagonal, pairwise or combinatorial)")
    if isinstance(damp, bool) or not isinstance(damp, (int, float)) or not (math.isfinite(damp) and damp > 0):
        raise ValueError(f"damp must be a finite number > 0 (a fraction of mean(diag X^T X)), got {damp!r}")


def _to(value, device: Optional[torch.device]):
    """`value` with every tensor inside it (tuples, lists, dicts) on `device` (None: as it is)."""
    if device is None:
        return value
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (list, tuple)):
        return type(value)(_to(v, device) for v in value)
    if isinstance(value, dict):
        return type(value)((k, _to(v, device)) for k, v in value.items())
    return value


def _call(model: torch.nn.Module, batch):
    if isinstance(batch, dict):
        return model(**batch)
    if isinstance(batch, (tuple, list)):
        return model(*batch)
    return model(batch)


class _Progress:
    """One line on stderr, rewritten in place (tqdm's bar where tqdm is installed), or a callable's calls."""

    def __init__(self, progress, total: int):
        self.callback = progress if callable(progress) else None
        self.bar = self.line = None
        if progress is True:
            try:
                from tqdm.auto import tqdm
                self.bar = tqdm(total=total, desc="prune_model", unit="block")
            except ImportError:
                self.line = sys.stderr.isatty()
        self.total, self.width = total, 0

    def __call__(self, done: int, name: str, stage: str) -> None:
        if self.callback:
            self.callback(done, self.total, name, stage)
        elif self.bar is not None:
            self.bar.n = done
            self.bar.set_postfix_str(f"{name}: {stage}" if name else stage)
        elif self.line:
            text = f"prune_model: block {min(done + 1, self.total)}/{self.total} {name}: {stage}"
            sys.stderr.write("\r" + text.ljust(self.width))
            sys.stderr.flush()
            self.width = len(text)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.n = self.total
            self.bar.close()
        elif self.line and self.width:
            sys.stderr.write("\n")
            sys.stderr.flush()


class _Statistics:
    """X^T X (fp32) and the token count of one Linear's inputs."""

    def __init__(self, linear: torch.nn.Linear, device: torch.device):
        self.xtx = torch.zeros((linear.in_features, linear.in_features), dtype=torch.float32, device=device)
        self.tokens = 0


@contextlib.contextmanager
def _tf32_matmuls(enabled: bool):
    """TF32 tensor cores for the products inside, when `enabled`: for inputs that came as f16 or bf16 it loses
    nothing (their significands, 10 and 7 bits, fit TF32's 10; products and sums stay fp32) and is ~7x the fp32
    speed on a Hopper GPU."""
    if not enabled:
        yield
        return
    settings = torch.backends.cuda.matmul
    name, value = ("fp32_precision", "tf32") if hasattr(settings, "fp32_precision") else ("allow_tf32", True)
    before = getattr(settings, name)
    setattr(settings, name, value)
    try:
        yield
    finally:
        setattr(settings, name, before)


class _BlockStatistics:
    """Forward hooks summing X^T X for a block's Linears. Linears called one after the other on the same tensor (a
    decoder's q, k and v; gate and up) share its product: it is computed once per batch and added to each, the
    sharing learned on the first batch and checked by identity on every call (a Linear whose input differs from
    its predecessor's computes its own)."""

    def __init__(self, linears: list, device: torch.device):
        self.stats = {name: _Statistics(linear, device) for name, linear in linears}
        self.handles = [linear.register_forward_hook(functools.partial(self.hook, name)) for name, linear in linears]
        self.leaders = set()  # Linears whose input the next Linear took too
        self.first_batch = True
        self.last = None  # (input, its product or None, Linear name) of the last call in this batch
        self.products = 0  # products computed (the test's count)

    def hook(self, name, module, inputs, output) -> None:
        x = inputs[0]
        stats = self.stats[name]
        rows = x.numel() // x.shape[-1]
        if self.last is not None and self.last[0] is x:
            self.leaders.add(self.last[2])
            if self.last[1] is not None:
                stats.xtx.add_(self.last[1])
                stats.tokens += rows
                return
        exact = x.dtype in (torch.float16, torch.bfloat16) and stats.xtx.is_cuda
        x2 = x.detach().reshape(-1, x.shape[-1]).to(device=stats.xtx.device, dtype=torch.float32)
        with _tf32_matmuls(exact):
            if self.first_batch or name in self.leaders:  # kept for the Linears after it
                product = x2.T @ x2
                stats.xtx.add_(product)
            else:
                product = None
                stats.xtx.addmm_(x2.T, x2)
        self.products += 1
        stats.tokens += rows
        self.last = (x, product, name)

    def end_batch(self) -> None:
        self.last = None
        self.first_batch = False

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.last = None


def _capture_first_inputs(model, first_block, batches, device) -> list:
    """The (args, kwargs) the first block is called with, one per batch, by running the model up to it."""
    captured = []

    def hook(module, args, kwargs):
        captured.append((args, kwargs))
        raise _FirstBlockReached

    handle = first_block.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        for i, batch in enumerate(batches):
            try:
                _call(model, _to(batch, device))
            except _FirstBlockReached:
                continue
            raise RuntimeError(f"calibration batch {i} ran through the model without reaching its first block")
    finally:
        handle.remove()
    return captured


def _hidden_state(args, kwargs):
    if args:
        return args[0]
    if "hidden_states" in kwargs:
        return kwargs["hidden_states"]
    raise ValueError("the first block was called without a positional input or 'hidden_states': cannot tell which "
                     "of its inputs the previous block's output replaces")


def _with_hidden_state(args, kwargs, hidden):
    if args:
        return (hidden,) + tuple(args[1:]), kwargs
    return args, {**kwargs, "hidden_states": hidden}


def _block_output(output):
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    raise TypeError(f"a block returned {type(output).__name__}: expected a tensor or a tuple whose first element is "
                    "the hidden state")


def _move_outside_blocks(model, block_modules, device):
    """Moves the parameters and buffers of `model` that belong to no block to `device`; returns the undo."""
    inside = {id(m) for block in block_modules for m in block.modules()}
    moved = []
    for module in model.modules():
        if id(module) in inside:
            continue
        for store in (module._parameters, module._buffers):
            for key, tensor in store.items():
                if tensor is not None and tensor.device != device:
                    moved.append((tensor, tensor.data))
                    tensor.data = tensor.data.to(device)

    def undo():
        for tensor, data in moved:
            tensor.data = data
    return undo


def _model_device(model) -> torch.device:
    for tensor in model.parameters():
        return tensor.device
    return torch.device("cpu")


def _prune_linear(name, linear, stats, format, method, damp, candidates,
                  dtype=None, solver="cpu") -> tuple:
    """The pruned weight (SparseWeight or QuantizedWeight) and, where the solver left it there, the same weight dense
    on the Linear's device (else None: the caller expands the compressed one)."""
    try:
        if solver == "torch":
            return _prune_linear_torch(linear, stats, format, damp, _storage_dtype(linear.weight, dtype))
        weight = linear.weight.detach().to(device="cpu", dtype=torch.float32).contiguous().numpy()
        xtx = None if stats is None else stats.xtx.cpu().numpy()
        return _nmkit.prune_with_statistics(weight, xtx, 0 if stats is None else stats.tokens, format, method, damp,
                                            candidates, _storage_dtype(linear.weight, dtype)), None
    except (ValueError, NotImplementedError, RuntimeError) as e:
        raise type(e)(f"{name}: {e}") from None


SOLVERS = ("auto", "cpu", "torch")
_LAZY_COLUMNS = 128  # OBS's lazy-update block, as the C++ solver's ObsOptions::block_cols


def _nm_pattern(format: str) -> Optional[tuple]:
    """(N, M) of an N:M format string, None for the others."""
    match = re.fullmatch(r"(\d+):(\d+)", format)
    return (int(match.group(1)), int(match.group(2))) if match else None


def _resolve_solver(solver, method, format, candidates, device: torch.device) -> str:
    """Which solver prunes the Linears: "torch" (N:M OBS with diagonal candidates, on the device the statistics are
    summed on) or "cpu" (nmkit's C++ solvers, everything else). "auto" takes torch on a CUDA device."""
    if solver not in SOLVERS:
        raise ValueError(f"unknown solver {solver!r} (expected auto, cpu or torch)")
    takes_torch = method == "obs" and candidates == "diagonal" and _nm_pattern(format) is not None
    if solver == "torch" and not takes_torch:
        raise NotImplementedError(f"solver 'torch' runs OBS with diagonal candidates into N:M formats; got method "
                                  f"{method!r}, candidates {candidates!r}, format {format!r} (use solver='cpu')")
    if solver == "auto":
        return "torch" if takes_torch and device.type == "cuda" else "cpu"
    return solver


def _obs_nm_torch(weight: torch.Tensor, xtx: torch.Tensor, n: int, m: int, damp: float) -> tuple:
    """nmkit's N:M OBS (src/prune/obs.cpp with diagonal candidates) in float64 on xtx's device: the same damping,
    inverse-Hessian factor, group decisions (w^2 / U_jj^2 rounded to float32, the N largest of each group, ties to
    the lower column) and column-by-column updates in lazy blocks. Returns the updated weight (float32, pruned
    entries zero) and the kept mask, both on xtx's device."""
    device = xtx.device
    w = weight.to(device=device, dtype=torch.float64).clone()
    h = xtx.to(dtype=torch.float64).clone()
    k = h.shape[0]
    diag = h.diagonal()
    mean = max(diag.sum().item() / k, 1e-12)
    diag[diag == 0] = 1.0  # columns no token touched: their weights never mattered
    diag += damp * mean
    # U (upper, H^-1 = U^T U) = J L^-1 J for J H J = L L^T, J the reversal (the C++ solver's derivation).
    lower, info = torch.linalg.cholesky_ex(h.flip(0, 1))
    if info.item() != 0:
        raise ValueError("the calibration Hessian is not positive definite; raise the damping (damp)")
    u = torch.linalg.solve_triangular(lower, torch.eye(k, dtype=torch.float64, device=device), upper=False)
    u = u.flip(0, 1)
    del lower, h
    kept = torch.zeros(w.shape, dtype=torch.bool, device=device)
    lazy = max(m, _LAZY_COLUMNS // m * m)  # a multiple of M: no group straddles two lazy blocks
    for b0 in range(0, k, lazy):
        b1 = min(k, b0 + lazy)
        err = torch.empty((w.shape[0], b1 - b0), dtype=torch.float64, device=device)
        for g0 in range(b0, b1, m):
            g1 = min(g0 + m, b1)
            d = u.diagonal()[g0:g1]
            score = (w[:, g0:g1] * w[:, g0:g1] / (d * d)).float()
            best = torch.sort(score, dim=1, descending=True, stable=True).indices[:, :min(n, g1 - g0)]
            keep = torch.zeros(score.shape, dtype=torch.bool, device=device).scatter_(1, best, True)
            kept[:, g0:g1] = keep
            for i in range(g0, g1):
                e = torch.where(keep[:, i - g0], 0.0, w[:, i] / u[i, i])
                w[:, i] = torch.where(keep[:, i - g0], w[:, i], 0.0)
                if i + 1 < b1:
                    w[:, i + 1:b1] -= e[:, None] * u[i, i + 1:b1][None, :]
                err[:, i - b0] = e
        if b1 < k:
            w[:, b1:] -= err @ u[b0:b1, b1:]
    return w.float(), kept


# A SparseWeight's value dtypes, whose rounding torch reproduces exactly (round to nearest even, gradual underflow).
_TORCH_STORAGE = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def _prune_linear_torch(linear, stats, format, damp, storage: str) -> tuple:
    n, m = _nm_pattern(format)
    weight = linear.weight.detach().to(dtype=torch.float32)
    if not torch.isfinite(stats.xtx).all():
        raise ValueError("the calibration statistics (X^T X) are not finite: the layer's calibration inputs hold NaN "
                         "or infinity")
    values, kept = _obs_nm_torch(weight, stats.xtx, n, m, damp)
    compressed = _nmkit.compress_selected(weight.cpu().contiguous().numpy(), values.cpu().numpy(),
                                          kept.cpu().numpy(), format, storage)
    # The dense pruned weight without a round trip through the host: values are zero where not kept, and rounding
    # them to the storage dtype is what compressing did (8-bit storages are dequantized by to_dense instead).
    stored = _TORCH_STORAGE.get(compressed.dtype) if isinstance(compressed, SparseWeight) else None
    on_device = None if stored is None else values.to(stored).to(device=linear.weight.device)
    return compressed, on_device


def _state_entries(model, weights: dict) -> list:
    """The model's state dict as save_file entries, the pruned Linears' weights compressed."""
    compressed = {f"{name}.weight": weight for name, weight in weights.items()}
    entries = []
    for key, tensor in model.state_dict(keep_vars=False).items():
        if key in compressed:
            entries.append((key, compressed[key]))
            continue
        st_dtype = _TORCH_ST_DTYPES.get(tensor.dtype)
        if st_dtype is None:
            raise TypeError(f"the state dict's '{key}' is {tensor.dtype}, which safetensors does not store")
        tensor = tensor.detach().cpu().contiguous()
        if tensor.dtype == torch.bfloat16:  # numpy has no bfloat16: its bits, as stored
            entries.append((key, "BF16", tuple(tensor.shape), tensor.view(torch.int16).numpy().tobytes()))
        else:
            entries.append(_dense_entry(key, tensor.numpy()))
    return entries


class _Checkpoint:
    """prune_model's checkpoint directory: one file of pruned weights per finished block, in block order."""

    SETTINGS_KEY = "prune_model_settings"

    def __init__(self, directory: str, settings: dict, selected: list):
        if os.path.exists(directory) and not os.path.isdir(directory):
            raise ValueError(f"checkpoint '{directory}' exists and is not a directory")
        os.makedirs(directory, exist_ok=True)
        self.directory, self.selected = directory, selected
        self.settings = json.dumps(settings, sort_keys=True)
        self.contiguous = True  # blocks are taken from the files only up to the first one missing

    def path(self, index: int) -> str:
        return os.path.join(self.directory, f"block-{index:05d}.safetensors")

    def restore(self, index: int) -> Optional[dict]:
        """Block `index`'s {Linear name: weight} from its file, or None when it is to be pruned (no file, or a file
        missing before it). ValueError when the file was written with other settings or does not fit the block."""
        path = self.path(index)
        if not self.contiguous or not os.path.exists(path):
            self.contiguous = False
            return None
        stored, metadata = load_file(path, metadata=True)
        theirs = metadata.get(self.SETTINGS_KEY)
        if theirs != self.settings:
            differ = "the file has no prune_model settings"
            if theirs is not None:
                try:
                    a, b = json.loads(theirs), json.loads(self.settings)
                    differ = "; ".join(f"{key}: {a.get(key)!r} there, {b.get(key)!r} here"
                                       for key in sorted(set(a) | set(b)) if a.get(key) != b.get(key))
                except ValueError:
                    differ = "its prune_model settings are not JSON"
            raise ValueError(f"checkpoint file '{path}' was written by another prune_model run ({differ}): delete "
                             "the checkpoint directory or pass another")
        linears = dict(self.selected[index])
        out = {}
        for key, weight in stored.items():
            name = key[:-len(".weight")] if key.endswith(".weight") else key
            linear = linears.get(name)
            if linear is None:
                raise ValueError(f"checkpoint file '{path}' holds '{key}', which is not a pruned Linear of block "
                                 f"{index}: delete the checkpoint directory or pass another")
            if tuple(weight.shape) != (linear.out_features, linear.in_features):
                raise ValueError(f"checkpoint file '{path}': '{key}' is {tuple(weight.shape)}, the Linear is "
                                 f"{(linear.out_features, linear.in_features)}")
            out[name] = weight
        return out

    def write(self, index: int, weights: dict) -> None:
        _nmkit._save_file(self.path(index), [(f"{name}.weight", w) for name, w in weights.items()],
                          {"pruned_by": "nmkit.torch.prune_model", self.SETTINGS_KEY: self.settings,
                           "block_index": str(index)})


def prune_model(model: torch.nn.Module, calibration, format: str, method: str = "obs", blocks=None,
                include: Optional[str] = None, exclude: Optional[str] = None, damp: float = 0.01,
                candidates: str = "diagonal", out=None, progress=True, device=None,
                dtype: Optional[str] = None, checkpoint=None, solver: str = "auto") -> dict:
    """Prunes every nn.Linear inside `model`'s blocks into `format`, block by block, in place; returns
    {qualified Linear name: SparseWeight (QuantizedWeight for an 8-bit dtype)} in block order.

    calibration: an iterable of batches, each passed to the model as model(**batch) for a dict, model(*batch) for a
        tuple or list, model(batch) otherwise (tensors in it are moved to `device`). Every token of a batch counts in
        the statistics, padding included: calibrate with unpadded sequences (equal lengths, or one per batch).
        Not used by magnitude (None is taken).
    format: "2:4" (any "N:M"), "vnm:V:N:M", "tile:RxC:DENSITY".
    method: "obs" (SparseGPT-style OBS: the solver chooses the pattern and updates the kept weights), "wanda"
        (|w| * ||X_j||) or "magnitude" (|w|).
    blocks: None (found: the ModuleList named 'layers', 'layer' or 'h'), the name of a module list, or the modules.
    include, exclude: regular expressions searched in each Linear's qualified name (default: every Linear of the
        blocks). damp: OBS's damping, a fraction of mean(diag X^T X). candidates: OBS's choice of each row's kept
        entries in a group ("diagonal", "pairwise", "combinatorial").
    out: a path: writes the model's whole state dict there (nmkit safetensors), the pruned Linears' weights
        compressed; load_file, load_sparse and `nmkit inspect` read it.
    progress: True (a line on stderr when it is a terminal, or tqdm's bar where tqdm is installed), False, or a
        callable(block_index, blocks, block_name, stage).
    device: where the blocks run and X^T X is summed (default: where the model's parameters are). Where it is
        another device, the parts of the model before the blocks are moved there for the first pass and each block
        while it is pruned, and moved back after.
    dtype: how the kept values are stored: None (the Linear's dtype), "f32", "f16", "bf16", or for N:M formats 8-bit
        "fp8" (= "e4m3"), "e5m2", "int8": quantized per row after each Linear is pruned (QuantizedWeights; the Linear
        gets the dequantized values; load_sparse runs 8-bit 2:4 weights on the GPU's 8-bit kernel).
    solver: "cpu" (nmkit's C++ solvers, OpenMP on the host), "torch" (OBS with diagonal candidates into N:M formats
        in PyTorch, float64, on the device the statistics are summed on: the same algorithm as the C++ one, for a
        GPU's speed), or "auto" (torch for those on a CUDA device, cpu otherwise).
    checkpoint: a directory (made if missing) where each block's pruned weights are written as it finishes
        (block-00000.safetensors, ..., each replaced atomically, with this call's settings in its metadata). A call
        that finds files there takes the blocks they hold, in order, instead of pruning them again: their Linears
        get the stored weights and run once more over the calibration for the next block's inputs. So an
        interrupted run, called again with the same model, calibration and arguments, ends with what one
        uninterrupted run gives (a block interrupted part-way is put back to its dense weights first; restored
        weights carry no energy: None). Files written with other settings (format, method, damp, candidates,
        dtype, include, exclude, the blocks' names, the number of calibration batches) are refused with ValueError.

    The pruned weights are stored in the Linear's dtype (f32 for float32) unless `dtype` says otherwise, and written
    back into the Linear as their dense form (dequantized for 8 bits), so that the model computes what load_sparse's
    layers will. A Linear that the calibration never ran (no tokens) is kept dense with a warning. Every argument,
    and every selected weight's values, are checked before anything is pruned; an error while a block is pruned
    (e.g. a Hessian OBS cannot factor: raise damp) leaves the blocks before it pruned."""
    layer_list = find_blocks(model, blocks)
    format = _check_format(format, dtype)
    _check_options(method, damp, candidates)
    device = _model_device(model) if device is None else torch.device(device)
    solver = _resolve_solver(solver, method, format, candidates, device)
    keep, drop = _compile("include", include), _compile("exclude", exclude)
    if out is not None:
        try:
            out = os.fsdecode(os.fspath(out))
        except TypeError:
            raise TypeError(f"out must be a str, bytes or os.PathLike, got {type(out).__name__}") from None
    if checkpoint is not None:
        try:
            checkpoint = os.fsdecode(os.fspath(checkpoint))
        except TypeError:
            raise TypeError(f"checkpoint must be a str, bytes or os.PathLike, got {type(checkpoint).__name__}") from None
    selected = []  # per block: [(qualified name, Linear)]
    for block_name, block in layer_list:
        linears = [(f"{block_name}.{name}" if name else block_name, m) for name, m in block.named_modules()
                   if isinstance(m, torch.nn.Linear)]
        selected.append([(name, m) for name, m in linears
                         if (keep is None or keep.search(name)) and not (drop is not None and drop.search(name))])
    if not any(selected):
        raise ValueError("no nn.Linear inside the blocks matches include/exclude: nothing to prune")
    for linears in selected:
        for name, linear in linears:
            if not torch.isfinite(linear.weight.detach()).all():
                # the C++ names the entry
                _prune_linear(name, linear, None, format, "magnitude", damp, candidates, dtype)
    calibrated = method != "magnitude"
    if calibrated:
        if calibration is None:
            raise ValueError(f"method '{method}' needs calibration batches, got None")
        batches = list(calibration)
        if not batches:
            raise ValueError(f"the calibration is empty: method '{method}' needs at least one batch")
    store = None
    if checkpoint is not None:
        settings = {"format": format, "method": method, "damp": repr(float(damp)), "candidates": candidates,
                    "dtype": {"fp8": "e4m3"}.get(dtype, dtype), "include": _pattern_text(keep),
                    "exclude": _pattern_text(drop),
                    "blocks": [name for name, _ in layer_list], "calibration_batches": len(batches) if calibrated else 0,
                    "solver": solver}
        store = _Checkpoint(checkpoint, settings, selected)

    weights = {}
    bar = _Progress(progress, len(layer_list))
    was_training = model.training
    config = getattr(model, "config", None)
    use_cache = getattr(config, "use_cache", None)
    model.eval()
    try:
        if use_cache:
            config.use_cache = False  # a KV cache would grow with every pass over the blocks
        with torch.no_grad():
            inputs = None
            if calibrated:
                bar(0, layer_list[0][0], "calibration up to the first block")
                undo = _move_outside_blocks(model, [b for _, b in layer_list], device)
                try:
                    inputs = _capture_first_inputs(model, layer_list[0][1], batches, device)
                finally:
                    undo()
                _hidden_state(*inputs[0])  # which input the blocks' outputs replace, before any is pruned
            for index, ((block_name, block), linears) in enumerate(zip(layer_list, selected)):
                block_device = _model_device(block)
                if block_device != device:
                    block.to(device)
                try:
                    restored = store.restore(index) if store is not None else None
                    if restored is not None:
                        bar(index, block_name, "restored from the checkpoint")
                        for name, linear in linears:
                            if name in restored:
                                pruned = torch.from_numpy(restored[name].to_dense())
                                linear.weight.copy_(pruned.to(device=linear.weight.device, dtype=linear.weight.dtype))
                                weights[name] = restored[name]
                        if calibrated and index + 1 < len(layer_list):
                            bar(index, block_name, "outputs of the pruned block")
                            inputs = [_with_hidden_state(args, kwargs, _block_output(block(*args, **kwargs)))
                                      for args, kwargs in inputs]
                        continue
                    stats = {}
                    if calibrated and linears:
                        bar(index, block_name, "statistics")
                        hooks = _BlockStatistics(linears, device)
                        try:
                            for args, kwargs in inputs:
                                block(*args, **kwargs)
                                hooks.end_batch()
                        finally:
                            hooks.remove()
                        stats = hooks.stats
                    # With a checkpoint, a block interrupted part-way is put back as it was, so that a later call
                    # on the same model object prunes it from its dense weights again, as one run would.
                    dense = None if store is None else {name: linear.weight.detach().clone()
                                                        for name, linear in linears}
                    try:
                        for name, linear in linears:
                            bar(index, block_name, f"pruning {name}")
                            if calibrated and stats[name].tokens == 0:
                                warnings.warn(f"{name}: the calibration never ran it; kept dense", RuntimeWarning,
                                              stacklevel=2)
                                continue
                            weight, pruned = _prune_linear(name, linear, stats.get(name), format, method, damp,
                                                           candidates, dtype, solver)
                            if pruned is None:
                                pruned = torch.from_numpy(weight.to_dense())
                            linear.weight.copy_(pruned.to(device=linear.weight.device, dtype=linear.weight.dtype))
                            weights[name] = weight
                    except BaseException:
                        if dense is not None:
                            for name, linear in linears:
                                linear.weight.copy_(dense[name])
                                weights.pop(name, None)
                        raise
                    del stats, dense
                    if store is not None:
                        bar(index, block_name, "writing the checkpoint")
                        store.write(index, {name: weights[name] for name, _ in linears if name in weights})
                    if calibrated and index + 1 < len(layer_list):
                        bar(index, block_name, "outputs of the pruned block")
                        inputs = [_with_hidden_state(args, kwargs, _block_output(block(*args, **kwargs)))
                                  for args, kwargs in inputs]
                finally:
                    if block_device != device:
                        block.to(block_device)
            bar(len(layer_list), "", "done")
    finally:
        bar.close()
        if use_cache:
            config.use_cache = use_cache
        model.train(was_training)
    if out is not None:
        _nmkit._save_file(out, _state_entries(model, weights),
                          {"pruned_by": "nmkit.torch.prune_model", "method": method, "format": format})
    return weights
