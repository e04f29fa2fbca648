"""Write tests/fixtures/timm_cait/: tiny CaiT models (timm's `Cait`) saved by timm, and timm's outputs.

Run in the side venv of tools/make_fixtures.py (timm there, never in the project's venv):

    /work/refvenv/bin/python tools/make_cait_fixtures.py

Each case is timm's `Cait` (timm/models/cait.py) through a registered
architecture at tiny sizes (16-wide embeddings in 2 heads, 2 talking-heads
blocks, 8-pixel patches), with random values in every tensor (norms around
1, every `gamma_1`/`gamma_2` around 0.5, the talking-heads maps `proj_l` and
`proj_w`, the class-attention blocks' `q`, `k`, `v` and the rest around 0),
saved by timm's own `save_for_hf` to `tests/fixtures/timm_cait/<case>/`
and read back strictly by timm. `token`: class-token pooling, two
class-attention blocks, q/k/v biases. `gap_nonsquare`: average pooling of
the patches on a 4x6 grid, one class-attention block with a narrower MLP
(`mlp_ratio_token_only`), no q/k/v biases, headless.

`timm_cait_reference.npz` keeps, per case, two images (channels-last, in
keras_vit's [-1, 1], on 8-bit levels) and timm's outputs for them
(normalised by the model's pretrained_cfg mean and std):
`<case>/native/{images,logits|pooled,tokens}` (`tokens` is
`model.forward_features(x)`: the class token and the patches after the
final norm). timm's `Cait` takes one input size (its checkpoint filter does
not resize `pos_embed`), so there is no second size. Case i (1-based)
draws from torch.Generator().manual_seed(1100 + i) and
numpy.random.default_rng(1100 + i).
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

CAIT_FOLDER = os.path.join(FIXTURES, "timm_cait")
REFERENCE = os.path.join(FIXTURES, "timm_cait_reference.npz")
TINY = dict(embed_dim=16, num_heads=2, depth=2, patch_size=8, img_size=32, mlp_ratio=2.0)
CASES = {
    "token": ("cait_xxs24_224", dict(TINY, num_classes=5)),
    "gap_nonsquare": ("cait_s24_224", dict(TINY, img_size=(32, 48), num_classes=0, global_pool="avg",
                                           qkv_bias=False, depth_token_only=1, mlp_ratio_token_only=1.5)),
}


def randomise_cait(model, generator, scale=0.2):
    """Norm weights around 1, gammas around 0.5, every other tensor around 0; each one changed."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator) * scale
            if name.endswith(("gamma_1", "gamma_2")):
                noise = noise * 0.5 + 0.5
            elif ".norm" in name or name.startswith("norm."):
                noise = noise + (1.0 if name.endswith("weight") else 0.0)
            parameter.copy_(noise)
    parameters = dict(model.named_parameters())
    missing = [name for name in model.state_dict() if name not in parameters]
    if missing:
        raise AssertionError(f"state-dict entries that are not parameters (not randomised): {missing}")
    for name, module in model.named_modules():
        if isinstance(module, nn.LayerNorm) and not 0.8 < module.weight.mean() < 1.2:
            raise AssertionError(f"{name}.weight is not around 1")


def timm_case(case, arch, model_args, seed, out):
    import timm

    model = timm.create_model(arch, pretrained=False, **model_args).eval()
    built = (len(model.blocks_token_only), model.global_pool, model.blocks[0].attn.qkv.bias is not None,
             model.blocks_token_only[0].mlp.fc1.out_features)
    wanted = (model_args.get("depth_token_only", 2), model_args.get("global_pool", "token"),
              model_args.get("qkv_bias", True), int(16 * model_args.get("mlp_ratio_token_only", 4.0)))
    if built != wanted:
        raise AssertionError(f"{case}: timm built {built}, not {wanted}")
    randomise_cait(model, torch.Generator().manual_seed(seed))
    folder = os.path.join(CAIT_FOLDER, case)
    save_timm_folder(model, folder)
    again = timm.create_model(arch, pretrained=False, **model_args).eval()
    timm.models.load_checkpoint(again, os.path.join(folder, "model.safetensors"), strict=True)
    mean, std = (np.array(model.pretrained_cfg[key], "float32") for key in ("mean", "std"))
    images = image_batch(np.random.default_rng(seed), *model.patch_embed.img_size)
    pixels = batch_of((((images + 1) / 2 - mean) / std).astype(np.float32))
    with torch.no_grad():
        outputs, tokens = numpy(again(pixels)), numpy(again.forward_features(pixels))
        if not (np.array_equal(outputs, numpy(model(pixels))) and np.array_equal(tokens, numpy(
                model.forward_features(pixels)))):
            raise AssertionError(f"{case}: timm read its own file back differently")
    out[f"{case}/native/images"] = images
    out[f"{case}/native/{'logits' if model.num_classes else 'pooled'}"] = outputs
    out[f"{case}/native/tokens"] = tokens


def main():
    torch.set_num_threads(1)
    out = {}
    for index, (case, (arch, model_args)) in enumerate(CASES.items(), start=1):
        timm_case(case, arch, model_args, 1100 + index, out)
        print(case, "written")
    np.savez_compressed(REFERENCE, **out)
    with open(os.path.join(CAIT_FOLDER, "cases.json"), "w") as f:
        json.dump({case: dict(architecture=arch, model_args=args) for case, (arch, args) in CASES.items()}, f,
                  indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
