"""Writing timm's layout: `save_timm`, and the keywords with which timm rebuilds a keras_vit model.

`timm_arguments` gives `timm.create_model`'s keywords for a model, and one
check, `check_timm_rebuilds`, proves them: what keras_vit's own timm readers
make of the architecture name with those keywords as `model_args` (the
model timm builds) must be the model, and the file `save_timm` writes must
read back through them strictly (timm's tensor names and shapes) before it
takes its name.

Example:
>>> from keras_vit import checkpoints
>>> checkpoints.save_timm(model, "vit.safetensors")  # doctest: +SKIP
>>> checkpoints.timm_arguments(model)["embed_dim"]  # doctest: +SKIP
"""

import dataclasses
import json
import logging
import os
import re
import shutil

import numpy as np

from keras_vit.checkpoints.source import CheckpointError, preview, read_json_object, state_of
from keras_vit.checkpoints.state_dict_files import TIMM_ENDINGS, _safetensors
from keras_vit.checkpoints.tensor_layout import keras_to_torch
from keras_vit.checkpoints.timm.beit import BEIT_ARCHITECTURES
from keras_vit.checkpoints.timm.cait import CAIT_ARCHITECTURES
from keras_vit.checkpoints.timm.eva_families import EVA_ARCHITECTURES
from keras_vit.checkpoints.timm.eva_layout import to_timm_eva
from keras_vit.checkpoints.timm.families import timm_architecture, timm_mlp_dim, timm_mlp_ratio
from keras_vit.checkpoints.timm.gemma4 import GEMMA4_ARCHITECTURES, timm_statistics
from keras_vit.checkpoints.timm.class_common import gives_tokens
from keras_vit.checkpoints.timm.folders import CLASSES
from keras_vit.checkpoints.timm.hybrid import (
    check_timm_rebuilds_backbone,
    conv_stem_to_timm,
    mbconv_to_timm,
    timm_backbone_name,
)
from keras_vit.checkpoints.timm.layout import configured_architecture, layout_of, read_timm
from keras_vit.checkpoints.timm.naflex import FACTORIZED, from_vision_transformer, naflex_architecture, naflex_arguments, \
    read_timm_naflex
from keras_vit.checkpoints.timm.relpos import RELPOS_ARCHITECTURES
from keras_vit.data import preprocessing
from keras_vit.model.architecture import Architecture
from keras_vit.model.description import (
    architecture_of,
    conv_stem_widths_of,
    is_naflex,
    mbconv_of,
    native_image_size,
    resnet_layers_of,
)
from keras_vit.model.variants import CONV_STEM_STRIDE, MBCONV_PATCH_SIZE, mbconv_stride, resnet_stride
from keras_vit.model.vision_transformer import eval_transform
from keras_vit.utils.files import atomic_path_with_sidecars


