"""State-dict files as `{name: numpy array}`: `.safetensors` (header checked before any tensor is read) and
PyTorch pickles through `torch.load(weights_only=True)`. Every PyTorch-layout reader (timm, transformers' ViT,
DINOv2, CLIP and SigLIP) reads its file here.

Example:
>>> read_state_dict("model.safetensors")  # doctest: +SKIP
{'cls_token': array(...), ...}
"""

import logging
import os

from keras_vit.checkpoints.source import CheckpointError, require_regular_file

# The safetensors dtypes numpy holds; the float8 and float4 ones (F8_E4M3, ...) it does not.
_NUMPY_DTYPES = ("F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U64", "U32", "U16", "U8", "BOOL")


# timm's `load_state_dict_from_path` (`local-dir:` folders): these names first, else the first file of each ending.
TIMM_PREFERRED = ("model.safetensors", "pytorch_model.bin", "pytorch_model.pth", "model.pth",
                  "open_clip_model.safetensors", "open_clip_pytorch_model.safetensors", "open_clip_pytorch_model.bin",
                  "open_clip_pytorch_model.pth")
TIMM_ENDINGS = (".safetensors", ".pth", ".pth.tar", ".bin")


def folder_weights(folder, layout):
    """A Hub folder's state-dict file: `model.safetensors`, else `pytorch_model.bin`; an error names `layout`.

    A timm folder's is the one timm's `local-dir:` reads: one of its
    preferred names, else its one weights file of any name (the first in
    sorted order where several share an ending, as timm takes it, with
    timm's warning).
    """
    if layout == "timm":
        for name in TIMM_PREFERRED:
            if os.path.isfile(os.path.join(folder, name)):
                return os.path.join(folder, name)
        for ending in TIMM_ENDINGS:
            found = sorted(name for name in os.listdir(folder)
                           if name.endswith(ending) and os.path.isfile(os.path.join(folder, name)))
            if len(found) > 1:
                logging.getLogger("keras_vit").warning("Multiple %s checkpoints in %s: %s. Using %r, as timm does.",
                                                       ending, folder, found, found[0])
            if found:
                return os.path.join(folder, found[0])
        raise CheckpointError(f"{folder} has a timm config.json but no weights file (model.safetensors, "
                              "pytorch_model.bin, or one file of another name ending in "
                              f"{', '.join(TIMM_ENDINGS)}).")
    for name in ("model.safetensors", "pytorch_model.bin"):
        if os.path.exists(os.path.join(folder, name)):
            return os.path.join(folder, name)
    raise CheckpointError(f"{folder} has a {layout} config.json but no model.safetensors or pytorch_model.bin.")


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
    """`{name: (dtype, shape)}` of a `.safetensors` file, refused if it is malformed or beyond `budget`.

    The `safetensors` package checks the header when it opens the file (its
    size, each tensor's offsets and byte count, overlaps, that the tensors
    fill the file), reading no tensor; what is left to check here is the
    model's memory budget, and dtypes numpy cannot hold.
    """
    size = require_regular_file(path).st_size
    if budget is not None:
        budget.check(path, size, "data")
    try:
        with _safetensors_open(path) as f:
            declared = {name: (f.get_slice(name).get_dtype(), tuple(f.get_slice(name).get_shape()))
                        for name in f.keys()}
    except CheckpointError:
        raise
    except Exception as error:  # safetensors' SafetensorError, or an OSError
        raise CheckpointError(f"{path} is not a readable .safetensors file: {error}") from error
    unreadable = sorted((name, dtype) for name, (dtype, _) in declared.items() if dtype not in _NUMPY_DTYPES)
    if unreadable:
        name, dtype = unreadable[0]
        more = f" (and {len(unreadable) - 1} more)" if len(unreadable) > 1 else ""
        raise CheckpointError(f"{path}: tensor {name!r} is stored as {dtype}{more}, which keras_vit does not read: "
                              "weights must be F64, F32, F16 or BF16. Dequantize the file first. Nothing was loaded.")
    return declared


def read_state_dict(path, budget=None):
    """A timm state dict file as `{name: numpy array}`: `.safetensors`, or `.bin`/`.pth` through torch."""
    if str(path).endswith(".safetensors"):
        names = safetensors_header(path, budget)
        try:
            return {name: _read_tensor(path, name) for name in names}
        except Exception as error:  # safetensors' SafetensorError: the file changed since its header was read
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


def _read_tensor(path, name):
    """One tensor of a `.safetensors` file, read through a mapping of the file that is closed at once.

    The pages a mapping reads stay in the process's memory until it is
    closed: reading every tensor through one mapping would hold the file
    twice, once mapped and once as arrays.
    """
    with _safetensors_open(path) as f:
        return f.get_tensor(name)


def _safetensors_open(path):
    _safetensors()
    from safetensors import safe_open

    return safe_open(path, framework="numpy")
