"""nmkit.torch: sparse linear layers for PyTorch on nmkit's GPU kernels (inference).

    import torch, nmkit.torch
    dense = torch.nn.Linear(4096, 11008, dtype=torch.float16, device="cuda")
    sparse = nmkit.torch.SparseLinear.from_linear(dense, "2:4")      # prunes by magnitude, packs, uploads
    y = sparse(x)                                                     # x [..., 4096] f16 on the GPU

The layer computes y = act(x W^T + b) for x row-major (the layout nn.Linear takes, no transpose), on the current
CUDA stream, with one kernel launch and no synchronisation; each token count gets its plan on first use. Formats:
"2:4", "vnm:V:2:M" (V:N:M; the 2:4 kernel over all of K where M % 4 == 0, the gathering kernel otherwise) and
"tile:RxC:DENSITY". It has no backward: inputs that require grad are refused while grad mode is on.

A chain of layers can hand x on feature-major: with `layer.feature_major_output = True` the layer returns y as the
[..., R] view of a y^T it wrote (where the token count is a multiple of 8), elementwise ops keep that layout, and a
condensed V:N:M layer (the row gather) reads such an x (x^T contiguous) as it is, where it would transpose
token-major x first (other layers copy it to x, which their kernels read faster):

    gate.feature_major_output = up.feature_major_output = True
    y = down(F.silu(gate(x)) * up(x))                                 # a condensed V:N:M down reads x^T as it is

8-bit 2:4 weights (an nmkit.QuantizedWeight: e4m3, e5m2 or int8 codes with a scale per row) run on the 8-bit
kernel, x (f16 or bf16) quantized per token to the weight's code type inside the call (two launches) and y in x's
dtype; in_features must be a multiple of 16:

    fp8 = nmkit.torch.SparseLinear.from_linear(dense, "2:4", quantize="fp8")   # or "e5m2", "int8"
    fp8 = nmkit.torch.SparseLinear(nmkit.prune(w, "2:4", dtype="fp8"), dtype=torch.bfloat16)

DFSS attention (docs/attention.md) on nmkit's fused Hopper kernel, inference only:

    o = nmkit.torch.dfss_attention(q, k, v, causal=True)             # q [B, H, S, D], k/v [B, H_kv, S_k, D]
    o = nmkit.torch.dfss_attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k)   # FlashAttention's varlen form
    nmkit.torch.use_dfss_attention(model)                             # a transformers model's attention to DFSS
"""
from __future__ import annotations

import functools
import math
import numbers
import re
from typing import Optional

import torch

from . import QuantizedWeight, SparseWeight, _nmkit, load_file, prune

__all__ = ["SparseLinear", "sparsify", "load_sparse", "prune_model", "dfss_attention", "dfss_attention_varlen",
           "use_dfss_attention", "register_transformers_attention"]

_DTYPES = {torch.float16: "f16", torch.bfloat16: "bf16"}
_ALIGNMENT = 16  # bytes: the Hopper kernels' TMA needs 16-byte aligned rows and bases
_QUANTIZE = ("fp8", "e4m3", "e5m2", "int8")  # the 8-bit types from_linear and sparsify quantize to
_QUANTIZED_COLUMNS = 16  # the 8-bit kernel reads x's codes by TMA rows: K a multiple of 16 (gpu::SparseLinear's rule)
_ROW_TOKENS = 8  # feature-major x and y: rows of x^T / y^T as whole 16-byte pieces, which the row gather reads


def _device_layer(weight, activation: str, has_bias: bool, device: torch.device, dtype: torch.dtype):
    """The GPU side of a layer: the device it runs on (the current CUDA device where `device` has no index) and
    nmkit's C++ layer holding the packed weight there (an 8-bit weight with x and y of `dtype`). Everything else in
    this module runs before it, on the host, and is tested on CPU-only machines with this function replaced by a CPU
    stand-in (python/tests/test_torch.py)."""
    if not hasattr(_nmkit, "_SparseLinear"):
        raise RuntimeError("SparseLinear needs nmkit's GPU kernels, and this nmkit was built without CUDA "
                           "(nmkit.build_info()['cuda'] is False)")
    if not torch.cuda.is_available():
        raise RuntimeError("SparseLinear needs a CUDA device, and PyTorch sees none" +
                           (" (this PyTorch was built without CUDA)" if torch.version.cuda is None else ""))
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    with torch.cuda.device(device):
        if isinstance(weight, QuantizedWeight):
            return device, _nmkit._SparseLinear(weight, activation, has_bias, _DTYPES[dtype])
        return device, _nmkit._SparseLinear(weight, activation, has_bias)