def to_timm(model, architecture=None, written_as=None):
    """A keras_vit model's weights as a timm ViT state dict of numpy arrays (refuses what timm cannot express).

    `written_as`: `{variable path: tensor name}` of weights the ViT layout has no place for, written under that name
    as they are (NaFlexVit's factorized tables)."""
    names = {v.path for v in model.weights}
    if any("lora_" in name for name in names):
        raise CheckpointError(f"{model.name} has LoRA adapters, which timm's VisionTransformer does not have: call "
                              "keras_vit.merge_lora(model) first, then save_timm.")
    hybrid = resnet_layers_of(names)
    if hybrid is not None and architecture_of(model).resnet_epsilons != "timm":
        raise CheckpointError(f"{model.name}'s ResNet computes the original Flax epsilons, timm's hybrids others: "
                              "timm would compute other outputs; save it with checkpoints.save_npz instead.")
    if "pre_logits/kernel" in names:
        raise CheckpointError("timm's VisionTransformer has no pre-logits layer (representation_size); "
                              "build the model with representation_size=0, or save it with checkpoints.save_npz.")
    state = state_of(model)
    as_named = {name: np.ascontiguousarray(state.pop(path).astype("float32")) for path, name in
                (written_as or {}).items()}
    backbone = {path: state.pop(path) for path in list(state) if hybrid is not None
                and timm_backbone_name(path, stem_only=hybrid == ())}
    stem = {name: np.ascontiguousarray(value if value.dtype == np.int64 else value.astype("float32"))
            for name, value in conv_stem_to_timm(state, keras_to_torch).items()} \
        if conv_stem_widths_of(state) is not None else {}
    if mbconv_of(state) is not None:
        stem = {name: np.ascontiguousarray(value.astype("float32"))
                for name, value in mbconv_to_timm(state, keras_to_torch).items()}
    found = architecture_of(model)
    unpacked = found.mlp_activation == "geglu" or architecture is not None and \
        timm_architecture(architecture, "save_timm").switches.get("mlp_layer") == "swiglu"
    tensors = layout_of((), found).write(state, unpacked=unpacked, architecture=found)
    tensors.update(stem)
    tensors.update(as_named)
    for path, value in backbone.items():
        name = timm_backbone_name(path, stem_only=hybrid == ())
        tensors[name] = np.ascontiguousarray(keras_to_torch(name, value).astype("float32"))
    return tensors


# What a timm file and its keywords leave open, so the model need not share it with what they rebuild: the pixel
# statistics (unless a config.json's pretrained_cfg states them), the layer scale's initial value (the learned
# scales are in the file) and a hybrid's ResNet epsilons (to_timm refuses the Flax ones).
_LEFT_OPEN = ("input_mean", "input_std", "layer_scale", "resnet_epsilons", "class_attention_mlp_ratio")
# The config.json fields timm writes for information only: `timm.create_model` builds without them.
_INFORMATIONAL = ("num_features", "global_pool")


def check_timm_rebuilds(model, architecture, arguments, path=None, written=None, config=None):
    """Refuse `arguments` with which timm's `architecture` would not rebuild `model`, or a `written` file it would
    not load strictly as `model` (`path`: the file's final name, for the errors).

    One comparison: keras_vit's own timm reader, given a config.json that
    names `architecture` with `arguments` as `model_args` (or `config`, the
    whole config.json save_timm writes, less what timm builds without),
    describes the model timm builds. Its `Architecture` and sizes must be
    the model's, the pixel statistics too where `config` states them; and
    the `written` file, read back through it with every check (each tensor
    timm's model has, no other, each of its shape), must give the model's
    weights.
    """
    name = architecture or "vit_base_patch16_224"
    config = {key: value for key, value in (config or {"architecture": name, "model_args": arguments}).items()
              if key not in _INFORMATIONAL}
    left_open = _LEFT_OPEN[2:] if "pretrained_cfg" in config else _LEFT_OPEN
    where = f"timm_arguments(model, {architecture!r})"
    configure, read = _family(name)
    entry, args, switches, _, rebuilt = configure(config, where)
    found = architecture_of(model)
    try:  # as the model carries it: one key/value head count per block, or None (timm's Gemma 4 takes one count)
        rebuilt = rebuilt.with_blocks(args.get("depth", entry.depth), args.get("num_heads", entry.num_heads))
    except ValueError:
        pass  # counts for another depth: the comparison below names them
    differs = {field.name: (getattr(rebuilt, field.name), getattr(found, field.name))
               for field in dataclasses.fields(Architecture) if field.name not in left_open
               and getattr(rebuilt, field.name) != getattr(found, field.name)}
    if (rebuilt.layer_scale is None) != (found.layer_scale is None):
        differs["layer_scale"] = (rebuilt.layer_scale, found.layer_scale)
    block = model.get_layer("encoderblock_0")
    embed = args.get("embed_dim", entry.embed_dim)
    gated_width = args.get("intermediate_size", switches.get("intermediate_size"))  # Gemma 4's gate and up, each
    mlp_dim = 2 * gated_width if gated_width else timm_mlp_dim(embed, args.get("mlp_ratio", entry.mlp_ratio), switches)
    for key, value, own in (("embed_dim", embed, int(model.get_layer("embedding").kernel.shape[-1])),
                            ("num_heads", args.get("num_heads", entry.num_heads), int(block.num_heads)),
                            ("mlp_dim", mlp_dim, int(block.mlp_dim)), *_class_attention_widths(model, rebuilt, embed)):
        if value != own:
            differs[key] = (value, own)
    prefix, written_nothing = (f"{path}: ", " Nothing was written.") if path else ("", "")
    if differs:
        raise CheckpointError(
            f"{prefix}timm's {name!r} builds " + ", ".join(f"{key}={value!r}" for key, (value, _) in differs.items())
            + f" where {model.name} has " + ", ".join(f"{key}={own!r}" for key, (_, own) in differs.items())
            + "; pass architecture= a timm name that builds the same model." + written_nothing)
    if written is None:
        return
    try:
        source = read(written, None, config, where)
    except CheckpointError as error:  # keras_vit's writer and reader disagree: a bug, said as plainly as it can be
        reason = re.sub(r"[.;] [Nn]othing was loaded\.$", "", str(error).replace(written, "the file"))
        raise CheckpointError(f"{prefix}timm's {name!r} would not load the file save_timm wrote strictly: {reason}."
                              f"{written_nothing}") from None
    shapes = {variable.path: tuple(variable.shape) for variable in model.weights}
    read = {key: tuple(value.shape) for key, value in source.state.items()}
    if read != shapes:
        differ = sorted(set(read) ^ set(shapes)) or sorted(key for key in read if read[key] != shapes[key])
        raise CheckpointError(f"{prefix}read back as timm's {name!r}, the file's weights are not {model.name}'s "
                              f"({preview(differ, 3)}).{written_nothing}")


