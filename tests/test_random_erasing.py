"""Random erasing as timm's `--reprob` (`--remode pixel`): the same boxes and noise, in distribution, on both paths.

The reference is tests/fixtures/timm_augmentation/random_erasing.json (tools/make_augmentation_fixtures.py): the
statistics of timm's `RandomErasing` over 20,000 images.
"""

import json

import keras
import numpy as np
import pytest
from conftest import fixture

from keras_vit.data import tensorflow_installed
from keras_vit.data.random_erasing import RandomErasing

with open(fixture("timm_augmentation/random_erasing.json")) as _file:
    TIMM = json.load(_file)
HEIGHT, WIDTH = TIMM["size"]
DRAWS = 4096


def _statistics(images):
    """What the fixture records, of a batch of erased zero images (the noise: the erased pixels)."""
    found = {"height": [], "width": [], "top": [], "left": [], "noise": []}
    for image in images:
        rows, columns = np.nonzero((image != 0).any(-1))
        if len(rows):
            found["height"].append(rows.max() - rows.min() + 1)
            found["width"].append(columns.max() - columns.min() + 1)
            found["top"].append(rows.min())
            found["left"].append(columns.min())
            found["noise"].append(image[rows.min():rows.max() + 1, columns.min():columns.max() + 1].ravel())
    found = {key: np.concatenate(value) if key == "noise" else np.array(value, float) for key, value in found.items()}
    found["area"] = found["height"] * found["width"] / (HEIGHT * WIDTH)
    return len(found["height"]) / len(images), found


def _erased(layer, path):
    if path == "tf.data" and keras.backend.backend() != "torch":
        pytest.skip("tf.data runs the layer with TensorFlow's ops on every backend: once, in the torch pass")
    if path == "keyed" and keras.backend.backend() != "torch":
        pytest.skip("the keyed draws are the numpy path's ops with other seeds: once, in the torch pass")
    images = np.zeros((DRAWS, HEIGHT, WIDTH, 3), "float32")
    if path == "numpy":
        return np.asarray(keras.ops.convert_to_numpy(layer(images, training=True)))
    if path == "keyed":  # as both pipelines draw a batch: from its (seed, epoch, index), 64 images a batch
        from keras_vit.data.array_batches import apply_augmenter

        return np.concatenate([apply_augmenter(layer, batch, None, (3, 0, index))[0]
                               for index, batch in enumerate(np.split(images, DRAWS // 64))])
    if not tensorflow_installed():
        pytest.skip("tf.data needs TensorFlow")
    import tensorflow as tf

    from keras_vit.data.tf_data_steps import apply_augmenter

    dataset = tf.data.Dataset.from_tensor_slices((images, np.zeros(DRAWS))).batch(512).map(apply_augmenter(layer))
    return np.concatenate([batch.numpy() for batch, _ in dataset])


@pytest.mark.parametrize("path", ["numpy", "keyed", "tf.data"])
@pytest.mark.parametrize("probability", ["0.25", "1.0"])
def test_boxes_and_noise_follow_timms_random_erasing(probability, path):
    """The share of images erased, and each box's height, width, area, offsets and noise, have timm's means and
    standard deviations, to 4.5 standard errors. The noise is standard normal in the normalized space: `mean + std
    * z` in pixels (here mean 0, std 1/255, so the [0, 255] images hold z)."""
    layer = RandomErasing(probability=float(probability), mean=(0.0,) * 3, std=(1 / 255,) * 3, seed=1)
    share, ours = _statistics(_erased(layer, path))
    theirs = TIMM["probabilities"][probability]
    p = theirs["erased"]
    assert abs(share - p) <= 4.5 * np.sqrt(p * (1 - p) / DRAWS + 1e-12), (share, p)
    for key, (mean, std) in ((key, value) for key, value in theirs.items() if isinstance(value, list)):
        count = len(ours[key])
        error = 4.5 * std * np.sqrt(1 / count + 1 / (theirs["count"] if key != "noise" else 10 * theirs["count"]))
        assert abs(ours[key].mean() - mean) <= error, f"{key}: mean {ours[key].mean():.4g}, timm's {mean:.4g}"
        assert abs(ours[key].std() - std) <= error * 1.5, f"{key}: std {ours[key].std():.4g}, timm's {std:.4g}"


@pytest.mark.backend_independent
def test_bad_random_erasing_settings_are_refused():
    with pytest.raises(ValueError, match=r"^probability \(--reprob\) must be in \[0, 1\], got 1\.5\.$"):
        RandomErasing(probability=1.5)
    with pytest.raises(ValueError, match="Need 0 < min_area <= max_area <= 1"):
        RandomErasing(min_area=0.5, max_area=0.2)
