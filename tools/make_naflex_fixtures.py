"""Write tests/fixtures/naflex_reference.json: NaFlex preprocessing as transformers and timm compute it.

Run in the side venv of tools/make_fixtures.py (timm, transformers, torchvision, Pillow; never the project's venv):

    /work/sidevenv/bin/python tools/make_naflex_fixtures.py

No keras_vit code runs. It writes:

`sizes`: for `(height, width, patch_size, max_patches)` cases (edges, then
a seeded sample of photo-like and extreme shapes), the resized
`(height, width)` of transformers' `get_image_size_for_max_num_patches` (the
rule of `Siglip2ImageProcessor`) and of timm's `get_image_size_for_seq` (the
rule of `ResizeToSequence`, timm's NaFlex eval transform), or timm's refusal.

`images`: three photo-sized uint8 images, made as the tests make them
(`image_of`: `numpy.random.default_rng(seed).integers(0, 256, (h, w, 3),
uint8)`), with the CRC-32 of their bytes so a test sees that it made the
same ones.

`batches`: for each `(source, patch_size, max_patches)` case, the three
images run through the library's own pipeline at once:
- `siglip2`: transformers' Pillow backend, `Siglip2ImageProcessorPil`
  (transformers 4's `Siglip2ImageProcessor`), `return_tensors="np"`;
- `siglip2_torchvision`: transformers 5's default `Siglip2ImageProcessor`
  (torchvision's antialiased uint8 resize, which differs from Pillow's by one
  8-bit level in a few values; `max_level_difference` and
  `share_of_values_that_differ` record how much and how often);
- `timm`: timm's eval transform `create_transform(is_training=False,
  naflex=True, patchify=True, interpolation="bicubic", mean=std=0.5)` (what
  `create_naflex_loader` builds for validation; bicubic is the NaFlexVit
  pretrained configs' interpolation) on Pillow images, collated by
  `NaFlexCollator(max_seq_len)`.
Each keeps the `grids` (rows, columns), `valid` (mask sums), `length` (the
padded sequence length), and of the valid patches the CRC-32 of their 8-bit
levels (`round((x + 1) * 127.5)`, every value checked to be within 1e-4 of a
level), `sums` (float64 sum of each image's valid values) and `windows`:
`[image, patch, first values]` of a few patches, as floats, exactly as the
library wrote them. The torchvision case keeps the levels of two whole
patches per image instead of the CRC.
"""

import json
import os
import zlib

import numpy as np
from PIL import Image
from timm.data import create_transform
from timm.data.naflex_dataset import NaFlexCollator
from timm.data.naflex_transforms import get_image_size_for_seq
from transformers.models.siglip2.image_processing_pil_siglip2 import Siglip2ImageProcessorPil
from transformers.models.siglip2.image_processing_siglip2 import (
    Siglip2ImageProcessor,
    get_image_size_for_max_num_patches,
)

OUTPUT = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "naflex_reference.json")
# (seed, height, width): 500x375, 333x640 and 1024x768 photos (width x height).
IMAGES = ((0, 375, 500), (1, 640, 333), (2, 768, 1024))
BATCH_CASES = (("siglip2", 16, 256), ("siglip2", 14, 576), ("siglip2_torchvision", 16, 256), ("timm", 16, 256),
               ("timm", 14, 576))
SIDES = (1, 2, 15, 16, 17, 31, 100, 224, 333, 341, 375, 384, 457, 500, 512, 640, 768, 1000, 1024, 1920, 4032, 20000)
PATCHES = (8, 14, 16, 32)
BUDGETS = (1, 2, 3, 16, 64, 196, 256, 576, 729, 784, 1024, 4096)
EDGE_SIZES = ((1, 1, 16, 1), (1, 1, 16, 1024), (16, 16, 16, 1), (10_000_000, 10, 16, 1), (10, 10_000_000, 16, 4),
              (100_000_000, 10, 16, 1),
              (375, 500, 16, 256), (640, 333, 16, 256), (768, 1024, 16, 256), (375, 500, 14, 576))


def image_of(seed, height, width):
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def size_cases():
    rng = np.random.default_rng(47)
    cases = list(EDGE_SIZES)
    for _ in range(400):
        cases.append((int(rng.choice(SIDES)), int(rng.choice(SIDES)), int(rng.choice(PATCHES)),
                      int(rng.choice(BUDGETS))))
    rows = []
    for height, width, patch, budget in cases:
        siglip2 = get_image_size_for_max_num_patches(height, width, patch, budget)
        try:
            timm = list(get_image_size_for_seq((height, width), patch, budget)[1])
        except ValueError as error:
            timm = str(error)
        rows.append([height, width, patch, budget, list(siglip2), timm])
    return rows