def _check_class_named(model, found, architecture):
    """Refuse a model with a relative position bias, or CaiT's talking heads or class attention (`found`, its
    `Architecture`), unless `architecture` is a name of the timm class that has them."""
    if found.relative_position_tables and architecture not in BEIT_ARCHITECTURES \
            and architecture not in RELPOS_ARCHITECTURES:
        raise CheckpointError(f"{model.name} has a relative position bias, as timm's Beit and VisionTransformerRelPos "
                              "classes: pass architecture= the name it is (beit_base_patch16_224, "
                              "beitv2_base_patch16_224, vit_relpos_base_patch16_224, ...).")
    if (found.class_attention_blocks or found.talking_heads) and architecture not in CAIT_ARCHITECTURES:
        raise CheckpointError(f"{model.name} has CaiT's talking heads or class attention, as timm's Cait class: pass "
                              "architecture= the Cait name it is (cait_s24_224, cait_xxs24_384, ...).")
    if (found.axis_position_table or found.sandwich_norm) and architecture not in GEMMA4_ARCHITECTURES:
        raise CheckpointError(f"{model.name} has Gemma 4's position tables or sandwich norms, as timm's Gemma4Vit "
                              "classes: pass architecture= the name it is (gemma4_vit_167m, gemma4_vit_167m_enc, "
                              "gemma4_vit_570m, gemma4_vit_570m_enc).")


def _class_attention_widths(model, rebuilt, embed):
    """`[("class_attention_mlp_dim", timm's, the model's)]` for CaiT's class-attention MLP, else nothing."""
    blocks = [layer for layer in model.layers if layer.name.startswith("class_attention_")]
    if not blocks or not rebuilt.class_attention_blocks:
        return []
    return [("class_attention_mlp_dim", int(embed * rebuilt.class_attention_mlp_ratio), int(blocks[0].mlp_dim))]


def _family(name):
    """`(configure, read)`: the config and file readers of the timm class that architecture `name` belongs to."""
    return CLASSES[name][:2] if name in CLASSES else (configured_architecture, read_timm)


