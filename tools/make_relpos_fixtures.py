"""Write tests/fixtures/timm_relpos/: tiny relative-position ViTs (timm's VisionTransformerRelPos) saved by timm.

Run in the side venv of tools/make_fixtures.py (timm there, never in the project's venv):

    /work/refvenv/bin/python tools/make_relpos_fixtures.py [--case NAME ...]

Each case is timm's `VisionTransformerRelPos` (timm/models/vision_transformer_relpos.py)
through one of its registered architectures at tiny sizes (`TINY`: 16-wide
embeddings in 2 heads, 2 blocks with 32-wide MLPs, 8-pixel patches, 32-48 px, a 16-wide
relative-position MLP), with random values in every tensor (`randomise`:
norms around 1, the blocks' `LayerScale` gammas around 0.5, the rest, the
relative-position MLPs `attn.rel_pos.mlp.fc1/fc2` and the
`relative_position_bias_table`s included, around 0), saved by timm's own
`save_for_hf` to `tests/fixtures/timm_relpos/<case>/` and read back strictly
by timm. Between them every switch of the family is on somewhere: the
log-coordinate MLP ('cr' mode: identity, both MLP biases; 'swin' mode:
16 * sigmoid, no fc2 bias) per block and shared by all blocks, timm's
RelPosBias table per block (with a class token: 3 extra rows) and shared
(no class token), pre-norm blocks with layer scale and post-norm blocks
(ResPostRelPosBlock) without, a class token with token pooling and with
average pooling, fc_norm and the final norm, qkv biases and none, qk_norm,
a non-square grid. `SWITCHES` says what each case must have built; it is
checked on the model itself, as timm.create_model drops arguments set to
None.

`timm_relpos_reference.npz` keeps, per case, two images (channels-last, in
keras_vit's [-1, 1], on 8-bit levels) and timm's outputs for them normalised by the
model's pretrained_cfg mean/std (0.5 for every architecture here):
`<case>/native/{images,logits|pooled,tokens}` at the case's own size
(`logits` is `model(x)`, `pooled` the same for the headless cases,
`tokens` is `model.forward_features(x)`: every token after the final norm,
Identity where fc_norm is used). Cases with a second size keep
`<case>/other/{images,logits|pooled,tokens}` from a model built there
(`img_size=OTHER`, the same model_args otherwise) and loaded from the file
through timm's own `checkpoint_filter_fn` (resize_rel_pos_bias_table for the
tables, nothing for the MLPs, whose biases timm recomputes from the new
grid's coordinates); the table cases also keep that model's resized
`blocks.0.attn.rel_pos.relative_position_bias_table` as
`<case>/other/block0_table` (`shared_table`: `shared_rel_pos.relative_position_bias_table`).

`timm_relpos/cases.json` maps each case to its architecture, the model_args
given to timm.create_model and the (height, width) of its second size (or
null). Case i (1-based, in the order of `CASES`) draws its weights from
torch.Generator().manual_seed(1000 + i) and its images from
numpy.random.default_rng(1000 + i).
"""

import argparse
import copy
import json
import os
import sys

import numpy as np
import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(__file__))
from make_beit_fixtures import image_batch  # noqa: E402
from make_family_fixtures import FIXTURES, batch_of, numpy, randomise, save_timm_folder  # noqa: E402

