"""timm's `VisionTransformerSAM` class (SAM's image encoder, `samvit_*`): its architectures and state dict layout,
read and written.

SAM's encoder has no class token: its patches (a position table on their
grid, `pos_embed` `(1, h, w, c)`) go through blocks that attend within
windows (`window_size`) but for the global ones (`global_attn_indexes`),
each with decomposed relative positions (`attn.rel_pos_h`, `rel_pos_w`),
then through the neck (`neck.0`-`neck.3`: 1x1 convolution, LayerNorm2d, 3x3
convolution, LayerNorm2d; with `neck_chans=None` one LayerNorm2d); a head,
where there is one, averages the neck's grid (`head.fc`). Its blocks' norms
are torch's LayerNorm (epsilon 1e-5), its neck's timm's LayerNorm2d (1e-6).
keras_vit builds it with `window_size`, `global_attention_blocks`,
`decomposed_relative_position` and `neck_channels`
(`keras_vit.layers.windows`). timm's RoPE variant (`use_rope`) and its MLP
head (`head_hidden_size`) are refused by name, as model_args keras_vit does
not compute.

Example:
>>> fields = sam_switches_to_architecture(SAM_ARCHITECTURES["samvit_base_patch16"].switches)
>>> fields["window_size"], fields["global_attention_blocks"], fields["neck_channels"]
(14, (2, 5, 8, 11), 256)
"""

import dataclasses

import numpy as np

from keras_vit.checkpoints.source import CheckpointError, source_from_state
from keras_vit.checkpoints.state_dict_files import read_state_dict
from keras_vit.checkpoints.tensor_layout import settings
from keras_vit.checkpoints.timm import eva_layout
from keras_vit.checkpoints.timm.class_common import size_arguments, state_without_adapters
from keras_vit.checkpoints.timm.config import (
    check_head,
    configured_class_architecture,
    configured_eval_transform,
    configured_image_sizes,
)
from keras_vit.checkpoints.timm.families import (
    INFERENCE_NEUTRAL_KEYWORDS,
    SIZE_KEYWORDS,
    TimmArchitecture,
)
from keras_vit.checkpoints.timm.layout import LAYOUT as VISION_TRANSFORMER_LAYOUT
from keras_vit.layers.windows import resize_decomposed_table
from keras_vit.model.description import architecture_of

# timm's VisionTransformerSAM keywords that keras_vit computes, as model_args (and the table) spell them.
SAM_KEYWORDS = ("qkv_bias", "qk_norm", "init_values", "pre_norm", "use_abs_pos", "use_rel_pos", "window_size",
                "global_attn_indexes", "neck_chans", "global_pool")
SAM_ARGUMENTS = frozenset({*SAM_KEYWORDS, "weight_init", *SIZE_KEYWORDS, *INFERENCE_NEUTRAL_KEYWORDS})
POOLS = {"avg": "gap"}


def _sam(image_size, embed_dim, depth, num_heads, global_blocks, **switches):
    return TimmArchitecture(16, (image_size, image_size), embed_dim, depth, num_heads, 4.0,
                            dict(global_attn_indexes=list(global_blocks), use_rel_pos=True, window_size=14,
                                 **switches))


SAM_ARCHITECTURES = {
    "samvit_base_patch16": _sam(1024, 768, 12, 12, (2, 5, 8, 11)),
    "samvit_base_patch16_224": _sam(224, 768, 12, 12, (2, 5, 8, 11), neck_chans=None, use_abs_pos=False),
    "samvit_huge_patch16": _sam(1024, 1280, 32, 16, (7, 15, 23, 31)),
    "samvit_large_patch16": _sam(1024, 1024, 24, 16, (5, 11, 17, 23)),
}


def sam_switches_to_architecture(switches):
    """keras_vit `Architecture` fields for timm `VisionTransformerSAM` keywords, with its defaults: no class token,
    the average of the neck's grid, windows of 14 patches but for `global_attn_indexes`, a 256-channel neck,
    LayerNorm epsilon 1e-5 (torch's), exact GELU."""
    neck = switches.get("neck_chans", 256)
    pre_norm = bool(switches.get("pre_norm", False))
    init_values = switches.get("init_values")
    return dict(
        class_token=False,
        classifier=POOLS[switches.get("global_pool", "avg")],
        final_norm=False,  # the neck is the last
        position_embedding=bool(switches.get("use_abs_pos", True)),
        norm_pre=pre_norm,
        patch_bias=not pre_norm,
        qkv_bias=bool(switches.get("qkv_bias", True)),
        qk_norm=bool(switches.get("qk_norm", False)),
        layer_scale=float(init_values) if init_values else None,
        mlp_activation="gelu",
        layer_norm_epsilon=1e-5,
        decomposed_relative_position=bool(switches.get("use_rel_pos", False)),
        window_size=int(switches.get("window_size", 14)),
        global_attention_blocks=tuple(switches.get("global_attn_indexes", ())),
        neck_channels=int(neck) if neck else 0,
    )


