"""Reading any checkpoint into the internal state, and loading that state into a model.

Loading is all-or-nothing: a checkpoint is read into a plain dict of numpy
arrays, every name and shape is checked against the model, and only then
are the variables assigned. Any mismatch raises `CheckpointError` from the
model constructor, so no half-loaded model is ever returned. Position
embeddings are resized to the model's grid, patch kernels to its patch size
(FlexiViT), and heads adapted here.
"""

import dataclasses
import logging
import math
import os

import keras
import numpy as np

from keras_vit.checkpoints.flax_npz import read_npz
from keras_vit.checkpoints.hub.huggingface import HF_PREFIX, resolve_handle
from keras_vit.checkpoints.hub.registry import fetch, find_checkpoint
from keras_vit.checkpoints.keras_files import read_keras, read_weights_h5, read_weights_h5_state
from keras_vit.checkpoints.source import (
    BLOCK,
    CheckpointError,
    WeightsSource,
    non_finite,
    pixel_statistics,
    preview,
    read_json_object,
    refuse_non_float,
    require_regular_file,
    weight_budget,
)
from keras_vit.checkpoints.tensor_layout import file_shape
from keras_vit.checkpoints.timm.folders import read_timm_folder
from keras_vit.checkpoints.timm.layout import read_timm
from keras_vit.checkpoints.timm.sam import resize_global_tables
from keras_vit.checkpoints.transformers.clip import MODEL_TYPES as VISION_TOWER_TYPES
from keras_vit.checkpoints.transformers.clip import read_vision_tower_folder
from keras_vit.checkpoints.transformers.dinov2 import MODEL_TYPES as DINOV2_TYPES
from keras_vit.checkpoints.transformers.dinov2 import read_dinov2_folder
from keras_vit.checkpoints.transformers.beit import MODEL_TYPES as BEIT_TYPES
from keras_vit.checkpoints.transformers.beit import read_beit_folder
from keras_vit.checkpoints.transformers.dinov3 import MODEL_TYPES as DINOV3_TYPES
from keras_vit.checkpoints.transformers.sam import MODEL_TYPES as SAM_TYPES
from keras_vit.checkpoints.transformers.gemma4 import MODEL_TYPES as GEMMA4_TYPES
from keras_vit.checkpoints.transformers.gemma4 import read_gemma4_vision_folder
from keras_vit.checkpoints.transformers.sam import read_sam_vision_folder
from keras_vit.checkpoints.transformers.dinov3 import read_dinov3_folder
from keras_vit.checkpoints.transformers.siglip2 import MODEL_TYPES as SIGLIP2_TYPES
from keras_vit.checkpoints.transformers.siglip2 import read_siglip2_folder
from keras_vit.checkpoints.transformers.vit import MODEL_TYPES as VIT_TYPES
from keras_vit.checkpoints.transformers.vit import read_transformers_folder
from keras_vit.data import preprocessing
from keras_vit.layers.position_embedding import resize_patch_embedding, resize_position_embeddings
from keras_vit.layers.relative_position import relative_table_rows, resize_relative_position_table
from keras_vit.model.description import conv_stem_widths_of, mbconv_of, resnet_layers_of
from keras_vit.model.variants import VARIANTS, width_name
from keras_vit.utils.keras_internals import set_value
from keras_vit.utils.names import looks_like_path

logger = logging.getLogger("keras_vit")


