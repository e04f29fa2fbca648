"""Write tests/fixtures/timm_naflex/: tiny timm NaFlexVit folders and timm's outputs on NaFlex batches.

Run in the side venv (timm installed there, never in the project's venv):

    /work/sidevenv/bin/python tools/make_naflex_timm_fixtures.py

One folder per distinct configuration kind among timm's 14 NaFlexVit
architectures (factorized position tables twice: parfac's, and per axis on
a non-square grid), each built by `timm.create_model(arch, pretrained=False, ...)`
at tiny sizes (patch 4, width 16, depth 1-2, a small position grid), every
parameter random (norm weights and layer-scale gammas too), written by
timm's own `save_for_hf(..., safe_serialization=True)`.

The batch: three images (tall, wide, square) at two patch budgets, six in
one padded batch, made by timm's own NaFlex eval pipeline: `ResizeToSequence`
(bicubic), `Patchify` and `NaFlexCollator`. The images are in [0, 1]; timm's
`Normalize` (a per-channel affine map, so it commutes with cutting into
patches) is applied to the collated patches with each folder's mean and std.
keras_vit is given the same patches mapped to [-1, 1] and normalises them
itself with the statistics it reads from the folder's config.json.

Stored per kind (`timm_naflex_reference.npz`): timm's `model(batch)` (logits
or pooled features) and `forward_features` (every token; the tests compare
the prefix tokens and the valid patch tokens).

`radio_v4_nonsquare`: RADIO v4's resize (bilinear, aspect-preserving, no
anti-aliasing) with a non-square 4 x 6 table, on its own batch
(`radio_v4_nonsquare/patches`, ...) whose images include the table's own
grid in both orientations: timm adds the table unchanged where an image's
grid is the table's, and resizes it to a square of the longer side
elsewhere.

Standard mode (`<kind>/standard_output`): timm's `model(images)` on a plain
`(batch, 3, height, width)` batch of two random images (`STANDARD_SHAPE`, a
3 x 5 grid, not the table's), which timm patchifies itself
(`batch_patchify`) and gives the table resized to that one grid;
`radio_v4_nonsquare` on images of its table's own 4 x 6 grid
(`radio_v4_nonsquare/standard_images`). `standard_images` keeps the
images channels-last in [-1, 1], as keras_vit takes them. A size the patch
does not divide is refused by timm's linear patch embedding (checked here,
not stored).
"""

import json
import os
import shutil
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timm_family_coverage import randomise  # noqa: E402

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "tests", "fixtures")
OUT = os.path.join(FIXTURES, "timm_naflex")
REFERENCE = os.path.join(FIXTURES, "timm_naflex_reference.npz")
PATCH = 4
BUDGETS = (6, 16)
IMAGE_SHAPES = ((44, 16), (12, 40), (24, 24))  # tall, wide, square (height, width)
STANDARD_SHAPE = (12, 20)  # a plain image batch: a 3 x 5 grid of 4-pixel patches
TINY = dict(patch_size=PATCH, embed_dim=16, num_heads=2)
# kind -> (architecture, model_args over its NaFlexVitCfg)
KINDS = {
    "siglip": ("naflexvit_base_patch16_siglip", dict(TINY, depth=2, pos_embed_grid_size=(5, 5))),
    "gap_registers": ("naflexvit_base_patch16_gap", dict(TINY, depth=2, pos_embed_grid_size=(5, 5), num_classes=5)),
    "par_gap": ("naflexvit_base_patch16_par_gap", dict(TINY, depth=1, pos_embed_grid_size=(5, 5), num_classes=0)),
    "map_registers": ("naflexvit_base_patch16_map", dict(TINY, depth=1, pos_embed_grid_size=(5, 5), num_classes=5)),
    "so150m2": ("naflexvit_so150m2_patch16_reg1_gap",
                dict(patch_size=PATCH, embed_dim=26, num_heads=2, depth=1, pos_embed_grid_size=(5, 5),
                     num_classes=3)),
    "radio_v3": ("naflexvit_base_patch16_radio_v3", dict(TINY, depth=2, pos_embed_grid_size=(7, 7))),
    "radio_v4": ("naflexvit_so400m_patch16_radio_v4", dict(TINY, depth=1, pos_embed_grid_size=(7, 7))),
    # Factorized tables (a row table and a column table): parfac's own (aspect-preserving), and on a non-square
    # grid resized per axis.
    "parfac": ("naflexvit_base_patch16_parfac_gap", dict(TINY, depth=1, pos_embed_grid_size=(5, 5), num_classes=4)),
    "factorized_nonsquare": ("naflexvit_base_patch16_parfac_gap",
                             dict(TINY, depth=1, pos_embed_grid_size=(4, 6), pos_embed_ar_preserving=False,
                                  num_classes=0)),
}
# kind -> (architecture, model_args, budgets, image shapes): a batch of its own.
OWN_BATCH_KINDS = {
    "radio_v4_nonsquare": ("naflexvit_so400m_patch16_radio_v4", dict(TINY, depth=1, pos_embed_grid_size=(4, 6)),
                           (24, 12), ((16, 24), (24, 16), (20, 20))),  # at 24 patches: grids 4x6, 6x4, 4x4
}
OWN_STANDARD_SHAPES = {"radio_v4_nonsquare": (16, 24)}  # its table's own 4 x 6 grid


