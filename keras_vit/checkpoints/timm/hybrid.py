"""timm's ResNet hybrids: the `ResNetV2` (or its stem alone) in front of the patches, in keras_vit's names.

timm's `vit_base_r50_s16_224`, `vit_small_r26_s32_384`, ... put a `ResNetV2`
without pre-activation in a `HybridEmbed` (`patch_embed.backbone.stem.conv`,
`...stages.S.blocks.B.conv1`, `...downsample.conv`, then `patch_embed.proj`);
`vit_tiny_r_s16_p8_*` has the stem alone (`patch_embed.backbone.conv`,
`patch_embed.backbone.norm`). That is the paper's hybrid, which keras_vit
builds for the original `.npz` files, with timm's epsilons
(`RESNET_EPSILONS["timm"]`): the tensors load into the same model. timm's
stages and blocks count from 0, keras_vit's `block{S}_unit{B}` from 1.

The ResNet's units per stage and stem width are read from the tensors (timm's
model functions take no argument for them); a ResNet that is not whole is
refused, naming its tensors.

MobileCLIP's `ConvStem` (`vit_base_mci_224`: `patch_embed.backbone.{0,1}`
convolutions with BatchNorm, then `patch_embed.backbone.2.conv`, which is
the patch embedding, as timm's `HybridEmbed` has no projection there) maps
onto `keras_vit.layers.conv_stem` and keras_vit's `embedding`.

ViTamin's `MbConvStages` (`vitamin_*`: `patch_embed.backbone.stem.conv1`,
`...stages.S.B.conv1_1x1`, ..., then `...pool.norm` and `pool.proj`, the
patch embedding, as its `HybridEmbed` has no projection either) maps onto
`keras_vit.layers.mbconv`; a stem without one of timm's two stages, a
block or a tensor is refused, naming them.

Example:
>>> timm_backbone_name("block2_unit1/conv_proj/kernel", stem_only=False)
'patch_embed.backbone.stages.1.blocks.0.downsample.conv.weight'
"""

import re

import numpy as np

from keras_vit.checkpoints.source import CheckpointError, preview, refuse_non_float
from keras_vit.model.description import MBCONV_BLOCK, UNIT, conv_stem_widths_of, mbconv_of, resnet_layers_of

BACKBONE = "patch_embed.backbone."
STEM = BACKBONE + "stem."  # ResNetV2's stem; the stem alone (a Sequential) has no "stem." part.
# timm name after the stem's prefix -> keras_vit name.
STEM_NAMES = {"conv.weight": "conv_root/kernel", "norm.weight": "gn_root/gamma", "norm.bias": "gn_root/beta"}
# timm name after "patch_embed.backbone.stages.{S}.blocks.{B}." -> keras_vit name after "block{S+1}_unit{B+1}/".
UNIT_NAMES = {
    "conv1.weight": "conv1/kernel",
    "norm1.weight": "gn1/gamma",
    "norm1.bias": "gn1/beta",
    "conv2.weight": "conv2/kernel",
    "norm2.weight": "gn2/gamma",
    "norm2.bias": "gn2/beta",
    "conv3.weight": "conv3/kernel",
    "norm3.weight": "gn3/gamma",
    "norm3.bias": "gn3/beta",
    "downsample.conv.weight": "conv_proj/kernel",
    "downsample.norm.weight": "gn_proj/gamma",
    "downsample.norm.bias": "gn_proj/beta",
}
DOWNSAMPLE = ("downsample.conv.weight", "downsample.norm.weight", "downsample.norm.bias")
GROUPS = 32
_STAGED = re.compile(r"patch_embed\.backbone\.stages\.(\d+)\.blocks\.(\d+)\.(.+)$")
# MobileCLIP's ConvStem: timm name after "patch_embed.backbone." -> keras_vit name; the last layer is the patches.
CONV_STEM_NAMES = {
    **{name: ours for index in (0, 1) for name, ours in (
        (f"{index}.conv.weight", f"conv_stem_{index}/kernel"),
        (f"{index}.bn.weight", f"conv_stem_{index}_norm/gamma"),
        (f"{index}.bn.bias", f"conv_stem_{index}_norm/beta"),
        (f"{index}.bn.running_mean", f"conv_stem_{index}_norm/moving_mean"),
        (f"{index}.bn.running_var", f"conv_stem_{index}_norm/moving_variance"))},
    "2.conv.weight": "embedding/kernel",
    "2.conv.bias": "embedding/bias",
}
# BatchNorm's step counter: a buffer that changes no output (written back as 0).
CONV_STEM_COUNTERS = ("0.bn.num_batches_tracked", "1.bn.num_batches_tracked")


