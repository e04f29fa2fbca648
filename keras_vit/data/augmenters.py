"""The pipeline's augmentations: keras_vit's per-example RandAugment, then timm's batched random erasing, and
MixUp and CutMix."""

from keras_vit.data.randaugment import RandAugment


def make_augmenters(randaugment=None, mixup=0.0, cutmix=0.0, seed=0, reprob=0.0, pixel_statistics=None):
    """The pipeline's augmentations: keras_vit's RandAugment, then the batched layers.

    `randaugment=(num_ops, magnitude)` adds `keras_vit.data.randaugment.RandAugment`,
    timm's `rand-m{magnitude}-n{num_ops}-mstd0.5-inc1` (`(2, 9)`: timm's
    `rand-m9-mstd0.5-inc1`), applied to each example after its crop and flip and
    keyed by the pipeline's `(seed, epoch, example)`; `mixup` / `cutmix` give the
    Beta-distribution parameters of timm's MixUp and CutMix (`mixing.MixUpCutMix`: one or the
    other per batch where both are on; 0 = off), drawn from `seed`; `reprob` is timm's random erasing (`random_erasing.RandomErasing`), each
    image's chance of a box of noise in the model's normalized space
    (`pixel_statistics`: the model's `(mean, std)`), before the mixing, as timm
    erases each image before it mixes the batch.
    """
    from keras_vit.data.mixing import MixUpCutMix  # Keras layers: keras_vit.data itself imports no Keras
    from keras_vit.data.random_erasing import RandomErasing

    layers = []
    if randaugment:
        num_ops, magnitude = randaugment
        layers.append(RandAugment(num_ops=num_ops, magnitude=magnitude))
    if reprob:
        mean, std = pixel_statistics or ((0.5,) * 3, (0.5,) * 3)
        layers.append(RandomErasing(probability=reprob, mean=mean, std=std, seed=seed))
    if mixup or cutmix:
        layers.append(MixUpCutMix(mixup_alpha=mixup or 0.0, cutmix_alpha=cutmix or 0.0, seed=seed))
    return layers


def per_example_augmenter(augmenters):
    """`(randaugment, batched)`: the `RandAugment` among `augmenters` (or None) and the Keras layers."""
    randaugment = [a for a in augmenters if isinstance(a, RandAugment)]
    if len(randaugment) > 1:
        raise ValueError(f"{len(randaugment)} RandAugment policies among the augmenters; give one.")
    return (randaugment or [None])[0], [a for a in augmenters if not isinstance(a, RandAugment)]
