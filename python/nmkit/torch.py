"""nmkit.torch: sparse linear layers for PyTorch on nmkit's GPU kernels (inference).

    import torch, nmkit.torch
    dense = torch.nn.Linear(4096, 11008, dtype=torch.float16, device="cuda")
    sparse = nmkit.torch.SparseLinear.from_linear(dense, "2:4")      # prunes by magnitude, packs, uploads
    y = sparse(x)                                                     # x [..., 4096] f16 on the GPU

The layer computes y = act(x W^T + b) for x row-major (the layout nn.Linear takes, no transpose), on the current
CUDA stream, with one kernel launch and no synchronisation; each token count gets its plan on first use. Formats:
"2:4", "vnm:V:2:M" (V:N:M; the 2:4 kernel over all of K where M % 4 == 0, the gathering kernel otherwise) and
"tile:RxC:DENSITY". It has no backward: inputs that require grad are refused while grad mode is on.
"""
from __future__ import annotations

import re
from typing import Optional

import torch

from . import QuantizedWeight, SparseWeight, _nmkit, load_file, prune

__all__ = ["SparseLinear", "sparsify", "load_sparse", "prune_model"]

_DTYPES = {torch.float16: "f16", torch.bfloat16: "bf16"}
_ALIGNMENT = 16  # bytes: the Hopper kernels' TMA needs 16-byte aligned rows and bases


def _device_layer(weight: SparseWeight, activation: str, has_bias: bool, device: torch.device):
    """The GPU side of a layer: the device it runs on (the current CUDA device where `device` has no index) and
    nmkit's C++ layer holding the packed weight there. Everything else in this module runs before it, on the host,
    and is tested on CPU-only machines with this function replaced by a CPU stand-in (python/tests/test_torch.py)."""
    if not hasattr(_nmkit, "_SparseLinear"):
        raise RuntimeError("SparseLinear needs nmkit's GPU kernels, and this nmkit was built without CUDA "
                           "(nmkit.build_info()['cuda'] is False)")
    if not torch.cuda.is_available():
        raise RuntimeError("SparseLinear needs a CUDA device, and PyTorch sees none" +
                           (" (this PyTorch was built without CUDA)" if torch.version.cuda is None else ""))
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    with torch.cuda.device(device):
        return device, _nmkit._SparseLinear(weight, activation, has_bias)


def _check_device(device) -> torch.device:
    device = torch.device("cuda" if device is None else device)
    if device.type != "cuda":
        raise ValueError(f"SparseLinear runs on a CUDA device, got {device}")
    return device


def _check_activation(activation) -> str:
    if not isinstance(activation, str):
        raise TypeError(f"activation must be a string ('none', 'relu' or 'gelu'), got {type(activation).__name__}")
    return _nmkit._check_activation(activation)


def _check_input(x, device: torch.device, dtype: torch.dtype, in_features: int) -> None:
    """The checks of a call's x, naming what is wrong (SparseLinear.forward runs them when its cheap test fails)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.device != device:
        raise ValueError(f"x is on {x.device}, the layer on {device}")
    if x.dtype != dtype:
        raise TypeError(f"x is {x.dtype}, the layer computes in {dtype}")
    if x.dim() < 1 or x.shape[-1] != in_features:
        raise ValueError(f"x must have {in_features} features in its last dimension, got shape {tuple(x.shape)}")
    if x.requires_grad and torch.is_grad_enabled():
        raise RuntimeError("SparseLinear is inference-only (no backward); call it under torch.no_grad() or "
                           "torch.inference_mode()")


def _check_output(out, tokens: int, device: torch.device, dtype: torch.dtype, out_features: int) -> None:
    """The checks of a call's `out` for `tokens` rows of x."""
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out must be a torch.Tensor, got {type(out).__name__}")
    if out.device != device or out.dtype != dtype:
        raise TypeError(f"out must be {dtype} on {device}, got {out.dtype} on {out.device}")
    if out.dim() < 1 or out.numel() != tokens * out_features or out.shape[-1] != out_features:
        raise ValueError(f"out must hold {tokens} x {out_features} values, got shape {tuple(out.shape)}")
    if not out.is_contiguous() or out.data_ptr() % _ALIGNMENT:
        raise ValueError("out must be contiguous and 16-byte aligned")


def _current_stream(device_index: int) -> int:
    """The cudaStream_t of PyTorch's current stream on the device, as an integer."""
    return torch.cuda.current_stream(device_index).cuda_stream


# PyTorch's raw accessor skips building a Stream object (several microseconds per call); the public one otherwise.
if hasattr(torch._C, "_cuda_getCurrentRawStream"):
    _current_stream = torch._C._cuda_getCurrentRawStream  # noqa: F811


