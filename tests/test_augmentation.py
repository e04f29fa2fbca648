"""Keras' augmentation layers in the input pipeline: their code follows the Keras backend, so every backend runs this."""

import numpy as np
import pytest

pytest.importorskip("tensorflow")

from keras_vit import data  # noqa: E402


def test_batched_keras_augmentations_mix_one_hot_labels():
    (x, y), _ = data.digits(image_size=16)
    source = data.from_arrays(x[:64], y[:64])
    augmenters = data.make_augmenters(randaugment=(2, 9), mixup=0.2, cutmix=1.0, seed=1)
    assert [type(a).__name__ for a in augmenters] == ["RandAugment", "MixUpCutMix"]
    images, labels = next(iter(data.make_dataset(source, 16, 32, training=True, augmenters=augmenters, one_hot=True)))
    labels = labels.numpy()
    np.testing.assert_allclose(labels.sum(1), 1.0, atol=1e-5)
    assert (labels.max(1) < 1.0 - 1e-6).any(), "MixUp/CutMix must blend some labels"
    assert images.numpy().min() >= -1.0 - 1e-6 and images.numpy().max() <= 1.0 + 1e-6
