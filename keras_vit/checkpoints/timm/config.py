"""timm's `config.json` read against its tensors: what a Hub folder says must be what its file holds.

`layout.read_timm` reads the tensors and the family table entry
(`families`); the checks here refuse every disagreement between the
name, `model_args`, `pretrained_cfg` and the tensors, each with the file and
the field or tensors, before a model is built.

Example:
>>> model_args_of({"model_args": {"num_heads": 6, "drop_path_rate": 0.1}}, "config.json")
{'num_heads': 6, 'drop_path_rate': 0.1}
"""

import dataclasses

from keras_vit.checkpoints.config_fields import check_table_fits, checked_fields, image_size_of_grid
from keras_vit.checkpoints.source import CheckpointError, architecture_from_state, pixel_statistics
from keras_vit.checkpoints.timm.families import (
    ACTIVATIONS,
    DEFAULT_ONLY_KEYWORDS,
    INFERENCE_NEUTRAL_KEYWORDS,
    SIZE_KEYWORDS,
    SWITCH_KEYWORDS,
    TABLE_ONLY_KEYWORDS,
    timm_mlp_dim,
    timm_mlp_pieces,
)
from keras_vit.data import preprocessing
from keras_vit.layers.relative_position import relative_table_rows
from keras_vit.model.architecture import Architecture

# The model_args keywords of timm's VisionTransformer that keras_vit reads (the rest are refused by name).
VISION_TRANSFORMER_ARGUMENTS = frozenset({*SIZE_KEYWORDS, *INFERENCE_NEUTRAL_KEYWORDS, *DEFAULT_ONLY_KEYWORDS,
                                          *(set(SWITCH_KEYWORDS) - set(TABLE_ONLY_KEYWORDS))})


def model_args_of(config, where, family="VisionTransformer", computed=VISION_TRANSFORMER_ARGUMENTS):
    """`config.json`'s `model_args` for timm's `family` class, each value as `config_fields.checked_fields` reads it.

    A key outside `computed`, or one keras_vit computes only at timm's
    default, is a `CheckpointError` naming it; so is a value of another kind.
    A null is left out, as `timm.create_model` leaves it out.
    """
    args = config.get("model_args") or {}
    if not isinstance(args, dict):
        raise CheckpointError(f"{where}: model_args is a JSON {type(args).__name__}; timm writes an object of "
                              f"{family} arguments ({{\"num_heads\": 12, ...}}).")
    # timm's create_model drops the keywords that are None, so the name's own value stands.
    args = {key: value for key, value in args.items() if value is not None}
    for key, value in args.items():
        if key not in computed:
            raise CheckpointError(f"{where}: model_args.{key} is not {'an' if family[0] in 'AEIOU' else 'a'} {family} "
                                  "argument keras_vit computes; nothing was loaded.")
        if key in DEFAULT_ONLY_KEYWORDS and value != DEFAULT_ONLY_KEYWORDS[key]:
            raise CheckpointError(f"{where}: model_args.{key} is {value!r}, which keras_vit does not compute "
                                  f"(only timm's default {DEFAULT_ONLY_KEYWORDS[key]!r}); nothing was loaded.")
    args = checked_fields(args, where, "model_args.")
    if args.get("act_layer") not in ACTIVATIONS:
        raise CheckpointError(f"{where}: model_args.act_layer is {args['act_layer']!r}; keras_vit computes "
                              f"{sorted(name for name in ACTIVATIONS if name)}.")
    if args.get("in_chans", 3) != 3:
        raise CheckpointError(f"{where}: model_args.in_chans is {args['in_chans']!r}; keras_vit's models take RGB "
                              "images (3 channels).")
    return args


# The last convolution of each stem timm's hybrids have, keras_vit's patches: (its tensor, whose, its fixed side).
_STEM_PATCHES = {"conv_stem_0/kernel": ("patch_embed.backbone.2.conv.weight", "MobileCLIP's ConvStem", 2),
                 "mbconv_stem_conv1/kernel": ("patch_embed.backbone.pool.proj.weight", "ViTamin's MbConvStages", 3)}


