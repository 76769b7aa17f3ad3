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

from . import SparseWeight, _nmkit, load_file, prune

__all__ = ["SparseLinear", "sparsify", "load_sparse"]

_DTYPES = {torch.float16: "f16", torch.bfloat16: "bf16"}
_ALIGNMENT = 16  # bytes: the Hopper kernels' TMA needs 16-byte aligned rows and bases


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
        if weight.dtype not in _DTYPES.values():
            raise TypeError(f"SparseLinear needs an f16 or bf16 weight, got {weight.dtype} (prune with dtype='f16')")
        device = torch.device("cuda" if device is None else device)
        if device.type != "cuda":
            raise ValueError(f"SparseLinear runs on a CUDA device, got {device}")
        self.device = device if device.index is not None else torch.device("cuda", torch.cuda.current_device())
        self._device_index = self.device.index
        self.out_features, self.in_features = weight.shape
        self.dtype = next(t for t, name in _DTYPES.items() if name == weight.dtype)
        self.format = weight.format
        with torch.cuda.device(self.device):
            self._layer = _nmkit._SparseLinear(weight, activation, bias is not None)
        if bias is not None:
            if tuple(bias.shape) != (self.out_features,):
                raise ValueError(f"bias must have shape ({self.out_features},), got {tuple(bias.shape)}")
            bias = bias.detach().to(device=self.device, dtype=torch.float32).contiguous()
        self.register_buffer("bias", bias)
        self.activation = activation

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, format: str = "2:4", activation: str = "none",
                    dtype: Optional[torch.dtype] = None) -> "SparseLinear":
        """Prunes `linear`'s weight by magnitude into `format` and builds the layer on its device (or the current
        CUDA device); dtype defaults to the weight's own (f16 or bf16)."""
        dtype = dtype or linear.weight.dtype
        if dtype not in _DTYPES:
            raise TypeError(f"SparseLinear computes in float16 or bfloat16, got {dtype} (pass dtype=torch.float16)")
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
            self._check_input(x)
        tokens = x.numel() // self.in_features
        x2 = x.view(tokens, self.in_features) if x.is_contiguous() else x.reshape(tokens, self.in_features)
        if not x2.is_contiguous() or x2.data_ptr() % _ALIGNMENT:
            x2 = x2.clone(memory_format=torch.contiguous_format)  # a fresh allocation is aligned
        if out is None:
            y = torch.empty((tokens, self.out_features), dtype=self.dtype, device=self.device)
        else:
            self._check_output(out, tokens)
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

    def _check_input(self, x: torch.Tensor) -> None:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
        if x.device != self.device:
            raise ValueError(f"x is on {x.device}, the layer on {self.device}")
        if x.dtype != self.dtype:
            raise TypeError(f"x is {x.dtype}, the layer computes in {self.dtype}")
        if x.dim() < 1 or x.shape[-1] != self.in_features:
            raise ValueError(f"x must have {self.in_features} features in its last dimension, got shape {tuple(x.shape)}")
        if x.requires_grad and torch.is_grad_enabled():
            raise RuntimeError("SparseLinear is inference-only (no backward); call it under torch.no_grad() or "
                               "torch.inference_mode()")

    def _check_output(self, out: torch.Tensor, tokens: int) -> None:
        if out.device != self.device or out.dtype != self.dtype:
            raise TypeError(f"out must be {self.dtype} on {self.device}, got {out.dtype} on {out.device}")
        if out.numel() != tokens * self.out_features or out.shape[-1] != self.out_features:
            raise ValueError(f"out must hold {tokens} x {self.out_features} values, got shape {tuple(out.shape)}")
        if not out.is_contiguous() or out.data_ptr() % _ALIGNMENT:
            raise ValueError("out must be contiguous and 16-byte aligned")

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, format='{self.format}', "
                f"dtype={self.dtype}, bias={self.bias is not None}, activation='{self.activation}'")


def _replace(model: torch.nn.Module, name: str, layer: torch.nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, layer)


def _linears(model: torch.nn.Module, include: str, exclude: Optional[str]):
    keep, drop = re.compile(include), re.compile(exclude) if exclude else None
    return [(name, m) for name, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) and keep.search(name) and not (drop and drop.search(name))]


def sparsify(model: torch.nn.Module, format: str = "2:4", include: str = "", exclude: Optional[str] = None,
             dtype: Optional[torch.dtype] = None) -> list:
    """Replaces every nn.Linear of `model` whose qualified name matches the regex `include` (default: all) and not
    `exclude` by a SparseLinear pruned by magnitude into `format`, on the Linear's device (or the current CUDA
    device). Returns the names replaced. Pruning runs on the CPU, once per layer."""
    replaced = []
    for name, linear in _linears(model, include, exclude):
        _replace(model, name, SparseLinear.from_linear(linear, format, dtype=dtype))
        replaced.append(name)
    return replaced


def load_sparse(model: torch.nn.Module, path: str, strict: bool = True) -> list:
    """Replaces each nn.Linear `name` of `model` for which the file at `path` (written by `nmkit prune`) holds a
    compressed `name.weight` by a SparseLinear with that weight and the Linear's own bias. Every pair is checked
    before any layer is replaced: shapes must match, and with `strict` every compressed weight of the file must find
    its Linear. Returns the names replaced."""
    linears = dict(_linears(model, "", None))
    pairs = []
    for key, weight in load_file(path).items():
        name = key[:-len(".weight")] if key.endswith(".weight") else None
        linear = linears.get(name)
        if linear is None:
            if strict:
                raise KeyError(f"{path}: the compressed weight '{key}' has no nn.Linear '{name}' in the model")
            continue
        if weight.shape != (linear.out_features, linear.in_features):
            raise ValueError(f"{path}: '{key}' is {weight.shape[0]}x{weight.shape[1]}, the model's Linear "
                             f"'{name}' {linear.out_features}x{linear.in_features}")
        pairs.append((name, linear, weight))
    for name, linear, weight in pairs:
        if weight.dtype not in _DTYPES.values():  # a file pruned from fp32 weights: the GPU kernels take 16 bits
            weight = weight.astype(_DTYPES.get(linear.weight.dtype, "f16"))
        device = linear.weight.device if linear.weight.is_cuda else None
        _replace(model, name, SparseLinear(weight, linear.bias, device=device))
    return [name for name, _, _ in pairs]
