"""`make_family_fixtures.py --only timm_hybrid`: tiny timm hybrids (ResNetV2 or its stem, then a ViT).

Two cases, each written by timm's own `save_for_hf` to `tests/fixtures/timm_hybrid/<case>/`
and read back by timm with `strict=True`:

- `resnet`: `vit_base_r50_s16_224` with its ResNetV2 shrunk to two stages of (2, 1) bottleneck
  units on a 32-wide stem, built exactly as timm's `_resnetv2` builds the R50 (`StdConv2dSame`
  with eps 1e-8, GroupNorm of 32 groups, the TF-"SAME" stem). timm's model function takes no
  argument for its ResNet's depth or width, so the small backbone is passed as `embed_layer`
  (which the function only sets by default) and left out of `model_args`: timm rebuilds the
  same model from `HybridEmbed(backbone=tiny_resnetv2())`, not from the name.
- `stem_only`: `vit_tiny_r_s16_p8_224` itself (its backbone is the stem alone, 64 wide),
  shrunk through `model_args` only: timm rebuilds it from its name.
- `conv_stem`: `vit_base_mci_224` (MobileCLIP's image tower) with its `ConvStem` built as timm's
  model function builds it (4x4/4 and 2x2/2 convolutions with BatchNorm and GELU, then the 2x2/2
  patch convolution, `HybridEmbed(proj=False)`) but 8 and 24 wide instead of 192 and 768; BatchNorm
  running statistics are random too. Its pixel statistics are 0 and 1: the images stay keras_vit's
  [-1, 1] and timm is given `(images + 1) / 2`.
- `mbconv`: `vitamin_small_224` (ViTamin) with its `MbConvStages` built from a tiny `VitCfg` (an 8-wide stem,
  stages of 1 and 2 blocks 8 and 16 wide, then the 24-wide pool projection), the config `_create_vitamin`
  takes as `embed_cfg` (timm's model function passes it on; config.json cannot hold it). The blocks keep
  their GeGluMlp MLPs (`w0`, `w1`, `w2`, the input norm); the stem widens in its second stage, so its first
  block's shortcut has its 1x1 convolution after the average pool. Its pixel statistics are OpenAI's CLIP's.

Every tensor is random: GroupNorm weights around 1, convolution kernels with a per-channel
scale from 3e-5 to 0.3 (so that where timm adds the standardisation's epsilon, to the variance,
changes the outputs), the rest around 0. The images are 32x48: TF "SAME" pads the stem's 7x7/2
convolution and 3x3/2 max pool unevenly in both directions. `timm_hybrid_reference.npz` keeps
`<case>/images` (NHWC, in [-1, 1]: the statistics are 0.5), `<case>/outputs` (logits),
`<case>/features` (`forward_features`), `<case>/state_dict_shapes` and `<case>/model_args`.
"""

import json
import os
from functools import partial

import numpy as np
import torch
import torch.nn as nn

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures")
FOLDER = os.path.join(FIXTURES, "timm_hybrid")
KEEP = {"config.json", "model.safetensors"}
IMAGE_SIZE = (32, 48)
# case -> (timm architecture, model_args, the ResNetV2 in place of the name's, or None for the name's own)
CASES = {
    "resnet": ("vit_base_r50_s16_224", dict(img_size=list(IMAGE_SIZE), embed_dim=32, depth=1, num_heads=2,
                                            num_classes=5), dict(layers=(2, 1), channels=(128, 256), stem_chs=32)),
    "stem_only": ("vit_tiny_r_s16_p8_224", dict(img_size=list(IMAGE_SIZE), patch_size=2, embed_dim=24, depth=1,
                                                num_heads=3, num_classes=4), None),
    "conv_stem": ("vit_base_mci_224", dict(img_size=list(IMAGE_SIZE), embed_dim=24, depth=1, num_heads=2,
                                           num_classes=3), dict(conv_stem=(8, 8, 24))),
    "mbconv": ("vitamin_small_224", dict(img_size=list(IMAGE_SIZE), embed_dim=24, depth=2, num_heads=2,
                                         num_classes=3), dict(mbconv=dict(embed_dim=(8, 16, 24), depths=(1, 2),
                                                                          stem_width=8))),
}


def tiny_resnetv2(layers, channels, stem_chs):
    """A ResNetV2 built as timm's `_resnetv2` builds the hybrids' (no pre-activation, TF-SAME, eps 1e-8)."""
    from timm.layers import StdConv2dSame
    from timm.models.resnetv2 import ResNetV2

    return ResNetV2(layers=layers, channels=channels, stem_chs=stem_chs, num_classes=0, global_pool="",
                    preact=False, stem_type="same", conv_layer=partial(StdConv2dSame, eps=1e-8))


