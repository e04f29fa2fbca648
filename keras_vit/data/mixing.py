"""timm's MixUp and CutMix (`--mixup`, `--cutmix`) as one Keras augmentation layer, on both input paths.

Keras' `MixUp` and `CutMix` draw a weight per image and mix it with a random
other one, and the pipeline ran both on every batch. timm's `Mixup`, which
the DeiT, MAE, BEiT and EVA-02 recipes use, draws one weight per batch and
mixes each image with its mirror in the batch (image i with image B-1-i),
by MixUp or, with `switch_prob` 0.5 where both are on, by CutMix: one box,
its side `sqrt(1 - lam)` of the image's, centred anywhere, clipped, the
weight then corrected to the share of the image the box leaves. This layer
is Keras' CutMix with timm's draws: it runs in tf.data and on the numpy
path, on batches of [0, 255] images and one-hot labels. The pipelines
draw each batch's transformation from its `(seed, epoch, batch)` key
(`keyed`; `array_batches.apply_augmenter`), so a resumed run mixes as an
uninterrupted one; called as a layer, it draws from its seed generator.

Example:
>>> import numpy as np
>>> mix = MixUpCutMix(mixup_alpha=0.8, cutmix_alpha=1.0, seed=0)
>>> out = mix({"images": np.zeros((4, 8, 8, 3), "float32"), "labels": np.eye(4, dtype="float32")})
>>> np.asarray(out["labels"]).sum(axis=1).round(5).tolist()
[1.0, 1.0, 1.0, 1.0]
"""

import keras

from keras_vit.data.randaugment import keyed_seeds


@keras.saving.register_keras_serializable(package="keras_vit")
class MixUpCutMix(keras.layers.CutMix):
    """timm's `Mixup(mixup_alpha, cutmix_alpha, switch_prob, mode="batch", correct_lam=True)` on a batch.

    Args:
        mixup_alpha: MixUp's Beta(alpha, alpha) weight (0: no MixUp).
        cutmix_alpha: CutMix's Beta(alpha, alpha) weight (0: no CutMix).
        switch_prob: where both are on, each batch's chance of CutMix.
        seed: the draws' seed.
    """

    def __init__(self, mixup_alpha=0.8, cutmix_alpha=1.0, switch_prob=0.5, seed=None, **kwargs):
        if mixup_alpha < 0 or cutmix_alpha < 0 or not mixup_alpha + cutmix_alpha > 0:
            raise ValueError(f"mixup_alpha and cutmix_alpha must be at least 0 and one of them positive, got "
                             f"{mixup_alpha!r} and {cutmix_alpha!r}.")
        if not 0 <= switch_prob <= 1:
            raise ValueError(f"switch_prob must be in [0, 1], got {switch_prob!r}.")
        super().__init__(factor=1.0, seed=seed, **kwargs)
        self.mixup_alpha, self.cutmix_alpha = float(mixup_alpha), float(cutmix_alpha)
        self.switch_prob = float(switch_prob)

    keyed = True  # the pipelines draw each batch's transformation from its (seed, epoch, batch) key

    def get_random_transformation(self, data, training=True, seed=None):
        if not training:
            return None
        images = data["images"] if isinstance(data, dict) else data
        backend = self.backend
        shape = backend.shape(images)
        height, width = shape[self.height_axis], shape[self.width_axis]
        seeds = keyed_seeds(self, seed, 3)
        draw = backend.random.uniform((3,), 0.0, 1.0, "float32", seeds[0])  # the switch, the box's centre
        if self.mixup_alpha and self.cutmix_alpha:
            use_cutmix = draw[0] < self.switch_prob
        else:
            use_cutmix = backend.convert_to_tensor(bool(self.cutmix_alpha))
        weight = backend.numpy.where(
            use_cutmix, self._beta(self.cutmix_alpha, seeds[1]), self._beta(self.mixup_alpha, seeds[2]))
        # timm's rand_bbox: a box of int(side * sqrt(1 - lam)) a side, centred on an integer in [0, side)
        ratio = backend.numpy.sqrt(1.0 - weight)
        cut_h, cut_w = backend.numpy.floor(float(height) * ratio), backend.numpy.floor(float(width) * ratio)
        centre_y = backend.numpy.floor(draw[1] * float(height))
        centre_x = backend.numpy.floor(draw[2] * float(width))
        top = backend.numpy.clip(centre_y - backend.numpy.floor(cut_h / 2), 0, float(height))
        bottom = backend.numpy.clip(centre_y + backend.numpy.floor((cut_h + 1) / 2), 0, float(height))
        left = backend.numpy.clip(centre_x - backend.numpy.floor(cut_w / 2), 0, float(width))
        right = backend.numpy.clip(centre_x + backend.numpy.floor((cut_w + 1) / 2), 0, float(width))
        box_weight = 1.0 - (bottom - top) * (right - left) / float(height * width)  # timm's correct_lam
        rows = backend.cast(backend.numpy.arange(height), "float32")[:, None]
        columns = backend.cast(backend.numpy.arange(width), "float32")[None, :]
        inside = backend.numpy.logical_and(backend.numpy.logical_and(rows >= top, rows < bottom),
                                           backend.numpy.logical_and(columns >= left, columns < right))
        return {"use_cutmix": use_cutmix, "box": inside[None, :, :, None],
                "weight": backend.numpy.where(use_cutmix, box_weight, weight)}

    def _beta(self, alpha, seed):
        if not alpha:
            return self.backend.convert_to_tensor(1.0, "float32")
        return self.backend.cast(self.backend.random.beta((), alpha, alpha, seed=seed), "float32")

    def transform_images(self, images, transformation=None, training=True):
        images = self.backend.cast(images, self.compute_dtype)
        if not training or transformation is None:
            return images
        numpy = self.backend.numpy
        mirrored = numpy.flip(images, axis=0)
        weight = self.backend.cast(transformation["weight"], self.compute_dtype)
        mixed = weight * images + (1.0 - weight) * mirrored
        cut = numpy.where(transformation["box"], mirrored, images)
        return numpy.where(transformation["use_cutmix"], cut, mixed)

    def transform_labels(self, labels, transformation, training=True):
        if not training or transformation is None:
            return labels
        labels = self.backend.cast(labels, self.compute_dtype)
        weight = self.backend.cast(transformation["weight"], self.compute_dtype)
        return weight * labels + (1.0 - weight) * self.backend.numpy.flip(labels, axis=0)

    def get_config(self):
        config = super().get_config()
        config.pop("factor", None)
        config.update(mixup_alpha=self.mixup_alpha, cutmix_alpha=self.cutmix_alpha, switch_prob=self.switch_prob)
        return config

