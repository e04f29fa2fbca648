"""The original Flax layout: the `.npz` files of vision_transformer and big_vision.

The one home of the mapping from the original names
(`Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query/kernel`,
...) to keras_vit's variable paths (`encoderblock_0/qkv/kernel`, ...):
`from_flax` and `read_npz` read into the internal state, `to_flax` and
`save_npz` write out of it. The layout holds the paper's ViT (class token
or `gap`), big_vision's MAP head, a pre-logits layer and a hybrid's ResNet;
`save_npz` refuses, by name, every other switch of a model, so that each
file it writes reads back as the same model.
"""

import dataclasses
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
from keras_vit.checkpoints.tensor_layout import check_shape
from keras_vit.data import preprocessing
from keras_vit.model.architecture import Architecture
from keras_vit.model.description import UNIT, architecture_of, native_grid
from keras_vit.utils.files import atomic_path

_PREFIXES = ("", "opt/target/", "params/", "params/img/")


def _flax_block_names(big_vision):
    """Per-block Flax sub-names: (attention, second LayerNorm, MLP) modules."""
    if big_vision:
        return "MultiHeadDotProductAttention_0", "LayerNorm_1", "MlpBlock_0"
    return "MultiHeadDotProductAttention_1", "LayerNorm_2", "MlpBlock_3"


def from_flax(arrays, description="checkpoint", origins=None):
    """Convert original `.npz` arrays to `{keras_vit variable path: array}`.

    Understands the original (pre-Linen) vision_transformer names, the Linen
    and big_vision names (`params/` prefixes, `MultiHeadDotProductAttention_0`,
    a top-level `pos_embedding`, a `MAPHead_0` attention-pooling head) and
    scanned blocks (`Transformer/encoderblock/` with a leading layer axis).
    Every array must be used; anything left over raises `CheckpointError`,
    as does anything missing, and each attention tensor (q, k and v are kept
    apart) is checked against its own shape before they are fused.
    `origins`, a dict, receives `{keras_vit path: the file's name}` (a tuple
    of names where the file keeps the weight otherwise: split, reshaped or
    scanned), so that later errors name the file's arrays.
    """
    prefix = next((p for p in _PREFIXES if f"{p}embedding/kernel" in arrays), None)
    if prefix is None:
        raise CheckpointError(
            f"{description} is not a ViT checkpoint: no 'embedding/kernel' "
            f"(found {preview(arrays)})."
        )
    refuse_non_float(description, {key: np.asarray(value).dtype for key, value in arrays.items()})  # all are used
    used = set()
    origins = {} if origins is None else origins
    state = {}

    def take(key):
        full = prefix + key
        if full not in arrays:
            raise CheckpointError(f"{description} is missing '{full}'.")
        used.add(full)
        return np.asarray(arrays[full])

    def put(path, key):
        state[path] = take(key)
        origins[path] = prefix + key

    scanned = f"{prefix}Transformer/encoderblock/LayerNorm_0/scale" in arrays
    big_vision = prefix.startswith("params/") or f"{prefix}pos_embedding" in arrays or scanned
    if f"{prefix}conv_root/kernel" in arrays:
        _resnet_from_flax(arrays, prefix, put)
    put("embedding/kernel", "embedding/kernel")
    put("embedding/bias", "embedding/bias")
    width = int(state["embedding/kernel"].shape[-1])
    if prefix + "cls" in arrays:
        put("class_token/cls", "cls")
    put("position_embedding/pos_embedding", "pos_embedding" if big_vision else "Transformer/posembed_input/pos_embedding")

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
        """`(the file's name, array)`: the name a tuple where the array is one slice of a scanned one."""
        if index is None:
            return prefix + base + key, take(base + key)
        if base + key not in stacked:
            stacked[base + key] = take(base + key)
        return (prefix + base + key,), stacked[base + key][index]

    for number, (base, index) in enumerate(blocks):
        def get(key):
            return block_array(base, key, index)

        def put_block(path, key):
            origins[f"encoderblock_{number}/{path}"], state[f"encoderblock_{number}/{path}"] = get(key)

        put_block("attention_norm/gamma", "LayerNorm_0/scale")
        put_block("attention_norm/beta", "LayerNorm_0/bias")
        _attention_from_flax(get, f"{attention}/", width, description, state, origins, f"encoderblock_{number}/",
                             ("qkv",))
        put_block("mlp_norm/gamma", f"{second_norm}/scale")
        put_block("mlp_norm/beta", f"{second_norm}/bias")
        for flax_dense, our_dense in (("Dense_0", "mlp_hidden"), ("Dense_1", "mlp_output")):
            put_block(f"{our_dense}/kernel", f"{mlp}/{flax_dense}/kernel")
            put_block(f"{our_dense}/bias", f"{mlp}/{flax_dense}/bias")

    put("encoder_norm/gamma", "Transformer/encoder_norm/scale")
    put("encoder_norm/beta", "Transformer/encoder_norm/bias")
    if f"{prefix}{MAP_HEAD}probe" in arrays:
        _map_head_from_flax(lambda key: (prefix + key, take(key)), width, description, state, origins)
    for layer in ("pre_logits", "head"):
        if f"{prefix}{layer}/kernel" in arrays:
            put(f"{layer}/kernel", f"{layer}/kernel")
            put(f"{layer}/bias", f"{layer}/bias")

    unused = sorted(set(arrays) - used)
    if unused:
        raise CheckpointError(
            f"{description} has {len(unused)} entries this ViT does not use, "
            f"for example {unused[:5]} (another architecture?)."
        )
    return state


