"""Write tests/fixtures/timm_eva/ and transformers_dinov3/: tiny RoPE ViTs saved by timm's and transformers' savers.

Run in the side venv of tools/make_fixtures.py (timm and transformers there, never in the project's venv):

    /tmp/timm-venv/bin/python tools/make_eva_fixtures.py [--case NAME ...]

Each timm case is one of timm's `Eva` architectures at tiny sizes (two
blocks, 32-64 px), with random values in every tensor, saved by timm's own
`save_for_hf` to `tests/fixtures/timm_eva/<case>/` and read back strictly
by timm. One case per RoPE form (axial with EVA-02's reference grid, mixed,
DINOv3's) and per block variant (q/v biases only, q/k/v apart with the
split SwiGLU and its norm, attention's inner norm, all three biases with a
pre-norm and attention pooling, post-norm blocks, registers without a
position table, Sapiens2's grouped-query attention per block with a layer
scale on attention only). `timm_eva_reference.npz` keeps, per case, the images and
timm's logits at the case's own size (`<case>/native`) and at a second size
(`<case>/other`: timm with `dynamic_img_size=True`, which recomputes RoPE
on the new grid and resamples a position table as its checkpoint filter
does), so the tests check coordinates, not one grid.

The transformers cases are `DINOv3ViTModel`s (`save_pretrained`): one with
registers and a gated MLP, one without registers, with `pooler_output` and
`last_hidden_state` at its own size and at a second one.
"""

import argparse
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(__file__))
from make_family_fixtures import FIXTURES, batch_of, numpy, randomise, save_timm_folder  # noqa: E402

EVA_FOLDER = os.path.join(FIXTURES, "timm_eva")
TINY = dict(embed_dim=32, num_heads=2, depth=2, num_classes=5)
# case -> (timm architecture, model_args, (height, width) of the second size)
CASES = {
    "eva02_axial": ("eva02_tiny_patch14_224", dict(TINY, img_size=56), (42, 70)),
    "eva02_separate_qkv": ("eva02_base_patch16_clip_224", dict(TINY, img_size=48), (64, 32)),
    "pe_core": ("vit_pe_core_base_patch16_224", dict(TINY, img_size=48), (32, 64)),
    "naver_mixed_ape": ("vit_small_patch16_rope_mixed_ape_224", dict(TINY, img_size=48), (64, 48)),
    "dinov3": ("vit_small_plus_patch16_dinov3", dict(TINY, img_size=48), (32, 64)),
    "sbb_registers": ("vit_medium_patch16_rope_reg1_gap_256", dict(TINY, img_size=48), (64, 32)),
    "post_norm": ("eva02_enormous_patch14_clip_224", dict(TINY, img_size=42), (56, 42)),
    # Settings timm takes that keras_vit once read otherwise (one block each): mixed RoPE ignores rope_grid_offset,
    # a post-norm block ignores init_values, init_values 0.0 still makes gammas, a patch size as a pair.
    "naver_mixed_offset": ("vit_small_patch16_rope_mixed_224", dict(TINY, depth=1, img_size=32, patch_size=8,
                                                                     rope_grid_offset=1.0), (24, 40)),
    "post_norm_init_values": ("eva02_enormous_patch14_clip_224", dict(TINY, depth=1, img_size=28, patch_size=7,
                                                                      init_values=0.1), (42, 28)),
    "init_values_zero": ("vit_small_patch16_rope_224", dict(TINY, depth=1, img_size=32, patch_size=8, init_values=0.0),
                         (48, 24)),
    "patch_size_pair": ("eva02_tiny_patch14_224", dict(TINY, depth=1, img_size=32, patch_size=(8, 8)), (48, 32)),
    # Sapiens2: grouped-query attention set per block (full in the first and last, 2 key/value heads between), a
    # layer scale on attention only, RMSNorms and 8 registers, at a portrait size as its own 1024x768.
    "sapiens2": ("vit_base_patch16_sapiens2", dict(TINY, num_heads=4, depth=3, num_kv_heads=(4, 2, 4), mlp_ratio=1.0,
                                                   img_size=(32, 24), patch_size=8), (24, 40)),
}
# transformers DINOv3 case -> (DINOv3ViTConfig keywords, (model, weights, images) seeds). The second has no
# registers (its file holds an empty register_tokens) and apply_layernorm false, which only the Backbone reads.
DINOV3 = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, image_size=32, patch_size=8)
TRANSFORMERS_CASES = {
    "transformers_dinov3": (dict(DINOV3, intermediate_size=48, num_register_tokens=2, use_gated_mlp=True,
                                 hidden_act="silu", layerscale_value=0.5, key_bias=False, query_bias=True,
                                 value_bias=True), (7, 8, 9)),
    "transformers_dinov3_no_registers": (dict(DINOV3, intermediate_size=64, num_hidden_layers=1,
                                              num_register_tokens=0, apply_layernorm=False, layerscale_value=0.5),
                                         (17, 18, 19)),
}