def checked_sizes(state, entry, args, name, path, where):
    """The patch size and head count, with the tensors' sizes checked against the name's or `model_args`'."""
    sizes = {}
    for key, default in (("patch_size", entry.patch_size), ("embed_dim", entry.embed_dim), ("depth", entry.depth),
                         ("num_heads", entry.num_heads)):
        sizes[key] = args.get(key, default)
    ratio = args.get("mlp_ratio", entry.mlp_ratio)
    kernel, mlp = state["embedding/kernel"], state.get("encoderblock_0/mlp_hidden/kernel")
    found = dict(patch_size=(int(kernel.shape[0]), "patch_embed.proj.weight"),
                 embed_dim=(int(kernel.shape[-1]), "patch_embed.proj.weight"),
                 depth=(len({key.split("/")[0] for key in state if key.startswith("encoderblock_")}), "blocks.*"))
    if mlp is not None:
        pieces = timm_mlp_pieces(entry.switches)  # fc1_g and fc1_x, each of the ratio, or one fc1
        sizes["mlp_dim"] = timm_mlp_dim(sizes["embed_dim"], ratio, entry.switches)
        found["mlp_dim"] = (int(mlp.shape[-1]), "blocks.0.mlp.fc1.weight" if pieces == 1 else
                            "blocks.0.mlp.w0.weight and w1.weight" if entry.switches.get("mlp_layer") == "geglu" else
                            "blocks.0.mlp.fc1_g.weight and fc1_x.weight")
    stem = next((stem for key, stem in _STEM_PATCHES.items() if key in state), None)
    if stem is not None:  # timm's patch 1 is over the stem, whose last convolution is keras_vit's patches: its own
        found.pop("patch_size")
        tensor, owner, side = stem
        if tuple(kernel.shape[:2]) != (side, side):
            raise CheckpointError(f"{path}: {tensor} is a {kernel.shape[0]}x{kernel.shape[1]} kernel, but {owner} "
                                  f"(timm's {name!r}) ends in a {side}x{side} one. Nothing was loaded.")
    for key, (value, tensor) in found.items():
        if value != sizes[key] and not (key == "patch_size" and kernel.shape[0] != kernel.shape[1]):
            given = f"model_args.{key}" if key in args else (
                "model_args.embed_dim and mlp_ratio" if key == "mlp_dim" and ("embed_dim" in args or "mlp_ratio" in args)
                else f"timm's {name!r}")
            raise CheckpointError(f"{path}: {tensor} gives {key} {value}, but {given} has {sizes[key]} ({where}); "
                                  "the name, config and tensors disagree (a config for other sizes lists them in "
                                  "model_args). Nothing was loaded.")
    if sizes["embed_dim"] % sizes["num_heads"]:
        field = "model_args.num_heads" if "num_heads" in args else f"timm's {name!r} num_heads"
        raise CheckpointError(f"{where}: {field} is {sizes['num_heads']}, which does not divide the width "
                              f"{sizes['embed_dim']} of {path}.")
    return sizes


# Each tensor-visible switch: its tensor in timm's names, and the setting that decides it (for the errors).
_SWITCH_TENSORS = {
    "class_token": ("cls_token", "class_token={}"),
    "distillation_token": ("dist_token", "a distilled DeiT: {}"),
    "norm_pre": ("norm_pre.weight", "pre_norm={}"),
    "fc_norm": ("fc_norm.weight", "fc_norm={}"),
    "patch_bias": ("patch_embed.proj.bias", "pre_norm={}", lambda bias: not bias),
    "qkv_bias": ("blocks.0.attn.qkv.bias", "qkv_bias={}"),
    "qk_norm": ("blocks.0.attn.q_norm.weight", "qk_norm={}"),
    "attention_output_norm": ("blocks.0.attn.norm.weight", "scale_attn_norm={}"),
    "mlp_hidden_norm": ("blocks.0.mlp.norm.weight", "scale_mlp_norm={}"),
    "mlp_input_norm": ("blocks.0.mlp.norm.weight", "GeGluMlp: {}"),
    "position_embedding": ("pos_embed", "pos_embed {}", lambda table: "'learn'" if table else "'none'"),
    "layer_scale": ("blocks.0.ls1.gamma", "init_values {}", lambda scale: "set" if scale else "None"),
    "projection_bias": ("blocks.0.attn.proj.bias", "proj_bias={}"),
    "patch_norm": ("patch_embed.norm.weight", "embed_norm_layer {}", lambda norm: "set" if norm else "None"),
    "parallel": ("blocks.0.in_norm.weight", "block_fn {}", lambda parallel: "a parallel block" if parallel else "Block"),
    "differential_attention": ("blocks.0.lambda_q1 or blocks.0.attn.lambda_q1", "differential attention: {}"),
}