def _neck(channels):
    if not channels:
        return {"neck.weight": "neck/norm/gamma", "neck.bias": "neck/norm/beta"}
    return {"neck.0.weight": "neck/reduce/kernel", "neck.1.weight": "neck/reduce_norm/gamma",
            "neck.1.bias": "neck/reduce_norm/beta", "neck.2.weight": "neck/mix/kernel",
            "neck.3.weight": "neck/mix_norm/gamma", "neck.3.bias": "neck/mix_norm/beta"}


def layout_of(neck_channels):
    """The `TensorLayout` of a `VisionTransformerSAM` with `neck_channels` (0: its one LayerNorm2d)."""
    top = {name: path for name, path in VISION_TRANSFORMER_LAYOUT.top.items() if not name.startswith("head.")}
    top.update(_neck(neck_channels), **{"head.fc.weight": "head/kernel", "head.fc.bias": "head/bias"})
    return dataclasses.replace(
        VISION_TRANSFORMER_LAYOUT, name="timm's VisionTransformerSAM layout", top=top,
        block={**VISION_TRANSFORMER_LAYOUT.block, "attn.rel_pos_h": "rel_pos_h", "attn.rel_pos_w": "rel_pos_w"},
        hint="; keras_vit reads timm VisionTransformerSAM state dicts (blocks.N.attn.rel_pos_h, neck.0.weight, ...)")


def configured_sam_architecture(config, where):
    """`(entry, model_args, switches, pretrained_cfg, Architecture)` of a timm `config.json` (parsed, read from
    `where`) naming one of `SAM_ARCHITECTURES`: the model it describes, before any tensor is read."""
    return configured_class_architecture(config, where, "VisionTransformerSAM", SAM_ARCHITECTURES, SAM_ARGUMENTS,
                                         SAM_KEYWORDS, sam_switches_to_architecture, POOLS)


def check_decomposed_tables(state, origins, architecture, grid, path, where, field_prefix=""):
    """Refuse decomposed relative position tables (`rel_pos_h`, `rel_pos_w`) whose lengths are not those of the model
    the file's own config describes, naming the tensor and the config field.

    A windowed block's tables have `2 window - 1` rows and a global block's
    `2 side - 1` for its axis of the file's own patch grid `grid`, as timm's
    and transformers' SAM build them; both refuse any other length at load,
    so nothing that a file holds legitimately is resized here (the loader
    resizes a global block's tables only to another image size asked for).
    """
    window, global_blocks = architecture.window_size, tuple(architecture.global_attention_blocks)
    for key, table in state.items():
        block, _, name = key.partition("/")
        if name not in ("rel_pos_h", "rel_pos_w") or not block.startswith("encoderblock_"):
            continue
        index, side = int(block[len("encoderblock_"):]), grid[0] if name == "rel_pos_h" else grid[1]
        windowed = bool(window) and index not in global_blocks
        rows = 2 * (window if windowed else side) - 1
        if table.shape[0] == rows:
            continue
        if windowed:
            reason = (f"{where}'s {field_prefix}window_size {window} makes block {index} attend within {window}x{window} "
                      f"windows ({field_prefix}global_attn_indexes {list(global_blocks)}), whose tables have "
                      f"2*{window} - 1 = {rows} rows")
            other = table.shape[0] == 2 * side - 1
        else:
            reason = (f"block {index} is global in {where} ({field_prefix}global_attn_indexes {list(global_blocks)}), "
                      f"and its tables on the file's {grid[0]}x{grid[1]} patch grid have 2*{side} - 1 = {rows} rows")
            other = bool(window) and table.shape[0] == 2 * window - 1
        hint = (f" ({table.shape[0]} rows are a {'global' if windowed else 'windowed'} block's: the config's "
                f"{field_prefix}global_attn_indexes or {field_prefix}window_size is not the file's)") if other else ""
        raise CheckpointError(f"{path}: {origins.get(key, key)} has {table.shape[0]} rows, but {reason}{hint}. Nothing "
                              "was loaded.")