# timm's `global_pool` of each keras_vit classifier.
_TIMM_POOLS = {"token": "token", "gap": "avg", "map": "map"}

# Where a model needs what only one of timm's model functions sets, one such architecture to name.
_NAMED_ONLY = {"layer_norm_epsilon": ("LayerNorm epsilon {:g}", "vit_base_patch16_clip_224 (CLIP's 1e-5)"),
               "swiglu": ("a SwiGLU MLP", "vit_giant_patch14_dinov2 (a packed SwiGLU MLP)"),
               "geglu": ("GeGLU MLPs", "vitamin_small_224 (ViTamin's GeGluMlp)"),
               "post_norm": ("post-norm blocks", "vit_base_patch16_rpn_224 (timm's ResPostBlock)"),
               "rms_norm": ("RMSNorms", "aimv2_large_patch14_224 (AIMv2's RmsNorm)"),
               "patch_norm": ("a patch-embedding norm", "aimv2_large_patch14_224 (AIMv2's embed_norm_layer)"),
               "parallel": ("parallel blocks", "vit_pwee_patch16_reg1_gap_256 (timm's ParallelScalingBlock)"),
               "distillation_token": ("a distillation token and head", "deit_tiny_distilled_patch16_224 (timm's "
                                      "VisionTransformerDistilled)")}


def timm_arguments(model, architecture=None):
    """The keywords of `timm.create_model(architecture or "vit_base_patch16_224", **kwargs)` that rebuild `model`.

    The sizes (`img_size`, `patch_size`, `embed_dim`, `depth`, `num_heads`,
    `mlp_ratio`, `num_classes`) and every switch (class and register tokens,
    `no_embed_class`, `global_pool`, norms, biases, layer scale, activation).
    A LayerNorm epsilon other than 1e-6 and a SwiGLU MLP are set only by
    timm's model functions, which take them as classes, not keywords: for
    those, name an `architecture` of `families.ARCHITECTURES` (or of
    timm's Eva class) that sets the same (CLIP's 1e-5, DINOv2 giant's
    SwiGLU). Keywords with which the named architecture would build another
    model are a `CheckpointError` naming each field that differs
    (`check_timm_rebuilds`), as is what timm's `VisionTransformer` cannot
    build at all (a patch bias beside `pre_norm`, none without it).

    Example:
    >>> import keras_vit
    >>> model = keras_vit.ViT(image_size=32, patch_size=8, hidden_size=24, num_layers=1, num_heads=3,
    ...                       mlp_dim=48, register_tokens=2, class_token_position_embedding=False)
    >>> timm_arguments(model)["reg_tokens"], timm_arguments(model)["no_embed_class"]
    (2, True)
    """
    arguments = _keywords(model, architecture)
    check_timm_rebuilds(model, architecture, arguments)
    return arguments


def _token_note(model, architecture):
    """A note for a model without its head that gives its token sequence: timm's model of `architecture` has them
    as its `forward_features` (Gemma 4's encoder as its output, its classifier nowhere: `gemma4_arguments`)."""
    if not gives_tokens(model) or architecture in GEMMA4_ARCHITECTURES:
        return None
    return (f"{model.name} gives its token sequence (include_top=False, pooling=None): the folder holds timm's "
            f"{architecture or 'vit_base_patch16_224'!r} without a head, whose forward gives the pooled features "
            "(num_classes=0) and whose forward_features gives these tokens; keras_vit.from_pretrained(folder, "
            "include_top=False, pooling=None) gives them back.")