def check_tensors_agree(state, architecture, name, path, unpacked=(False, False)):
    """Refuse tensors that the architecture does not have, or lack, naming both.

    `unpacked`: whether timm's model function keeps a SwiGLU in two tensors
    (AIMv2's `fc1_g`, `fc1_x`) rather than one (`fc1`, DINOv2 giant's), and
    whether the file does; they must agree.
    """
    shown = architecture_from_state(state, None)
    problems = []
    declared, found = unpacked
    if architecture.mlp_activation == "geglu":  # its gate, which the tensors do not show, is the layout's
        shown = dataclasses.replace(shown, mlp_activation="geglu" if shown.mlp_activation == "swiglu"
                                    else shown.mlp_activation)
    if architecture.mlp_activation == "swiglu" and shown.mlp_activation == "swiglu" and declared != found:
        problems.append("keeps its SwiGLU " + ("packed in blocks.0.mlp.fc1.weight where the architecture's has "
                                               "fc1_g and fc1_x" if declared else "in blocks.0.mlp.fc1_g and fc1_x "
                                               "where the architecture's packs it in fc1"))
    for field, (tensor, setting, *shown_as) in _SWITCH_TENSORS.items():
        expected, found = bool(getattr(architecture, field)), bool(getattr(shown, field))
        if expected != found:
            problems.append(f"{'lacks' if expected else 'has'} {tensor} "
                            f"({setting.format((shown_as[0] if shown_as else bool)(expected))})")
    if architecture.register_tokens != shown.register_tokens:
        problems.append(f"holds {shown.register_tokens} register tokens (reg_token) where the architecture has "
                        f"{architecture.register_tokens} (reg_tokens)")
    if (architecture.classifier == "map") != (shown.classifier == "map"):
        problems.append(f"{'lacks' if architecture.classifier == 'map' else 'has'} attn_pool.* (attention "
                        f"pooling; global_pool is {'map' if architecture.classifier == 'map' else 'not map'})")
    final = architecture.final_norm and not architecture.fc_norm
    if final != ("encoder_norm/gamma" in state):
        problems.append(f"{'lacks' if final else 'has'} norm.weight (the final norm; final_norm is "
                        f"{architecture.final_norm}, fc_norm {architecture.fc_norm})")
    if architecture.normalization != shown.normalization:
        rms = architecture.normalization == "rms_norm"
        problems.append(f"{'has' if rms else 'lacks'} norm biases (blocks.0.norm1.bias): "
                        f"{'Layer' if rms else 'RMS'}Norms where the architecture's norm_layer is "
                        f"{'RmsNorm' if rms else 'LayerNorm'}")
    if architecture.mlp_activation != shown.mlp_activation and "geglu" in (architecture.mlp_activation,
                                                                           shown.mlp_activation):
        problems.append(f"has {'no ' if architecture.mlp_activation == 'geglu' else ''}GeGluMlp MLP "
                        "(blocks.0.mlp.w0.weight, w1.weight) where the architecture's "
                        f"{'is one' if architecture.mlp_activation == 'geglu' else 'has none'}")
    elif (architecture.mlp_activation == "swiglu") != (shown.mlp_activation == "swiglu"):
        problems.append("has a plain MLP (blocks.0.mlp.fc1.weight) where the architecture's is a SwiGLU"
                        if architecture.mlp_activation == "swiglu" else "has a SwiGLU MLP (blocks.0.mlp.fc1_g and "
                        "fc1_x, or an fc1 twice fc2's width) where the architecture's is plain")
    if problems:
        raise CheckpointError(f"{path} does not hold timm's {name!r} as its config.json sets it: it "
                              + "; it ".join(problems) + ". Nothing was loaded.")