def resize_global_tables(model, state, variables, source, notes):
    """Resize the decomposed tables of `model`'s global blocks in `state` from the file's own grid to the model's,
    linearly, as timm's `get_rel_pos` does in its forward (timm's and transformers' files alike; a note each). A
    windowed block's tables depend on its window alone, and a table of another length is the shape check's to
    report: nothing else is resized (`variables`: the model's, by path)."""
    file_grid = None if source.grid_size is None or None in source.grid_size else tuple(source.grid_size)
    for layer in model.layers:
        if file_grid is None or not getattr(layer, "decomposed_relative_position", False) or layer.window_size:
            continue
        for side, name in zip(file_grid, ("rel_pos_h", "rel_pos_w")):
            key = f"{layer.name}/{name}"
            table, variable = state.get(key), variables.get(key)
            if table is None or variable is None or table.ndim != 2 or table.shape[0] != 2 * side - 1 \
                    or table.shape[0] == variable.shape[0] or table.shape[1] != variable.shape[1]:
                continue
            state[key] = resize_decomposed_table(table, int(variable.shape[0]))
            notes.append(f"Resized {source.description}'s {key} from {table.shape[0]} to {variable.shape[0]} offsets "
                         f"(the file's {file_grid[0]}x{file_grid[1]} patch grid to the model's; linear, as timm's "
                         "get_rel_pos).")


def read_timm_sam(path, budget, config, where):
    """Read a timm `VisionTransformerSAM` state dict whose `config.json` (parsed as `config`, read from `where`)
    names one of `SAM_ARCHITECTURES` into a `WeightsSource`."""
    name = config.get("architecture")
    entry, args, switches, pretrained, architecture = configured_sam_architecture(config, where)
    transform = configured_eval_transform(config, where)
    tensors = read_state_dict(path, budget)
    table = tensors.get("pos_embed")
    if table is not None and table.ndim == 4:  # (1, h, w, c): keras_vit's table is the grid's rows in order
        grid = tuple(int(side) for side in table.shape[1:3])
        tensors["pos_embed"] = table.reshape(1, -1, table.shape[-1])
    layout = layout_of(architecture.neck_channels)
    state = layout.read(tensors, path)
    if "embedding/kernel" not in state or "encoderblock_0/mlp_hidden/kernel" not in state:
        raise CheckpointError(f"{path} lacks timm's patch embedding or first block (patch_embed.proj.weight, "
                              "blocks.0.mlp.fc1.weight). Nothing was loaded.")
    sizes = eva_layout.checked_eva_sizes(state, entry, args, switches, name, path, where,
                                          resamples_patches=False)  # timm loads the kernel as it is
    layout.check_complete(list(tensors), architecture, sizes["depth"],
                          settings(dict(sizes, architecture=name), "architecture", "depth"), path)
    check_head(state, args.get("num_classes", config.get("num_classes")), path, where)
    size = configured_image_sizes(args, {}, entry, where)[0]  # its pretrained_cfg states SAM's 1024 px whatever
    grid = (size[0] // sizes["patch_size"], size[1] // sizes["patch_size"])
    if table is not None and tuple(table.shape[1:3]) != grid:
        raise CheckpointError(f"{path}: pos_embed is a {table.shape[1]}x{table.shape[2]} grid, but model_args.img_size "
                              f"{list(size)} makes {grid[0]}x{grid[1]}. Nothing was loaded.")
    origins = layout.origins(tensors)
    check_decomposed_tables(state, origins, architecture, grid, path, where, "model_args.")
    source = source_from_state(path, state, grid, sizes["num_heads"], architecture)
    source.origins = origins
    source.position_resize = ("bicubic", True)  # timm's resample_abs_pos_embed_nhwc in its forward
    source.eval_transform = transform
    return source


def sam_arguments(model, architecture):
    """The keywords of `timm.create_model(architecture, **kwargs)` with the sizes and switches of `model`, for a
    name of timm's `VisionTransformerSAM` class (`writer.timm_arguments` checks that they rebuild it)."""
    found = architecture_of(model)
    arguments = dict(**size_arguments(model), qkv_bias=found.qkv_bias,
                     qk_norm=found.qk_norm, init_values=found.layer_scale, pre_norm=found.norm_pre,
                     use_abs_pos=found.position_embedding, use_rel_pos=found.decomposed_relative_position,
                     window_size=found.window_size, global_attn_indexes=list(found.global_attention_blocks),
                     global_pool="avg")
    if found.neck_channels:  # timm's create_model drops a None: the name's own neck (samvit_base_patch16_224's) stands
        arguments["neck_chans"] = found.neck_channels
    return arguments


def to_timm_sam(model, architecture):
    """`model`'s weights as the state dict of timm's `VisionTransformerSAM` `architecture` (numpy arrays, PyTorch's
    shapes)."""
    state = state_without_adapters(model, "VisionTransformerSAM")
    found = architecture_of(model)
    tensors = layout_of(found.neck_channels).write(state, architecture=found)
    if "pos_embed" in tensors:
        grid = tuple(model.get_layer("position_embedding").grid_size)
        tensors["pos_embed"] = tensors["pos_embed"].reshape(1, *grid, -1)
    return {name: np.ascontiguousarray(value) for name, value in tensors.items()}