def _check_weight(weight, dtype) -> torch.dtype:
    """The dtype a layer of `weight` computes in (x and y): a 16-bit weight's own, or `dtype` for an 8-bit one. Also
    the 8-bit rules of gpu::SparseLinear::create, here so that they are named on machines without CUDA."""
    if isinstance(weight, QuantizedWeight):
        if weight.format != "2:4":
            raise NotImplementedError(
                f"SparseLinear: 8-bit weights run on the GPU as 2:4 only, this one is {weight.dtype} {weight.format} "
                "(prune it to '2:4', or store its values as f16 or bf16 for the other formats' kernels)")
        if dtype is None:
            raise TypeError(f"SparseLinear of an 8-bit weight ({weight.dtype} 2:4) needs dtype=torch.float16 or "
                            "torch.bfloat16: the dtype of x and y")
        if dtype not in _DTYPES:
            raise TypeError(f"SparseLinear of an 8-bit weight computes x and y in float16 or bfloat16, got {dtype}")
        if weight.shape[1] % _QUANTIZED_COLUMNS:
            raise NotImplementedError(
                f"SparseLinear: an 8-bit weight needs in_features a multiple of {_QUANTIZED_COLUMNS} (the 8-bit "
                f"kernel reads x's codes by TMA rows), got {weight.shape[1]}")
        return dtype
    if not isinstance(weight, SparseWeight):
        raise TypeError(f"weight must be an nmkit.SparseWeight or QuantizedWeight (nmkit.prune, compress or "
                        f"load_file), got {type(weight).__name__}")
    if weight.dtype not in _DTYPES.values():
        raise TypeError(f"SparseLinear needs an f16 or bf16 weight, got {weight.dtype} (prune with dtype='f16')")
    own = next(t for t, name in _DTYPES.items() if name == weight.dtype)
    if dtype is not None and dtype != own:
        raise TypeError(f"SparseLinear computes in its {weight.dtype} weight's dtype {own}, got dtype={dtype} (dtype= "
                        "is for 8-bit weights; convert a 16-bit one with weight.astype)")
    return own


