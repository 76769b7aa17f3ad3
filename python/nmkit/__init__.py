"""nmkit: structured sparsity (2:4, V:N:M, tiles) for NVIDIA sparse tensor cores.

Formats, magnitude pruning and the CPU reference product work on numpy arrays::

    import numpy as np, nmkit
    w = np.random.default_rng(0).standard_normal((1024, 4096), dtype=np.float32)
    sw = nmkit.prune(w, "vnm:128:2:8")          # a SparseWeight (values stored as f16 by default)
    sw.format, sw.shape, sw.energy, sw.storage_bytes
    y = nmkit.spmm(sw, x)                       # CPU oracle: (R, K) @ (K, C) -> float32 (R, C)

PyTorch layers on the GPU are in ``nmkit.torch`` (``SparseLinear``).
"""
from __future__ import annotations

import numpy as _np

from . import _nmkit
from ._nmkit import SparseWeight, build_info, cuda_devices, load_file

__all__ = ["SparseWeight", "prune", "compress", "spmm", "load_file", "build_info", "cuda_devices", "cuda_available"]
__version__ = build_info()["version"]


def _host_matrix(a, what: str) -> _np.ndarray:
    """A C-contiguous float32 2-D copy (or view) of `a`, or a TypeError naming `what`."""
    array = _np.asarray(a)
    if array.ndim != 2:
        raise TypeError(f"{what} must be a 2-D array, got shape {array.shape}")
    if not (_np.issubdtype(array.dtype, _np.floating) or _np.issubdtype(array.dtype, _np.integer)):
        raise TypeError(f"{what} must hold real numbers, got dtype {array.dtype}")
    return _np.ascontiguousarray(array, dtype=_np.float32)


def prune(weight, format: str, dtype: str = "f16") -> SparseWeight:
    """Prunes `weight` (R, K) by magnitude into `format` and compresses it.

    format: "2:4" (any "N:M"), "vnm:V:N:M" (e.g. "vnm:128:2:8"), or "tile:RxC:DENSITY" (e.g. "tile:64x64:0.25").
    dtype: how the kept values are stored: "f16" (default), "bf16" or "f32"; the GPU layers take f16 and bf16.
    """
    return _nmkit.prune(_host_matrix(weight, "weight"), format, dtype)


def compress(weight, format: str, dtype: str = "f16") -> SparseWeight:
    """Compresses a weight that already satisfies `format` (raises ValueError naming the first violation)."""
    return _nmkit.compress(_host_matrix(weight, "weight"), format, dtype)


def spmm(a: SparseWeight, b, bias=None, alpha: float = 1.0, activation: str = "none") -> _np.ndarray:
    """CPU reference: act(alpha * a @ b + bias) in float32, a (R, K) sparse, b (K, C), bias (R,) or None."""
    bias_array = None if bias is None else _np.ascontiguousarray(_np.asarray(bias), dtype=_np.float32).reshape(-1)
    return _nmkit.spmm(a, _host_matrix(b, "b"), bias_array, float(alpha), activation)


def cuda_available() -> bool:
    """Whether this build has CUDA and the process sees a device (cuda_devices() says why not)."""
    return len(cuda_devices()[0]) > 0