# ViTamin's MbConvStages: timm name after "patch_embed.backbone." -> keras_vit name; pool.proj is the patches.
_FIELDS = {"conv": (("weight", "kernel"), ("bias", "bias")), "norm": (("weight", "gamma"), ("bias", "beta"))}
MBCONV_NAMES = {f"{timm}.{field}": f"{ours}/{kind}" for timm, ours, layer in (
    ("stem.conv1", "mbconv_stem_conv1", "conv"), ("stem.norm1", "mbconv_stem_norm1", "norm"),
    ("stem.conv2", "mbconv_stem_conv2", "conv"), ("pool.norm", "mbconv_pool_norm", "norm"),
    ("pool.proj", "embedding", "conv")) for field, kind in _FIELDS[layer]}
# timm name after "patch_embed.backbone.stages.{S}.{B}." -> keras_vit name after "mbconv_stage{S}_block{B}/".
MBCONV_BLOCK_NAMES = {
    **{f"{timm}.{field}": f"{ours}/{kind}" for timm, ours in (("conv1_1x1", "conv1"), ("conv2_kxk", "conv2"),
                                                              ("conv3_1x1", "conv3"), ("shortcut.expand", "shortcut"))
       for field, kind in _FIELDS["conv"]},
    **{f"pre_norm.{field}": f"pre_norm/{kind}" for field, kind in _FIELDS["norm"]},
}
MBCONV_SHORTCUT = ("shortcut.expand.weight", "shortcut.expand.bias")  # the first block's, where the width changes
MBCONV_STAGES = 2  # timm's MbConvStages builds two, from embed_dim[:2]
_MBCONV_STAGED = re.compile(r"patch_embed\.backbone\.stages\.(\d+)\.(\d+)\.(.+)$")


def is_mbconv(names):
    """Whether timm tensor `names` hold ViTamin's MbConvStages."""
    return any(name.startswith((BACKBONE + "stem.conv1.", BACKBONE + "pool.")) for name in names)