def _check_quantize(quantize, format) -> None:
    """from_linear's and sparsify's `quantize` (None or an 8-bit type), checked before anything is pruned."""
    if quantize is None:
        return
    if not isinstance(quantize, str) or quantize not in _QUANTIZE:
        raise ValueError(f"quantize must be None or one of {', '.join(_QUANTIZE)}, got {quantize!r}")
    if format != "2:4":
        raise NotImplementedError(f"SparseLinear: 8-bit weights run on the GPU as 2:4 only, got format {format!r} "
                                  f"with quantize={quantize!r}")


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
    """y = act(x W^T + bias) with W a pruned weight on nmkit's sparse kernels.

    8-bit layers quantize x, and condensed V:N:M layers transpose it (and pad it), into scratch that each call
    takes from PyTorch's caching allocator (so the layers of a model share it, and CUDA graphs capture it). Plans
    are made per bucket of token counts at the first call of each: run the layer once at the token counts a
    CUDA graph will see before capturing it."""

    def __init__(self, weight, bias: Optional[torch.Tensor] = None, activation: str = "none", device=None,
                 dtype: Optional[torch.dtype] = None):
        """weight: a SparseWeight (f16 or bf16; the layer computes in its dtype) or an 8-bit 2:4 QuantizedWeight
        (x and y then of `dtype`, float16 or bfloat16, x quantized per token inside each call)."""
        super().__init__()
        # Every argument is checked before the device is needed (_device_layer), so that a wrong one is named as
        # such on any machine, and a machine without CUDA says so only for arguments that would work.
        dtype = _check_weight(weight, dtype)
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
        self.device, self._layer = _device_layer(weight, activation, bias is not None, device, dtype)
        # tensor.get_device()'s number for the device: the call's cheap test compares it (-1 would be the CPU).
        self._device_index = -1 if self.device.index is None else self.device.index
        self.out_features, self.in_features = out_features, in_features
        self.dtype = dtype
        # The weight's 8-bit code type (None: 16-bit), and its format as the C++ layer names it ("2:4 e4m3").
        self.quantized = weight.dtype if isinstance(weight, QuantizedWeight) else None
        self.format = weight.format if self.quantized is None else f"{weight.format} {self.quantized}"
        # Whether a call hands x given as x^T (a [T, K] view with strides (1, ldx), ldx % 8 == 0) to the kernel as
        # it is: condensed V:N:M layers, whose row gather reads it without the transpose token-major x needs. The
        # others take x contiguous (PyTorch's copy), as their kernels read it faster than x^T.
        self._reads_features = self._layer.reads_feature_major_in_place
        # Layers that need device scratch for some token counts: x quantized (8-bit), x transposed (the row gather).
        self._scratch = self.quantized is not None or self._reads_features
        self.feature_major_output = False
        if bias is not None:
            bias = bias.detach().to(device=self.device, dtype=torch.float32).contiguous()
        self.register_buffer("bias", bias)
        self.activation = activation

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, format: str = "2:4", activation: str = "none",
                    dtype: Optional[torch.dtype] = None, quantize: Optional[str] = None) -> "SparseLinear":
        """Prunes `linear`'s weight by magnitude into `format` and builds the layer on its device (or the current
        CUDA device); dtype (x's and y's) defaults to the weight's own (f16 or bf16). quantize ("fp8" = "e4m3",
        "e5m2" or "int8"; 2:4 only) stores the kept values as 8-bit codes with a scale per row instead, and each
        call quantizes x per token."""
        if not isinstance(linear, torch.nn.Linear):
            raise TypeError(f"from_linear takes a torch.nn.Linear, got {type(linear).__name__}")
        dtype = dtype or linear.weight.dtype
        if dtype not in _DTYPES:
            raise TypeError(f"SparseLinear computes in float16 or bfloat16, got {dtype} (pass dtype=torch.float16)")
        _check_activation(activation)  # before pruning, which takes seconds on large weights
        _check_quantize(quantize, format)
        if quantize is not None and linear.in_features % _QUANTIZED_COLUMNS:
            raise NotImplementedError(
                f"SparseLinear: an 8-bit weight needs in_features a multiple of {_QUANTIZED_COLUMNS} (the 8-bit "
                f"kernel reads x's codes by TMA rows), got {linear.in_features}")
        weight = prune(linear.weight.detach().float().cpu().numpy(), format, quantize or _DTYPES[dtype])
        device = linear.weight.device if linear.weight.is_cuda else None
        return cls(weight, linear.bias, activation, device, dtype if quantize is not None else None)

    def kernel(self, tokens: int, feature_major_x: bool = False) -> str:
        """The kernel a call with `tokens` rows of x launches (its plan is made if there is none yet): x token-major
        (contiguous), or feature-major (x^T contiguous) where feature_major_x; y as feature_major_output says."""
        with torch.cuda.device(self.device):
            whole_rows = tokens > 1 and tokens % _ROW_TOKENS == 0
            return self._layer.kernel(tokens, feature_major_x and self._reads_features and whole_rows, 0,
                                      self.feature_major_output and whole_rows)

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
        x_features, ldx = False, 0
        if x.is_contiguous():
            x2 = x.view(tokens, self.in_features)
        else:
            x2 = x.reshape(tokens, self.in_features)  # a view where x's strides allow one
            # x^T contiguous (a feature-major layer's output, through elementwise ops) with rows of whole 16-byte
            # pieces: read in place where the kernel takes it; any other layout is copied to x contiguous.
            if (self._reads_features and tokens > 1 and x2.stride(0) == 1 and x2.stride(1) >= tokens
                    and x2.stride(1) % _ROW_TOKENS == 0 and x2.data_ptr() % _ALIGNMENT == 0):
                x_features, ldx = True, x2.stride(1)
            elif not x2.is_contiguous():
                x2 = x2.clone(memory_format=torch.contiguous_format)
        if x2.data_ptr() % _ALIGNMENT:
            x2 = x2.clone(memory_format=torch.contiguous_format)  # a fresh allocation is aligned
            x_features, ldx = False, 0
        y_features = out is None and self.feature_major_output and tokens > 1 and tokens % _ROW_TOKENS == 0
        if out is not None:
            _check_output(out, tokens, self.device, self.dtype, self.out_features)
            y = out.view(tokens, self.out_features)
        elif y_features:
            # y^T [R, T] contiguous, returned as its [T, R] view: elementwise ops keep the layout, and a SparseLinear
            # that reads it takes it without a transpose.
            y = torch.empty((self.out_features, tokens), dtype=self.dtype, device=self.device).t()
        else:
            y = torch.empty((tokens, self.out_features), dtype=self.dtype, device=self.device)
        stream = _current_stream(self._device_index)
        scratch = self._layer.workspace_bytes(tokens, x_features, ldx) if self._scratch else 0
        if scratch or x_features or y_features:
            # From PyTorch's caching allocator, per call: freed in stream order after the launch, so that one block
            # serves every layer in turn (and a CUDA graph's pool holds it) instead of a buffer per layer.
            workspace = torch.empty(scratch, dtype=torch.uint8, device=self.device) if scratch else None
            self._layer.run_on(x2.data_ptr(), y.data_ptr(), tokens, self._bias_pointer(), stream,
                               workspace.data_ptr() if scratch else 0, scratch, x_features, ldx, y_features)
        else:
            self._layer.run(x2.data_ptr(), y.data_ptr(), tokens, self._bias_pointer(), stream)
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
             dtype: Optional[torch.dtype] = None, quantize: Optional[str] = None) -> list:
    """Replaces every nn.Linear of `model` whose qualified name matches the regex `include` (default: all) and not
    `exclude` by a SparseLinear pruned by magnitude into `format` (with `quantize`, 8-bit values: from_linear), on
    the Linear's device (or the current CUDA device). Returns the names replaced. Pruning runs on the CPU, once per
    layer. Every layer is made before any is replaced: where one cannot be (a bad format, a float32 Linear without
    `dtype`, no CUDA device), the model is left as it was."""
    _check_quantize(quantize, format)
    return _replace_all(model, ((name, lambda linear=linear: SparseLinear.from_linear(linear, format, dtype=dtype,
                                                                                      quantize=quantize))
                                for name, linear in _linears(model, include, exclude)))


