"""Write tests/fixtures/timm_sam/: tiny SAM encoders (timm's `VisionTransformerSAM`) saved by timm, and its outputs.

Run in the side venv of tools/make_fixtures.py (timm there, never in the project's venv):

    /work/refvenv/bin/python tools/make_sam_fixtures.py

Each case is timm's `VisionTransformerSAM` (timm/models/vision_transformer_sam.py)
through a registered architecture at tiny sizes (16-wide embeddings in 2
heads, 3 blocks, 8-pixel patches, MLP ratio 2), with random values in every
tensor (every LayerNorm weight, the neck's LayerNorm2d ones included, around
1; `pos_embed`, the decomposed relative position tables `rel_pos_h` and
`rel_pos_w` and the rest around 0), saved by timm's own `save_for_hf` to
`tests/fixtures/timm_sam/<case>/` and read back strictly by timm.

- `windowed_neck` (`samvit_base_patch16`): a 6x6 grid (48 px) in 4x4 windows,
  so the windowed blocks 0 and 2 pad the grid to 8x8 (timm pads the normed
  tokens with zeros after `norm1` and does not mask the padding in
  attention); block 1 global; absolute position embedding; a conv neck to 8
  channels; a 5-class head (average pooling of the neck's output, then fc).
- `no_neck_224style` (`samvit_base_patch16_224`): that architecture's own
  `neck_chans=None` (the neck is a single LayerNorm2d of the embeddings) and
  `use_abs_pos=False`; a 4x4 grid in 2x2 windows (no padding); block 2
  global; headless.
- `nonsquare` (`samvit_base_patch16`): a 4x6 grid (32x48 px) in 3x3 windows
  (padded to 6x6: the height only); blocks 0 and 2 global; a conv neck to 8
  channels; no q/k/v biases; headless.

`timm_sam_reference.npz` keeps, per case, two images (channels-last, in
keras_vit's [-1, 1], on 8-bit levels) and timm's outputs for them
(normalised by the model's pretrained_cfg mean and std):
`<case>/native/{images,features,logits|pooled,blocks}`. `features` is
`model.forward_features(x)` (NCHW: the neck's output), `blocks` the output of
the last block before the neck (NHWC, from a forward hook on
`model.blocks[-1]`). `windowed_neck` also has `<case>/other/...` at 64x64:
the 48-px model (the very same weights) run on 64x64 images, since a 64-px
timm model cannot load the 48-px file strictly (its `pos_embed` and global
`rel_pos_h/w` shapes follow the grid). timm resamples `pos_embed` on the fly
(`resample_abs_pos_embed_nhwc`: bicubic, antialias=True) and `get_rel_pos`
linearly interpolates the global block's 11-row tables to 15 rows; the 4x4
windows tile the 8x8 grid without padding. Case i (1-based) draws from
torch.Generator().manual_seed(1200 + i) and numpy.random.default_rng(1200 + i).
"""

import json
import os
import sys

import numpy as np
import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(__file__))
from make_beit_fixtures import image_batch  # noqa: E402
from make_family_fixtures import FIXTURES, batch_of, numpy, save_timm_folder  # noqa: E402

SAM_FOLDER = os.path.join(FIXTURES, "timm_sam")
REFERENCE = os.path.join(FIXTURES, "timm_sam_reference.npz")
TINY = dict(embed_dim=16, num_heads=2, depth=3, patch_size=8, mlp_ratio=2.0)
# case -> (timm architecture, model_args, other size or None)
CASES = {
    "windowed_neck": ("samvit_base_patch16", dict(TINY, img_size=48, window_size=4, global_attn_indexes=(1,),
                                                  neck_chans=8, num_classes=5, use_rel_pos=True, use_abs_pos=True),
                      (64, 64)),
    # neck_chans=None and use_abs_pos=False are the architecture's own (create_model drops None kwargs).
    "no_neck_224style": ("samvit_base_patch16_224", dict(TINY, img_size=32, window_size=2, global_attn_indexes=(2,),
                                                         num_classes=0), None),
    "nonsquare": ("samvit_base_patch16", dict(TINY, img_size=(32, 48), window_size=3, global_attn_indexes=(0, 2),
                                              neck_chans=8, num_classes=0, qkv_bias=False), None),
}
WANTED = {  # what timm must have built, per case
    "windowed_neck": dict(window_sizes=[4, 0, 4], neck="conv", pos_embed=(1, 6, 6, 16), qkv_bias=True,
                          rel_pos=[((7, 8), (7, 8)), ((11, 8), (11, 8)), ((7, 8), (7, 8))]),
    "no_neck_224style": dict(window_sizes=[2, 2, 0], neck="norm", pos_embed=None, qkv_bias=True,
                             rel_pos=[((3, 8), (3, 8)), ((3, 8), (3, 8)), ((7, 8), (7, 8))]),
    "nonsquare": dict(window_sizes=[0, 3, 0], neck="conv", pos_embed=(1, 4, 6, 16), qkv_bias=False,
                      rel_pos=[((7, 8), (11, 8)), ((5, 8), (5, 8)), ((7, 8), (11, 8))]),
}


