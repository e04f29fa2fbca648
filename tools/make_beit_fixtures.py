"""Write tests/fixtures/timm_beit/ and transformers_beit*/: tiny BEiTs saved by timm's and transformers' savers.

Run in the side venv of tools/make_fixtures.py (timm and transformers there, never in the project's venv):

    /work/refvenv/bin/python tools/make_beit_fixtures.py [--case NAME ...]

Each timm case is timm's `Beit` (timm/models/beit.py) through one of its
registered architectures at tiny sizes (embed_dim 32, 2 heads, 8-pixel
patches, 32-48 px), with random values in every tensor (`randomise`, plus
BEiT's own layer scales `gamma_1`/`gamma_2`, plain parameters rather than
timm's `LayerScale`, around 0.5), saved by timm's own `save_for_hf` to
`tests/fixtures/timm_beit/<case>/` and read back strictly by timm. Between
them every switch of `Beit` is on somewhere: per-block relative position
bias tables, the shared table (alone, and added to the blocks' own), an
absolute position table, q/v biases and none, layer scale and none, average
pooling with fc_norm and class-token pooling with the final norm, SwiGLU and
the MLP's inner norm (scale_mlp), a non-square grid.

`timm_beit_reference.npz` keeps, per case, two images (channels-last, in
keras_vit's [-1, 1], on 8-bit levels) and timm's outputs for them normalised by the model's
pretrained_cfg mean/std: `<case>/native/{images,logits|pooled,tokens}` at
the case's own size (`logits` is `model(x)`, `pooled` the same for the
headless case, `tokens` is `model.forward_features(x)`: every token after the
final norm, Identity where fc_norm is used). Cases with a second size keep
`<case>/other/{images,logits,tokens,block0_table}` from a model built at
that size and loaded from the file through timm's own
`checkpoint_filter_fn` (resize_rel_pos_bias_table for the tables,
resample_abs_pos_embed for pos_embed), and `block0_table`, that model's
resized `blocks.0.attn.relative_position_bias_table` (`shared_table`: its
`rel_pos_bias.relative_position_bias_table` where there is one).

The transformers cases are a `BeitModel` (per-layer tables, mean pooling)
and a `BeitForImageClassification` (shared table, absolute positions, CLS
pooling), written by `save_pretrained(safe_serialization=True)`, read back
by `from_pretrained`, with outputs at 32x32 in
`transformers_beit_reference.npz`: `<case>/native/{images,pooled,tokens}`
(and `logits` for the classifier). No preprocessor file is written: their
images go in as they are (BeitImageProcessor's mean and std are 0.5).
"""

import argparse
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(__file__))
from make_family_fixtures import FIXTURES, batch_of, numpy, randomise, save_timm_folder  # noqa: E402

BEIT_FOLDER = os.path.join(FIXTURES, "timm_beit")
TINY = dict(embed_dim=32, num_heads=2, depth=2, patch_size=8, img_size=32)
# case -> (timm architecture, model_args, (height, width) of the second size or None)
CASES = {
    # BEiT v1: per-block tables, layer scale (init_values 0.1), avg pool + fc_norm, no absolute positions.
    "beit_v1": ("beit_base_patch16_224", dict(TINY, num_classes=5), (48, 32)),
    # BEiT v2 on a non-square 4x6 grid (tables of 7*11+3 rows), headless: model(x) is the fc_norm'd mean.
    "beitv2_nonsquare": ("beitv2_base_patch16_224", dict(TINY, img_size=(32, 48), num_classes=0), None),
    # The shared table added to each block's own, an absolute position table, class-token pooling with the
    # final norm, no q/v biases, no layer scale: init_values 0.0, as timm.create_model drops None arguments (None
    # would leave the architecture's 0.1) and Block makes gammas only for a true init_values.
    "shared_abs_token": ("beit_base_patch16_224", dict(TINY, num_classes=3, use_shared_rel_pos_bias=True,
                                                       use_rel_pos_bias=True, use_abs_pos_emb=True,
                                                       global_pool="token", qkv_bias=False, init_values=0.0),
                         (48, 48)),
    # SwiGLU with its inner norm (scale_mlp), the shared table alone.
    "swiglu_scale_mlp": ("beitv2_large_patch16_224", dict(TINY, depth=1, num_classes=4, swiglu_mlp=True,
                                                          scale_mlp=True, use_shared_rel_pos_bias=True,
                                                          use_rel_pos_bias=False), None),
}
# What each case must have built (checked on the model, so an argument timm drops cannot pass unseen).
SWITCHES = {
    "beit_v1": dict(block_tables=True, shared_table=False, pos_embed=False, qkv_bias=True, layer_scale=True,
                    fc_norm=True, swiglu=False, mlp_norm=False),
    "beitv2_nonsquare": dict(block_tables=True, shared_table=False, pos_embed=False, qkv_bias=True,
                             layer_scale=True, fc_norm=True, swiglu=False, mlp_norm=False),
    "shared_abs_token": dict(block_tables=True, shared_table=True, pos_embed=True, qkv_bias=False,
                             layer_scale=False, fc_norm=False, swiglu=False, mlp_norm=False),
    "swiglu_scale_mlp": dict(block_tables=False, shared_table=True, pos_embed=False, qkv_bias=True,
                             layer_scale=True, fc_norm=True, swiglu=True, mlp_norm=True),
}
# transformers case -> (model class, BeitConfig keywords, (model, weights, images) seeds)
BEIT = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, image_size=32,
            patch_size=8)