def load_sparse(model: torch.nn.Module, path, strict: bool = True) -> list:
    """Replaces each nn.Linear `name` of `model` for which the file at `path` (written by `nmkit prune`) holds a
    compressed `name.weight` by a SparseLinear with that weight and the Linear's own bias. Every pair is checked
    and every layer made before any is replaced: shapes must match, and with `strict` every compressed weight of the
    file must find its Linear. Weights stored as f32 are rounded to the Linear's dtype (f16 unless it is bf16); 8-bit
    2:4 weights (QuantizedWeight) run on the 8-bit kernel with x and y in the Linear's dtype (f16 unless it is
    bf16), other 8-bit formats raise NotImplementedError. Returns the names replaced."""
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
        # A file pruned from fp32 weights: the GPU kernels take 16 bits; an 8-bit weight computes in 16 bits too.
        dtype = linear.weight.dtype if linear.weight.dtype in _DTYPES else torch.float16
        if isinstance(weight, SparseWeight) and weight.dtype not in _DTYPES.values():
            weight = weight.astype(_DTYPES[dtype])
        return SparseLinear(weight, linear.bias, device=linear.weight.device if linear.weight.is_cuda else None,
                            dtype=dtype if isinstance(weight, QuantizedWeight) else None)

    return _replace_all(model, ((name, lambda linear=linear, weight=weight: make(linear, weight))
                                for name, linear, weight in pairs))


# DFSS attention: O = softmax(prune(scale * Q K^T)) V, each row of scores pruned to 2:4 over the keys (in each group
# of 4 consecutive keys the 2 largest scores are kept, ties to the lower key index; masked keys never), by nmkit's
# fused Hopper kernel (include/nmkit/attention/dfss_gpu.hpp). The functions below check the tensors on the host and pass
# their pointers and strides; every check runs before the device is needed, so a wrong argument is named as such on
# any machine.

_ATTENTION_PATTERNS = ("2:4", "dense")  # dense: the same kernel with pruning off (the control)
_HEAD_DIMS = (64, 128)


def _attention_device(q: torch.Tensor) -> int:
    """The index of the CUDA device the attention runs on (q's), or why it cannot run. With _launch_attention, the
    only code that needs CUDA; python/tests/test_attention.py replaces both by CPU stand-ins."""
    if q.device.type != "cuda":
        raise ValueError(f"q is on {q.device}; DFSS attention runs on a CUDA device")
    if not hasattr(_nmkit, "_attention"):
        raise RuntimeError("DFSS attention needs nmkit's GPU kernels, and this nmkit was built without CUDA "
                           "(nmkit.build_info()['cuda'] is False)")
    return q.device.index


def _launch_attention(device_index: int, *args) -> None:
    """_nmkit._attention(*args, stream) on the device's current PyTorch stream: one launch, no synchronisation."""
    if device_index == torch.cuda.current_device():
        _nmkit._attention(*args, _current_stream(device_index))
    else:
        with torch.cuda.device(device_index):
            _nmkit._attention(*args, _current_stream(device_index))


def _check_attention_options(causal, pattern, scale, return_lse) -> Optional[float]:
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if not isinstance(pattern, str):
        raise TypeError(f"pattern must be a string ('2:4' or 'dense'), got {type(pattern).__name__}")
    if pattern not in _ATTENTION_PATTERNS:
        raise ValueError(f"pattern must be '2:4' or 'dense', got {pattern!r}")
    if scale is not None:
        if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
            raise TypeError(f"scale must be a real number or None, got {type(scale).__name__}")
        scale = float(scale)
        if not (math.isfinite(scale) and scale > 0):
            raise ValueError(f"scale must be finite and positive, got {scale}")
    if not isinstance(return_lse, bool):
        raise TypeError(f"return_lse must be a bool, got {type(return_lse).__name__}")
    return scale