def check_relative_tables(tensors, grid, heads, class_token, path):
    """Refuse relative position bias tables (`...relative_position_bias_table`) that are not those timm builds for
    `grid` and `heads` (three more rows with a `class_token`), naming the tensor."""
    rows = relative_table_rows(grid, class_token)
    for name, value in tensors.items():
        if name.endswith("relative_position_bias_table") and tuple(value.shape) != (rows, heads):
            raise CheckpointError(f"{path}: {name} has shape {tuple(value.shape)}, but timm builds ({rows}, {heads}) "
                                  f"for its {grid[0]}x{grid[1]} patch grid and {heads} heads (the config's img_size "
                                  "and num_heads). Nothing was loaded.")


def check_head(state, num_classes, path, where):
    head = state.get("head/kernel")
    if num_classes is None:
        return
    checked_fields({"num_classes": num_classes}, where)
    if num_classes and head is None:
        raise CheckpointError(f"{path} lacks head.weight and head.bias, which its config.json's num_classes "
                              f"{num_classes} needs. Nothing was loaded.")
    if head is not None and int(head.shape[-1]) != num_classes:
        raise CheckpointError(f"{path}: head.weight has {head.shape[-1]} classes, but its config.json's "
                              f"num_classes is {num_classes}. Nothing was loaded.")


