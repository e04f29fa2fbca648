"""Write a NaFlex `.keras` file as keras_vit saved it before its token mask came from each image's grid, with its
outputs.

Run once, with the code of commit 8af4eef (before the change), from the repository root:

    git archive 8af4eef | tar -x -C /tmp/old
    PYTHONPATH=/tmp/old KERAS_BACKEND=jax python tools/make_legacy_naflex_fixture.py

In that file the `token_mask` layer is called on `patch_mask` alone; `tests/test_naflex.py` loads it with the code
of today and checks its outputs. A tiny model (registers, MAP pooling), random weights.
"""

import os

import keras
import numpy as np

import keras_vit
from keras_vit import data

FOLDER = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "legacy_keras")


def main():
    keras.utils.set_random_seed(0)
    model = keras_vit.ViT(naflex=True, image_size=32, patch_size=4, hidden_size=16, num_layers=1, num_heads=2,
                          mlp_dim=32, classes=3, register_tokens=1, classifier="map", class_token=False,
                          classifier_activation=None)
    for variable in model.weights:  # random values in every tensor, biases and norms included
        variable.assign(np.random.default_rng(len(variable.path)).normal(0, 0.5, variable.shape).astype("float32"))
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, shape, dtype=np.uint8) for shape in ((20, 36, 3), (40, 12, 3), (16, 16, 3))]
    batch = data.naflex_batch(images, 4, max_patches=36, buckets=())
    model.save(os.path.join(FOLDER, "naflex.keras"))
    np.savez(os.path.join(FOLDER, "naflex_outputs.npz"), output=keras.ops.convert_to_numpy(model(batch)), **batch)


if __name__ == "__main__":
    main()