def mbconv_from_timm(tensors, description, convert):
    """keras_vit's state of ViTamin's MbConvStages among timm `tensors`, `pool.proj` as the patches; a stem that
    is not whole (a stage, a block or a tensor missing) is refused, naming them."""
    names = sorted(name for name in tensors if name.startswith(BACKBONE))
    blocks, state, unknown = {}, {}, []
    for name in names:
        match = _MBCONV_STAGED.match(name)
        if match and match.group(3) in MBCONV_BLOCK_NAMES:
            blocks.setdefault((int(match.group(1)), int(match.group(2))), set()).add(match.group(3))
        elif name[len(BACKBONE):] not in MBCONV_NAMES:
            unknown.append(name)
    if unknown:
        raise CheckpointError(f"{description} has {preview(unknown, 3)}, which ViTamin's MbConvStages (a stem, two "
                              "stages of MbConv blocks, a pool) does not have. Nothing was loaded.")
    fix = "the file is not whole: load the complete checkpoint (timm's save_for_hf writes every tensor)"
    missing = [BACKBONE + name for name in MBCONV_NAMES if BACKBONE + name not in tensors]
    if missing:
        raise CheckpointError(f"{description}: ViTamin's MbConv stem lacks {preview(missing, 4)}; {fix}. Nothing "
                              "was loaded.")
    stages = sorted({stage for stage, _ in blocks})
    for stage in range(MBCONV_STAGES):
        if stage not in stages:
            raise CheckpointError(f"{description}: ViTamin's MbConv stem lacks stage {stage} (no "
                                  f"{BACKBONE}stages.{stage}.* tensors; timm's MbConvStages has {MBCONV_STAGES}); "
                                  f"{fix}. Nothing was loaded.")
    if stages[-1] >= MBCONV_STAGES:
        raise CheckpointError(f"{description} has {BACKBONE}stages.{stages[-1]}.*, a stage past the "
                              f"{MBCONV_STAGES} of timm's MbConvStages. Nothing was loaded.")
    width = int(tensors[BACKBONE + "stem.conv1.weight"].shape[0])
    for stage in stages:
        depth = max(block for found, block in blocks if found == stage) + 1
        base = f"{BACKBONE}stages.{stage}."
        out = int(tensors[f"{base}{depth - 1}.conv3_1x1.weight"].shape[0]) if "conv3_1x1.weight" in blocks.get(
            (stage, depth - 1), ()) else None
        gaps = sorted(set(range(depth)) - {block for found, block in blocks if found == stage})
        if gaps:
            raise CheckpointError(f"{description}: ViTamin's MbConv stem lacks stage {stage}'s block {gaps[0]} "
                                  f"({base}{gaps[0]}.*) before its block {depth - 1}; {fix}. Nothing was loaded.")
        for block in range(depth):
            needed = [rest for rest in MBCONV_BLOCK_NAMES
                      if rest not in MBCONV_SHORTCUT or (block == 0 and width != out)]
            lacking = [f"{base}{block}.{rest}" for rest in needed if rest not in blocks.get((stage, block), ())]
            extra = [f"{base}{block}.{rest}" for rest in blocks.get((stage, block), ()) if rest not in needed]
            if lacking or extra:
                what = f"lacks {preview(lacking, 4)}" if lacking else f"has {preview(extra, 2)}, which its " \
                    "block does not (a shortcut convolution only where the first block of a stage changes the width)"
                raise CheckpointError(f"{description}: ViTamin's MbConv stem {what}; "
                                      f"{fix if lacking else 'the tensors are of two models'}. Nothing was loaded.")
            for rest in needed:
                name = f"{base}{block}.{rest}"
                ours = f"mbconv_stage{stage}_block{block}/{MBCONV_BLOCK_NAMES[rest]}"
                value = convert(name, tensors[name])  # a depthwise kernel: Keras' (h, w, channels, 1)
                state[ours] = value.transpose(0, 1, 3, 2) if rest == "conv2_kxk.weight" else value
        width = out
    state.update({ours: convert(BACKBONE + name, tensors[BACKBONE + name]) for name, ours in MBCONV_NAMES.items()})
    return state


def mbconv_to_timm(state, convert):
    """timm's names and tensors for a model's MbConv stem and patch embedding (popped from keras_vit's `state`)."""
    tensors = {BACKBONE + name: convert(BACKBONE + name, state.pop(ours)) for name, ours in MBCONV_NAMES.items()}
    blocks = {ours: rest for rest, ours in MBCONV_BLOCK_NAMES.items()}
    for path in [path for path in state if MBCONV_BLOCK.match(path)]:
        match = MBCONV_BLOCK.match(path)
        name = f"{BACKBONE}stages.{match.group(1)}.{match.group(2)}.{blocks[path[match.end():]]}"
        value = state.pop(path)
        tensors[name] = convert(name, value.transpose(0, 1, 3, 2) if name.endswith("conv2_kxk.weight") else value)
    return tensors


def is_conv_stem(names):
    """Whether timm tensor `names` hold MobileCLIP's ConvStem (rather than a ResNetV2 or its stem)."""
    return any(name.startswith(BACKBONE + "0.conv.") for name in names)