def _keywords(model, architecture):
    """`timm_arguments` before its check: the keywords, and refusals of what no keyword expresses."""
    found = architecture_of(model)
    _check_class_named(model, found, architecture)
    if architecture in CLASSES:
        return CLASSES[architecture][2](model, architecture)
    entry = None if architecture is None else timm_architecture(architecture, "timm_arguments")
    no_table = entry is not None and entry.switches.get("pos_embed") == "none"  # ViTamin XL's pos_embed='none'
    if found.rope or not found.key_bias or (not found.position_embedding and not no_table):
        raise CheckpointError(f"{model.name} has RoPE, no key bias or no position table, as timm's Eva class: pass "
                              "architecture= the Eva name it is (eva02_base_patch14_224, vit_base_patch16_dinov3, ...).")
    if found.patch_bias == found.norm_pre:
        raise CheckpointError(
            f"{model.name} has {'a' if found.patch_bias else 'no'} patch bias {'and' if found.norm_pre else 'but no'} "
            "norm_pre; timm's VisionTransformer has a patch bias exactly when it has no pre_norm, so it cannot build "
            "this model.")
    activations = {"gelu": "gelu", "gelu_tanh": "gelu_tanh", "quick_gelu": "quick_gelu"}
    block = model.get_layer("encoderblock_0")
    embed = int(model.get_layer("embedding").kernel.shape[-1])
    patch = tuple(model.get_layer("embedding").kernel.shape[:2])
    resnet = resnet_layers_of({v.path for v in model.weights})
    stem = conv_stem_widths_of({variable.path: variable for variable in model.weights})
    mbconv = mbconv_of({variable.path: variable for variable in model.weights})
    stride = CONV_STEM_STRIDE if stem is not None else 1 if resnet is None else resnet_stride(resnet)
    if mbconv is not None:  # keras_vit's patches are timm's pool.proj, a 3x3 kernel striding by 2
        patch, stride = (MBCONV_PATCH_SIZE,) * 2, mbconv_stride(mbconv[1])
    head = [layer for layer in model.layers if layer.name == "head"]
    arguments = dict(
        img_size=native_image_size(model, (patch[0] * stride, patch[1] * stride)),
        patch_size=patch[0] if patch[0] == patch[1] else list(patch),
        embed_dim=embed, depth=sum(layer.name.startswith("encoderblock_") for layer in model.layers),
        num_heads=int(block.num_heads),
        mlp_ratio=timm_mlp_ratio(embed, block.mlp_dim, {} if entry is None else entry.switches),
        num_classes=int(head[0].kernel.shape[-1]) if head else 0,
        class_token=found.class_token, reg_tokens=found.register_tokens,
        no_embed_class=not found.class_token_position_embedding, global_pool=_TIMM_POOLS[found.classifier],
        fc_norm=found.fc_norm, final_norm=found.final_norm, pre_norm=found.norm_pre, qkv_bias=found.qkv_bias,
        qk_norm=found.qk_norm, init_values=found.layer_scale, scale_attn_norm=found.attention_output_norm,
        scale_mlp_norm=found.mlp_hidden_norm, pool_include_prefix=found.pool_include_prefix,
        proj_bias=found.projection_bias,
    )
    if found.layer_scale is None and entry is not None and entry.switches.get("init_values"):
        arguments["init_values"] = 0.0  # timm's create_model drops a None, and the name's own layer scale would stand
    if found.differential_attention and not found.parallel:  # DiffParallelScalingBlock has its own
        arguments["attn_layer"] = "diff"
    needs_name = [key for key, needed in (("layer_norm_epsilon", found.layer_norm_epsilon != 1e-6),
                                          ("swiglu", found.mlp_activation == "swiglu"),
                                          ("geglu", found.mlp_activation == "geglu" or found.mlp_input_norm),
                                          ("post_norm", found.post_norm),
                                          ("parallel", found.parallel),
                                          ("rms_norm", found.normalization == "rms_norm"),
                                          ("patch_norm", found.patch_norm),
                                          ("distillation_token", found.distillation_token)) if needed]
    if stem is not None:
        arguments["patch_size"] = 1  # timm's HybridEmbed patches the ConvStem's output, its last convolution ours
        if architecture is None:
            raise CheckpointError(f"{model.name} has MobileCLIP's ConvStem, which only timm's model function builds; "
                                  "pass architecture='vit_base_mci_224'.")
    if mbconv is not None:
        arguments["patch_size"] = 1  # timm's HybridEmbed patches the MbConvStages' output, its pool.proj ours
        if architecture is None:
            raise CheckpointError(f"{model.name} has ViTamin's MbConv stem, which only timm's model functions build; "
                                  "pass architecture= the vitamin_* it is (vitamin_small_224, ...).")
    if resnet is not None and architecture is None:
        raise CheckpointError(f"{model.name} is a hybrid, which only timm's model functions build; pass "
                              "architecture= the timm hybrid it is (vit_base_r50_s16_224, ..., vit_tiny_r_s16_p8_224).")
    if architecture is None:
        if needs_name:
            raise CheckpointError(
                f"{model.name} has " + " and ".join(_NAMED_ONLY[key][0].format(found.layer_norm_epsilon)
                                                    for key in needs_name)
                + ", which timm's VisionTransformer takes only from a model function: pass architecture= a timm "
                "name that sets the same, such as " + " or ".join(_NAMED_ONLY[key][1] for key in needs_name) + ".")
        arguments["act_layer"] = activations[found.mlp_activation]
        return arguments
    if resnet is not None or entry.resnet_layers is not None:
        if resnet is None:
            raise CheckpointError(f"timm's {architecture!r} is a hybrid, but {model.name} is a plain ViT.")
        check_timm_rebuilds_backbone(resnet, int(model.get_layer("conv_root").kernel.shape[-1]),
                                     found.resnet_epsilons, entry, architecture, model.name)
    if (stem is not None) != entry.conv_stem:
        raise CheckpointError(f"timm's {architecture!r} {'has' if entry.conv_stem else 'has no'} ConvStem, but "
                              f"{model.name} {'has' if stem is not None else 'has none'}.")
    if stem is not None and (stem, embed) != (entry.conv_stem_widths, entry.embed_dim):
        raise CheckpointError(f"{model.name}'s ConvStem has widths {stem} before a {embed}-wide ViT, but timm's "
                              f"{architecture!r} builds {entry.conv_stem_widths} before {entry.embed_dim} and takes no "
                              "argument for them, so timm.create_model cannot rebuild this model.")
    if (mbconv is not None) != (entry.mbconv is not None):
        raise CheckpointError(f"timm's {architecture!r} {'has' if entry.mbconv else 'has no'} MbConv stem, but "
                              f"{model.name} {'has' if mbconv is not None else 'has none'}.")
    if mbconv is not None and (mbconv, embed) != (entry.mbconv, entry.embed_dim):
        raise CheckpointError(f"{model.name}'s MbConv stem has widths {mbconv[0]} and depths {mbconv[1]} before a "
                              f"{embed}-wide ViT, but timm's {architecture!r} builds {entry.mbconv[0]} and "
                              f"{entry.mbconv[1]} before {entry.embed_dim} and takes no config.json argument for them, "
                              "so timm.create_model cannot rebuild this model.")
    if found.mlp_activation not in ("swiglu", "geglu"):
        arguments["act_layer"] = activations[found.mlp_activation]
    return arguments


