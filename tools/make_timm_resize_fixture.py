"""Write tests/fixtures/timm_resize_reference.npz: timm's outputs when it loads a family folder at another size.

Run in the side venv of tools/make_fixtures.py:

    /work/sidevenv/bin/python tools/make_timm_resize_fixture.py

For the `deit` (bicubic, antialiased) and `flexivit` (bilinear, not
antialiased) folders of tests/fixtures/timm_family/, timm builds the
architecture at a larger and a smaller image size and loads the folder's file
as timm loads a Hub folder (`create_model("local-dir:...", pretrained=True,
img_size=...)`), where `checkpoint_filter_fn` resamples the position table
from the grid the folder's config states, as timm does for that
architecture. At the folder's own size the same path gives the family
reference outputs, checked here. The outputs of random images at that size are kept as
`<case>/<size>/images` (NHWC, in timm's normalised space) and `<case>/<size>/outputs`; a
`(height, width)` size is keyed `HxW`. The non-square sizes have as many
patches as the folder's grid (4x4 to 2x8 and 8x2): timm resamples the table
there too, from the grid its config states.

`deit/24x40/pos_embed` is timm's table of the `deit` file loaded at 24x40 (a
3x5 grid); with it in place of the file's and `img_size` [24, 40] in its
config, the folder is a non-square file, and `deit_24x40/40x24/*` timm's
outputs when it loads that folder at 40x24 (5x3).
"""

import json
import os
import tempfile

import numpy as np
import timm
import torch
from safetensors.numpy import load_file, save_file

FAMILY = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "timm_family")
OUTPUT = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "timm_resize_reference.npz")
CASES = {"deit": (48, 24, (16, 64), (64, 16)), "flexivit": (48, 24, (16, 64))}


def key(size):
    return f"{size[0]}x{size[1]}" if isinstance(size, tuple) else str(size)


def timm_load(folder, size):
    """timm's model of `folder` at `size`, loaded as timm loads a Hub folder (`checkpoint_filter_fn`, which takes
    the file's grid from its config)."""
    return timm.create_model(f"local-dir:{folder}", pretrained=True, img_size=size).eval()


def outputs_of(model, images):
    with torch.no_grad():
        return model(torch.from_numpy(images).permute(0, 3, 1, 2)).numpy()


def main():
    out = {}
    with np.load(os.path.join(FAMILY, "..", "timm_family_reference.npz")) as reference:
        own = {case: (reference[f"{case}/images"], reference[f"{case}/outputs"]) for case in CASES}
    rng = np.random.default_rng(7)
    for case, sizes in CASES.items():
        folder = os.path.join(FAMILY, case)
        with open(os.path.join(folder, "config.json")) as f:
            config = json.load(f)
        for size in (config["pretrained_cfg"]["input_size"][1], *sizes):
            model = timm_load(folder, size)
            if size == config["pretrained_cfg"]["input_size"][1]:
                assert np.abs(outputs_of(model, own[case][0]) - own[case][1]).max() < 1e-5, case
                continue
            height, width = size if isinstance(size, tuple) else (size, size)
            images = rng.uniform(-2, 2, size=(2, height, width, 3)).astype(np.float32)
            outputs = outputs_of(model, images)
            out[f"{case}/{key(size)}/images"], out[f"{case}/{key(size)}/outputs"] = images, outputs
            print(case, size, outputs.shape)
    write_non_square_file(out, rng)
    np.savez(OUTPUT, **out)


def write_non_square_file(out, rng):
    """The `deit` file made a 24x40 one by timm's own resize, and timm's load of it at 40x24."""
    folder = os.path.join(FAMILY, "deit")
    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    table = timm_load(folder, (24, 40)).pos_embed.detach().numpy()
    out["deit/24x40/pos_embed"] = table
    with tempfile.TemporaryDirectory() as copy:
        tensors = load_file(os.path.join(folder, "model.safetensors"))
        save_file(dict(tensors, pos_embed=table), os.path.join(copy, "model.safetensors"), metadata={"format": "pt"})
        written = dict(config, model_args=dict(config["model_args"], img_size=[24, 40]))
        written["pretrained_cfg"] = dict(config["pretrained_cfg"], input_size=[3, 24, 40])
        with open(os.path.join(copy, "config.json"), "w") as f:
            json.dump(written, f)
        model = timm_load(copy, (40, 24))
        images = rng.uniform(-2, 2, size=(2, 40, 24, 3)).astype(np.float32)
        out["deit_24x40/40x24/images"], out["deit_24x40/40x24/outputs"] = images, outputs_of(model, images)


if __name__ == "__main__":
    main()