def conv_stem_from_timm(tensors, description, convert):
    """keras_vit's state of MobileCLIP's ConvStem among timm `tensors`, its last convolution as the patches."""
    names = {name[len(BACKBONE):] for name in tensors if name.startswith(BACKBONE)}
    unknown = sorted(names - set(CONV_STEM_NAMES) - set(CONV_STEM_COUNTERS))
    if unknown:
        raise CheckpointError(f"{description} has {[BACKBONE + name for name in unknown]}, which MobileCLIP's "
                              "ConvStem (two convolutions with BatchNorm, then the patch convolution) does not have. "
                              "Nothing was loaded.")
    missing = [BACKBONE + name for name in CONV_STEM_NAMES if name not in names]
    if missing:
        raise CheckpointError(f"{description}: MobileCLIP's ConvStem lacks {preview(missing, 4)}. Nothing was loaded.")
    if "patch_embed.proj.weight" in tensors:
        raise CheckpointError(f"{description} has both patch_embed.proj.weight and a ConvStem whose last convolution "
                              "is the patch embedding (timm's HybridEmbed with proj=False). Nothing was loaded.")
    return {ours: convert(BACKBONE + name, tensors[BACKBONE + name]) for name, ours in CONV_STEM_NAMES.items()}


def conv_stem_to_timm(state, convert):
    """timm's names and tensors for a model's ConvStem and patch embedding (popped from keras_vit's `state`)."""
    tensors = {BACKBONE + name: convert(BACKBONE + name, state.pop(ours)) for name, ours in CONV_STEM_NAMES.items()}
    tensors.update({BACKBONE + name: np.zeros((), "int64") for name in CONV_STEM_COUNTERS})
    return tensors


def backbone_from_timm(tensors, description, convert):
    """keras_vit's state of the ResNet among timm `tensors` (`{}` for none), each array through `convert(name, value)`.

    Refuses a backbone that is not timm's ResNetV2 hybrid or its stem, and
    one with a stem tensor, a stage, a block or a downsample missing, a
    GroupNorm that 32 groups do not divide, or widths that do not chain
    into `patch_embed.proj`.
    """
    names = sorted(name for name in tensors if name.startswith(BACKBONE))
    if not names:
        return {}
    counters = {BACKBONE + name for name in CONV_STEM_COUNTERS}
    refuse_non_float(description, {name: np.asarray(tensors[name]).dtype for name in names if name not in counters})
    if is_conv_stem(names):
        return conv_stem_from_timm(tensors, description, convert)
    if is_mbconv(names):
        return mbconv_from_timm(tensors, description, convert)
    blocks = {}
    for name in names:
        match = _STAGED.match(name)
        if match:
            blocks.setdefault((int(match.group(1)), int(match.group(2))), {})[match.group(3)] = name
    prefix = STEM if blocks else BACKBONE
    state, used = {}, set()
    for rest, ours in STEM_NAMES.items():
        if prefix + rest in tensors:
            state[ours] = convert(prefix + rest, tensors[prefix + rest])
            used.add(prefix + rest)
    for (stage, block), parts in blocks.items():
        for rest, name in parts.items():
            if rest in UNIT_NAMES:
                state[f"block{stage + 1}_unit{block + 1}/{UNIT_NAMES[rest]}"] = convert(name, tensors[name])
                used.add(name)
    unknown = [name for name in names if name not in used]
    if unknown:
        raise CheckpointError(
            f"{description} is a timm ViT with a convolutional stem before the patches (a hybrid's ResNet, but not "
            "timm's ResNetV2 or its stem alone, nor MobileCLIP's ConvStem or ViTamin's MbConvStages: another backbone) "
            f"({preview(unknown, 3)}), which keras_vit's ViT does not have.")
    _check_whole(tensors, blocks, prefix, description)
    return state