def read_weights(weights, variant=None, image_size=(224, 224), sizes=None, classes=None, verbose=None):
    """Read `weights` (a file, a folder, an `hf://org/name` handle or a published name) into a `WeightsSource`.

    The one reader every caller goes through: `ViT(weights=...)`,
    `from_pretrained`, training and the commands. `variant` is the model's
    variant name (or `None` for custom sizes) and `image_size` its
    `(height, width)`, used to choose among named files.
    `sizes` (a `Variant`, default the named variant's) and `classes` are
    the model's it is meant for: a file far larger than any checkpoint of
    that model is refused before it is read. A named checkpoint not yet in
    the cache is downloaded with a progress bar unless `verbose=0`.
    """
    if isinstance(weights, WeightsSource):
        return weights
    if not isinstance(weights, (str, os.PathLike)):
        raise CheckpointError(f"weights must be None, a name or a path, got {type(weights).__name__}.")
    path = os.fspath(weights)
    if path.startswith(HF_PREFIX):
        path = resolve_handle(path)
    if not looks_like_path(path):
        checkpoint = find_checkpoint(variant, path, image_size)
        source = read_npz(fetch(checkpoint, verbose))  # Checked against the variant's budget on download.
        if checkpoint.image_size != image_size[0] or image_size[0] != image_size[1]:
            logger.warning(
                "Using %s weights %r trained at %d px for a %s input.",
                variant, path, checkpoint.image_size, image_size,
            )
        return source
    sizes = sizes or VARIANTS.get(variant)
    budget = None if sizes is None else weight_budget(sizes, classes)
    if os.path.isdir(path):
        return read_folder(path, budget)
    readers = {".npz": read_npz, ".keras": read_keras, ".weights.h5": read_weights_h5,
               ".safetensors": read_timm, ".bin": read_timm, ".pth": read_timm}
    reader = next((read for suffix, read in readers.items() if path.endswith(suffix)), None)
    kinds = ("keras_vit reads an original .npz, a .keras or a .weights.h5 file, a timm state dict (.safetensors, "
             ".bin, .pth) or a timm or transformers folder.")
    kind = os.path.splitext(path)[1]
    if not os.path.exists(path):  # first: a mistyped path is not a file of an unknown type
        raise CheckpointError(f"Weights file not found: {path}" + ("" if reader is not None or not kind else
                                                                   f" ({kind!r} is no weights file type either: "
                                                                   f"{kinds})"))
    if reader is None:
        raise CheckpointError(f"Unknown weights file type {kind or 'without an extension'!r}: {path}. {kinds}")
    require_regular_file(path)  # Before anything opens it: a FIFO or a device would hang or never end.
    source = reader(path, budget=budget)
    return source if source.state is not None else read_weights_h5_state(source)


def read_folder(folder, budget=None):
    """A Hub-style folder: timm's (`config.json` with `architecture`) or transformers' (ViT, DeiT, DINOv2, DINOv3, CLIP,
    SigLIP, SigLIP 2, BEiT, SAM's vision encoder, Gemma 4's vision tower), named as its library names it (timm's
    architecture, transformers' model_type)."""
    config = read_json_object(
        os.path.join(folder, "config.json"),
        f"{folder} is a folder without a readable config.json (timm's or transformers')",
        "timm's and transformers' config.json is an object ({\"architecture\": ...} or {\"model_type\": \"vit\", ...}).")
    source = _read_folder(folder, config, budget)
    name = config.get("architecture", config.get("model_type"))
    source.name = name if isinstance(name, str) and name and "/" not in name else None
    return source


def _read_folder(folder, config, budget):
    if "architecture" in config:
        return read_timm_folder(folder, config, budget)
    model_type = config.get("model_type")
    if model_type in VIT_TYPES:
        return _with_preprocessor_statistics(read_transformers_folder(folder, config, budget), folder, model_type)
    if model_type in DINOV2_TYPES:
        return _with_preprocessor_statistics(read_dinov2_folder(folder, config, budget), folder, model_type)
    if model_type in DINOV3_TYPES:
        return _with_preprocessor_statistics(read_dinov3_folder(folder, config, budget), folder, model_type)
    if model_type in VISION_TOWER_TYPES:
        return _with_preprocessor_statistics(read_vision_tower_folder(folder, config, budget), folder, model_type)
    if model_type in SIGLIP2_TYPES:
        return _with_preprocessor_statistics(read_siglip2_folder(folder, config, budget), folder, model_type)
    if model_type in BEIT_TYPES:
        return _with_preprocessor_statistics(read_beit_folder(folder, config, budget), folder, model_type)
    if model_type in SAM_TYPES:
        return _with_preprocessor_statistics(read_sam_vision_folder(folder, config, budget), folder, model_type)
    if model_type in GEMMA4_TYPES:  # its processor (a patch budget) read with the folder
        return read_gemma4_vision_folder(folder, config, budget)
    known = ", ".join(repr(name) for name in (*VIT_TYPES, *DINOV2_TYPES, *DINOV3_TYPES, *VISION_TOWER_TYPES,
                                              *SIGLIP2_TYPES, *BEIT_TYPES, *SAM_TYPES, *GEMMA4_TYPES))
    raise CheckpointError(f"{folder}: its config.json is neither timm's (architecture) nor a transformers ViT, "
                          f"DeiT, DINOv2, DINOv3, CLIP, SigLIP, SigLIP 2, BEiT, SAM vision or Gemma 4 model's "
                          f"(model_type "
                          f"{known}; this one is {config.get('model_type')!r}).")