def save_timm(model, path, architecture=None):
    """Write `model` as a timm state dict (`.safetensors`) that timm loads with `strict=True`, and beside it the
    `config.json` timm's `save_for_hf` writes, from which timm and keras_vit rebuild the same model.

    The folder then reads as one timm model: `timm.create_model("local-dir:"
    + folder, pretrained=True)` and `keras_vit.from_pretrained(folder)`
    build it from the config.json (`architecture`, `model_args` =
    `timm_arguments(model, architecture)`, `pretrained_cfg`: the pixel mean
    and std, the eval transform's size, filter and crop, and `label_names`
    where the model has class names). A model those keywords cannot rebuild
    exactly is refused with the reason (`check_timm_rebuilds`), as is a
    folder that holds another model's weights file or a `config.json` that is
    not timm's: save each model into a folder of its own. Both files are
    written whole or not at all: checked under temporary names, then renamed
    (the config.json first). An eval transform that timm's fields cannot
    state (keras_vit's own `tf.image.resize`, transformers' rounding) is
    written as its nearest, with a warning.

    Example:
    >>> import keras_vit
    >>> model = keras_vit.ViT(image_size=32, patch_size=8, hidden_size=24, num_layers=1, num_heads=3,
    ...                       mlp_dim=48, classes=5)
    >>> save_timm(model, "/tmp/vit/model.safetensors")  # doctest: +SKIP
    >>> keras_vit.from_pretrained("/tmp/vit")  # doctest: +SKIP
    """
    if not str(path).endswith(".safetensors"):
        raise CheckpointError(f"save_timm writes a .safetensors file; got {path}.")
    path = os.fspath(path)
    if is_naflex(model):
        return _save_naflex(model, path, architecture or "naflexvit_base_patch16_gap")
    eva = architecture in EVA_ARCHITECTURES
    _check_class_named(model, architecture_of(model), architecture)
    # first: its refusals (LoRA, ...) name the fix precisely
    writer = CLASSES[architecture][3] if architecture in CLASSES else to_timm
    tensors = None if writer is None else writer(model, architecture)
    arguments = _keywords(model, architecture)
    pretrained, note = _pretrained_cfg(model, arguments)
    config = _timm_config(model, architecture or "vit_base_patch16_224", arguments, pretrained)
    check_timm_rebuilds(model, architecture, arguments, path, config=config)  # before to_timm_eva's and the folder's
    tensors = to_timm_eva(model, architecture) if eva else tensors
    _write_folder(path, tensors, config, lambda written: check_timm_rebuilds(  # and read back through config.json
        model, architecture, arguments, path, written=written, config=config))
    for line in (note, _token_note(model, architecture)):
        if line:
            logging.getLogger("keras_vit").warning(line)
    return path


