"""Write `.keras` files as keras_vit saved them before the subpackages (issue 46), with their outputs.

Run once, at the commit before the move (11207d3), from the repository root:

    KERAS_BACKEND=jax python tools/make_legacy_keras_fixtures.py

`tests/test_legacy_files.py` loads them with the code of today and checks
the outputs and that they train on. Tiny models, random weights.
"""

import os

import keras
import numpy as np

import keras_vit

FOLDER = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "legacy_keras")
SMALL = dict(patch_size=8, hidden_size=48, num_layers=2, num_heads=3, mlp_dim=96, image_size=32, classes=5)
MODELS = {
    "plain": dict(SMALL),
    "rope": dict(SMALL, architecture=keras_vit.Architecture(
        rope="axial", mlp_activation="swiglu", qk_norm=True, layer_scale=True, class_token=False, classifier="gap")),
    "hybrid": dict(SMALL, patch_size=1, resnet_layers=(1,), resnet_width=32),
}


def main():
    os.makedirs(FOLDER, exist_ok=True)
    keras.utils.set_random_seed(0)
    images = np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    outputs = {"images": images}
    for name, arguments in MODELS.items():
        model = keras_vit.ViT(**arguments)
        for variable in model.weights:  # random values in every tensor, biases and norms included
            variable.assign(np.random.default_rng(len(outputs)).normal(0, 0.2, variable.shape).astype("float32")
                            + (1.0 if variable.path.endswith(("gamma", "scale")) else 0.0))
        model.save(os.path.join(FOLDER, f"{name}.keras"))
        outputs[name] = keras.ops.convert_to_numpy(model(images))
    np.savez(os.path.join(FOLDER, "outputs.npz"), **outputs)


if __name__ == "__main__":
    main()