# transformers' models that take any image size in every call: DINOv2's interpolate_pos_encoding resizes its table
# each time, DINOv3's RoPE has none. The others (ViT, DeiT, CLIP, SigLIP) take their config's image_size alone.
ANY_SIZE_TYPES = (*DINOV2_TYPES, *DINOV3_TYPES)


def _with_preprocessor_statistics(source, folder, model_type):
    """`source` with the pixel mean and std and the eval transform of the folder's `preprocessor_config.json`.

    transformers keeps the normalisation there, not in `config.json` (DINOv2's is ImageNet's, google/vit-*'s
    the paper's 0.5). A NaFlex source (SigLIP 2) gets its patch budget instead of an eval transform (from the
    processor's defaults where the folder has no such file). Where the processor gives images of another size
    than the config's `image_size`, a model of `ANY_SIZE_TYPES` runs at the processor's, its table resized as
    transformers resizes it on every call (published DINOv2: 224 px beside a 518-pixel table); any other model
    type is refused, as transformers refuses those images.
    """
    path = os.path.join(folder, "preprocessor_config.json")
    if not os.path.exists(path) and not source.naflex:
        return source
    config = read_json_object(path, f"{path} is not a readable JSON file",
                              "transformers writes an object ({\"image_mean\": [...], \"image_std\": [...], ...}).") \
        if os.path.exists(path) else {}
    statistics = pixel_statistics(config.get("image_mean"), config.get("image_std"), path,
                                  ("image_mean", "image_std"))
    try:
        if source.naflex:
            source.naflex_preprocessing = preprocessing.naflex_from_preprocessor_config(
                config, path, int(source.state["embedding/kernel"].shape[0]))
        else:
            source.eval_transform = preprocessing.from_preprocessor_config(config, path)
    except ValueError as error:
        raise CheckpointError(str(error)) from None
    source.architecture = dataclasses.replace(source.architecture, **statistics)
    crop = None if source.eval_transform is None else source.eval_transform.image_size
    if crop is not None and tuple(crop) != tuple(source.image_size):
        if model_type not in ANY_SIZE_TYPES:
            raise CheckpointError(
                f"{path} gives {crop[0]}x{crop[1]} images, but {os.path.join(folder, 'config.json')} has image_size "
                f"{list(source.image_size)}, the only size transformers' {model_type!r} model takes (without "
                "interpolate_pos_encoding): the folder's processor and model disagree; set one to the other. "
                "Nothing was loaded.")
        source.input_size = tuple(crop)
    return source


_OPTIONAL = ("pre_logits/", "head/", "head_dist/")