class SparseLinear(torch.nn.Module):
    """y = act(x W^T + bias) with W a pruned weight on nmkit's sparse kernels."""

    def __init__(self, weight: SparseWeight, bias: Optional[torch.Tensor] = None, activation: str = "none",
                 device=None):
        super().__init__()
        # Every argument is checked before the device is needed (_device_layer), so that a wrong one is named as
        # such on any machine, and a machine without CUDA says so only for arguments that would work.
        if isinstance(weight, QuantizedWeight):
            raise NotImplementedError(
                f"SparseLinear: the GPU kernels for 8-bit weights ({weight.dtype} {weight.format}) are not built yet; "
                "prune with dtype='f16' or 'bf16' for the GPU, or use the dequantized weight.to_dense() in a dense "
                "torch.nn.Linear")
        if not isinstance(weight, SparseWeight):
            raise TypeError(f"weight must be an nmkit.SparseWeight (nmkit.prune, compress or load_file), "
                            f"got {type(weight).__name__}")
        if weight.dtype not in _DTYPES.values():
            raise TypeError(f"SparseLinear needs an f16 or bf16 weight, got {weight.dtype} (prune with dtype='f16')")
        activation = _check_activation(activation)
        device = _check_device(device)
        out_features, in_features = weight.shape
        if bias is not None:
            if not isinstance(bias, torch.Tensor):
                raise TypeError(f"bias must be a torch.Tensor or None, got {type(bias).__name__}")
            if not bias.is_floating_point():
                raise TypeError(f"bias must hold floating-point values, got {bias.dtype}")
            if tuple(bias.shape) != (out_features,):
                raise ValueError(f"bias must have shape ({out_features},), got {tuple(bias.shape)}")
        self.device, self._layer = _device_layer(weight, activation, bias is not None, device)
        # tensor.get_device()'s number for the device: the call's cheap test compares it (-1 would be the CPU).
        self._device_index = -1 if self.device.index is None else self.device.index
        self.out_features, self.in_features = out_features, in_features
        self.dtype = next(t for t, name in _DTYPES.items() if name == weight.dtype)
        self.format = weight.format
        if bias is not None:
            bias = bias.detach().to(device=self.device, dtype=torch.float32).contiguous()
        self.register_buffer("bias", bias)
        self.activation = activation

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, format: str = "2:4", activation: str = "none",
                    dtype: Optional[torch.dtype] = None) -> "SparseLinear":
        """Prunes `linear`'s weight by magnitude into `format` and builds the layer on its device (or the current
        CUDA device); dtype defaults to the weight's own (f16 or bf16)."""
        if not isinstance(linear, torch.nn.Linear):
            raise TypeError(f"from_linear takes a torch.nn.Linear, got {type(linear).__name__}")
        dtype = dtype or linear.weight.dtype
        if dtype not in _DTYPES:
            raise TypeError(f"SparseLinear computes in float16 or bfloat16, got {dtype} (pass dtype=torch.float16)")
        _check_activation(activation)  # before pruning, which takes seconds on large weights
        weight = prune(linear.weight.detach().float().cpu().numpy(), format, _DTYPES[dtype])
        device = linear.weight.device if linear.weight.is_cuda else None
        return cls(weight, linear.bias, activation, device)

    def kernel(self, tokens: int) -> str:
        """The kernel a call with `tokens` rows of x launches (its plan is made if there is none yet)."""
        with torch.cuda.device(self.device):
            return self._layer.kernel(tokens)

    def forward(self, x: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        # The per-call path is kept to cheap attribute reads: the full checks, which name what is wrong, run only
        # when one of these fails (bench/torch_linear.py measures the host time of a call).
        try:
            suspect = (x.dtype is not self.dtype or x.get_device() != self._device_index or x.dim() == 0
                       or x.shape[-1] != self.in_features or (x.requires_grad and torch.is_grad_enabled()))
        except AttributeError:
            suspect = True
        if suspect:
            _check_input(x, self.device, self.dtype, self.in_features)
        tokens = x.numel() // self.in_features
        x2 = x.view(tokens, self.in_features) if x.is_contiguous() else x.reshape(tokens, self.in_features)
        if not x2.is_contiguous() or x2.data_ptr() % _ALIGNMENT:
            x2 = x2.clone(memory_format=torch.contiguous_format)  # a fresh allocation is aligned
        if out is None:
            y = torch.empty((tokens, self.out_features), dtype=self.dtype, device=self.device)
        else:
            _check_output(out, tokens, self.device, self.dtype, self.out_features)
            y = out.view(tokens, self.out_features)
        self._layer.run(x2.data_ptr(), y.data_ptr(), tokens, self._bias_pointer(), _current_stream(self._device_index))
        if out is not None:
            return out
        return y if x.dim() == 2 else y.view(*x.shape[:-1], self.out_features)

    def _bias_pointer(self) -> int:
        if self.bias is None:
            return 0
        if self.bias.get_device() != self._device_index:
            raise RuntimeError(f"SparseLinear's weight stays on {self.device}; its bias was moved to {self.bias.device}")
        if self.bias.dtype != torch.float32:  # the kernels add an fp32 bias (module.half() casts buffers)
            self.bias = self.bias.float()
        return self.bias.data_ptr()

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, format='{self.format}', "
                f"dtype={self.dtype}, bias={self.bias is not None}, activation='{self.activation}'")


