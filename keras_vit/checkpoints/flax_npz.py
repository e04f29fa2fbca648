"""The original Flax layout: the `.npz` files of vision_transformer and big_vision.

The one home of the mapping from the original names
(`Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query/kernel`,
...) to keras_vit's variable paths (`encoderblock_0/qkv/kernel`, ...):
`from_flax` and `read_npz` read into the internal state, `to_flax` and
`save_npz` write out of it.
"""

import math
import re
import zipfile

import numpy as np

from keras_vit.checkpoints.source import (
    CheckpointError,
    architecture_from_state,
    check_declared_size,
    preview,
    refuse_non_float,
    require_regular_file,
    source_from_state,
    state_of,
    warn_unkept_pixel_statistics,
)
from keras_vit.data import preprocessing
from keras_vit.model.description import UNIT
from keras_vit.utils.files import atomic_path

_PREFIXES = ("", "opt/target/", "params/", "params/img/")


def _flax_block_names(big_vision):
    """Per-block Flax sub-names: (attention, second LayerNorm, MLP) modules."""
    if big_vision:
        return "MultiHeadDotProductAttention_0", "LayerNorm_1", "MlpBlock_0"
    return "MultiHeadDotProductAttention_1", "LayerNorm_2", "MlpBlock_3"


def from_flax(arrays, description="checkpoint"):
    """Convert original `.npz` arrays to `{keras_vit variable path: array}`.

    Understands the original (pre-Linen) vision_transformer names, the Linen
    and big_vision names (`params/` prefixes, `MultiHeadDotProductAttention_0`,
    a top-level `pos_embedding`) and scanned blocks (`Transformer/encoderblock/`
    with a leading layer axis). Every array must be used; anything left over
    raises `CheckpointError`, as does anything missing.
    """
    prefix = next((p for p in _PREFIXES if f"{p}embedding/kernel" in arrays), None)
    if prefix is None:
        raise CheckpointError(
            f"{description} is not a ViT checkpoint: no 'embedding/kernel' "
            f"(found {preview(arrays)})."
        )
    refuse_non_float(description, {key: np.asarray(value).dtype for key, value in arrays.items()})  # all are used
    used = set()

    def take(key):
        full = prefix + key
        if full not in arrays:
            raise CheckpointError(f"{description} is missing '{full}'.")
        used.add(full)
        return np.asarray(arrays[full])

    scanned = f"{prefix}Transformer/encoderblock/LayerNorm_0/scale" in arrays
    big_vision = prefix.startswith("params/") or f"{prefix}pos_embedding" in arrays or scanned
    state = _resnet_from_flax(arrays, prefix, take) if f"{prefix}conv_root/kernel" in arrays else {}
    state.update({"embedding/kernel": take("embedding/kernel"), "embedding/bias": take("embedding/bias")})
    if prefix + "cls" in arrays:
        state["class_token/cls"] = take("cls")
    position_key = "pos_embedding" if big_vision else "Transformer/posembed_input/pos_embedding"
    state["position_embedding/pos_embedding"] = take(position_key)

    attention, second_norm, mlp = _flax_block_names(big_vision)
    if scanned:
        depth = arrays[f"{prefix}Transformer/encoderblock/LayerNorm_0/scale"].shape[0]
        blocks = [("Transformer/encoderblock/", index) for index in range(depth)]
    else:
        blocks = [
            (f"Transformer/encoderblock_{index}/", None) for index in _block_indices(arrays, prefix)
        ]
    stacked = {}

    def block_array(base, key, index):
        if index is None:
            return take(base + key)
        if base + key not in stacked:
            stacked[base + key] = take(base + key)
        return stacked[base + key][index]

    for number, (base, index) in enumerate(blocks):
        get = lambda key: block_array(base, key, index)  # noqa: E731
        ours = f"encoderblock_{number}/"
        hidden = get("LayerNorm_0/scale").shape[0]
        state[ours + "attention_norm/gamma"] = get("LayerNorm_0/scale")
        state[ours + "attention_norm/beta"] = get("LayerNorm_0/bias")
        state[ours + "qkv/kernel"] = np.concatenate(
            [get(f"{attention}/{n}/kernel").reshape(hidden, -1) for n in ("query", "key", "value")],
            axis=1,
        )
        state[ours + "qkv/bias"] = np.concatenate(
            [get(f"{attention}/{n}/bias").reshape(-1) for n in ("query", "key", "value")]
        )
        state[ours + "attention_output/kernel"] = get(f"{attention}/out/kernel").reshape(-1, hidden)
        state[ours + "attention_output/bias"] = get(f"{attention}/out/bias")
        state[ours + "mlp_norm/gamma"] = get(f"{second_norm}/scale")
        state[ours + "mlp_norm/beta"] = get(f"{second_norm}/bias")
        for flax_dense, our_dense in (("Dense_0", "mlp_hidden"), ("Dense_1", "mlp_output")):
            state[ours + f"{our_dense}/kernel"] = get(f"{mlp}/{flax_dense}/kernel")
            state[ours + f"{our_dense}/bias"] = get(f"{mlp}/{flax_dense}/bias")

    state["encoder_norm/gamma"] = take("Transformer/encoder_norm/scale")
    state["encoder_norm/beta"] = take("Transformer/encoder_norm/bias")
    for layer in ("pre_logits", "head"):
        if f"{prefix}{layer}/kernel" in arrays:
            state[f"{layer}/kernel"] = take(f"{layer}/kernel")
            state[f"{layer}/bias"] = take(f"{layer}/bias")

    unused = sorted(set(arrays) - used)
    if unused:
        raise CheckpointError(
            f"{description} has {len(unused)} entries this ViT does not use, "
            f"for example {unused[:5]} (another architecture?)."
        )
    return state