def _check_whole(tensors, blocks, prefix, description):
    missing = [prefix + rest for rest in STEM_NAMES if prefix + rest not in tensors]
    if missing:
        raise CheckpointError(f"{description}: the hybrid's ResNet stem lacks {missing}. Nothing was loaded.")
    stages = sorted({stage for stage, _ in blocks})
    gaps = sorted(set(range(stages[-1] + 1)) - set(stages)) if stages else []
    if gaps:
        raise CheckpointError(f"{description}: the hybrid's ResNet lacks stage {gaps} (no "
                              f"{[f'{BACKBONE}stages.{stage}.*' for stage in gaps]} tensors). Nothing was loaded.")
    for stage in stages:
        indices = sorted(block for found, block in blocks if found == stage)
        gaps = sorted(set(range(indices[-1] + 1)) - set(indices))
        if gaps:
            raise CheckpointError(f"{description}: the hybrid's ResNet stage {stage} lacks "
                                  f"{[f'{BACKBONE}stages.{stage}.blocks.{block}.*' for block in gaps]}. Nothing was "
                                  "loaded.")
    for (stage, block), parts in sorted(blocks.items()):
        base = f"{BACKBONE}stages.{stage}.blocks.{block}."
        needed = [rest for rest in UNIT_NAMES if block == 0 or rest not in DOWNSAMPLE]
        missing = [base + rest for rest in needed if rest not in parts]
        if missing:
            raise CheckpointError(f"{description}: the hybrid's ResNet lacks {missing} (timm's ResNetStage projects "
                                  "the shortcut in the first block of every stage). Nothing was loaded.")
        extra = [base + rest for rest in DOWNSAMPLE if block and rest in parts]
        if extra:
            raise CheckpointError(f"{description}: the hybrid's ResNet has {extra}, a downsample in a later block of "
                                  "a stage, which timm's ResNetStage does not have. Nothing was loaded.")
    width = int(tensors[prefix + "conv.weight"].shape[0])
    channels = {prefix + "norm.weight": width}  # norm weight -> the channels keras_vit's ResNet has there
    for (stage, block), parts in blocks.items():
        base, mid = f"{BACKBONE}stages.{stage}.blocks.{block}.", width * 2 ** stage
        channels.update({base + "norm1.weight": mid, base + "norm2.weight": mid, base + "norm3.weight": 4 * mid})
        if block == 0:
            channels[base + "downsample.norm.weight"] = 4 * mid
    for name, expected in sorted(channels.items()):
        found = int(tensors[name].shape[0])
        if found % GROUPS:
            raise CheckpointError(f"{description}: {name} has {found} channels, which GroupNorm's {GROUPS} groups "
                                  f"(timm's GroupNormAct in every hybrid) do not divide. Nothing was loaded.")
        if found != expected:
            raise CheckpointError(f"{description}: {name} has {found} channels where a ResNet on a {width}-wide stem "
                                  f"has {expected} (its bottleneck width doubles with each stage). Nothing was "
                                  "loaded.")
    given = 4 * width * 2 ** stages[-1] if stages else width
    proj = tensors.get("patch_embed.proj.weight")
    if proj is not None and proj.ndim == 4 and int(proj.shape[1]) != given:
        last = f"its last stage ({BACKBONE}stages.{stages[-1]})" if stages else "its stem"
        raise CheckpointError(f"{description}: patch_embed.proj.weight takes {int(proj.shape[1])} channels, but the "
                              f"hybrid's ResNet ends in {last} with {given}: a stage is missing or the tensors are of "
                              "two models. Nothing was loaded.")


def timm_backbone_name(path, stem_only):
    """timm's name for a keras_vit ResNet variable `path` (None for another variable).

    `stem_only`: the model's ResNet is its root block alone (timm's
    `vit_tiny_r_s16_p8_*`), whose names have no `stem.` part.
    """
    for rest, ours in STEM_NAMES.items():
        if path == ours:
            return (BACKBONE if stem_only else STEM) + rest
    unit = UNIT.match(path)
    if unit is None:
        return None
    names = {ours: rest for rest, ours in UNIT_NAMES.items()}
    rest = names.get(path[unit.end():])
    if rest is None:
        return None
    return f"{BACKBONE}stages.{int(unit.group(1)) - 1}.blocks.{int(unit.group(2)) - 1}.{rest}"


def backbone_origins(state):
    """`{keras_vit path: timm's name}` of the stem weights among keras_vit's `state` (a ResNet, a ConvStem or an MbConv
    stem; `WeightsSource.origins`), a depthwise kernel keras_vit keeps transposed as a tuple of its name."""
    found = {}
    if conv_stem_widths_of(state) is not None:
        found.update({ours: BACKBONE + name for name, ours in CONV_STEM_NAMES.items()})
    if mbconv_of(state) is not None:
        found.update({ours: BACKBONE + name for name, ours in MBCONV_NAMES.items()})
        blocks = {ours: rest for rest, ours in MBCONV_BLOCK_NAMES.items()}
        for path in state:
            match = MBCONV_BLOCK.match(path)
            if match and path[match.end():] in blocks:
                name = f"{BACKBONE}stages.{match.group(1)}.{match.group(2)}.{blocks[path[match.end():]]}"
                found[path] = (name,) if name.endswith("conv2_kxk.weight") else name
    resnet = resnet_layers_of(state)
    if resnet is not None:
        found.update({path: name for path in state
                      if (name := timm_backbone_name(path, stem_only=resnet == ())) is not None})
    return found