def naflex_batch(budgets=BUDGETS, shapes=IMAGE_SHAPES):
    """`(patches in [0, 1], patch_coord, patch_valid)` of timm's eval pipeline: each shape at each budget, one
    batch."""
    from timm.data.naflex_dataset import NaFlexCollator
    from timm.data.naflex_transforms import Patchify, ResizeToSequence

    generator = torch.Generator().manual_seed(0)
    images = [torch.rand((3, *shape), generator=generator) for shape in shapes]
    samples = []
    for budget in budgets:
        resize, patchify = ResizeToSequence(PATCH, budget, interpolation="bicubic"), Patchify(PATCH)
        samples.extend((patchify(resize(image)), 0) for image in images)
    batch, _ = NaFlexCollator(max_seq_len=max(budgets))(samples)
    return batch["patches"], batch["patch_coord"], batch["patch_valid"]


def as_keras_vit(patches, coord, valid):
    """The batch as keras_vit takes it: patches in [-1, 1], each image's grid, the mask."""
    grid = (coord.amax(1) + 1).numpy().astype("int32")
    assert (grid.prod(1) == valid.sum(1).numpy()).all()
    return {"patches": (patches.numpy() * 2 - 1).astype("float32"), "patch_grid": grid,
            "patch_mask": valid.numpy()}


def standard_images(shape, seed):
    """Two random images `(2, 3, height, width)` in [0, 1] (timm's layout), and channels-last in [-1, 1]."""
    images = torch.rand((2, 3, *shape), generator=torch.Generator().manual_seed(seed))
    return images, (images.permute(0, 2, 3, 1).numpy() * 2 - 1).astype("float32")


def write_kind(kind, arch, args, patches, coord, valid, arrays, images):
    """timm's model of `arch` with random values, saved by `save_for_hf`, and its outputs on the batch."""
    import timm
    from timm.models._hub import save_for_hf

    model = timm.create_model(arch, pretrained=False, **args)
    randomise(model, torch.Generator().manual_seed(len(kind)))
    model.eval()
    folder = os.path.join(OUT, kind)
    save_for_hf(model, folder, safe_serialization=True)
    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    mean, std = (torch.tensor(config["pretrained_cfg"][key]).repeat(PATCH * PATCH) for key in ("mean", "std"))
    inputs = {"patches": (patches - mean) / std, "patch_coord": coord, "patch_valid": valid}
    with torch.no_grad():
        arrays[f"{kind}/output"] = model(inputs).numpy()
        arrays[f"{kind}/tokens"] = model.forward_features(**inputs)["patches"].numpy()
        mean, std = (torch.tensor(config["pretrained_cfg"][key])[:, None, None] for key in ("mean", "std"))
        arrays[f"{kind}/standard_output"] = model((images - mean) / std).numpy()
        try:  # timm's linear patch embedding refuses an image the patch does not divide
            model(torch.zeros((1, 3, images.shape[2] + 1, images.shape[3])))
        except RuntimeError:
            pass
        else:
            raise AssertionError(f"{kind}: timm took an image the patch does not divide")
    print(kind, arch, arrays[f"{kind}/output"].shape, arrays[f"{kind}/tokens"].shape)


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    patches, coord, valid = naflex_batch()
    arrays = as_keras_vit(patches, coord, valid)
    images, arrays["standard_images"] = standard_images(STANDARD_SHAPE, 1)
    for kind, (arch, args) in KINDS.items():
        write_kind(kind, arch, args, patches, coord, valid, arrays, images)
    for kind, (arch, args, budgets, shapes) in OWN_BATCH_KINDS.items():
        own = naflex_batch(budgets, shapes)
        arrays.update({f"{kind}/{key}": value for key, value in as_keras_vit(*own).items()})
        own_images, arrays[f"{kind}/standard_images"] = standard_images(OWN_STANDARD_SHAPES[kind], 2)
        write_kind(kind, arch, args, *own, arrays, own_images)
        print(kind, "grids", arrays[f"{kind}/patch_grid"].tolist())
    np.savez_compressed(REFERENCE, **arrays)
    print("grids", arrays["patch_grid"].tolist(), "->", REFERENCE)


if __name__ == "__main__":
    main()