# A hybrid's ResNet: Flax `block{i}/unit{j}/gn1/scale` is keras_vit's `block{i}_unit{j}/gn1/gamma`.
_NORM_NAMES = (("scale", "gamma"), ("bias", "beta"))
_FLAX_UNIT = re.compile(r"block(\d+)/unit(\d+)/")


def _resnet_from_flax(arrays, prefix, take):
    state = {"conv_root/kernel": take("conv_root/kernel")}
    for theirs, ours in _NORM_NAMES:
        state[f"gn_root/{ours}"] = take(f"gn_root/{theirs}")
    units = sorted({
        (int(m.group(1)), int(m.group(2)))
        for m in (_FLAX_UNIT.match(key[len(prefix):]) for key in arrays if key.startswith(prefix)) if m
    })
    for stage, unit in units:
        base, ours = f"block{stage}/unit{unit}/", f"block{stage}_unit{unit}/"
        layers = ["1", "2", "3"] + (["_proj"] if f"{prefix}{base}conv_proj/kernel" in arrays else [])
        for layer in layers:
            state[f"{ours}conv{layer}/kernel"] = take(f"{base}conv{layer}/kernel")
            for theirs_name, our_name in _NORM_NAMES:
                state[f"{ours}gn{layer}/{our_name}"] = take(f"{base}gn{layer}/{theirs_name}")
    return state


def _resnet_to_flax(state):
    out = {}
    for key, value in state.items():
        unit = UNIT.match(key)
        if unit:
            key = f"block{unit.group(1)}/unit{unit.group(2)}/" + key[unit.end():]
        elif not key.startswith(("conv_root/", "gn_root/")):
            continue
        for theirs, ours in _NORM_NAMES:
            key = re.sub(f"/{ours}$", f"/{theirs}", key)
        out[key] = value
    return out


