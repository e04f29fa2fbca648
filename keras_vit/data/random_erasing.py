"""timm's random erasing (`--reprob`, `--remode pixel`) as a Keras augmentation layer, on both input paths.

Keras' own `RandomErasing` draws the box's height and width fractions
independently (the square roots of two uniform draws) and fills it with a
constant or noise of its own; timm's, which the DeiT, MAE and BEiT recipes
use, draws the box's area (2-33% of the image) and its log aspect ratio
(0.3-3.3), tries that up to 10 times until the box fits, and fills it with
per-pixel normal noise in the model's normalized space (mean 0, std 1 after
the checkpoint's mean and std). This layer is Keras' with timm's draws: it
runs in tf.data and on the numpy path as MixUp and CutMix do, on batches of
[0, 255] images, before them (timm erases in its per-image transform, and
mixes the batch after). The pipelines draw each batch's boxes from its
`(seed, epoch, batch)` key, as `mixing.MixUpCutMix`'s.

Example:
>>> import numpy as np
>>> erase = RandomErasing(probability=1.0, seed=0)
>>> images = np.full((2, 32, 32, 3), 128.0, "float32")
>>> bool((np.asarray(erase(images)) != 128.0).any())
True
"""

import math

import keras

from keras_vit.data.randaugment import keyed_seeds

ATTEMPTS = 10  # timm's: the draws per image until a box fits, else no box


@keras.saving.register_keras_serializable(package="keras_vit")
class RandomErasing(keras.layers.RandomErasing):
    """timm's `RandomErasing(probability, mode="pixel", max_count=1)` on batches of [0, 255] images.

    Args:
        probability: each image's chance to get a box (timm's `--reprob`:
            0.25 in the DeiT and MAE recipes).
        min_area, max_area: the box's area as a share of the image.
        min_aspect: the box's aspect ratio is log-uniform in
            `[min_aspect, 1 / min_aspect]`.
        mean, std: the model's pixel statistics (in [0, 1]; the paper's 0.5 by default); the box holds
            `mean + std * z` for standard normal `z`, timm's noise in the
            normalized space, times 255.
        seed: the draws' seed.
    """

    def __init__(self, probability=0.25, min_area=0.02, max_area=1 / 3, min_aspect=0.3,
                 mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), seed=None, **kwargs):
        if not 0 <= probability <= 1:
            raise ValueError(f"probability (--reprob) must be in [0, 1], got {probability!r}.")
        if not 0 < min_area <= max_area <= 1 or not 0 < min_aspect <= 1:
            raise ValueError(f"Need 0 < min_area <= max_area <= 1 and 0 < min_aspect <= 1, got {min_area!r}, "
                             f"{max_area!r}, {min_aspect!r}.")
        super().__init__(factor=1.0, scale=(min_area, max_area), seed=seed, **kwargs)
        self.probability, self.min_area, self.max_area = float(probability), float(min_area), float(max_area)
        self.min_aspect = float(min_aspect)
        self.mean, self.std = tuple(float(v) for v in mean), tuple(float(v) for v in std)

    keyed = True  # the pipelines draw each batch's transformation from its (seed, epoch, batch) key

    def get_random_transformation(self, data, training=True, seed=None):
        if not training:
            return None
        images = data["images"] if isinstance(data, dict) else data
        backend = self.backend
        shape = backend.shape(images)
        batch, height, width = shape[0], shape[self.height_axis], shape[self.width_axis]
        seeds = keyed_seeds(self, seed, 6)

        def uniform(size, seed, low=0.0, high=1.0):
            return backend.random.uniform(size, low, high, "float32", seed)

        area = uniform((batch, ATTEMPTS), seeds[0], self.min_area, self.max_area) * float(height * width)
        aspect = backend.numpy.exp(uniform((batch, ATTEMPTS), seeds[1], math.log(self.min_aspect),
                                           -math.log(self.min_aspect)))
        box_height = backend.numpy.round(backend.numpy.sqrt(area * aspect))  # Python's round, as timm's int(round())
        box_width = backend.numpy.round(backend.numpy.sqrt(area / aspect))
        fits = backend.numpy.logical_and(box_height < height, box_width < width)
        first = backend.numpy.argmax(backend.cast(fits, "int32"), axis=1)[:, None]
        box_height = backend.numpy.take_along_axis(box_height, first, axis=1)[:, 0]
        box_width = backend.numpy.take_along_axis(box_width, first, axis=1)[:, 0]
        erase = backend.numpy.logical_and(uniform((batch,), seeds[2]) < self.probability,
                                          backend.numpy.any(fits, axis=1))
        # timm's randint(0, side - box): each of the side - box + 1 offsets alike
        top = backend.numpy.floor(uniform((batch,), seeds[3]) * (float(height) - box_height + 1.0))
        left = backend.numpy.floor(uniform((batch,), seeds[4]) * (float(width) - box_width + 1.0))
        rows = backend.cast(backend.numpy.arange(height), "float32")[None, :, None]
        columns = backend.cast(backend.numpy.arange(width), "float32")[None, None, :]
        inside = backend.numpy.logical_and(
            backend.numpy.logical_and(rows >= top[:, None, None], rows < (top + box_height)[:, None, None]),
            backend.numpy.logical_and(columns >= left[:, None, None], columns < (left + box_width)[:, None, None]))
        noise = backend.random.normal(shape, seed=seeds[5], dtype="float32")
        fill = (backend.convert_to_tensor(self.mean, "float32") + backend.convert_to_tensor(self.std, "float32")
                * noise) * 255.0
        return {"mask": backend.numpy.logical_and(inside, erase[:, None, None])[..., None], "fill": fill}

    def transform_images(self, images, transformation=None, training=True):
        images = self.backend.cast(images, self.compute_dtype)
        if not training or transformation is None:
            return images
        return self.backend.numpy.where(transformation["mask"], self.backend.cast(transformation["fill"],
                                                                                  self.compute_dtype), images)

    def get_config(self):
        config = super().get_config()
        for key in ("factor", "scale", "fill_value", "value_range"):
            config.pop(key, None)
        config.update(probability=self.probability, min_area=self.min_area, max_area=self.max_area,
                      min_aspect=self.min_aspect, mean=list(self.mean), std=list(self.std))
        return config
