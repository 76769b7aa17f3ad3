"""What the Python tests share."""
import json
import os
import struct

import numpy as np


def torch_missing(error: ImportError) -> str:
    """Why the PyTorch tests skip; raises `error` again where NMKIT_REQUIRE_TORCH=1 says PyTorch must be there."""
    if os.environ.get("NMKIT_REQUIRE_TORCH") == "1":
        raise error
    return f"PyTorch is not installed ({error})"


def write_safetensors(path, tensors):
    """A minimal safetensors file of float32 arrays (the format's spec: length, JSON header, data)."""
    header, offset, blobs = {}, 0, []
    for name, array in tensors.items():
        blob = np.ascontiguousarray(array, dtype=np.float32).tobytes()
        header[name] = {"dtype": "F32", "shape": list(array.shape), "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
        blobs.append(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


_NUMPY_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32,
                 "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}


def read_safetensors(path):
    """(header, {name: numpy array}) of a safetensors file, by the format's spec (BF16 and unknown dtypes as raw
    uint16 / bytes)."""
    with open(path, "rb") as f:
        data = f.read()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + length])
    body, tensors = data[8 + length:], {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        dtype = np.uint16 if entry["dtype"] == "BF16" else _NUMPY_DTYPES.get(entry["dtype"], np.uint8)
        tensors[name] = np.frombuffer(body[begin:end], dtype=np.dtype(dtype).newbyteorder("<")).reshape(entry["shape"])
    return header, tensors


def graph_replay_and_eager(layer, x):
    """(y, want): `layer(x)` captured in a CUDA graph after a warm-up call on a side stream (which makes its plan and
    workspace outside the capture), replayed on new x over a NaN-poisoned y; then the eager call on that x."""
    import torch

    with torch.no_grad():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            layer(x)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = layer(x)
        x.copy_(torch.randn_like(x))
        y.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        return y, layer(x)