# The second size of the transformers cases (a 6x6 grid beside their own 4x4).
OTHER_SIZE = (48, 48)
TRANSFORMERS_CASES = {
    "transformers_beit": ("BeitModel", dict(BEIT, use_relative_position_bias=True,
                                            use_absolute_position_embeddings=False, layer_scale_init_value=0.1,
                                            use_mean_pooling=True), (51, 52, 53)),
    "transformers_beit_shared": ("BeitForImageClassification",
                                 dict(BEIT, num_labels=3, use_shared_relative_position_bias=True,
                                      use_relative_position_bias=False, use_absolute_position_embeddings=True,
                                      use_mean_pooling=False, layer_scale_init_value=0.1), (61, 62, 63)),
}


def image_batch(rng, height, width):
    """Two random channels-last images in keras_vit's [-1, 1], on the 256 levels of 8-bit images (uint8 / 127.5 - 1,
    as a photo read in would be), which keeps the compressed references small."""
    return (rng.integers(0, 256, size=(2, height, width, 3)) / 127.5 - 1).astype(np.float32)


def randomise_beit(model, generator):
    """`randomise`, then BEiT's layer scales (plain parameters, which `randomise` leaves around 0) around 0.5."""
    randomise(model, generator)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith(("gamma_1", "gamma_2")):
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.1 + 0.5)


def switches(model):
    block = model.blocks[0]
    return dict(block_tables=block.attn.relative_position_bias_table is not None,
                shared_table=model.rel_pos_bias is not None, pos_embed=model.pos_embed is not None,
                qkv_bias=block.attn.q_bias is not None, layer_scale=block.gamma_1 is not None,
                fc_norm=not isinstance(model.fc_norm, torch.nn.Identity), swiglu=hasattr(block.mlp, "fc1_g"),
                mlp_norm=not isinstance(block.mlp.norm, torch.nn.Identity))


def timm_case(case, arch, model_args, other, seed, out):
    import timm
    from timm.models.beit import checkpoint_filter_fn

    if timm.layers.pos_embed_rel._USE_SCIPY:  # TIMM_USE_SCIPY_INTERP: scipy's cubic interp2d, not timm's default
        raise SystemExit("unset TIMM_USE_SCIPY_INTERP: the references are of timm's default table resize")
    generator = torch.Generator().manual_seed(900 + seed)
    rng = np.random.default_rng(900 + seed)
    model = timm.create_model(arch, pretrained=False, **model_args).eval()
    if switches(model) != SWITCHES[case]:
        raise AssertionError(f"{case}: timm built {switches(model)}, not {SWITCHES[case]}")
    randomise_beit(model, generator)
    folder = os.path.join(BEIT_FOLDER, case)
    save_timm_folder(model, folder)
    weights = os.path.join(folder, "model.safetensors")
    again = timm.create_model(arch, pretrained=False, **model_args).eval()
    timm.models.load_checkpoint(again, weights, strict=True)
    mean, std = (np.array(model.pretrained_cfg[key], "float32") for key in ("mean", "std"))
    sizes = [("native", tuple(model.patch_embed.img_size), again)]
    if other is not None:
        # timm's own "loaded at another size": a model built there, the file through its checkpoint filter.
        resized = timm.create_model(arch, pretrained=False, **dict(model_args, img_size=other)).eval()
        resized.load_state_dict(checkpoint_filter_fn(timm.models.load_state_dict(weights), resized), strict=True)
        sizes.append(("other", tuple(other), resized))
        out[f"{case}/other/block0_table"] = numpy(resized.blocks[0].attn.relative_position_bias_table)
        if resized.rel_pos_bias is not None:
            out[f"{case}/other/shared_table"] = numpy(resized.rel_pos_bias.relative_position_bias_table)
    for key, (height, width), reader in sizes:
        images = image_batch(rng, height, width)
        pixels = batch_of((((images + 1) / 2 - mean) / std).astype(np.float32))  # timm's, as its config states
        with torch.no_grad():
            outputs, tokens = numpy(reader(pixels)), numpy(reader.forward_features(pixels))
            if key == "native" and not (np.array_equal(outputs, numpy(model(pixels)))
                                        and np.array_equal(tokens, numpy(model.forward_features(pixels)))):
                raise AssertionError(f"{case}: timm read its own file back differently")
        out[f"{case}/{key}/images"] = images
        out[f"{case}/{key}/{'logits' if model.num_classes else 'pooled'}"] = outputs
        out[f"{case}/{key}/tokens"] = tokens
    out[f"{case}/architecture"] = arch