def check_backbone_agrees(state, entry, name, path):
    """Refuse a ResNet, or none, where timm's architecture `name` (its family table `entry`) has the other."""
    found, declared = resnet_layers_of(state), entry.resnet_layers
    if conv_stem_widths_of(state) is not None:
        found = "conv_stem"
    if mbconv_of(state) is not None:
        found = "mbconv"
    if entry.conv_stem:
        declared = "conv_stem"
    if entry.mbconv is not None:
        declared = "mbconv"
    if (found is None) == (declared is None) and (found == ()) == (declared == ()) and \
            (found == "conv_stem") == (declared == "conv_stem") and (found == "mbconv") == (declared == "mbconv"):
        _check_stage_depths(state, entry, name, path)
        return
    def describe(layers):
        return ("a plain ViT (no patch_embed.backbone.*)" if layers is None else
                "a hybrid on MobileCLIP's ConvStem (patch_embed.backbone.0.conv, 1.conv, 2.conv)"
                if layers == "conv_stem" else
                "a hybrid on ViTamin's MbConvStages (patch_embed.backbone.stem.conv1, stages.*, pool.*)"
                if layers == "mbconv" else
                "a hybrid on a ResNet stem alone (patch_embed.backbone.conv, norm)" if layers == () else
                "a hybrid on a ResNetV2 (patch_embed.backbone.stem.*, stages.*)")
    raise CheckpointError(f"{path} holds {describe(found)}, but timm's {name!r} is {describe(declared)}. Nothing was "
                          "loaded.")


def _check_stage_depths(state, entry, name, path):
    """Refuse timm's own ViTamin stem for `name` (its widths) with other block counts: a file missing a stage's last
    blocks would otherwise load as a shallower stem, its outputs wrong. A stem of other widths is a model built with
    its own `embed_cfg`, read from its tensors."""
    if entry.mbconv is None:
        return
    (widths, depths), (declared_widths, declared_depths) = mbconv_of(state), entry.mbconv
    if tuple(widths) == tuple(declared_widths) and tuple(depths) != tuple(declared_depths):
        raise CheckpointError(f"{path}: ViTamin's MbConv stem has {list(depths)} blocks in its stages "
                              f"({BACKBONE}stages.<stage>.<block>.*), but timm's {name!r} builds "
                              f"{list(declared_depths)}; the file is not whole: load the complete checkpoint. Nothing "
                              "was loaded.")


def check_timm_rebuilds_backbone(model_layers, model_width, epsilons, entry, architecture, model_name):
    """Refuse a hybrid whose ResNet timm's model function `architecture` (its table `entry`) does not build."""
    if entry.resnet_layers is None:
        raise CheckpointError(f"{model_name} is a hybrid, but timm's {architecture!r} is a plain ViT; pass "
                              "architecture= one of timm's hybrids (vit_base_r50_s16_224, ..., vit_tiny_r_s16_p8_224).")
    if (tuple(model_layers), model_width) != (entry.resnet_layers, entry.resnet_width):
        raise CheckpointError(
            f"{model_name}'s ResNet has units per stage {tuple(model_layers)} on a {model_width}-wide stem, but timm's "
            f"{architecture!r} builds {entry.resnet_layers} on a {entry.resnet_width}-wide stem and takes no argument "
            "for them, so timm.create_model cannot rebuild this model.")
    if epsilons != "timm":
        raise CheckpointError(
            f"{model_name}'s ResNet computes the original Flax epsilons (weight standardisation 1e-5 added to the "
            "std, GroupNorm 1e-6), timm's hybrids others (1e-8 added to the variance, 1e-5), so timm would compute "
            "other outputs; save it in the original layout with checkpoints.save_npz.")