def _check_qkv(q, k, v, layout: str) -> None:
    """The checks q, k and v share in both forms: tensors of one 16-bit dtype on one device, `layout`'s rank, head
    dim 64 or 128 (the same for all three), k and v alike, and their heads dividing q's; no grad."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if q.dtype not in _DTYPES:
        raise TypeError(f"q is {q.dtype}; DFSS attention computes in torch.float16 or torch.bfloat16")
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise TypeError(f"{name} is {t.dtype} and q {q.dtype}: q, k and v must have one dtype")
    rank = layout.count(",") + 1
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != rank:
            raise ValueError(f"{name} must be {layout} ({rank}-D), got shape {tuple(t.shape)}")
    if q.shape[-1] not in _HEAD_DIMS:
        raise ValueError(f"the head dim (q's last dimension) must be 64 or 128, got {q.shape[-1]}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have one shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if k.shape[-1] != q.shape[-1]:
        raise ValueError(f"k and v have head dim {k.shape[-1]} and q {q.shape[-1]}: they must be equal")
    heads, kv_heads = q.shape[1], k.shape[1]  # [B, H, S, D] and [T, H, D] alike
    if (kv_heads == 0 and heads != 0) or (kv_heads and heads % kv_heads):
        raise ValueError(f"k and v have {kv_heads} heads, which must divide q's {heads} (grouped-query attention)")
    for name, t in (("k", k), ("v", v)):
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} and q on {q.device}: they must be on one device")
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        raise RuntimeError("DFSS attention is inference-only (no backward); call it under torch.no_grad() or "
                           "torch.inference_mode()")


def _kernel_operand(t: torch.Tensor) -> torch.Tensor:
    """t [B, H, S, D] as it is where the kernel can read it in place (head dim contiguous, 16-byte aligned base,
    every other stride of a dimension longer than 1 a positive multiple of 16 bytes), else a contiguous copy."""
    item = t.element_size()
    if t.stride(3) == 1 and t.data_ptr() % _ALIGNMENT == 0 and all(
            n == 1 or (s > 0 and s * item % _ALIGNMENT == 0) for n, s in zip(t.shape[:3], t.stride()[:3])):
        return t
    return t.clone(memory_format=torch.contiguous_format)  # a fresh allocation is aligned


def _kernel_strides(t: torch.Tensor) -> tuple:
    """(batch, head, token) element strides of t [B, H, S, D]; a dimension of length 1 gets its packed stride
    (PyTorch's stride of such a dimension is arbitrary, and never used)."""
    _, heads, tokens, dim = t.shape
    packed = (heads * tokens * dim, tokens * dim, dim)
    return tuple(s if n > 1 else p for n, s, p in zip(t.shape[:3], t.stride()[:3], packed))


def _attention_bhsd(q, k, v, causal, pattern, scale, lse, o):
    """The kernel on checked [B, H, S, D] q, k, v (k, v with H_kv heads), into o [B, H, S_q, D] (any strides the
    kernel takes) and lse [B, H, S_q] fp32 (or None)."""
    index = _attention_device(q)
    batch, heads, seq_q, dim = q.shape
    kv_heads, seq_k = k.shape[1], k.shape[2]
    if batch * heads * seq_q == 0:
        return
    if seq_k == 0:  # nothing to attend: O is 0 and lse -inf, as the kernel gives such rows
        o.zero_()
        if lse is not None:
            lse.fill_(-math.inf)
        return
    q, k, v = _kernel_operand(q), _kernel_operand(k), _kernel_operand(v)
    _launch_attention(index, q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(),
                      0 if lse is None else lse.data_ptr(), 0, 0, batch, heads, kv_heads, seq_q, seq_k, 0, 0, dim,
                      _DTYPES[q.dtype], pattern, causal, scale, False, _kernel_strides(q), _kernel_strides(k),
                      _kernel_strides(v), _kernel_strides(o))


def dfss_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, pattern: str = "2:4",
                   scale: Optional[float] = None, return_lse: bool = False):
    """softmax(prune(scale * q k^T)) v in SDPA's layout, on nmkit's fused Hopper kernel (inference only).

    q [B, H, S_q, D], k and v [B, H_kv, S_k, D]: float16 or bfloat16 CUDA tensors, D 64 or 128, H_kv dividing H
    (grouped-query attention: query head h reads k/v head h // (H / H_kv)). Any strides with D contiguous are read
    in place (a [B, S, H, D] tensor's .transpose(1, 2) is not copied); others are copied first. pattern "2:4" keeps,
    in each group of 4 consecutive keys of a row, the 2 largest scores (ties to the lower key index; masked keys
    never), and softmax runs over the kept ones; "dense" is the same kernel unpruned. causal masks key j > query i
    (top-left aligned, as SDPA's is_causal); scale defaults to 1 / sqrt(D). Returns o [B, H, S_q, D] in q's dtype
    and, with return_lse, the fp32 natural-log log-sum-exp of each row's kept scores [B, H, S_q] (-inf for a row
    with nothing to attend, whose o is 0). Runs on the current CUDA stream without synchronising."""
    scale = _check_attention_options(causal, pattern, scale, return_lse)
    _check_qkv(q, k, v, "[batch, heads, seq, head_dim]")
    if k.shape[0] != q.shape[0]:
        raise ValueError(f"k and v hold {k.shape[0]} sequences and q {q.shape[0]}: the batch must be equal")
    batch, heads, seq_q, dim = q.shape
    o = torch.empty((batch, heads, seq_q, dim), dtype=q.dtype, device=q.device)
    lse = torch.empty((batch, heads, seq_q), dtype=torch.float32, device=q.device) if return_lse else None
    _attention_bhsd(q, k, v, causal, pattern, scale, lse, o)
    return (o, lse) if return_lse else o