def randomise_transformers_beit(model, generator, scale=0.2):
    """Layer norms (layernorm_before/after, the final and the pooler's) around 1, lambda_1/2 around 0.5, the rest
    (biases, tokens, position and bias tables, weights) around 0."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator) * scale
            if "layernorm" in name and name.endswith("weight"):
                noise = noise + 1.0
            elif name.endswith(("lambda_1", "lambda_2")):
                noise = noise * 0.5 + 0.5
            parameter.copy_(noise)
    parameters = dict(model.named_parameters())
    missing = [name for name in model.state_dict() if name not in parameters]
    if missing:
        raise AssertionError(f"state-dict entries that are not parameters (not randomised): {missing}")


def transformers_case(case, model_name, keywords, seeds, out):
    import transformers

    torch.manual_seed(seeds[0])
    model_class = getattr(transformers, model_name)
    model = model_class(transformers.BeitConfig(**keywords)).eval()
    randomise_transformers_beit(model, torch.Generator().manual_seed(seeds[1]))
    folder = os.path.join(FIXTURES, case)
    model.save_pretrained(folder, safe_serialization=True)
    if case == "transformers_beit":  # BEiT's own image processor beside it: bicubic, squashed to the size, no crop
        transformers.BeitImageProcessor(size={"height": 32, "width": 32}).save_pretrained(folder)
    again = model_class.from_pretrained(folder).eval()
    rng = np.random.default_rng(seeds[2])
    images = image_batch(rng, 32, 32)
    pixels = batch_of(((images + 1) / 2 - 0.5) / 0.5).float()  # BeitImageProcessor's mean and std: 0.5
    results = {}
    with torch.no_grad():
        for name, reader in (("original", model), ("read", again)):
            base = getattr(reader, "beit", reader)
            result = base(pixel_values=pixels)
            results[name] = dict(pooled=result.pooler_output, tokens=result.last_hidden_state)
            if base is not reader:
                results[name]["logits"] = reader(pixel_values=pixels).logits
    for field, value in results["read"].items():
        if not torch.equal(value, results["original"][field]):
            raise AssertionError(f"transformers read its own {case} folder back differently ({field})")
        out[f"{case}/native/{field}"] = numpy(value)
    out[f"{case}/native/images"] = images
    # At another size: transformers' forward with interpolate_pos_encoding resizes the absolute table (bicubic) and
    # the relative position bias tables (bilinear) on every call.
    images = image_batch(rng, *OTHER_SIZE)
    pixels = batch_of(((images + 1) / 2 - 0.5) / 0.5).float()
    with torch.no_grad():
        base = getattr(again, "beit", again)
        result = base(pixel_values=pixels, interpolate_pos_encoding=True)
        out[f"{case}/other/pooled"] = numpy(result.pooler_output)
        out[f"{case}/other/tokens"] = numpy(result.last_hidden_state)
        if base is not again:
            out[f"{case}/other/logits"] = numpy(again(pixel_values=pixels, interpolate_pos_encoding=True).logits)
    out[f"{case}/other/images"] = images


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", nargs="+", choices=[*CASES, *TRANSFORMERS_CASES],
                        help="rewrite only these cases (the reference files keep the others')")
    cases = parser.parse_args().case or [*CASES, *TRANSFORMERS_CASES]
    torch.set_num_threads(1)
    for path, chosen, write in (
            (os.path.join(FIXTURES, "timm_beit_reference.npz"), CASES,
             lambda case, seed, out: timm_case(case, *CASES[case], seed, out)),
            (os.path.join(FIXTURES, "transformers_beit_reference.npz"), TRANSFORMERS_CASES,
             lambda case, seed, out: transformers_case(case, *TRANSFORMERS_CASES[case], out))):
        out = {}
        if os.path.exists(path):
            with np.load(path) as existing:
                out = {key: existing[key] for key in existing.files if key.split("/")[0] not in cases}
        for seed, case in enumerate(chosen):
            if case in cases:
                write(case, seed, out)
                print(case, "written")
        np.savez_compressed(path, **out)
    with open(os.path.join(BEIT_FOLDER, "cases.json"), "w") as f:
        json.dump({case: dict(architecture=arch, model_args=args, other=list(other) if other else None)
                   for case, (arch, args, other) in CASES.items()}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
