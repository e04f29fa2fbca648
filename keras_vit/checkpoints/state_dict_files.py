"""State-dict files as `{name: numpy array}`: `.safetensors` (header checked before any tensor is read) and
PyTorch pickles through `torch.load(weights_only=True)`. Every PyTorch-layout reader (timm, transformers' ViT,
DINOv2, CLIP and SigLIP) reads its file here.

Example:
>>> read_state_dict("model.safetensors")  # doctest: +SKIP
{'cls_token': array(...), ...}
"""

import json
import math
import struct

from keras_vit.checkpoints.source import CheckpointError, require_regular_file

_SAFETENSORS_DTYPES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
                       "BOOL": 1}
_MAX_HEADER_BYTES = 100 << 20



def _safetensors():
    try:
        import safetensors.numpy
    except ImportError as error:
        raise CheckpointError(
            "Reading or writing .safetensors files needs the safetensors package: pip install "
            "'keras-vision-transformer[hub]' (or pip install safetensors)."
        ) from error
    return safetensors.numpy


def safetensors_header(path, budget=None):
    """`{name: (dtype, shape)}` from a `.safetensors` header, checked against the file's size and `budget`.

    Reads only the header: a file whose tensors declare more bytes than it
    holds, or more than the model's `budget`, is refused before any tensor
    is read.
    """
    size = require_regular_file(path).st_size
    try:
        with open(path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            if length > min(_MAX_HEADER_BYTES, size - 8):
                raise CheckpointError(f"{path} is not a readable .safetensors file: its header claims {length:,} bytes.")
            header = json.loads(f.read(length))
    except (struct.error, ValueError, UnicodeDecodeError) as error:
        raise CheckpointError(f"{path} is not a readable .safetensors file (truncated or another format): {error}") \
            from error
    if not isinstance(header, dict):
        raise CheckpointError(f"{path} is not a readable .safetensors file: its header is a JSON "
                              f"{type(header).__name__}, not an object of tensors.")
    header.pop("__metadata__", None)
    declared, spans = {}, []
    total = 0
    for name, entry in header.items():
        try:
            dtype, shape, (start, stop) = entry["dtype"], tuple(entry["shape"]), entry["data_offsets"]
            if not all(isinstance(n, int) and n >= 0 for n in (*shape, start, stop)):
                raise ValueError(f"shape {list(shape)} and data_offsets {[start, stop]} must be whole numbers >= 0")
            nbytes = math.prod(shape) * _SAFETENSORS_DTYPES[dtype]
        except (KeyError, TypeError, ValueError) as error:
            raise CheckpointError(f"{path}: tensor {name!r} has an unreadable header entry: {error}") from error
        if stop - start != nbytes or stop > size - 8 - length:
            raise CheckpointError(f"{path}: tensor {name!r} declares {nbytes:,} bytes that the file does not hold; "
                                  "the file is truncated or corrupt.")
        declared[name] = (dtype, shape)
        spans.append((start, stop, name))
        total += nbytes
    spans.sort()
    for (_, stop, first), (start, _, second) in zip(spans, spans[1:]):
        if start < stop:
            raise CheckpointError(f"{path}: tensors {first!r} and {second!r} overlap in the file (data_offsets); "
                                  "the file is corrupt.")
    if budget is not None:
        budget.check(path, total, "tensors")
    return declared


def read_state_dict(path, budget=None):
    """A timm state dict file as `{name: numpy array}`: `.safetensors`, or `.bin`/`.pth` through torch."""
    if str(path).endswith(".safetensors"):
        safetensors_header(path, budget)
        try:
            with _safetensors_open(path) as f:
                return {name: f.get_tensor(name) for name in f.keys()}
        except CheckpointError:
            raise
        except Exception as error:  # safetensors' own SafetensorError, for what the header check let through.
            raise CheckpointError(f"{path} is not a readable .safetensors file: {error}") from error
    size = require_regular_file(path).st_size
    if budget is not None:
        budget.check(path, size, "data")
    try:
        import torch
    except ImportError as error:
        raise CheckpointError(
            f"{path} is a PyTorch pickle (.bin/.pth), which keras_vit reads only with torch installed "
            "(torch.load with weights_only=True): pip install torch, or convert it to .safetensors."
        ) from error
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises many types for a bad or unsafe pickle.
        raise CheckpointError(f"{path} is not a loadable PyTorch state dict (weights_only=True): {error}") from error
    for wrapper in ("state_dict", "model"):
        if isinstance(loaded, dict) and isinstance(loaded.get(wrapper), dict):
            loaded = loaded[wrapper]
    if not isinstance(loaded, dict):
        raise CheckpointError(f"{path} holds a {type(loaded).__name__}, not a state dict of tensors.")
    return {name: tensor.float().numpy() if tensor.is_floating_point() else tensor.numpy()
            for name, tensor in loaded.items()}


def _safetensors_open(path):
    _safetensors()
    from safetensors import safe_open

    return safe_open(path, framework="numpy")
