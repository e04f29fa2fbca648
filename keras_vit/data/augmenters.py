"""The pipeline's augmentations: keras_vit's per-example RandAugment, then Keras' batched MixUp and CutMix."""

from keras_vit.data.randaugment import RandAugment


def make_augmenters(randaugment=None, mixup=0.0, cutmix=0.0, seed=0):
    """The pipeline's augmentations: keras_vit's RandAugment, then Keras' batched layers.

    `randaugment=(num_ops, magnitude)` adds `keras_vit.data.randaugment.RandAugment`,
    timm's `rand-m{magnitude}-n{num_ops}-mstd0.5-inc1` (`(2, 9)`: timm's
    `rand-m9-mstd0.5-inc1`), applied to each example after its crop and flip and
    keyed by the pipeline's `(seed, epoch, example)`; `mixup` / `cutmix` give the
    Beta-distribution parameters of Keras' `MixUp` / `CutMix` (0 = off), drawn from `seed`.
    """
    import keras

    layers = []
    if randaugment:
        num_ops, magnitude = randaugment
        layers.append(RandAugment(num_ops=num_ops, magnitude=magnitude))
    if mixup:
        layers.append(keras.layers.MixUp(alpha=mixup, seed=seed))
    if cutmix:
        layers.append(keras.layers.CutMix(factor=cutmix, seed=seed))
    return layers


def per_example_augmenter(augmenters):
    """`(randaugment, batched)`: the `RandAugment` among `augmenters` (or None) and the Keras layers."""
    randaugment = [a for a in augmenters if isinstance(a, RandAugment)]
    if len(randaugment) > 1:
        raise ValueError(f"{len(randaugment)} RandAugment policies among the augmenters; give one.")
    return (randaugment or [None])[0], [a for a in augmenters if not isinstance(a, RandAugment)]
