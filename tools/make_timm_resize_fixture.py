"""Write tests/fixtures/timm_resize_reference.npz: timm's outputs when it loads a family folder at another size.

Run in the side venv of tools/make_fixtures.py:

    /tmp/timm-venv/bin/python tools/make_timm_resize_fixture.py

For the `deit` (bicubic, antialiased) and `flexivit` (bilinear, not
antialiased) folders of tests/fixtures/timm_family/, timm builds the
architecture at a larger and a smaller image size and loads the folder's file
through its own pretrained path (`pretrained_cfg_overlay=dict(file=...)`),
where `checkpoint_filter_fn` resamples the position table as timm does for
that architecture (the overlay's `num_classes` is the file's, so timm keeps
its head). At the folder's own size the same path gives the family
reference outputs, checked here. The outputs of random images at that size are kept as
`<case>/<size>/images` (NHWC, in timm's normalised space) and `<case>/<size>/outputs`.
"""

import json
import os

import numpy as np
import timm
import torch

FAMILY = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "timm_family")
OUTPUT = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "timm_resize_reference.npz")
CASES = {"deit": (48, 24), "flexivit": (48, 24)}


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
            args = dict(config["model_args"], img_size=size)
            model = timm.create_model(config["architecture"], pretrained=True, **args,
                                      pretrained_cfg_overlay=dict(file=os.path.join(folder, "model.safetensors"),
                                                                  num_classes=config["num_classes"])).eval()
            if size == config["pretrained_cfg"]["input_size"][1]:
                with torch.no_grad():
                    again = model(torch.from_numpy(own[case][0]).permute(0, 3, 1, 2)).numpy()
                assert np.abs(again - own[case][1]).max() < 1e-5, case
                continue
            images = rng.uniform(-2, 2, size=(2, size, size, 3)).astype(np.float32)
            with torch.no_grad():
                outputs = model(torch.from_numpy(images).permute(0, 3, 1, 2)).numpy()
            out[f"{case}/{size}/images"], out[f"{case}/{size}/outputs"] = images, outputs
            print(case, size, outputs.shape)
    np.savez(OUTPUT, **out)


if __name__ == "__main__":
    main()