def to_flax(model):
    """A keras_vit model's weights under the original vision_transformer names and layouts.

    The inverse of `from_flax` (for the original, un-prefixed layout).
    """
    state = state_of(model)
    hidden = state["embedding/kernel"].shape[-1]
    out = {
        "embedding/kernel": state["embedding/kernel"],
        "embedding/bias": state["embedding/bias"],
        "Transformer/posembed_input/pos_embedding": state["position_embedding/pos_embedding"],
        "Transformer/encoder_norm/scale": state["encoder_norm/gamma"],
        "Transformer/encoder_norm/bias": state["encoder_norm/beta"],
        **_resnet_to_flax(state),
    }
    if "class_token/cls" in state:
        out["cls"] = state["class_token/cls"]
    attention, second_norm, mlp = _flax_block_names(big_vision=False)
    index = 0
    while f"encoderblock_{index}/qkv/kernel" in state:
        ours, theirs = f"encoderblock_{index}/", f"Transformer/encoderblock_{index}/"
        heads = model.get_layer(f"encoderblock_{index}").num_heads
        if getattr(model.get_layer(f"encoderblock_{index}"), "num_kv_heads", heads) != heads:
            raise CheckpointError(f"{model.name} has grouped-query attention (num_kv_heads), which the original "
                                  "layout has not: save it with model.save, or checkpoints.save_timm with "
                                  "architecture= a Sapiens2 name.")
        out[theirs + "LayerNorm_0/scale"] = state[ours + "attention_norm/gamma"]
        out[theirs + "LayerNorm_0/bias"] = state[ours + "attention_norm/beta"]
        kernels = np.split(state[ours + "qkv/kernel"], 3, axis=1)
        biases = np.split(state[ours + "qkv/bias"], 3)
        for name, kernel, bias in zip(("query", "key", "value"), kernels, biases):
            out[theirs + f"{attention}/{name}/kernel"] = kernel.reshape(hidden, heads, -1)
            out[theirs + f"{attention}/{name}/bias"] = bias.reshape(heads, -1)
        out[theirs + f"{attention}/out/kernel"] = state[ours + "attention_output/kernel"].reshape(heads, -1, hidden)
        out[theirs + f"{attention}/out/bias"] = state[ours + "attention_output/bias"]
        out[theirs + f"{second_norm}/scale"] = state[ours + "mlp_norm/gamma"]
        out[theirs + f"{second_norm}/bias"] = state[ours + "mlp_norm/beta"]
        for flax_dense, our_dense in (("Dense_0", "mlp_hidden"), ("Dense_1", "mlp_output")):
            out[theirs + f"{mlp}/{flax_dense}/kernel"] = state[ours + f"{our_dense}/kernel"]
            out[theirs + f"{mlp}/{flax_dense}/bias"] = state[ours + f"{our_dense}/bias"]
        index += 1
    for layer in ("pre_logits", "head"):
        if f"{layer}/kernel" in state:
            out[f"{layer}/kernel"], out[f"{layer}/bias"] = state[f"{layer}/kernel"], state[f"{layer}/bias"]
    return out


def save_npz(model, path):
    """Write a keras_vit model as an original-layout `.npz` checkpoint (readable by timm, vit_jax).

    Example:
    >>> save_npz(keras_vit.ViT_Ti16(image_size=32, classes=10), "/tmp/ti16.npz")
    """
    arrays = to_flax(model)
    warn_unkept_pixel_statistics(model, "the original layout takes [-1, 1] images; read the file back with "
                                        "architecture=keras_vit.checkpoints.architecture_of(model)")
    with atomic_path(path) as temporary, open(temporary, "wb") as f:  # whole, or the old file untouched
        np.savez(f, **arrays)
    return path


def _block_indices(arrays, prefix):
    pattern = re.compile(re.escape(prefix) + r"Transformer/encoderblock_(\d+)/")
    indices = sorted({int(m.group(1)) for m in map(pattern.match, arrays) if m})
    if indices != list(range(len(indices))):
        missing = sorted(set(range(max(indices, default=-1) + 1)) - set(indices))
        raise CheckpointError(f"Checkpoint blocks are not contiguous: missing encoderblock_{missing}.")
    return indices