def built(model):
    from timm.layers import LayerNorm2d

    if isinstance(model.neck, LayerNorm2d):
        neck = "norm"
    elif isinstance(model.neck, nn.Sequential) and [type(m).__name__ for m in model.neck] == [
            "Conv2d", "LayerNorm2d", "Conv2d", "LayerNorm2d"]:
        neck = "conv"
    else:
        neck = repr(model.neck)
    return dict(window_sizes=[b.window_size for b in model.blocks], neck=neck,
                pos_embed=None if model.pos_embed is None else tuple(model.pos_embed.shape),
                qkv_bias={b.attn.qkv.bias is not None for b in model.blocks}.pop(),
                rel_pos=[(tuple(b.attn.rel_pos_h.shape), tuple(b.attn.rel_pos_w.shape)) for b in model.blocks])


def randomise_sam(model, generator, scale=0.2):
    """Every LayerNorm/LayerNorm2d weight around 1, every other tensor around 0; each one changed."""
    norm_weights = {f"{name}.weight" for name, module in model.named_modules() if isinstance(module, nn.LayerNorm)}
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator) * scale
            parameter.copy_(noise + 1.0 if name in norm_weights else noise)
    parameters = dict(model.named_parameters())
    missing = [name for name in model.state_dict() if name not in parameters]
    if missing:
        raise AssertionError(f"state-dict entries that are not parameters (not randomised): {missing}")
    unchanged = [name for name, tensor in model.state_dict().items() if torch.equal(tensor, before[name])]
    if unchanged:
        raise AssertionError(f"state-dict entries left unchanged: {unchanged}")
    for name in norm_weights:
        if not 0.8 < parameters[name].mean() < 1.2:
            raise AssertionError(f"{name} is not around 1")


def run(model, pixels):
    """(model(x), model.forward_features(x), the last block's NHWC output) for `pixels`."""
    seen = []
    hook = model.blocks[-1].register_forward_hook(lambda module, args, output: seen.append(numpy(output)))
    try:
        with torch.no_grad():
            outputs, features = numpy(model(pixels)), numpy(model.forward_features(pixels))
    finally:
        hook.remove()
    if len(seen) != 2 or not np.array_equal(seen[0], seen[1]):
        raise AssertionError("the last block's output differs between model(x) and forward_features(x)")
    return outputs, features, seen[0]


def record(out, prefix, model, images, results):
    outputs, features, blocks = results
    out[f"{prefix}/images"] = images
    out[f"{prefix}/features"] = features
    out[f"{prefix}/{'logits' if model.num_classes else 'pooled'}"] = outputs
    out[f"{prefix}/blocks"] = blocks