def _check_cu_seqlens(cu, name: str, device: torch.device) -> torch.Tensor:
    if not isinstance(cu, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(cu).__name__}")
    if cu.dtype != torch.int32:
        raise TypeError(f"{name} must be torch.int32 (batch + 1 offsets), got {cu.dtype}")
    if cu.dim() != 1 or cu.shape[0] < 1:
        raise ValueError(f"{name} must be 1-D with batch + 1 offsets, got shape {tuple(cu.shape)}")
    if cu.device != device:
        raise ValueError(f"{name} is on {cu.device} and q on {device}: they must be on one device")
    return cu if cu.is_contiguous() else cu.contiguous()


def _check_max_seqlen(n, name: str) -> int:
    if isinstance(n, bool) or not isinstance(n, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(n).__name__}")
    if n < 0:
        raise ValueError(f"{name} must be >= 0, got {n}")
    return int(n)


def _varlen_operand(t: torch.Tensor) -> torch.Tensor:
    """t [total, H, D] as a [1, H, total, D] view for _kernel_operand (copied where the kernel cannot read it)."""
    return _kernel_operand(t.permute(1, 0, 2).unsqueeze(0))


def _varlen_strides(t4: torch.Tensor) -> tuple:
    """The kernel's (batch, head, token) strides of a [1, H, total, D] view: the batch stride is unused (0)."""
    return (0,) + _kernel_strides(t4)[1:]


def dfss_attention_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                          cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, causal: bool = False,
                          pattern: str = "2:4", scale: Optional[float] = None, return_lse: bool = False):
    """dfss_attention over sequences of different lengths, packed as FlashAttention's varlen functions take them.

    q [total_q, H, D], k and v [total_k, H_kv, D]: sequence b's queries are rows cu_seqlens_q[b] to
    cu_seqlens_q[b + 1] - 1 of q, its keys likewise in k and v; cu_seqlens_q and cu_seqlens_k are int32 CUDA tensors
    of batch + 1 offsets (first 0, non-decreasing); max_seqlen_q and max_seqlen_k at least the longest sequence (an
    upper bound such as the padded length is enough). The offsets are not checked (that would synchronise): wrong
    ones read out of bounds, as in FlashAttention; max_seqlen_q and max_seqlen_k may not exceed total_q and total_k. causal is top-left aligned within each sequence (key j > query i
    masked; FlashAttention >= 2.1 aligns it bottom-right: the two agree where a sequence's q and k lengths are
    equal). Each sequence's key groups of 4 start at its first key. Returns o [total_q, H, D] and, with return_lse,
    lse [H, total_q] fp32 (total_q = q.shape[0]); rows of q past cu_seqlens_q[-1] are left unwritten there."""
    scale = _check_attention_options(causal, pattern, scale, return_lse)
    _check_qkv(q, k, v, "[total_tokens, heads, head_dim]")
    cu_seqlens_q = _check_cu_seqlens(cu_seqlens_q, "cu_seqlens_q", q.device)
    cu_seqlens_k = _check_cu_seqlens(cu_seqlens_k, "cu_seqlens_k", q.device)
    if cu_seqlens_q.shape[0] != cu_seqlens_k.shape[0]:
        raise ValueError(f"cu_seqlens_q has {cu_seqlens_q.shape[0]} offsets and cu_seqlens_k "
                         f"{cu_seqlens_k.shape[0]}: both must be batch + 1")
    max_seqlen_q = _check_max_seqlen(max_seqlen_q, "max_seqlen_q")
    max_seqlen_k = _check_max_seqlen(max_seqlen_k, "max_seqlen_k")
    total_q, heads, dim = q.shape
    batch = cu_seqlens_q.shape[0] - 1
    index = _attention_device(q)
    o = torch.empty((total_q, heads, dim), dtype=q.dtype, device=q.device)
    lse = torch.empty((heads, total_q), dtype=torch.float32, device=q.device) if return_lse else None
    if batch * heads * total_q * max_seqlen_q == 0:
        return (o, lse) if return_lse else o
    if k.shape[0] == 0 or max_seqlen_k == 0:  # no keys anywhere: O is 0 and lse -inf
        o.zero_()
        if lse is not None:
            lse.fill_(-math.inf)
    else:
        q4, k4, v4 = _varlen_operand(q), _varlen_operand(k), _varlen_operand(v)
        o4 = o.permute(1, 0, 2).unsqueeze(0)
        _launch_attention(index, q4.data_ptr(), k4.data_ptr(), v4.data_ptr(), o.data_ptr(),
                          0 if lse is None else lse.data_ptr(), cu_seqlens_q.data_ptr(), cu_seqlens_k.data_ptr(),
                          batch, heads, k.shape[1], max_seqlen_q, max_seqlen_k, total_q, k.shape[0], dim,
                          _DTYPES[q.dtype], pattern,
                          causal, scale, True, _varlen_strides(q4), _varlen_strides(k4), _varlen_strides(v4),
                          _varlen_strides(o4))
    return (o, lse) if return_lse else o