def check_npz(path, description=None, budget=None):
    """Raise `CheckpointError` unless `path` is a zip of numeric `.npy` arrays of sane sizes; reads only headers.

    `description` names the file in messages (default: `path`); `budget`
    (a `WeightBudget`) bounds the bytes its arrays may declare.
    """
    _declared_arrays(path, description, budget)


def _declared_arrays(path, description=None, budget=None):
    """`{name: (shape, dtype)}` from the `.npy` headers of an `.npz`, checked against each entry's stored size.

    The zip directory's total uncompressed size is checked against the
    file's size (`check_declared_size`) and against the `budget` of the
    model it is meant for first, so a decompression bomb, or a file out of
    proportion to the model, is refused before anything is decompressed.
    """
    file_size = require_regular_file(path).st_size
    given, path = path, description or path
    if not zipfile.is_zipfile(given):
        with open(given, "rb") as f:
            start = f.read(6)
        what = "a single .npy array" if start == b"\x93NUMPY" else "no zip archive (truncated, or another kind of file)"
        raise CheckpointError(f"{path} is not a readable .npz checkpoint: it is {what}, not np.savez's zip of arrays.")
    declared = {}
    try:
        with zipfile.ZipFile(given) as archive:
            entries = archive.infolist()
            declared_bytes = sum(entry.file_size for entry in entries)
            check_declared_size(path, declared_bytes, file_size, "arrays")
            if budget is not None:
                budget.check(path, declared_bytes, "arrays")
            if not entries:
                raise CheckpointError(f"{path} is an empty zip archive, not an .npz checkpoint.")
            for entry in entries:
                with archive.open(entry) as f:
                    version = np.lib.format.read_magic(f)
                    read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
                        np.lib.format.read_array_header_2_0
                    shape, _, dtype = read_header(f)
                    header_size = f.tell()
                name = entry.filename.removesuffix(".npy")
                if dtype.kind not in "fiu" or dtype.hasobject:
                    raise CheckpointError(f"{path}: '{name}' holds {dtype} values, not numbers.")
                size = math.prod(shape) * dtype.itemsize
                if size != entry.file_size - header_size:
                    raise CheckpointError(
                        f"{path}: '{name}' declares shape {shape} of {dtype} ({size:,} bytes) but stores "
                        f"{entry.file_size - header_size:,} bytes; the file is corrupt."
                    )
                declared[name] = (shape, dtype)
    except CheckpointError:
        raise
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as error:
        raise CheckpointError(f"{path} is not a readable .npz checkpoint (truncated or corrupt?): {error}") from error
    return declared


def read_npz(path, budget=None):
    """Read an original `.npz` checkpoint (vision_transformer or big_vision layout).

    Every array's header is checked before any array is read: a file that
    is no zip of `.npy` arrays, an entry whose declared shape and type do
    not match its stored size, or arrays beyond the `budget` (a
    `WeightBudget`) of the model they are meant for, are refused without
    allocating them.
    """
    _declared_arrays(path, budget=budget)
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {key: archive[key] for key in archive.files}
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, KeyError) as error:
        raise CheckpointError(
            f"{path} is not a readable .npz checkpoint (truncated or corrupt?): {error}"
        ) from error
    state = from_flax(arrays, description=path)
    query = next((v for k, v in sorted(arrays.items()) if k.endswith("query/kernel")), None)
    num_heads = None if query is None else int(query.shape[-2])
    positions = state["position_embedding/pos_embedding"].shape[1] - ("class_token/cls" in state)
    side = math.isqrt(positions)
    grid = (side, side) if side * side == positions else None
    # The original layout gives the class token a position embedding; the table's length cannot say so.
    source = source_from_state(path, state, grid, num_heads,
                               architecture_from_state(state, grid, class_token_position_embedding=True))
    source.eval_transform = preprocessing.vit_jax()  # vit_jax squashes to the square, tf.image.resize's bilinear
    return source