def timm_case(case, arch, model_args, other, seed, out):
    import timm

    generator = torch.Generator().manual_seed(700 + seed)
    rng = np.random.default_rng(700 + seed)
    model = timm.create_model(arch, pretrained=False, **model_args).eval()
    randomise(model, generator)
    folder = os.path.join(EVA_FOLDER, case)
    save_timm_folder(model, folder)
    again = timm.create_model(arch, pretrained=False, **model_args).eval()
    timm.models.load_checkpoint(again, os.path.join(folder, "model.safetensors"), strict=True)
    dynamic = timm.create_model(arch, pretrained=False, dynamic_img_size=True, **model_args).eval()
    timm.models.load_checkpoint(dynamic, os.path.join(folder, "model.safetensors"), strict=True)
    size = model.patch_embed.img_size
    mean, std = (np.array(model.pretrained_cfg[key], "float32") for key in ("mean", "std"))
    for key, (height, width), reader in (("native", size, again), ("other", other, dynamic)):
        images = rng.uniform(-1, 1, size=(2, height, width, 3)).astype(np.float32)  # keras_vit's input
        pixels = batch_of((((images + 1) / 2 - mean) / std).astype(np.float32))  # timm's, as its config states
        with torch.no_grad():
            logits = numpy(reader(pixels))
            if key == "native" and not np.array_equal(logits, numpy(model(pixels))):
                raise AssertionError(f"{case}: timm read its own file back differently")
        out[f"{case}/{key}/images"] = images
        out[f"{case}/{key}/logits"] = logits
    out[f"{case}/architecture"] = arch


def transformers_case(case, keywords, seeds, out):
    from transformers import DINOv3ViTConfig, DINOv3ViTModel

    torch.manual_seed(seeds[0])
    model = DINOv3ViTModel(DINOv3ViTConfig(**keywords)).eval()
    generator = torch.Generator().manual_seed(seeds[1])
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator) * 0.2
            parameter.copy_(noise + 1.0 if name.endswith("norm.weight") or "norm1" in name or "norm2" in name
                            else noise)
    folder = os.path.join(FIXTURES, case)
    model.save_pretrained(folder, safe_serialization=True)
    again = DINOv3ViTModel.from_pretrained(folder).eval()
    rng = np.random.default_rng(seeds[2])
    for key, (height, width) in (("native", (32, 32)), ("other", (48, 24))):
        images = rng.uniform(-1, 1, size=(2, height, width, 3)).astype(np.float32)
        mean, std = np.array([0.485, 0.456, 0.406], "float32"), np.array([0.229, 0.224, 0.225], "float32")
        pixels = ((images + 1) / 2 - mean) / std
        with torch.no_grad():
            result = again(pixel_values=batch_of(pixels.astype(np.float32)))
            check = model(pixel_values=batch_of(pixels.astype(np.float32)))
        if not torch.equal(result.pooler_output, check.pooler_output):
            raise AssertionError(f"transformers read its own {case} folder back differently")
        out[f"{case}/{key}/images"] = images
        out[f"{case}/{key}/pooled"] = numpy(result.pooler_output)
        out[f"{case}/{key}/tokens"] = numpy(result.last_hidden_state)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", nargs="+", choices=[*CASES, *TRANSFORMERS_CASES],
                        help="rewrite only these cases (the reference file keeps the others')")
    cases = parser.parse_args().case or [*CASES, *TRANSFORMERS_CASES]
    path = os.path.join(FIXTURES, "timm_eva_reference.npz")
    out = {}
    if os.path.exists(path):
        with np.load(path) as existing:
            out = {key: existing[key] for key in existing.files if key.split("/")[0] not in cases}
    for seed, (case, (arch, model_args, other)) in enumerate(CASES.items()):
        if case in cases:
            timm_case(case, arch, model_args, other, seed, out)
            print(case, "written")
    for case, (keywords, seeds) in TRANSFORMERS_CASES.items():
        if case in cases:
            transformers_case(case, keywords, seeds, out)
            print(case, "written")
    np.savez_compressed(path, **out)
    with open(os.path.join(EVA_FOLDER, "cases.json"), "w") as f:
        json.dump({case: dict(architecture=arch, model_args=args, other=list(other))
                   for case, (arch, args, other) in CASES.items()}, f, indent=1)


if __name__ == "__main__":
    main()
