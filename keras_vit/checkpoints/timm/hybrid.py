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

Example:
>>> timm_backbone_name("block2_unit1/conv_proj/kernel", stem_only=False)
'patch_embed.backbone.stages.1.blocks.0.downsample.conv.weight'
"""

import re

import numpy as np

from keras_vit.checkpoints.source import CheckpointError, preview, refuse_non_float
from keras_vit.model.description import UNIT, conv_stem_widths_of, resnet_layers_of

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
            "timm's ResNetV2 or its stem alone, nor MobileCLIP's ConvStem: another backbone such as ViTamin's) "
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


def check_backbone_agrees(state, entry, name, path):
    """Refuse a ResNet, or none, where timm's architecture `name` (its family table `entry`) has the other."""
    found, declared = resnet_layers_of(state), entry.resnet_layers
    if conv_stem_widths_of(state) is not None:
        found = "conv_stem"
    if entry.conv_stem:
        declared = "conv_stem"
    if (found is None) == (declared is None) and (found == ()) == (declared == ()) and \
            (found == "conv_stem") == (declared == "conv_stem"):
        return
    def describe(layers):
        return ("a plain ViT (no patch_embed.backbone.*)" if layers is None else
                "a hybrid on MobileCLIP's ConvStem (patch_embed.backbone.0.conv, 1.conv, 2.conv)"
                if layers == "conv_stem" else
                "a hybrid on a ResNet stem alone (patch_embed.backbone.conv, norm)" if layers == () else
                "a hybrid on a ResNetV2 (patch_embed.backbone.stem.*, stages.*)")
    raise CheckpointError(f"{path} holds {describe(found)}, but timm's {name!r} is {describe(declared)}. Nothing was "
                          "loaded.")


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