def levels(values):
    """The 8-bit levels of [-1, 1] values; each must lie within 1e-4 of one."""
    scaled = (np.asarray(values, "float64") + 1.0) * 127.5
    rounded = np.round(scaled)
    assert np.abs(scaled - rounded).max() < 1e-4, np.abs(scaled - rounded).max()
    return rounded.astype("uint8")


def library_batch(source, patch, budget, images):
    """`(patches, grids, mask)` as numpy, from the library's own pipeline."""
    if source.startswith("siglip2"):
        processor = (Siglip2ImageProcessor if source == "siglip2_torchvision" else Siglip2ImageProcessorPil)(
            patch_size=patch, max_num_patches=budget)
        out = processor(images=images, return_tensors="np")
        return out["pixel_values"], out["spatial_shapes"], out["pixel_attention_mask"].astype(bool)
    transform = create_transform(is_training=False, interpolation="bicubic", mean=(0.5,) * 3, std=(0.5,) * 3,
                                 naflex=True, patch_size=patch, max_seq_len=budget, patchify=True)
    batch, _ = NaFlexCollator(max_seq_len=budget)([(transform(Image.fromarray(im)), 0) for im in images])
    mask = batch["patch_valid"].numpy()
    coords = batch["patch_coord"].numpy()
    grids = np.stack([coords[i][mask[i]].max(0) + 1 for i in range(len(images))])
    # timm's coordinates are row-major over the grid: the layout keras_vit's patch_grid describes.
    for i, (rows, cols) in enumerate(grids):
        expected = np.stack(np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij"), -1).reshape(-1, 2)
        assert (coords[i][: rows * cols] == expected).all() and mask[i].sum() == rows * cols
    return batch["patches"].numpy(), grids, mask


def batch_case(source, patch, budget, images):
    patches, grids, mask = library_batch(source, patch, budget, images)
    valid = [patches[i][mask[i]] for i in range(len(images))]
    case = {"source": source, "patch_size": patch, "max_patches": budget, "length": int(patches.shape[1]),
            "grids": np.asarray(grids).tolist(), "valid": mask.sum(1).tolist(),
            "sums": [float(v.astype("float64").sum()) for v in valid],
            "windows": [[i, p, patches[i, p, :12].tolist()] for i, v in enumerate(valid) for p in (0, len(v) - 1)]}
    if source == "siglip2_torchvision":
        pillow, _, _ = library_batch("siglip2", patch, budget, images)
        difference = np.abs(levels(patches[mask]).astype(int) - levels(pillow[mask]))
        case["max_level_difference"] = int(difference.max())
        case["share_of_values_that_differ"] = round(float((difference > 0).mean()), 5)
        case["patch_levels"] = [[i, p, levels(v[p]).tobytes().hex()] for i, v in enumerate(valid)
                                for p in (0, len(v) // 2)]
    else:
        case["levels_crc32"] = [zlib.crc32(levels(v).tobytes()) for v in valid]
    return case


def main():
    images = [image_of(*spec) for spec in IMAGES]
    reference = {
        "sizes": {"columns": ["height", "width", "patch_size", "max_patches", "siglip2 (h, w)",
                              "timm (h, w) or its refusal"], "cases": size_cases()},
        "images": [{"seed": s, "height": h, "width": w, "crc32": zlib.crc32(im.tobytes())}
                   for (s, h, w), im in zip(IMAGES, images)],
        "batches": [batch_case(*spec, images) for spec in BATCH_CASES],
    }
    with open(OUTPUT, "w") as f:
        json.dump(reference, f, separators=(",", ":"))
        f.write("\n")
    refused = sum(isinstance(row[5], str) for row in reference["sizes"]["cases"])
    differ = sum(row[4] != row[5] for row in reference["sizes"]["cases"] if not isinstance(row[5], str))
    print(f"{OUTPUT}: {len(reference['sizes']['cases'])} size cases ({refused} timm refusals, {differ} where the "
          f"two rules differ), {len(BATCH_CASES)} batch cases, {os.path.getsize(OUTPUT)} bytes")
    print("transformers' torchvision backend against its Pillow one:",
          [(c["max_level_difference"], c["share_of_values_that_differ"]) for c in reference["batches"]
           if "max_level_difference" in c])


if __name__ == "__main__":
    main()