def _pretrained_cfg(model, arguments):
    """`(fields, note)`: timm's `pretrained_cfg` fields of `model`'s eval transform at the size of `arguments`, and
    the warning to give where they are only its nearest (else None)."""
    size = arguments["img_size"]
    transform = eval_transform(model, image_size=tuple(size) if isinstance(size, (list, tuple)) else (size, size))
    fields, exact = preprocessing.to_timm_config(transform)
    rule = ("tf.image.resize's bilinear, not antialiased" if not transform.antialias else
            "a resize to a stated size" if transform.resize_size is not None else "its own rounding")
    return fields, None if exact else (
        f"{model.name} evaluates photos by {transform.convention}'s rule ({rule}), which timm's pretrained_cfg "
        f"cannot state: config.json keeps the nearest, interpolation {fields['interpolation']!r}, crop_pct "
        f"{fields['crop_pct']:g}, crop_mode {fields['crop_mode']!r}, which timm and keras_vit.from_pretrained "
        "compute with Pillow (antialiased) and timm's rounding.")


def _timm_config(model, architecture, arguments, pretrained):
    """The `config.json` timm's `save_for_hf` writes for `model` as timm's `architecture` built with `arguments`,
    with `pretrained` (the eval transform's fields) and the pixel statistics as its `pretrained_cfg`."""
    found = architecture_of(model)
    config = {"architecture": architecture, "num_classes": arguments.get("num_classes", 0),
              "num_features": arguments["embed_dim"],
              "global_pool": arguments.get("global_pool", _TIMM_POOLS[found.classifier])}
    names = getattr(model, "class_names", None)
    if names and len(names) == arguments["num_classes"]:
        config["label_names"] = list(names)
    config["model_args"] = arguments
    mean, std = timm_statistics(found) if architecture in GEMMA4_ARCHITECTURES else (found.input_mean, found.input_std)
    config["pretrained_cfg"] = {**pretrained, "mean": list(mean), "std": list(std),
                                "num_classes": arguments.get("num_classes", 0)}
    return config