RELPOS_FOLDER = os.path.join(FIXTURES, "timm_relpos")
REFERENCE = os.path.join(FIXTURES, "timm_relpos_reference.npz")
# 16 wide (not the BEiT fixtures' 32) with 32-wide MLPs keeps the seven cases' files well under 600 KB together.
TINY = dict(embed_dim=16, num_heads=2, depth=2, patch_size=8, img_size=32, mlp_ratio=2.0, rel_pos_dim=16)
# case -> (timm architecture, model_args, (height, width) of the second size or None)
CASES = {
    # RelPosMlp 'cr' per block, no class token, avg pool + fc_norm, no qkv biases, LayerScale (init 1e-6).
    "mlp_gap": ("vit_relpos_medium_patch16_224", dict(TINY, num_classes=5), (48, 32)),
    # A class token (the MLP's bias is zero-padded for it), token pooling with the final norm, qk_norm, 4x6 grid.
    "mlp_cls_token_nonsquare": ("vit_relpos_medium_patch16_cls_224",
                                dict(TINY, img_size=(32, 48), num_classes=3, qk_norm=True), None),
    # One RelPosMlp shared by the blocks, the final norm before avg pooling, headless.
    "shared_mlp": ("vit_srelpos_small_patch16_224", dict(TINY, num_classes=0), None),
    # ResPostRelPosBlock: post-norm blocks without layer scale, qkv biases (the architecture leaves the default).
    "res_post_norm": ("vit_relpos_base_patch32_plus_rpn_256", dict(TINY, num_classes=4), None),
    # RelPosBias tables per block with a class token (7*7+3 rows), class token + avg pool + fc_norm.
    "table_cls_gap": ("vit_relpos_base_patch16_clsgap_224", dict(TINY, num_classes=5, rel_pos_type="bias"),
                      (48, 48)),
    # One shared RelPosBias table without a class token (7*7 rows), headless; resized to a 6x4 grid.
    "table_shared_no_prefix": ("vit_relpos_small_patch16_224",
                               dict(TINY, num_classes=0, rel_pos_type="bias", shared_rel_pos=True), (48, 32)),
    # RelPosMlp 'swin' per block: 16 * sigmoid, fc2 without bias, coordinates normalised by the grid.
    "mlp_swin": ("vit_relpos_small_patch16_224", dict(TINY, num_classes=3, rel_pos_type="mlp_swin"), (48, 48)),
}
_MLP = dict(block="RelPosBlock", layer_scale="LayerScale", qk_norm=False, shared=None, rel_pos_hidden=16)
# What each case must have built (checked on the model, so an argument timm drops cannot pass unseen).
SWITCHES = {
    "mlp_gap": dict(_MLP, rel_pos="RelPosMlp", mode="cr", fc2_bias=True, table_rows=None, cls_token=False,
                    global_pool="avg", fc_norm=True, norm=False, qkv_bias=False, grid=[4, 4]),
    "mlp_cls_token_nonsquare": dict(_MLP, rel_pos="RelPosMlp", mode="cr", fc2_bias=True, table_rows=None,
                                    cls_token=True, global_pool="token", fc_norm=False, norm=True, qkv_bias=False,
                                    qk_norm=True, grid=[4, 6]),
    "shared_mlp": dict(_MLP, rel_pos=None, shared="RelPosMlp", mode="cr", fc2_bias=True, table_rows=None,
                       cls_token=False, global_pool="avg", fc_norm=False, norm=True, qkv_bias=False, grid=[4, 4]),
    "res_post_norm": dict(_MLP, block="ResPostRelPosBlock", layer_scale="Identity", rel_pos="RelPosMlp", mode="cr",
                          fc2_bias=True, table_rows=None, cls_token=False, global_pool="avg", fc_norm=False,
                          norm=True, qkv_bias=True, grid=[4, 4]),
    "table_cls_gap": dict(_MLP, rel_pos="RelPosBias", mode=None, fc2_bias=None, table_rows=7 * 7 + 3,
                          rel_pos_hidden=None, cls_token=True, global_pool="avg", fc_norm=True, norm=False,
                          qkv_bias=False, grid=[4, 4]),
    "table_shared_no_prefix": dict(_MLP, rel_pos=None, shared="RelPosBias", mode=None, fc2_bias=None,
                                   table_rows=7 * 7, rel_pos_hidden=None, cls_token=False, global_pool="avg",
                                   fc_norm=True, norm=False, qkv_bias=False, grid=[4, 4]),
    "mlp_swin": dict(_MLP, rel_pos="RelPosMlp", mode="swin", fc2_bias=False, table_rows=None, cls_token=False,
                     global_pool="avg", fc_norm=True, norm=False, qkv_bias=False, grid=[4, 4]),
}


def switches(model):
    block = model.blocks[0]
    rel_pos = block.attn.rel_pos if block.attn.rel_pos is not None else model.shared_rel_pos
    mlp = getattr(rel_pos, "mlp", None)
    return dict(block=type(block).__name__,
                rel_pos=type(block.attn.rel_pos).__name__ if block.attn.rel_pos is not None else None,
                shared=type(model.shared_rel_pos).__name__ if model.shared_rel_pos is not None else None,
                mode=getattr(rel_pos, "mode", None),
                fc2_bias=None if mlp is None else mlp.fc2.bias is not None,
                rel_pos_hidden=None if mlp is None else mlp.fc1.out_features,
                table_rows=rel_pos.relative_position_bias_table.shape[0]
                if hasattr(rel_pos, "relative_position_bias_table") else None,
                cls_token=model.cls_token is not None, global_pool=model.global_pool,
                fc_norm=not isinstance(model.fc_norm, nn.Identity), norm=not isinstance(model.norm, nn.Identity),
                layer_scale=type(getattr(block, "ls1", nn.Identity())).__name__,
                qkv_bias=block.attn.qkv.bias is not None, qk_norm=not isinstance(block.attn.q_norm, nn.Identity),
                grid=list(model.patch_embed.grid_size))


def randomise_relpos(model, generator):
    """`randomise` (which already knows LayerScale and the norms), then a check that it reached every tensor."""
    from timm.layers import LayerScale

    before = {name: value.clone() for name, value in model.state_dict().items()}
    randomise(model, generator)  # raises if a state-dict entry is not a parameter
    for name, value in model.state_dict().items():
        if torch.equal(value, before[name]):
            raise AssertionError(f"{name} kept its initial values")
    for name, module in model.named_modules():
        if isinstance(module, LayerScale) and not 0.3 < module.gamma.mean() < 0.7:
            raise AssertionError(f"{name}.gamma is not around 0.5")
        if isinstance(module, nn.LayerNorm) and not 0.8 < module.weight.mean() < 1.2:
            raise AssertionError(f"{name}.weight is not around 1")