def timm_case(case, arch, model_args, other, seed, out):
    import timm

    model = timm.create_model(arch, pretrained=False, **model_args).eval()
    if built(model) != WANTED[case]:
        raise AssertionError(f"{case}: timm built {built(model)}, not {WANTED[case]}")
    randomise_sam(model, torch.Generator().manual_seed(seed))
    folder = os.path.join(SAM_FOLDER, case)
    save_timm_folder(model, folder)
    path = os.path.join(folder, "model.safetensors")
    again = timm.create_model(arch, pretrained=False, **model_args).eval()
    timm.models.load_checkpoint(again, path, strict=True)
    mean, std = (np.array(model.pretrained_cfg[key], "float32") for key in ("mean", "std"))
    rng = np.random.default_rng(seed)

    def compare_and_record(prefix, images):
        pixels = batch_of((((images + 1) / 2 - mean) / std).astype(np.float32))
        results, original = run(again, pixels), run(model, pixels)
        if not all(np.array_equal(a, b) for a, b in zip(results, original)):
            raise AssertionError(f"{prefix}: timm read its own file back differently")
        record(out, prefix, model, images, results)
        return results

    grid = model.patch_embed.grid_size
    outputs, features, blocks = compare_and_record(f"{case}/native", image_batch(rng, *model.patch_embed.img_size))
    if features.shape[2:] != tuple(grid) or blocks.shape[1:3] != tuple(grid):
        raise AssertionError(f"{case}: features {features.shape}, blocks {blocks.shape} for a {grid} grid")
    if other is not None:
        bigger = timm.create_model(arch, pretrained=False, **dict(model_args, img_size=other)).eval()
        try:
            timm.models.load_checkpoint(bigger, path, strict=True)
        except RuntimeError as error:
            print(f"{case}: a {other} model does not load the file strictly:",
                  str(error).split("\n", 1)[1].replace("\n", " ")[:600])
        else:
            raise AssertionError(f"{case}: the {other} model loaded the file strictly; store that model instead")
        # the same (read-back) model, run at the other size
        outputs, features, blocks = compare_and_record(f"{case}/other", image_batch(rng, *other))
        if blocks.shape[1:3] != (other[0] // 8, other[1] // 8):
            raise AssertionError(f"{case}: other blocks {blocks.shape}")


# transformers' SamVisionModel (`tests/fixtures/transformers_sam_vision/`): windows padded beside a global block,
# decomposed positions, the neck; its image processor's statistics are ImageNet's (given to it here).
TRANSFORMERS_SAM = dict(hidden_size=16, output_channels=8, num_hidden_layers=3, num_attention_heads=2, image_size=48,
                        patch_size=8, mlp_dim=32, window_size=4, global_attn_indexes=[1], qkv_bias=True)


def transformers_case(out, seed=1300):
    """A random `SamVisionModel`, saved by `save_pretrained`, read back, and its `last_hidden_state` (NCHW)."""
    from transformers import SamVisionConfig, SamVisionModel

    torch.manual_seed(seed)
    model = SamVisionModel(SamVisionConfig(**TRANSFORMERS_SAM)).eval()
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator) * 0.2
            parameter.copy_(noise + 1.0 if "layer_norm" in name and name.endswith("weight") else noise)
    folder = os.path.join(FIXTURES, "transformers_sam_vision")
    model.save_pretrained(folder, safe_serialization=True)
    again = SamVisionModel.from_pretrained(folder).eval()
    images = image_batch(np.random.default_rng(seed + 2), 48, 48)
    mean, std = np.array([0.485, 0.456, 0.406], "float32"), np.array([0.229, 0.224, 0.225], "float32")
    pixels = batch_of((((images + 1) / 2 - mean) / std).astype(np.float32))
    with torch.no_grad():
        features = again(pixel_values=pixels).last_hidden_state
        if not torch.equal(features, model(pixel_values=pixels).last_hidden_state):
            raise AssertionError("transformers read its own SamVisionModel back differently")
    out["transformers_sam_vision/native/images"] = images
    out["transformers_sam_vision/native/features"] = numpy(features)


def main():
    torch.set_num_threads(1)
    out = {}
    for index, (case, (arch, model_args, other)) in enumerate(CASES.items(), start=1):
        timm_case(case, arch, model_args, other, 1200 + index, out)
        print(case, "written")
    transformers_case(out)
    print("transformers_sam_vision written")
    np.savez_compressed(REFERENCE, **out)
    with open(os.path.join(SAM_FOLDER, "cases.json"), "w") as f:
        json.dump({case: dict(architecture=arch, model_args=args, other=None if other is None else list(other))
                   for case, (arch, args, other) in CASES.items()}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