def grid_of_config(state, architecture, entry, args, pretrained, patch, where):
    """`(grid, image size)` of the position table: `model_args.img_size`, else `pretrained_cfg.input_size`, else
    the name's size.

    The first of those whose grid the table fits; `(None, None)` for a table
    that fits none (a file resized after training), read as its own square
    grid. A table that does not fit the `model_args.img_size` it is built
    with is refused, as transformers refuses a table of another
    `image_size`.
    """
    candidates = configured_image_sizes(args, pretrained, entry, where)
    if "position_embedding/pos_embedding" not in state:  # no table (ViTamin XL): the size its eval transform gives
        stated = configured_image_sizes({}, pretrained, entry, where)
        size = tuple(stated[0] if len(stated) > 1 else candidates[0])
        return (size[0] // patch, size[1] // patch), size
    rows = state["position_embedding/pos_embedding"].shape[1] - architecture.position_prefix_rows
    if args.get("img_size") is not None:
        check_table_fits(rows + architecture.position_prefix_rows, architecture.position_prefix_rows, candidates[0],
                         patch, f"{where}: model_args.img_size")
    size = image_size_of_grid(candidates, patch, rows)
    return (None, None) if size is None else ((size[0] // patch, size[1] // patch), size)


def built_image_size(args, pretrained, default, where):
    """The one image size timm builds a class at from a config.json whose load resamples no table (Cait's):
    `model_args.img_size`, else `pretrained_cfg.input_size` where `fixed_input_size` says so (timm's
    `_update_default_model_kwargs`), else the class's `default`; with the field that sets it, for the errors."""
    if args.get("img_size") is not None:
        return tuple(args["img_size"]), f"{where}: model_args.img_size"
    input_size = checked_fields({"input_size": pretrained.get("input_size")}, where, "pretrained_cfg.")["input_size"]
    if pretrained.get("fixed_input_size") and input_size is not None:
        return tuple(input_size[1:]), f"{where}: pretrained_cfg.input_size (fixed_input_size true)"
    return tuple(default), f"{where}: with no model_args.img_size and no fixed_input_size, timm's default img_size"


def configured_image_sizes(args, pretrained, entry, where):
    """The image sizes a timm config.json states, first to last: `model_args.img_size`, `pretrained_cfg.input_size`
    (its height and width), the name's (`entry`)."""
    input_size = checked_fields({"input_size": pretrained.get("input_size")}, where, "pretrained_cfg.")["input_size"]
    stated = (args.get("img_size"), None if input_size is None else tuple(input_size[1:]), entry.image_size)
    return [size for size in stated if size is not None]


def configured_switches(entry, args, config, keywords, default_pool, where):
    """The switches of a named architecture `entry` with `model_args` (`args`) over it, and the pool checked."""
    switches = {**entry.switches, **{key: args[key] for key in keywords if key in args}}
    pool = args.get("global_pool", config.get("global_pool", switches.get("global_pool", default_pool)))
    if pool == "":  # timm's no pooling: its head maps every token, and the model gives (batch, tokens, classes)
        raise CheckpointError(f"{where}: global_pool is ''; timm then gives an output for every token, unpooled, "
                              "which keras_vit's models do not: set it to 'token', 'avg' or 'map' "
                              "(keras_vit.tools.features.feature_extractor gives the tokens).")
    if pool not in ("token", "avg", "map"):
        raise CheckpointError(f"{where}: global_pool is {pool!r}; keras_vit pools by 'token', 'avg' or 'map'.")
    switches["global_pool"] = pool
    return switches


def configured_class_architecture(config, where, family, table, computed, keywords, to_fields, pools):
    """`(entry, model_args, switches, pretrained_cfg, Architecture)` of a timm `config.json` (parsed, read from
    `where`) naming an architecture of `table`, timm's class `family` (`Beit`, `VisionTransformerRelPos`): the model
    it describes, before any tensor is read.

    `computed` are the `model_args` keras_vit reads, `keywords` the
    switches among them; `to_fields` turns the switches into `Architecture`
    fields (a KeyError names a setting keras_vit does not compute); the
    class pools by one of `pools` (its `global_pool`, `"avg"` by default).
    """
    name = config.get("architecture")
    entry = table[name]
    args = model_args_of(config, where, family, computed)
    switches = configured_switches(entry, args, config, keywords, "avg", where)
    if switches["global_pool"] not in pools:
        raise CheckpointError(f"{where}: global_pool is {switches['global_pool']!r}; timm's {family} pools by "
                              + " or ".join(repr(pool) for pool in pools) + ".")
    pretrained, statistics = configured_pixel_statistics(config, where)
    try:
        architecture = Architecture(**to_fields(switches), **statistics)
    except KeyError as error:
        raise CheckpointError(f"{where}: {error} is not a setting keras_vit computes.") from None
    except ValueError as error:
        raise CheckpointError(f"{where}: timm's {name!r} with these model_args is no model keras_vit can build: "
                              f"{error}") from None
    return entry, args, switches, pretrained, architecture


def configured_eval_transform(config, where):
    """The `EvalTransform` timm's `resolve_data_config` + `create_transform` make of a config.json's pretrained_cfg.

    An older config states the fields at its top level; a field timm's
    `PretrainedCfg` lacks, or a crop mode or filter keras_vit does not
    compute, is a `CheckpointError` that names it.
    """
    pretrained = config.get("pretrained_cfg")
    if not isinstance(pretrained, dict):
        pretrained = {key: config[key] for key in preprocessing.TIMM_COMPUTED if key in config}
    try:
        return preprocessing.from_timm_config(pretrained, where)
    except ValueError as error:
        raise CheckpointError(str(error)) from None


def configured_pixel_statistics(config, where):
    """`(pretrained_cfg, Architecture fields)`: the pixel mean and std a timm config.json states, checked."""
    pretrained = config.get("pretrained_cfg") if isinstance(config.get("pretrained_cfg"), dict) else {}
    statistics = [(pretrained.get(key), f"pretrained_cfg.{key}") if key in pretrained else (config.get(key), key)
                  for key in ("mean", "std")]
    return pretrained, pixel_statistics(statistics[0][0], statistics[1][0], where, (statistics[0][1], statistics[1][1]))