def load_into(model, source):
    """Check `source` against `model` completely, then assign every variable.

    Resizes the patch-embedding kernel to the model's patch size and the
    position embeddings to the model's grid; loads the head only
    when its class count matches (else keeps the fresh zero head) and
    raises `CheckpointError` for anything else that does not fit. A
    variable built without a value (`keras_internals.build_without_values`)
    gets its first from the checkpoint, and a `single_use` source's state is
    emptied as it loads.
    """
    variables = {v.path: v for v in model.weights}
    state = source.state if source.single_use else dict(source.state)
    name = source.description
    refuse_non_float(name, {key: np.asarray(value).dtype for key, value in state.items()})
    model_depth = len({m.group(1) for m in map(BLOCK.match, variables) if m})
    if source.num_layers != model_depth:
        raise CheckpointError(
            f"{name} has {source.num_layers} encoder blocks but the model has {model_depth}"
            f"{_apparent_size(state)}."
        )
    checkpoint_token, model_token = "class_token/cls" in state, "class_token/cls" in variables
    if checkpoint_token != model_token:
        if checkpoint_token:
            raise CheckpointError(
                f"{name} has a class token but the model has none (a classifier of 'gap' or 'map' given alone builds "
                "none); pass class_token=True to keep it (with classifier='gap' for average pooling), or leave "
                f"classifier unset for the file's {source.classifier!r}."
            )
        raise CheckpointError(
            f"{name} has no class token but the model has one; pass classifier={source.classifier!r} (the file's "
            "pooling), or class_token=False."
        )
    model_resnet = resnet_layers_of(variables)
    if source.resnet_layers != model_resnet:
        def describe(layers):
            return "a plain ViT" if layers is None else f"a hybrid with ResNet stages {layers}"
        raise CheckpointError(f"{name} is {describe(source.resnet_layers)} but the model is {describe(model_resnet)}.")
    stems = conv_stem_widths_of(state), conv_stem_widths_of(variables)
    if stems[0] != stems[1]:
        def describe(widths):
            return "without a convolutional stem" if widths is None else f"with a convolutional stem of widths {widths}"
        raise CheckpointError(f"{name} is a ViT {describe(stems[0])}, but the model is one {describe(stems[1])} "
                              "(conv_stem_widths).")
    stems = mbconv_of(state), mbconv_of(variables)
    if stems[0] != stems[1]:
        def describe(stem):
            return "without an MbConv stem" if stem is None else f"with an MbConv stem of widths {stem[0]} and " \
                f"depths {stem[1]}"
        raise CheckpointError(f"{name} is a ViT {describe(stems[0])}, but the model is one {describe(stems[1])} "
                              "(mbconv_widths, mbconv_depths).")
    model_heads = model.get_layer("encoderblock_0").num_heads if model_depth else None
    if source.num_heads and model_heads and source.num_heads != model_heads:
        raise CheckpointError(
            f"{name} has {source.num_heads} attention heads per block but the model has {model_heads}"
            f"{_apparent_size(state)}; pass num_heads={source.num_heads}."
        )
    notes = []  # Said only once the load succeeds.
    _adapt_patch_embedding(variables, state, name, notes)
    _adapt_position_embedding(model, state, source, notes)
    _adapt_relative_position_tables(model, state, source, notes)
    _adapt_head(variables, state, source, notes)

    missing = sorted(k for k in variables if k not in state and not k.startswith(_OPTIONAL))
    unexpected = sorted(k for k in state if k not in variables and not k.startswith(_OPTIONAL))
    if missing:
        raise CheckpointError(f"{name} lacks {len(missing)} model weights: {preview(missing, 8)}.")
    if unexpected:
        raise CheckpointError(
            f"{name} has {len(unexpected)} weights the model lacks: {preview(unexpected, 8)}."
        )
    loaded = [key for key in state if key in variables]
    for key in loaded:  # Every tensor is checked before any variable is assigned.
        value = state[key]
        if tuple(value.shape) != tuple(variables[key].shape):
            raise CheckpointError(f"{name}: {_shapes(source, key, value.shape, variables[key].shape)}"
                                  f"{_apparent_size(state)}. Nothing was loaded.")
        # Checked after the cast: 1e39 is finite in float64 but not in float32, 1e5 not in float16.
        if non_finite(key, _cast(value, variables[key].dtype)):
            if non_finite(key, value):
                raise CheckpointError(f"{name}: {_file_name(source, key)} holds NaN or infinite values. Nothing was "
                                      "loaded.")
            raise CheckpointError(
                f"{name}: {_file_name(source, key)} holds values up to {np.max(np.abs(value)):.3g}, beyond the "
                f"range of the model's {variables[key].dtype} variables. Nothing was loaded."
            )
    for key in loaded:  # Cast again, one at a time, each tensor dropped once held: the state is never held twice.
        set_value(variables[key], _cast(state.pop(key), variables[key].dtype))
    state.clear()
    for note in notes:
        logger.warning(note)


def _file_name(source, key):
    """keras_vit's weight `key` as `source`'s file names it: `'blocks.0.norm1.weight'`, or with the file's tensors
    that make it (`'encoderblock_0/qkv/kernel' (the file's 'q_proj.weight', ...)`)."""
    origin = (source.origins or {}).get(key)
    if origin is None:
        return f"'{key}'"
    if isinstance(origin, str):
        return f"'{origin}'"
    return f"'{key}' (the file's {', '.join(map(repr, origin))})"


def _shapes(source, key, shape, expected):
    """"'<tensor>' has shape <shape> but the model expects <expected>", in the file's own name and shape where one
    of its tensors is the weight `key`."""
    origin = (source.origins or {}).get(key)
    if isinstance(origin, str):
        shape, expected = file_shape(origin, shape), file_shape(origin, expected)
    return f"{_file_name(source, key)} has shape {tuple(shape)} but the model expects {tuple(expected)}"


