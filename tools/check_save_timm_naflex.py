"""Check that `checkpoints.save_timm` of NaFlex models writes files timm's NaFlexVit loads strictly, with keras_vit's
outputs.

keras_vit and timm live in separate venvs, so this runs in two steps:

    KERAS_BACKEND=jax /work/main/.venv/bin/python tools/check_save_timm_naflex.py write /tmp/save_timm_naflex
    /work/sidevenv/bin/python tools/check_save_timm_naflex.py check /tmp/save_timm_naflex

`write` loads each timm NaFlexVit fixture folder (tests/fixtures/timm_naflex/, one per configuration kind) and
saves it with `save_timm` into a folder of its own (`model.safetensors` and the `config.json` save_timm writes
beside it), with keras_vit's outputs on the fixtures' NaFlex batch. `check` builds each with
`timm.create_model(config["architecture"], pretrained=False, **config["model_args"])`, loads the file with
`timm.models.load_checkpoint(..., strict=True)` and compares timm's outputs on the same batch (keras_vit's [-1, 1]
patches normalised with the config's mean and std) with keras_vit's. One line per case; exit status 1 if any
fails. Nothing is downloaded.
"""

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_save_timm import main, report  # noqa: E402

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "tests", "fixtures")
KINDS = sorted(os.listdir(os.path.join(FIXTURES, "timm_naflex")))


def batch():
    with np.load(os.path.join(FIXTURES, "timm_naflex_reference.npz")) as data:
        return {key: data[key] for key in ("patches", "patch_grid", "patch_mask")}


def write(out):
    import keras

    import keras_vit
    from keras_vit import checkpoints

    for kind in KINDS:
        folder = os.path.join(FIXTURES, "timm_naflex", kind)
        with open(os.path.join(folder, "config.json")) as f:
            architecture = json.load(f)["architecture"]
        model = keras_vit.from_pretrained(folder, classifier_activation=None)
        os.makedirs(os.path.join(out, kind), exist_ok=True)
        checkpoints.save_timm(model, os.path.join(out, kind, "model.safetensors"), architecture=architecture)
        np.save(os.path.join(out, kind, "outputs.npy"), keras.ops.convert_to_numpy(model(batch())))
    print(f"wrote {len(KINDS)} cases to {out}")


def check(out):
    import timm
    import torch

    failures = 0
    inputs = batch()
    for kind in KINDS:
        with open(os.path.join(out, kind, "config.json")) as f:
            config = json.load(f)
        expected_outputs = np.load(os.path.join(out, kind, "outputs.npy"))
        def outputs(config=config):
            model = timm.create_model(config["architecture"], pretrained=False, **config["model_args"]).eval()
            timm.models.load_checkpoint(model, os.path.join(out, kind, "model.safetensors"), strict=True)
            patch = int(config["model_args"]["patch_size"])
            mean, std = (np.tile(config["pretrained_cfg"][key], patch * patch) for key in ("mean", "std"))
            patches = ((inputs["patches"] + 1) / 2 - mean) / std
            rows, cols = np.meshgrid(np.arange(64), np.arange(64), indexing="ij")
            coord = np.zeros((*inputs["patch_mask"].shape, 2), "int64")
            for index, (height, width) in enumerate(inputs["patch_grid"]):
                coord[index, :height * width] = np.stack([rows[:height, :width], cols[:height, :width]],
                                                         -1).reshape(-1, 2)
            with torch.no_grad():
                return model({"patches": torch.from_numpy(patches.astype("float32")),
                              "patch_coord": torch.from_numpy(coord),
                              "patch_valid": torch.from_numpy(inputs["patch_mask"])}).numpy()

        failures += not report(kind, config["architecture"], outputs, expected_outputs, 1e-5)
    return failures


if __name__ == "__main__":
    main(__doc__, write, check)