def _write_folder(path, tensors, config, check):
    """Write `tensors` at `path` and `config` as the `config.json` beside it, whole or not at all.

    `check(temporary)` reads the written file back under its temporary name
    and raises if it is not the model. A folder is one timm model: one
    that holds another weights file, or a `config.json` that is not timm's
    (an object naming an `architecture`), is refused before anything is
    written. A folder that is not there is made.
    """
    folder = os.path.dirname(os.path.abspath(path))
    config_path = os.path.join(folder, "config.json")
    if os.path.isdir(folder):
        others = sorted(name for name in os.listdir(folder) if name.endswith(TIMM_ENDINGS)
                        and name != os.path.basename(path) and not name.startswith(".tmp-"))
        if others:
            raise CheckpointError(f"{path}: its folder already holds {others[0]}, and timm and keras_vit read a "
                                  "folder as one model (its config.json beside its one weights file): save into a "
                                  "folder of its own. Nothing was written.")
        if os.path.lexists(config_path):
            try:
                existing = read_json_object(config_path, "unreadable", "not an object")
            except CheckpointError:
                existing = None
            if existing is None or not isinstance(existing.get("architecture"), str):
                raise CheckpointError(f"{config_path} is not timm's config.json (an object naming an architecture), "
                                      f"and save_timm would replace it with the one {os.path.basename(path)} needs: "
                                      "save into a folder of its own. Nothing was written.")
    made = not os.path.isdir(folder)
    os.makedirs(folder, exist_ok=True)
    try:
        with atomic_path_with_sidecars(path) as temporary:
            _safetensors().save_file(tensors, temporary, metadata={"format": "pt"})
            check(temporary)
            with open(os.path.join(os.path.dirname(temporary), "config.json"), "w") as f:
                json.dump(config, f, indent=2)
    except BaseException:
        if made:
            shutil.rmtree(folder, ignore_errors=True)  # only the temporary files this call made were in it
        raise


def _save_naflex(model, path, architecture):
    """`save_timm` of a NaFlex model: timm's NaFlexVit layout, and beside it the `config.json` (architecture,
    `model_args`, pixel statistics) with which `timm.create_model` and `keras_vit.from_pretrained` rebuild it."""
    naflex_architecture(architecture, "save_timm")
    found = architecture_of(model)
    arguments = naflex_arguments(model, found)
    factorized = {path: name for name, path in FACTORIZED.items() if arguments.get("pos_embed") == "factorized"}
    tensors = from_vision_transformer(to_timm(model, written_as=factorized), arguments["pos_embed_grid_size"])
    config = _timm_config(model, architecture, arguments, {"interpolation": "bicubic", "crop_pct": 1.0})
    where = f"save_timm({model.name}, architecture={architecture!r})"

    def check(written):
        try:
            source = read_timm_naflex(written, None, config, where)
        except CheckpointError as error:
            raise CheckpointError(f"{path}: timm's {architecture!r} would not load the file save_timm wrote: "
                                  f"{str(error).replace(written, 'the file')} Nothing was written.") from None
        rebuilt = {field.name: getattr(source.architecture, field.name) for field in dataclasses.fields(Architecture)
                   if field.name not in _LEFT_OPEN[2:]}
        own = {name: getattr(found, name) for name in rebuilt}
        shapes = {variable.path: tuple(variable.shape) for variable in model.weights}
        if rebuilt != own or {key: tuple(value.shape) for key, value in source.state.items()} != shapes:
            differ = sorted(name for name in rebuilt if rebuilt[name] != own[name]) or ["tensor shapes"]
            raise CheckpointError(f"{path}: read back as timm's {architecture!r}, the file is not {model.name} "
                                  f"({', '.join(differ)}). Nothing was written.")

    _write_folder(path, tensors, config, check)
    return path
