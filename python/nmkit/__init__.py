"""nmkit: structured sparsity (2:4, V:N:M, tiles) for NVIDIA sparse tensor cores.

Formats, magnitude pruning and the CPU reference product work on numpy arrays::

    import numpy as np, nmkit
    w = np.random.default_rng(0).standard_normal((1024, 4096), dtype=np.float32)
    sw = nmkit.prune(w, "vnm:128:2:8")          # a SparseWeight (values stored in the weight's dtype: f32 here)
    sw.format, sw.shape, sw.energy, sw.storage_bytes
    y = nmkit.spmm(sw, x)                       # CPU oracle: (R, K) @ (K, C) -> float32 (R, C)
    qw = nmkit.prune(w, "2:4", dtype="fp8")     # a QuantizedWeight: e4m3 codes, qw.scales per row, qw.to_dense()

PyTorch layers on the GPU are in ``nmkit.torch`` (``SparseLinear``).
"""
from __future__ import annotations

import errno as _errno
import os as _os

import numpy as _np

from . import _nmkit
from ._nmkit import QuantizedWeight, SparseWeight, build_info, cuda_devices

__all__ = ["SparseWeight", "QuantizedWeight", "prune", "compress", "spmm", "load_file", "save_file", "build_info",
           "cuda_devices", "cuda_available"]
__version__ = build_info()["version"]


_REAL_KINDS = "fiu"  # float, signed and unsigned integer: not bool, complex, object, strings, dates or durations
_FLOAT32_MAX = float(_np.finfo(_np.float32).max)


def _host_matrix(a, what: str) -> _np.ndarray:
    """A C-contiguous float32 2-D copy (or view) of `a`, or a TypeError naming `what`."""
    array = _np.asarray(a)
    if array.ndim != 2:
        raise TypeError(f"{what} must be a 2-D array, got shape {array.shape}")
    if array.dtype.kind not in _REAL_KINDS:  # numpy counts durations (timedelta64) as integers
        raise TypeError(f"{what} must hold real numbers, got dtype {array.dtype}")
    return _np.ascontiguousarray(array, dtype=_np.float32)


def _storage_dtype(weight, dtype: str | None) -> str:
    """The dtype the kept values are stored in: as asked, else the weight's own (f16 and bf16 stay, anything else is
    stored as f32), so that no value is rounded unless the caller asked for it."""
    if dtype is not None:
        return dtype
    name = str(getattr(weight, "dtype", ""))
    if name.endswith("bfloat16"):
        return "bf16"
    return "f16" if name.endswith("float16") else "f32"


def prune(weight, format: str, dtype: str | None = None) -> SparseWeight | QuantizedWeight:
    """Prunes `weight` (R, K) by magnitude into `format` and compresses it.

    format: "2:4" (any "N:M"), "vnm:V:N:M" (e.g. "vnm:128:2:8"), or "tile:RxC:DENSITY" (e.g. "tile:64x64:0.25").
    dtype: how the kept values are stored: "f32", "f16" or "bf16"; by default the weight's own (f32 for float32 and
    wider). The GPU layers take f16 and bf16 (``SparseWeight.astype``). A value that would round to infinity in
    `dtype`, NaN or infinity in the weight raise ValueError; non-zero values that round to zero warn (RuntimeWarning).
    For N:M formats, dtype "fp8" (= "e4m3"), "e5m2" or "int8" quantizes the kept values after pruning, per row
    (symmetric absmax, round to nearest even), into a QuantizedWeight (``.scales``, ``.to_dense()`` dequantized);
    other formats raise NotImplementedError. ``nmkit.torch.SparseLinear`` runs 8-bit 2:4 weights on the GPU (x
    quantized per token to the same type inside each call).
    """
    return _nmkit.prune(_host_matrix(weight, "weight"), format, _storage_dtype(weight, dtype))


def compress(weight, format: str, dtype: str | None = None) -> SparseWeight | QuantizedWeight:
    """Compresses a weight that already satisfies `format` (raises ValueError naming the first violation); `dtype`
    as for ``prune``."""
    return _nmkit.compress(_host_matrix(weight, "weight"), format, _storage_dtype(weight, dtype))


def _real_float32(a, what: str, ndim: int, shape_text: str) -> _np.ndarray:
    """`a` as a C-contiguous float32 array of `ndim` dimensions, or a TypeError/ValueError naming `what`: only real
    numbers are taken (no bool, complex, object, strings, dates or durations), and none that float32 cannot hold."""
    try:
        array = _np.asarray(a)
    except (ValueError, TypeError) as e:  # ragged nested lists
        raise TypeError(f"{what} must be {shape_text} of real numbers, got {type(a).__name__} ({e})") from None
    if array.dtype.kind not in _REAL_KINDS:
        raise TypeError(f"{what} must hold real numbers (float or integer), got dtype {array.dtype}")
    if array.ndim != ndim:
        raise TypeError(f"{what} must be {shape_text}, got shape {array.shape}")
    with _np.errstate(over="ignore"):
        converted = _np.ascontiguousarray(array, dtype=_np.float32)
    if array.dtype.kind == "f" and array.dtype.itemsize > 4:  # float64 and wider can exceed float32's range
        overflowed = _np.isinf(converted) & ~_np.isinf(array)
        if overflowed.any():
            index = tuple(int(i) for i in _np.argwhere(overflowed)[0])
            raise ValueError(f"{what}{list(index)} = {array[index]} is beyond float32's range (|x| <= {_FLOAT32_MAX:.4g})")
    return converted


