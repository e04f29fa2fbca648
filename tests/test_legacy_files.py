"""`.keras` files saved before the package moved into subpackages (issue 46) load, compute and train on.

The files were written at commit 11207d3 by `tools/make_legacy_keras_fixtures.py`.
"""

import os

import keras
import numpy as np
import pytest

import keras_vit
from conftest import FIXTURES

FOLDER = os.path.join(FIXTURES, "legacy_keras")


@pytest.mark.backend_independent  # Keras reads the file the same way on each backend
@pytest.mark.parametrize("name", ["plain", "rope", "hybrid"])
def test_a_keras_file_saved_before_the_subpackages_loads_computes_and_trains_on(name):
    saved = np.load(os.path.join(FOLDER, "outputs.npz"))
    path = os.path.join(FOLDER, f"{name}.keras")
    for model in (keras.saving.load_model(path), keras_vit.from_pretrained(path)):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(model(saved["images"])), saved[name], atol=1e-5)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy")
    before = [keras.ops.convert_to_numpy(weight).copy() for weight in model.trainable_weights]
    model.fit(saved["images"], np.array([0, 1]), epochs=1, verbose=0)
    assert any(not np.array_equal(old, keras.ops.convert_to_numpy(new))
               for old, new in zip(before, model.trainable_weights))