def build(arch, model_args, backbone):
    import timm
    from timm.layers import HybridEmbed

    if backbone is not None and "mbconv" in backbone:
        from timm.models.vitamin import VitCfg

        extra = dict(embed_cfg=VitCfg(**backbone["mbconv"]))
    elif backbone is not None and "conv_stem" in backbone:
        from timm.models.vision_transformer_hybrid import ConvStem

        stem = ConvStem(channels=backbone["conv_stem"], stride=(4, 2, 2), kernel_size=(4, 2, 2), padding=0,
                        act_layer=nn.GELU)  # as vit_base_mci_224 builds it, narrower
        extra = dict(embed_layer=partial(HybridEmbed, backbone=stem, proj=False))
    else:
        extra = {} if backbone is None else dict(embed_layer=partial(HybridEmbed, backbone=tiny_resnetv2(**backbone)))
    model = timm.create_model(arch, pretrained=False, **model_args, **extra).eval()
    for key in ("embed_layer", "embed_cfg"):  # not JSON: timm's config.json has no keyword for them
        getattr(model, "_model_args", {}).pop(key, None)
    return model


def randomise(model, generator):
    group_norms = {f"{name}.weight" for name, module in model.named_modules()
                   if isinstance(module, (nn.GroupNorm, nn.BatchNorm2d))}
    layer_norms = {f"{name}.weight" for name, module in model.named_modules() if isinstance(module, nn.LayerNorm)}
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator) * 0.2
            if name in group_norms or name in layer_norms:
                noise = noise + 1.0
            elif parameter.ndim == 4 and "backbone" in name and not name.startswith("patch_embed.backbone.0.") \
                    and not name.startswith(("patch_embed.backbone.1.", "patch_embed.backbone.2.")) \
                    and type(model.patch_embed.backbone).__name__ != "MbConvStages":  # a ResNet's (standardised)
                scale = 10 ** (torch.rand(parameter.shape[0], 1, 1, 1, generator=generator) * 4 - 4.5)
                noise = noise * 5 * scale
            parameter.copy_(noise)
        for name, module in model.named_modules():  # BatchNorm's running statistics, used at inference
            if isinstance(module, nn.BatchNorm2d):
                module.running_mean.copy_(torch.randn(module.running_mean.shape, generator=generator) * 0.2)
                module.running_var.copy_(torch.rand(module.running_var.shape, generator=generator) + 0.5)
    buffers = (".running_mean", ".running_var", ".num_batches_tracked")
    missing = [name for name in model.state_dict() if name not in dict(model.named_parameters())
               and not name.endswith(buffers)]
    if missing:
        raise AssertionError(f"state-dict entries that are not parameters (not randomised): {missing}")


def numpy(tensor):
    return tensor.detach().cpu().numpy().astype(np.float32)


def write_case(case, seed, out, save_timm_folder, record_case):
    import timm

    arch, model_args, backbone = CASES[case]
    generator = torch.Generator().manual_seed(500 + seed)
    rng = np.random.default_rng(500 + seed)
    model = build(arch, model_args, backbone)
    randomise(model, generator)
    folder = os.path.join(FOLDER, case)
    save_timm_folder(model, folder)
    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    if {"embed_layer", "embed_cfg"} & set(config.get("model_args", {})):
        raise AssertionError("embed_layer or embed_cfg leaked into model_args")
    again = build(arch, model_args, backbone)
    timm.models.load_checkpoint(again, os.path.join(folder, "model.safetensors"), strict=True)
    images = rng.uniform(-1, 1, size=(2, *IMAGE_SIZE, 3)).astype(np.float32)
    mean, std = model.pretrained_cfg["mean"], model.pretrained_cfg["std"]
    given = images if (tuple(mean), tuple(std)) == ((0.5,) * 3, (0.5,) * 3) else \
        (((images + 1) / 2 - np.array(mean)) / np.array(std)).astype(np.float32)
    with torch.no_grad():
        batch = torch.from_numpy(given.transpose(0, 3, 1, 2))
        outputs, features = numpy(model(batch)), numpy(model.forward_features(batch))
        if not (np.array_equal(outputs, numpy(again(batch)))
                and np.array_equal(features, numpy(again.forward_features(batch)))):
            raise AssertionError(f"{case}: timm read its own files back differently")
    record_case(out, case, arch, model_args, model, images, outputs, features)
    sizes = {name: os.path.getsize(os.path.join(folder, name)) for name in sorted(os.listdir(folder))}
    print(f"{case} ({arch}): outputs {outputs.shape}, features {features.shape}, files {sizes}")


def write_timm_hybrid(save_timm_folder, record_case):
    """Write the cases through make_family_fixtures.py's `save_timm_folder` and `record_case`."""
    import timm

    print(f"timm {timm.__version__}, torch {torch.__version__}")
    os.makedirs(FOLDER, exist_ok=True)
    out = {}
    for seed, case in enumerate(CASES):
        write_case(case, seed, out, save_timm_folder, record_case)
    out["timm_version"] = timm.__version__
    path = os.path.join(FIXTURES, "timm_hybrid_reference.npz")
    np.savez(path, **out)
    print(f"timm hybrids: {len(out)} arrays in {path}")