def _real_scalar(value, what: str) -> float:
    array = _np.asarray(value)
    if array.ndim != 0 or array.dtype.kind not in _REAL_KINDS:
        raise TypeError(f"{what} must be a real number, got {type(value).__name__} {value!r}")
    number = float(array)
    if not abs(number) <= _FLOAT32_MAX:  # NaN too
        raise ValueError(f"{what} = {number} is not a finite float32")
    return number


def spmm(a: SparseWeight, b, bias=None, alpha: float = 1.0, activation: str = "none") -> _np.ndarray:
    """CPU reference: act(alpha * a @ b + bias) in float32, a (R, K) sparse, b (K, C), bias (R,) or None.

    b and bias take real numbers (float or integer arrays, or nested lists of them); bool, complex, object and string
    arrays are refused with a TypeError, as are arrays of other ranks; b with other than K rows, bias with other than R
    values, and values beyond float32's range are refused with a ValueError."""
    if isinstance(a, QuantizedWeight):
        raise TypeError(f"a is an 8-bit QuantizedWeight ({a.dtype}), whose product nmkit.spmm does not compute: "
                        "multiply its dequantized a.to_dense(), or prune with dtype='f32'")
    if not isinstance(a, SparseWeight):
        raise TypeError(f"a must be an nmkit.SparseWeight (from nmkit.prune, compress or load_file), got {type(a).__name__}")
    if not isinstance(activation, str):
        raise TypeError(f"activation must be a string ('none', 'relu' or 'gelu'), got {type(activation).__name__}")
    rows, k = a.shape
    b_array = _real_float32(b, "b", 2, f"a 2-D array ({k}, C)")
    bias_array = None if bias is None else _real_float32(bias, "bias", 1, f"a 1-D array of {rows} values")
    return _nmkit.spmm(a, b_array, bias_array, _real_scalar(alpha, "alpha"), activation)


def load_file(path, metadata: bool = False):
    """The compressed weights of a file written by `nmkit prune` (safetensors), by name, as SparseWeights or, for
    8-bit values (``--dtype fp8|e5m2|int8``), QuantizedWeights (each validated; the file's dense tensors are left
    out). path: a str, bytes or os.PathLike; OSError when it cannot be read, is a directory or is malformed.
    metadata=True returns (weights, the file's metadata as str -> str, nmkit's own keys left out)."""
    try:
        path = _os.fsdecode(_os.fspath(path))
    except TypeError:
        raise TypeError(f"path must be a str, bytes or os.PathLike, got {type(path).__name__}") from None
    if _os.path.isdir(path):
        raise IsADirectoryError(_errno.EISDIR, "is a directory, not a file written by nmkit prune", path)
    return _nmkit.load_file(path, bool(metadata))


_ST_DTYPES = {"float64": "F64", "float32": "F32", "float16": "F16", "int64": "I64", "int32": "I32", "int16": "I16",
               "int8": "I8", "uint64": "U64", "uint32": "U32", "uint16": "U16", "uint8": "U8", "bool": "BOOL"}


def _dense_entry(name: str, array) -> tuple:
    """(name, safetensors dtype, shape, little-endian bytes) of a numpy array, or TypeError naming the tensor."""
    if not isinstance(array, _np.ndarray):
        raise TypeError(f"tensor '{name}' must be a numpy array or an nmkit.SparseWeight, got {type(array).__name__}")
    st_dtype = _ST_DTYPES.get(array.dtype.name)
    if st_dtype is None:
        raise TypeError(f"tensor '{name}' has dtype {array.dtype}, which safetensors does not store "
                        f"(expected one of {', '.join(_ST_DTYPES)})")
    data = _np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
    return name, st_dtype, tuple(int(d) for d in array.shape), data.tobytes()


def save_file(path, tensors: dict, metadata: dict | None = None) -> None:
    """Writes an nmkit model file (safetensors) that `load_file`, `nmkit.torch.load_sparse` and `nmkit inspect` read:
    `tensors` maps names to SparseWeights and QuantizedWeights (stored compressed, as `nmkit prune` stores them:
    name.values, ... and their description in the metadata) or numpy arrays (stored dense, in their own dtype), in
    the dict's order; `metadata` is str -> str (keys starting with 'nmkit' are nmkit's own). The file is written to
    a temporary beside `path` and renamed over it. TypeError for other values, ValueError for clashing names,
    OSError when it cannot be written."""
    try:
        path = _os.fsdecode(_os.fspath(path))
    except TypeError:
        raise TypeError(f"path must be a str, bytes or os.PathLike, got {type(path).__name__}") from None
    if not isinstance(tensors, dict):
        raise TypeError(f"tensors must be a dict of name -> numpy array, SparseWeight or QuantizedWeight, got "
                        f"{type(tensors).__name__}")
    metadata = dict(metadata or {})
    for key, value in metadata.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"metadata must map str to str, got {key!r}: {type(value).__name__}")
        if key.startswith("nmkit"):
            raise ValueError(f"metadata key '{key}': keys starting with 'nmkit' are nmkit's own")
    entries = []
    for name, value in tensors.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"tensor names must be non-empty strings, got {name!r}")
        entries.append((name, value) if isinstance(value, (SparseWeight, QuantizedWeight))
                       else _dense_entry(name, value))
    _nmkit._save_file(path, entries, metadata)


def cuda_available() -> bool:
    """Whether this build has CUDA and the process sees a device (cuda_devices() says why not)."""
    return len(cuda_devices()[0]) > 0