def _replace(model: torch.nn.Module, name: str, layer: torch.nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, layer)


def _linears(model: torch.nn.Module, include: str, exclude: Optional[str]):
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    patterns = []
    for what, pattern in (("include", include), ("exclude", exclude or None)):
        try:
            patterns.append(None if pattern is None else re.compile(pattern))
        except (re.error, TypeError) as e:
            raise ValueError(f"{what} must be a regular expression, got {pattern!r} ({e})") from None
    keep, drop = patterns
    return [(name, m) for name, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) and keep.search(name) and not (drop and drop.search(name))]


def _replace_all(model: torch.nn.Module, makers) -> list:
    """Makes the layer of every (name, make) pair, then puts them all in place: the model changes whole or not at
    all. An error names the layer it was making. Returns the names replaced."""
    layers = []
    for name, make in makers:
        try:
            layers.append((name, make()))
        except Exception as e:
            if hasattr(e, "add_note"):  # Python 3.11+: the layer's name under the message
                e.add_note(f"(making the SparseLinear for '{name}')")
            raise
    for name, layer in layers:
        _replace(model, name, layer)
    return [name for name, _ in layers]


def sparsify(model: torch.nn.Module, format: str = "2:4", include: str = "", exclude: Optional[str] = None,
             dtype: Optional[torch.dtype] = None) -> list:
    """Replaces every nn.Linear of `model` whose qualified name matches the regex `include` (default: all) and not
    `exclude` by a SparseLinear pruned by magnitude into `format`, on the Linear's device (or the current CUDA
    device). Returns the names replaced. Pruning runs on the CPU, once per layer. Every layer is made before any is
    replaced: where one cannot be (a bad format, a float32 Linear without `dtype`, no CUDA device), the model is
    left as it was."""
    return _replace_all(model, ((name, lambda linear=linear: SparseLinear.from_linear(linear, format, dtype=dtype))
                                for name, linear in _linears(model, include, exclude)))


def load_sparse(model: torch.nn.Module, path, strict: bool = True) -> list:
    """Replaces each nn.Linear `name` of `model` for which the file at `path` (written by `nmkit prune`) holds a
    compressed `name.weight` by a SparseLinear with that weight and the Linear's own bias. Every pair is checked
    and every layer made before any is replaced: shapes must match, and with `strict` every compressed weight of the
    file must find its Linear. Weights stored as f32 are rounded to the Linear's dtype (f16 unless it is bf16); 8-bit
    weights (QuantizedWeight) raise NotImplementedError (no GPU kernels for them yet). Returns the names replaced."""
    linears = dict(_linears(model, "", None))
    pairs = []
    for key, weight in load_file(path).items():
        name = key[:-len(".weight")] if key.endswith(".weight") else None
        linear = linears.get(name)
        if linear is None:
            if strict:
                raise KeyError(f"{path}: the compressed weight '{key}' has no nn.Linear '{name}' in the model"
                               if name is not None else f"{path}: the compressed tensor '{key}' is not a Linear's "
                               "'<name>.weight'")
            continue
        if weight.shape != (linear.out_features, linear.in_features):
            raise ValueError(f"{path}: '{key}' is {weight.shape[0]}x{weight.shape[1]}, the model's Linear "
                             f"'{name}' {linear.out_features}x{linear.in_features}")
        pairs.append((name, linear, weight))

    def make(linear, weight):
        # A file pruned from fp32 weights: the GPU kernels take 16 bits (8-bit weights: SparseLinear says why not).
        if isinstance(weight, SparseWeight) and weight.dtype not in _DTYPES.values():
            weight = weight.astype(_DTYPES.get(linear.weight.dtype, "f16"))
        return SparseLinear(weight, linear.bias, device=linear.weight.device if linear.weight.is_cuda else None)

    return _replace_all(model, ((name, lambda linear=linear, weight=weight: make(linear, weight))
                                for name, linear, weight in pairs))


from .prune_model import prune_model  # noqa: E402  (calibrated pruning of whole models, block by block)