def _cast(value, dtype):
    """`value` as `dtype`, copied only where the dtypes differ."""
    with np.errstate(over="ignore"):
        return np.asarray(value).astype(dtype, copy=False)


def _apparent_size(state):
    """", the file has hidden size 192 (a Ti checkpoint?)", or "" when the file's width is unknown."""
    kernel = state.get("embedding/kernel")
    if kernel is None:
        return ""
    hidden = int(kernel.shape[-1])
    width = width_name(hidden)
    return f"; the file has hidden size {hidden}" + (f" (a {width} checkpoint?)" if width else "")


def check_finite(model, description):
    """Raise `CheckpointError` if any of `model`'s weights is NaN or infinite (a model loaded by Keras)."""
    bad = [v.path for v in model.weights if non_finite(v.path, keras.ops.convert_to_numpy(v))]
    if bad:
        raise CheckpointError(f"{description} holds NaN or infinite weights in {len(bad)} variables: {preview(bad)}.")


def _adapt_patch_embedding(variables, state, name, notes):
    """A checkpoint of another patch size serves this one through FlexiViT's pseudo-inverse resize. A hybrid's
    patches are its stem's last convolution, over feature maps, not pixels: never resized."""
    key = "embedding/kernel"
    if key not in state or key not in variables or {"conv_root/kernel", "conv_stem_0/kernel",
                                                    "mbconv_stem_conv1/kernel"} & set(state):
        return
    kernel, target = state[key], tuple(variables[key].shape)
    if kernel.ndim != 4 or tuple(kernel.shape[2:]) != target[2:] or tuple(kernel.shape[:2]) == target[:2]:
        return  # Equal, or a mismatch the shape check reports.
    state[key] = resize_patch_embedding(kernel.astype("float32"), target[:2])
    notes.append(
        f"Resized the patch embedding of {name} from {kernel.shape[0]}x{kernel.shape[1]} to "
        f"{target[0]}x{target[1]} pixel patches (FlexiViT pseudo-inverse, bicubic)."
    )


def _adapt_position_embedding(model, state, source, notes):
    """Resize the file's position table from its grid to the model's: the one decision, made from the two grids.

    The file's grid is what its reader says (its config's, else the table's
    square); a table of as many rows on another grid (4x4 to 2x8) is
    resized too, as timm's own load at that size does. A table of no square
    grid whose file states none can only be taken as the model's own.
    """
    key = "position_embedding/pos_embedding"
    if key not in state:
        return
    try:
        layer = model.get_layer("position_embedding")
    except ValueError:
        return
    table = state[key]
    target = tuple(layer.pos_embedding.shape)
    if table.ndim != 3 or table.shape[0] != 1 or table.shape[-1] != target[-1]:
        raise CheckpointError(f"{source.description}: {_shapes(source, key, table.shape, target)}. Nothing was "
                              "loaded.")
    grid = None if source.grid_size is None else tuple(source.grid_size)
    if grid == tuple(layer.grid_size) or (grid is None and tuple(table.shape) == target):
        return  # Same grid: any other difference (prefix rows) is the shape check's to report.
    prefix = layer.num_prefix_tokens
    try:
        resized = resize_position_embeddings(
            table.astype("float32"),
            new_grid_size=layer.grid_size,
            old_grid_size=source.grid_size,
            num_prefix_tokens=prefix,
            interpolation=layer.interpolation,
            antialias=layer.antialias,
            # The source library's corner-to-corner resize (RADIO v3 in timm), where its resize is in force.
            align_corners=bool(source.resize_align_corners)
            and (layer.interpolation, layer.antialias) == tuple(source.position_resize or ()),
        )
    except ValueError as error:
        if source.grid_size is None:  # The table is not square and the file names no grid: not the caller's fault.
            raise CheckpointError(
                f"{source.description}: its position table has {table.shape[1]} rows, which are no square grid after "
                f"{prefix} prefix tokens, and the file does not state its grid (timm's model_args.img_size or "
                "pretrained_cfg.input_size, transformers' image_size): keras_vit cannot tell how to resize it."
            ) from error
        raise CheckpointError(f"{source.description}: cannot resize position embeddings: {error}") from error
    old = source.grid_size or (math.isqrt(table.shape[1] - prefix),) * 2
    notes.append(
        f"Resized position embeddings of {source.description} from a {old[0]}x{old[1]} to a "
        f"{layer.grid_size[0]}x{layer.grid_size[1]} patch grid ({layer.interpolation}"
        f"{', antialiased' if layer.antialias else ''})."
    )
    state[key] = resized