def rel_pos_effect(model, pixels):
    """How far the outputs move with every relative position bias set to zero (so the cases test it)."""
    from timm.layers import RelPosBias, RelPosMlp

    plain = copy.deepcopy(model)
    for module in plain.modules():
        if isinstance(module, (RelPosBias, RelPosMlp)):  # fused attention asks get_bias, the other path forward
            module.get_bias = lambda: None
            module.forward = lambda attn, shared_rel_pos=None: attn
    with torch.no_grad():
        return float((model.forward_features(pixels) - plain.forward_features(pixels)).abs().max())


def timm_case(case, arch, model_args, other, seed, out):
    import timm
    from timm.models.vision_transformer_relpos import checkpoint_filter_fn

    if timm.layers.pos_embed_rel._USE_SCIPY:  # TIMM_USE_SCIPY_INTERP: scipy's cubic interp2d, not timm's default
        raise SystemExit("unset TIMM_USE_SCIPY_INTERP: the references are of timm's default table resize")
    generator = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    model = timm.create_model(arch, pretrained=False, **model_args).eval()
    if switches(model) != SWITCHES[case]:
        raise AssertionError(f"{case}: timm built {switches(model)}, not {SWITCHES[case]}")
    randomise_relpos(model, generator)
    folder = os.path.join(RELPOS_FOLDER, case)
    save_timm_folder(model, folder)
    weights = os.path.join(folder, "model.safetensors")
    again = timm.create_model(arch, pretrained=False, **model_args).eval()
    timm.models.load_checkpoint(again, weights, strict=True)
    mean, std = (np.array(model.pretrained_cfg[key], "float32") for key in ("mean", "std"))
    sizes = [("native", tuple(model.patch_embed.img_size), again)]
    if other is not None:
        # timm's own "loaded at another size": a model built there, the file through its checkpoint filter.
        resized = timm.create_model(arch, pretrained=False, **dict(model_args, img_size=other)).eval()
        state_dict = timm.models.load_state_dict(weights)
        filtered = checkpoint_filter_fn(state_dict, resized)
        changed = [key if state_dict[key].shape == filtered[key].shape else
                   f"{key} {list(state_dict[key].shape)} -> {list(filtered[key].shape)}"
                   for key in state_dict if state_dict[key].shape != filtered[key].shape
                   or not torch.equal(state_dict[key], filtered[key])]
        print(f"  {case}: checkpoint_filter_fn to {other} changed {changed or 'nothing'}")
        resized.load_state_dict(filtered, strict=True)
        sizes.append(("other", tuple(other), resized))
        if resized.shared_rel_pos is not None and hasattr(resized.shared_rel_pos, "relative_position_bias_table"):
            out[f"{case}/other/shared_table"] = numpy(resized.shared_rel_pos.relative_position_bias_table)
        elif resized.blocks[0].attn.rel_pos is not None and hasattr(resized.blocks[0].attn.rel_pos,
                                                                    "relative_position_bias_table"):
            out[f"{case}/other/block0_table"] = numpy(resized.blocks[0].attn.rel_pos.relative_position_bias_table)
    for key, (height, width), reader in sizes:
        images = image_batch(rng, height, width)
        pixels = batch_of((((images + 1) / 2 - mean) / std).astype(np.float32))  # timm's, as its config states
        with torch.no_grad():
            outputs, tokens = numpy(reader(pixels)), numpy(reader.forward_features(pixels))
            if key == "native" and not (np.array_equal(outputs, numpy(model(pixels)))
                                        and np.array_equal(tokens, numpy(model.forward_features(pixels)))):
                raise AssertionError(f"{case}: timm read its own file back differently")
        effect = rel_pos_effect(reader, pixels)
        if effect < 1e-2:
            raise AssertionError(f"{case}/{key}: the relative position bias hardly matters ({effect})")
        print(f"  {case}/{key}: tokens move by up to {effect:.3f} without the relative position bias")
        out[f"{case}/{key}/images"] = images
        out[f"{case}/{key}/{'logits' if model.num_classes else 'pooled'}"] = outputs
        out[f"{case}/{key}/tokens"] = tokens
    out[f"{case}/architecture"] = arch


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", nargs="+", choices=list(CASES),
                        help="rewrite only these cases (the reference file keeps the others')")
    cases = parser.parse_args().case or list(CASES)
    torch.set_num_threads(1)
    out = {}
    if os.path.exists(REFERENCE):
        with np.load(REFERENCE) as existing:
            out = {key: existing[key] for key in existing.files if key.split("/")[0] not in cases}
    for index, case in enumerate(CASES, start=1):
        if case in cases:
            timm_case(case, *CASES[case], 1000 + index, out)
            print(case, "written")
    np.savez_compressed(REFERENCE, **out)
    with open(os.path.join(RELPOS_FOLDER, "cases.json"), "w") as f:
        json.dump({case: dict(architecture=arch, model_args=args, other=list(other) if other else None)
                   for case, (arch, args, other) in CASES.items()}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