# big_vision's attention-pooling head (`pool_type="map"`): a probe, one MultiHeadDotProductAttention, a LayerNorm
# and an MlpBlock, keras_vit's `attention_pool`.
MAP_HEAD = "MAPHead_0/"
_MAP_PARTS = (("LayerNorm_0/scale", "mlp_norm/gamma"), ("LayerNorm_0/bias", "mlp_norm/beta"),
              ("MlpBlock_0/Dense_0/kernel", "mlp_hidden/kernel"), ("MlpBlock_0/Dense_0/bias", "mlp_hidden/bias"),
              ("MlpBlock_0/Dense_1/kernel", "mlp_output/kernel"), ("MlpBlock_0/Dense_1/bias", "mlp_output/bias"))


def _attention_from_flax(get, base, width, description, state, origins, ours, fused):
    """One Flax `MultiHeadDotProductAttention` (under `base`; `get(key)` gives `(the file's name, array)`) into
    `state` under `ours`: q, k and v as one kernel `ours + fused[0]`, or as `query` and `key_value`.

    The query, key and value kernels are `(width, heads, head_dim)` (the
    heads the query's, their product `width`), their biases `(heads,
    head_dim)`, the output kernel `(heads, head_dim, width)`: each is checked
    against its own shape before they are fused, in the file's names.
    """
    parts = {f"{name}/{field}": get(f"{base}{name}/{field}") for name in ("query", "key", "value", "out")
             for field in ("kernel", "bias")}
    query = parts["query/kernel"][1]
    heads = int(query.shape[1]) if query.ndim == 3 and query.shape[1] and width % query.shape[1] == 0 else 1
    kernel, bias = (width, heads, width // heads), (heads, width // heads)
    expected = {"query/kernel": kernel, "key/kernel": kernel, "value/kernel": kernel, "query/bias": bias,
                "key/bias": bias, "value/bias": bias, "out/kernel": (*bias, width), "out/bias": (width,)}
    for name, shape in expected.items():
        check_shape(description, _first(parts[name][0]), parts[name][1].shape, shape, f"a model {width} wide")

    def names(*keys):
        return tuple(_first(parts[key][0]) for key in keys)

    def join(kind, keys, flat):
        return np.concatenate([parts[f"{key}/{kind}"][1].reshape(flat) for key in keys], axis=-1)

    groups = {fused[0]: ("query", "key", "value")} if len(fused) == 1 else \
        {fused[0]: ("query",), fused[1]: ("key", "value")}
    for path, keys in groups.items():
        state[f"{ours}{path}/kernel"] = join("kernel", keys, (width, -1))
        state[f"{ours}{path}/bias"] = join("bias", keys, (-1,))
        origins[f"{ours}{path}/kernel"] = names(*(f"{key}/kernel" for key in keys))
        origins[f"{ours}{path}/bias"] = names(*(f"{key}/bias" for key in keys))
    output = "attention_output" if len(fused) == 1 else fused[2]
    state[f"{ours}{output}/kernel"] = parts["out/kernel"][1].reshape(-1, width)
    origins[f"{ours}{output}/kernel"] = names("out/kernel")
    origins[f"{ours}{output}/bias"], state[f"{ours}{output}/bias"] = parts["out/bias"]
    return heads


def _first(name):
    """A file's name, or the one name of a scanned array's slice."""
    return name[0] if isinstance(name, tuple) else name


def _map_head_from_flax(get, width, description, state, origins):
    """big_vision's `MAPHead_0` into `state` as keras_vit's `attention_pool`."""
    origins["attention_pool/probe"], state["attention_pool/probe"] = get(f"{MAP_HEAD}probe")
    _attention_from_flax(get, f"{MAP_HEAD}MultiHeadDotProductAttention_0/", width, description, state, origins,
                         "attention_pool/", ("query", "key_value", "attention_output"))
    for theirs, ours in _MAP_PARTS:
        origins[f"attention_pool/{ours}"], state[f"attention_pool/{ours}"] = get(MAP_HEAD + theirs)


# A hybrid's ResNet: Flax `block{i}/unit{j}/gn1/scale` is keras_vit's `block{i}_unit{j}/gn1/gamma`.
_NORM_NAMES = (("scale", "gamma"), ("bias", "beta"))
_FLAX_UNIT = re.compile(r"block(\d+)/unit(\d+)/")


def _resnet_from_flax(arrays, prefix, put):
    put("conv_root/kernel", "conv_root/kernel")
    for theirs, ours in _NORM_NAMES:
        put(f"gn_root/{ours}", f"gn_root/{theirs}")
    units = sorted({
        (int(m.group(1)), int(m.group(2)))
        for m in (_FLAX_UNIT.match(key[len(prefix):]) for key in arrays if key.startswith(prefix)) if m
    })
    for stage, unit in units:
        base, ours = f"block{stage}/unit{unit}/", f"block{stage}_unit{unit}/"
        layers = ["1", "2", "3"] + (["_proj"] if f"{prefix}{base}conv_proj/kernel" in arrays else [])
        for layer in layers:
            put(f"{ours}conv{layer}/kernel", f"{base}conv{layer}/kernel")
            for theirs_name, our_name in _NORM_NAMES:
                put(f"{ours}gn{layer}/{our_name}", f"{base}gn{layer}/{theirs_name}")


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


def _held_architecture(found):
    """The `Architecture` that a file of the original layout with `found`'s tensors reads back as.

    The layout has the paper's block (tanh GELU, epsilon 1e-6, biases), a
    class token with a position embedding pooled by the head (`token`), or
    no class token with the mean of the tokens (`gap`) or big_vision's MAP
    head (`map`, its heads and MLP width in its arrays), a pre-logits layer,
    a hybrid's ResNet with the Flax epsilons, and nothing else. The pixel
    statistics are not in its arrays either: `save_npz` says where they go.
    """
    pooling = "token" if found.class_token else "map" if found.classifier == "map" else "gap"
    return Architecture(class_token=found.class_token, classifier=pooling,
                        **({} if pooling != "map" else dict(attention_pool_heads=found.attention_pool_heads,
                                                            attention_pool_mlp_ratio=found.attention_pool_mlp_ratio)),
                        input_mean=found.input_mean, input_std=found.input_std)


def _refuse_unheld(model):
    """Refuse, naming each, the switches of `model` that a file of the original layout cannot hold."""
    if any("lora_" in variable.path for variable in model.weights):
        raise CheckpointError(f"{model.name} has LoRA adapters, which the original .npz layout has not: call "
                              "keras_vit.merge_lora(model) first, then save_npz. Nothing was written.")
    found = architecture_of(model)
    held = _held_architecture(found)
    differs = [field.name for field in dataclasses.fields(Architecture)
               if getattr(found, field.name) != getattr(held, field.name)]
    if differs:
        raise CheckpointError(
            f"{model.name} has " + ", ".join(f"{name}={getattr(found, name)!r}" for name in differs)
            + ", which the original .npz layout cannot hold (a file of it reads back as "
            + ", ".join(f"{name}={getattr(held, name)!r}" for name in differs)
            + "): save it with model.save, or checkpoints.save_timm. Nothing was written.")


def to_flax(model):
    """A keras_vit model's weights under the original names and layouts: vision_transformer's, or with a MAP head
    big_vision's (`MAPHead_0`, a top-level `pos_embedding`).

    The inverse of `from_flax`. A model with what the layout cannot hold
    (layer scale, RoPE, register tokens, an exact GELU, ...) is refused,
    naming each such switch.
    """
    _refuse_unheld(model)
    state = state_of(model)
    hidden = state["embedding/kernel"].shape[-1]
    big_vision = "attention_pool/probe" in state
    attention, second_norm, mlp = _flax_block_names(big_vision)
    out = {
        "embedding/kernel": state["embedding/kernel"],
        "embedding/bias": state["embedding/bias"],
        ("pos_embedding" if big_vision else "Transformer/posembed_input/pos_embedding"):
            state["position_embedding/pos_embedding"],
        "Transformer/encoder_norm/scale": state["encoder_norm/gamma"],
        "Transformer/encoder_norm/bias": state["encoder_norm/beta"],
        **_resnet_to_flax(state),
    }
    if "class_token/cls" in state:
        out["cls"] = state["class_token/cls"]

    def split_attention(base, kernels, biases, output, heads):
        for name, kernel, bias in zip(("query", "key", "value"), kernels, biases):
            out[f"{base}{name}/kernel"] = kernel.reshape(hidden, heads, -1)
            out[f"{base}{name}/bias"] = bias.reshape(heads, -1)
        out[f"{base}out/kernel"] = state[f"{output}/kernel"].reshape(heads, -1, hidden)
        out[f"{base}out/bias"] = state[f"{output}/bias"]

    index = 0
    while f"encoderblock_{index}/qkv/kernel" in state:
        ours, theirs = f"encoderblock_{index}/", f"Transformer/encoderblock_{index}/"
        out[theirs + "LayerNorm_0/scale"] = state[ours + "attention_norm/gamma"]
        out[theirs + "LayerNorm_0/bias"] = state[ours + "attention_norm/beta"]
        split_attention(f"{theirs}{attention}/", np.split(state[ours + "qkv/kernel"], 3, axis=1),
                        np.split(state[ours + "qkv/bias"], 3), ours + "attention_output",
                        model.get_layer(f"encoderblock_{index}").num_heads)
        out[theirs + f"{second_norm}/scale"] = state[ours + "mlp_norm/gamma"]
        out[theirs + f"{second_norm}/bias"] = state[ours + "mlp_norm/beta"]
        for flax_dense, our_dense in (("Dense_0", "mlp_hidden"), ("Dense_1", "mlp_output")):
            out[theirs + f"{mlp}/{flax_dense}/kernel"] = state[ours + f"{our_dense}/kernel"]
            out[theirs + f"{mlp}/{flax_dense}/bias"] = state[ours + f"{our_dense}/bias"]
        index += 1
    if big_vision:
        out[f"{MAP_HEAD}probe"] = state["attention_pool/probe"]
        split_attention(f"{MAP_HEAD}MultiHeadDotProductAttention_0/",
                        [state["attention_pool/query/kernel"], *np.split(state["attention_pool/key_value/kernel"], 2,
                                                                           axis=1)],
                        [state["attention_pool/query/bias"], *np.split(state["attention_pool/key_value/bias"], 2)],
                        "attention_pool/attention_output", model.get_layer("attention_pool").num_heads)
        out.update({MAP_HEAD + theirs: state[f"attention_pool/{ours}"] for theirs, ours in _MAP_PARTS})
    for layer in ("pre_logits", "head"):
        if f"{layer}/kernel" in state:
            out[f"{layer}/kernel"], out[f"{layer}/bias"] = state[f"{layer}/kernel"], state[f"{layer}/bias"]
    return out


def save_npz(model, path):
    """Write a keras_vit model as an original-layout `.npz` checkpoint (readable by timm, vit_jax, big_vision).

    What the layout cannot hold is refused before anything is written,
    naming the switch (`to_flax`); the arrays are read back as `read_npz`
    reads the file, and must give the model's architecture, grid and
    weights, or nothing is written either.

    Example:
    >>> save_npz(keras_vit.ViT_Ti16(image_size=32, classes=10), "/tmp/ti16.npz")
    """
    arrays = to_flax(model)
    _check_reads_back(model, arrays, path)
    warn_unkept_pixel_statistics(model, "the original layout takes [-1, 1] images; read the file back with "
                                        "architecture=keras_vit.checkpoints.architecture_of(model)")
    with atomic_path(path) as temporary, open(temporary, "wb") as f:  # whole, or the old file untouched
        np.savez(f, **arrays)
    return path


def _check_reads_back(model, arrays, path):
    """Refuse `arrays` (`to_flax(model)`) that `read_npz` would not read as `model`: its architecture (but the
    pixel statistics), its patch grid and every weight."""
    source = source_of_arrays(arrays, str(path))
    found, read = architecture_of(model), source.architecture
    differ = [field.name for field in dataclasses.fields(Architecture) if field.name not in ("input_mean", "input_std")
              and getattr(found, field.name) != getattr(read, field.name)]
    grid = native_grid(model)
    if tuple(source.grid_size or ()) != tuple(grid):
        table = source.state["position_embedding/pos_embedding"].shape[1] - int(found.class_token)
        raise CheckpointError(f"{model.name} has a {grid[0]}x{grid[1]} patch grid, which the original .npz layout "
                              f"cannot state: its readers take the square grid of the table's {table} rows"
                              f"{'' if source.grid_size is None else ' (%dx%d)' % tuple(source.grid_size)}. "
                              "Save it with model.save, or checkpoints.save_timm. Nothing was written.")
    weights = state_of(model)
    differ += sorted(set(weights) ^ set(source.state)) or [key for key in weights
                                                          if not np.array_equal(weights[key], source.state[key])]
    if differ:
        raise CheckpointError(f"{path}: read back, the original layout's arrays are not {model.name}'s "
                              f"({preview(differ, 3)}). Nothing was written.")


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
    return source_of_arrays(arrays, path)


def source_of_arrays(arrays, description):
    """The `WeightsSource` of an original-layout file's `arrays` (`description` names it)."""
    origins = {}
    state = from_flax(arrays, description, origins)
    positions = state["position_embedding/pos_embedding"].shape[1] - ("class_token/cls" in state)
    side = math.isqrt(positions)
    grid = (side, side) if side * side == positions else None
    heads, pool = _heads(arrays, "Transformer/encoderblock"), {}
    if "attention_pool/probe" in state:  # big_vision's MAP head: its heads and MLP width where not the blocks'
        pool_heads = _heads(arrays, MAP_HEAD)
        hidden, mlp = state["embedding/kernel"].shape[-1], state["encoderblock_0/mlp_hidden/kernel"].shape[-1]
        pool_mlp = state["attention_pool/mlp_hidden/kernel"].shape[-1]
        pool = dict(attention_pool_heads=None if pool_heads == heads else pool_heads,
                    attention_pool_mlp_ratio=None if pool_mlp == mlp else pool_mlp / hidden)
    # The original layout gives the class token a position embedding; the table's length cannot say so.
    source = source_from_state(description, state, grid, heads,
                               architecture_from_state(state, grid, class_token_position_embedding=True, **pool))
    source.origins = origins
    source.eval_transform = preprocessing.vit_jax()  # vit_jax squashes to the square, tf.image.resize's bilinear
    return source


def _heads(arrays, part):
    """The heads of the first attention under `part` (the blocks', or `MAP_HEAD`'s): its query kernel's
    `(width, heads, head_dim)`, with a leading block axis where the blocks are scanned."""
    key = next((key for key in sorted(arrays) if part in key and key.endswith("query/kernel")), None)
    return None if key is None else int(arrays[key].shape[-2])
