"""MixUp and CutMix as timm's `Mixup` mixes a batch: one weight per batch, each image with its mirror, one of the two
per batch. The reference is tests/fixtures/timm_augmentation/mixing.json (tools/make_augmentation_fixtures.py)."""

import json

import keras
import numpy as np
import pytest
from conftest import fixture

from keras_vit.data import tensorflow_installed
from keras_vit.data.mixing import MixUpCutMix

with open(fixture("timm_augmentation/mixing.json")) as _file:
    TIMM = json.load(_file)
HEIGHT, WIDTH = TIMM["size"]
DRAWS = 1000


def _batches(path):
    """`DRAWS` mixed batches of two images, all 0 and all 255, with one-hot labels: (first images, first labels)."""
    if path == "tf.data" and keras.backend.backend() != "torch":
        pytest.skip("tf.data runs the layer with TensorFlow's ops on every backend: once, in the torch pass")
    if path == "keyed" and keras.backend.backend() != "torch":
        pytest.skip("the keyed draws are the numpy path's ops with other seeds: once, in the torch pass")
    layer = MixUpCutMix(mixup_alpha=0.8, cutmix_alpha=1.0, seed=3)
    images = np.stack([np.zeros((HEIGHT, WIDTH, 3), "float32"), np.full((HEIGHT, WIDTH, 3), 255.0, "float32")])
    labels = np.eye(2, dtype="float32")
    if path == "keyed":  # as both pipelines draw a batch: from its (seed, epoch, index)
        from keras_vit.data.array_batches import apply_augmenter

        mixed = [apply_augmenter(layer, images, labels, (3, 0, index)) for index in range(DRAWS)]
        return np.stack([x[0] for x, _ in mixed]), np.stack([y[0] for _, y in mixed])
    if path == "numpy":
        outputs = [layer({"images": images, "labels": labels}, training=True) for _ in range(DRAWS)]
        return (np.stack([keras.ops.convert_to_numpy(out["images"])[0] for out in outputs]),
                np.stack([keras.ops.convert_to_numpy(out["labels"])[0] for out in outputs]))
    if not tensorflow_installed():
        pytest.skip("tf.data needs TensorFlow")
    import tensorflow as tf

    from keras_vit.data.tf_data_steps import apply_augmenter

    dataset = tf.data.Dataset.from_tensors((images, labels)).repeat(DRAWS).map(apply_augmenter(layer))
    mixed = [(x.numpy()[0], y.numpy()[0]) for x, y in dataset]
    return np.stack([x for x, _ in mixed]), np.stack([y for _, y in mixed])


@pytest.mark.parametrize("path", ["numpy", "keyed", "tf.data"])
def test_mixup_and_cutmix_follow_timms_mixup(path):
    """The share of CutMix batches, each one's weight, and the CutMix box's sides have timm's means and standard
    deviations (to 4.5 standard errors); the labels mix by the weight the pixels did."""
    images, labels = _batches(path)
    first = images[..., 0] / 255.0
    cutmix = np.array([np.unique(image).size > 1 or (image.max() == 1.0 and label[0] < 1)
                       for image, label in zip(first, labels)])
    share = cutmix.mean()
    assert abs(share - TIMM["cutmix_share"]) <= 4.5 * np.sqrt(0.25 / DRAWS), share
    # MixUp: the image is the weight's blend; CutMix: the box holds the mirror image, the weight what it leaves
    np.testing.assert_allclose(first[~cutmix].mean(axis=(1, 2)), 1 - labels[~cutmix, 0], atol=1e-5)
    np.testing.assert_allclose(first[cutmix].mean(axis=(1, 2)), 1 - labels[cutmix, 0], atol=1e-5)
    boxes = [np.nonzero(image == 1.0) for image in first[cutmix]]
    found = {"mixup_weight": labels[~cutmix, 0], "cutmix_weight": labels[cutmix, 0],
             "box_height": np.array([rows.max() - rows.min() + 1 if len(rows) else 0 for rows, _ in boxes], float),
             "box_width": np.array([cols.max() - cols.min() + 1 if len(cols) else 0 for _, cols in boxes], float)}
    for key, values in found.items():
        mean, std = TIMM[key]
        error = 4.5 * std * np.sqrt(1 / len(values) + 1 / TIMM["counts"][key.split("_")[0] if "weight" in key
                                                                          else "cutmix"])
        assert abs(values.mean() - mean) <= error, f"{key}: mean {values.mean():.4g}, timm's {mean:.4g}"
        assert abs(values.std() - std) <= 1.5 * error, f"{key}: std {values.std():.4g}, timm's {std:.4g}"


@pytest.mark.backend_independent
def test_bad_mixing_settings_are_refused():
    with pytest.raises(ValueError, match="one of them positive, got 0.0 and 0.0"):
        MixUpCutMix(mixup_alpha=0.0, cutmix_alpha=0.0)


@pytest.mark.backend_independent  # the keys are the pipelines' own: the backend's random ops take them alike
def test_a_resumed_stream_mixes_and_erases_each_batch_as_one_run(tmp_path, monkeypatch):
    """The batched layers draw from each batch's (seed, epoch, index): a run resumed at epoch 1 gets the batches an
    uninterrupted one did, on both pipelines, which give the same batches (their seed generators started afresh on
    resume, and each pipeline drew its own)."""
    from PIL import Image

    from keras_vit import data

    rng = np.random.default_rng(0)
    for index in range(8):
        (tmp_path / f"c{index % 2}").mkdir(exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (12, 16, 3), dtype=np.uint8)).save(tmp_path / f"c{index % 2}/{index}.png")
    augmenters = data.make_augmenters(mixup=0.8, cutmix=1.0, reprob=0.5, seed=7)

    def stream(initial_epoch=0):
        batches = data.training_stream(data.from_folder(str(tmp_path)), 8, 2, 2, initial_epoch, seed=3,
                                       augmenters=augmenters, one_hot=True, workers=0)
        return [(np.asarray(images), np.asarray(labels)) for images, labels in batches]

    runs = {}
    for path in ("tf.data", "numpy"):
        if path == "numpy":
            monkeypatch.setattr(data.source, "tensorflow_installed", lambda: False)
        elif not tensorflow_installed():
            continue
        runs[path] = stream(), stream(initial_epoch=1)
    for whole, resumed in runs.values():
        assert len(whole) == 8 and len(resumed) == 4
        assert any(0 < labels.max() < 1 for _, labels in whole)  # mixed
        for (images, labels), (their_images, their_labels) in zip(whole[4:], resumed, strict=True):
            np.testing.assert_array_equal(images, their_images)
            np.testing.assert_array_equal(labels, their_labels)
    if len(runs) == 2:
        for (images, labels), (their_images, their_labels) in zip(runs["tf.data"][0], runs["numpy"][0], strict=True):
            np.testing.assert_allclose(images, their_images, atol=1e-5)
            np.testing.assert_allclose(labels, their_labels, atol=1e-6)