def _adapt_relative_position_tables(model, state, source, notes):
    """Resize the file's relative position bias tables from its grid to the model's, as the file's library does.

    The file's grid is its reader's (the config's image size), else the
    square its rows describe; a table of any other row count is the shape
    check's to report. (A bias computed by an MLP needs no resize.)
    """
    grids = {}
    for layer in model.layers:
        if getattr(layer, "relative_position_grid", None) is not None:
            grids[f"{layer.name}/relative_position_bias_table"] = tuple(layer.relative_position_grid)
        elif layer.name == "relative_position_bias":
            grids["relative_position_bias/relative_position_bias_table"] = tuple(layer.grid_size)
    variables = {variable.path: variable for variable in model.weights}
    resized = set()
    for key, grid in grids.items():
        table = state.get(key)
        if table is None or table.ndim != 2 or key not in variables:
            continue
        extra = int(variables[key].shape[0]) - relative_table_rows(grid, class_token=False)  # a class token's rows
        old = None if source.grid_size is None or None in source.grid_size else tuple(source.grid_size)
        if old is None:
            side = (math.isqrt(max(table.shape[0] - extra, 0)) + 1) // 2
            old = (side, side) if relative_table_rows((side, side), False) + extra == table.shape[0] else grid
        if old == grid or table.shape[0] != relative_table_rows(old, False) + extra:
            continue
        state[key] = resize_relative_position_table(table, old, grid, source.relative_position_resize)
        resized.add((old, grid))
    for old, grid in sorted(resized):
        notes.append(f"Resized the relative position bias tables of {source.description} from a {old[0]}x{old[1]} to "
                     f"a {grid[0]}x{grid[1]} patch grid (as {source.relative_position_resize} does).")
    resize_global_tables(model, state, variables, source, notes)  # SAM's decomposed ones


def _adapt_head(variables, state, source, notes):
    """Drop the checkpoint's pooling, pre-logits and head where the model cannot use them; a note says which
    pooling weights (`attention_pool`, `fc_norm`: timm's `forward_head`, not its `forward_features`) go.

    A distilled DeiT's two heads (`head`, `head_dist`) load or start at zero together.
    """
    name = source.description
    for pooling in ("attention_pool/", "fc_norm/"):  # A model of the token sequence, or pooled otherwise
        dropped = [] if any(key.startswith(pooling) for key in variables) else \
            sorted(key for key in state if key.startswith(pooling))
        for key in dropped:
            del state[key]
        if dropped:
            notes.append(f"{name}: {pooling.rstrip('/')} ({len(dropped)} weights) is not loaded: it belongs to the "
                         f"checkpoint's {source.classifier!r} pooling (timm's forward_head), which the model does "
                         f"not apply; include_top=False with pooling={source.classifier!r} keeps it.")
    has_pre_logits = "pre_logits/kernel" in variables
    if "pre_logits/kernel" in state and not has_pre_logits:
        del state["pre_logits/kernel"], state["pre_logits/bias"]
        if "head/kernel" in variables and "head/kernel" in state:
            notes.append(
                f"{name}: model has no pre-logits layer, so the checkpoint's head is not loaded; "
                "the head starts at zero."
            )
            _drop_head(state)
    if has_pre_logits and "pre_logits/kernel" not in state:
        notes.append(f"{name} has no pre-logits layer; the model's is freshly initialised.")
        _drop_head(state)
    if "head/kernel" not in variables:
        _drop_head(state)
        return
    if "head_dist/kernel" in variables and "head_dist/kernel" not in state:
        _drop_head(state)  # a distilled model's two heads load together
    if "head/kernel" not in state:
        notes.append(f"{name} has no head; the model's head starts at zero.")
        return
    checkpoint_shape, model_shape = state["head/kernel"].shape, tuple(variables["head/kernel"].shape)
    if tuple(checkpoint_shape) != model_shape:
        notes.append(
            f"{name}: head has {checkpoint_shape[-1]} classes, model has {model_shape[-1]}: "
            "the head starts at zero instead."
        )
        _drop_head(state)


def _drop_head(state):
    for key in ("head/kernel", "head/bias", "head_dist/kernel", "head_dist/bias"):
        state.pop(key, None)