# Hugging Face transformers (5.x): nmkit's attention registered with its AttentionInterface, so that a model whose
# attention layers call ALL_ATTENTION_FUNCTIONS.get_interface(config._attn_implementation) (BERT, Llama and most
# current models) runs DFSS after model.set_attn_implementation("nmkit_dfss"). Masks come from a mask function of
# our own (AttentionMaskInterface): None, or the 2-D key-padding mask, which the attention turns into varlen form.

_TRANSFORMERS_NAMES = {"2:4": "nmkit_dfss", "dense": "nmkit_dense"}


def _token_permutation(mask: torch.Tensor):
    """For a [B, S] key-padding mask (True: a token): (dest, cu_seqlens), dest [B * S] a permutation moving every
    valid token, in order, to the front (sequence b's to cu_seqlens[b]...) and the padding behind them; cu_seqlens
    int32 [B + 1]. On the device, without synchronising."""
    flat = mask.reshape(-1)
    valid, padding = flat.cumsum(0), (~flat).cumsum(0)
    dest = torch.where(flat, valid - 1, valid[-1] + padding - 1)
    cu_seqlens = torch.zeros(mask.shape[0] + 1, dtype=torch.int32, device=mask.device)
    cu_seqlens[1:] = mask.sum(1, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    return dest, cu_seqlens


def _packed_tokens(x: torch.Tensor, dest: torch.Tensor) -> torch.Tensor:
    """x [B, h, S, D] as [B * S, h, D] with token t at row dest[t]."""
    batch, heads, tokens, dim = x.shape
    flat = x.transpose(1, 2).reshape(batch * tokens, heads, dim)
    return flat.new_empty(flat.shape).index_copy_(0, dest, flat)


def _transformers_mask(batch_size=None, q_length=None, kv_length=None, q_offset=0, kv_offset=0, mask_function=None,
                       attention_mask=None, **kwargs):
    """transformers' mask function for nmkit: None where no token is padding, else the 2-D boolean key-padding mask
    [B, kv_length] (True: attend). Causal or full attention only (sliding windows, chunks, packed sequences and
    overlays are refused: the kernel has no such masks)."""
    from transformers.masking_utils import bidirectional_mask_function, causal_mask_function
    if mask_function not in (causal_mask_function, bidirectional_mask_function):
        raise NotImplementedError(
            "nmkit's attention takes causal or full attention with key padding; this model asks for the mask "
            f"{getattr(mask_function, '__name__', mask_function)!s} (a sliding window, chunks, packed sequences or an "
            "overlay)")
    if attention_mask is None:
        return None
    attention_mask = attention_mask[:, -kv_length:].bool()
    return None if attention_mask.shape[1] == kv_length and bool(attention_mask.all()) else attention_mask


def _transformers_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                            pattern="2:4", **kwargs):
    """transformers' attention function: query [B, H, S_q, D], key and value [B, H_kv, S_k, D] (GQA unrepeated),
    attention_mask from _transformers_mask; returns ([B, S_q, H, D], None)."""
    if dropout:
        raise NotImplementedError("nmkit's attention is inference-only (no dropout): call model.eval()")
    for name in ("sliding_window", "softcap", "s_aux", "position_bias"):
        if kwargs.get(name) is not None:
            raise NotImplementedError(f"nmkit's attention has no {name} (the model passed one)")
    causal = getattr(module, "is_causal", True) if is_causal is None else bool(is_causal)
    head_dim = query.shape[-1]
    scale = _check_attention_options(causal, pattern, head_dim ** -0.5 if scaling is None else scaling, False)
    dim = next((d for d in _HEAD_DIMS if d >= head_dim), None)
    if dim is None:
        raise NotImplementedError(f"nmkit's attention takes head dims up to 128, the model has {head_dim}")
    if dim != head_dim:  # zeros appended to the head dim change no score: the kernel's 64 or 128 (MiniLM has 32)
        query, key, value = (torch.nn.functional.pad(t, (0, dim - head_dim)) for t in (query, key, value))
    o, weights = _transformers_attention_padded(query, key, value, attention_mask, causal, pattern, scale)
    return (o if dim == head_dim else o[..., :head_dim]), weights


def _transformers_attention_padded(query, key, value, attention_mask, causal, pattern, scale):
    """_transformers_attention on q, k, v whose head dim the kernel takes."""
    _check_qkv(query, key, value, "[batch, heads, seq, head_dim]")
    batch, heads, seq_q, dim = query.shape
    seq_k = key.shape[2]
    if causal and seq_q == 1:
        causal = False  # one new token after a cache attends to every key
    if causal and seq_q != seq_k:
        raise NotImplementedError(f"nmkit's attention aligns the causal mask top-left; {seq_q} queries after "
                                  f"{seq_k - seq_q} cached keys need it bottom-right (prefill without a cache, then "
                                  "decode one token at a time, are supported)")
    o = torch.empty((batch, seq_q, heads, dim), dtype=query.dtype, device=query.device)
    if attention_mask is None:
        _attention_bhsd(query, key, value, causal, pattern, scale, None, o.transpose(1, 2))
        return o, None
    if not (attention_mask.dtype == torch.bool and tuple(attention_mask.shape) == (batch, seq_k)):
        raise NotImplementedError(
            f"nmkit's attention takes a [batch, keys] = [{batch}, {seq_k}] boolean key-padding mask (its own mask "
            f"function gives one), got {attention_mask.dtype} {tuple(attention_mask.shape)}: a 4-D or custom mask "
            "cannot be pruned by groups of keys")
    if batch * seq_q == 0 or seq_k == 0:
        return o.zero_(), None
    # Key padding: the valid keys of each sequence packed to the front (varlen form; groups of 4 start at each
    # sequence's first key, so padding never changes a sequence's result). Causal queries are packed the same way
    # (seq_q == seq_k: left padding shifts positions); other queries stay as they are, all attending.
    dest, cu_seqlens_k = _token_permutation(attention_mask)
    k_packed, v_packed = _packed_tokens(key, dest), _packed_tokens(value, dest)
    if causal:
        out = dfss_attention_varlen(_packed_tokens(query, dest), k_packed, v_packed, cu_seqlens_k, cu_seqlens_k,
                                    seq_q, seq_k, True, pattern, scale)
        o = out.index_select(0, dest).view(batch, seq_q, heads, dim)
        return o.masked_fill_(~attention_mask[:, :, None, None], 0), None
    cu_seqlens_q = torch.arange(0, (batch + 1) * seq_q, seq_q, dtype=torch.int32, device=query.device)
    out = dfss_attention_varlen(query.transpose(1, 2).reshape(batch * seq_q, heads, dim), k_packed, v_packed,
                                cu_seqlens_q, cu_seqlens_k, seq_q, seq_k, False, pattern, scale)
    return out.view(batch, seq_q, heads, dim), None


def register_transformers_attention() -> dict:
    """Registers nmkit's attention with transformers (its AttentionInterface and AttentionMaskInterface) as
    "nmkit_dfss" (2:4) and "nmkit_dense" (the same kernel unpruned); returns {pattern: name}. Then
    from_pretrained(..., attn_implementation="nmkit_dfss") or model.set_attn_implementation("nmkit_dfss") use it."""
    from transformers import AttentionInterface, AttentionMaskInterface
    for pattern, name in _TRANSFORMERS_NAMES.items():
        AttentionInterface.register(name, functools.partial(_transformers_attention, pattern=pattern))
        AttentionMaskInterface.register(name, _transformers_mask)
    return dict(_TRANSFORMERS_NAMES)


def use_dfss_attention(model: torch.nn.Module, pattern: str = "2:4") -> str:
    """Switches the attention of every Hugging Face transformers model in `model` (a PreTrainedModel, such as BERT
    or Llama, or any module holding them, each switched) to nmkit's: "2:4" (DFSS) or "dense" (the same
    kernel unpruned). Returns the implementation the model had: model.set_attn_implementation(it) switches back.

    Inference only (model.eval(), under torch.no_grad()), f16/bf16 on a Hopper GPU, head dim 64 or 128. Masks: none,
    causal, and key padding (2-D attention_mask; each sequence's result is the one it has alone). Causal models run
    a prefill without a cache and then one token at a time; anything else (sliding windows, several new tokens after
    a cache, 4-D masks) raises NotImplementedError in the forward pass."""
    if not isinstance(pattern, str) or pattern not in _ATTENTION_PATTERNS:
        raise ValueError(f"pattern must be '2:4' or 'dense', got {pattern!r}")
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    try:
        from transformers import PreTrainedModel
    except ImportError as e:
        raise ImportError(f"use_dfss_attention needs Hugging Face transformers ({e})") from e
    models = [m for m in model.modules() if isinstance(m, PreTrainedModel)]
    if not models:
        raise TypeError(f"model ({type(model).__name__}) holds no transformers PreTrainedModel")
    for m in models:
        if not m._can_set_attn_implementation():
            raise NotImplementedError(f"{type(m).__name__} cannot change its attention implementation (its attention "
                                      "does not go through transformers' AttentionInterface)")
    name = register_transformers_attention()[pattern]
    previous = models[0].config._attn_implementation
    for m in models:
        m.set_attn_implementation(name)
        if m.config._attn_implementation != name:
            raise RuntimeError(f"{type(m).__name__} kept attention '{m.config._attn_implementation}' instead of "
                               f"'{name}'")
    return previous


from .prune_model import prune_model  # noqa: E402  (calibrated pruning of whole models, block by block)
