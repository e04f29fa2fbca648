"""The pipeline's augmentations: keras_vit's per-example RandAugment or 3-Augment, then timm's batched random
erasing, and MixUp and CutMix."""

from keras_vit.data.randaugment import RandAugment
from keras_vit.data.three_augment import ThreeAugment

PER_EXAMPLE = (RandAugment, ThreeAugment)  # policies the pipelines apply to each example, by `(seed, epoch, position)`


def make_augmenters(randaugment=None, mixup=0.0, cutmix=0.0, seed=0, reprob=0.0, pixel_statistics=None,
                    three_augment=False, color_jitter=None):
    """The pipeline's augmentations: keras_vit's RandAugment or 3-Augment, then the batched layers.

    `randaugment=(num_ops, magnitude)` adds `keras_vit.data.randaugment.RandAugment`,
    timm's `rand-m{magnitude}-n{num_ops}-mstd0.5-inc1` (`(2, 9)`: timm's
    `rand-m9-mstd0.5-inc1`), applied to each example after its crop and flip and
    keyed by the pipeline's `(seed, epoch, example)`; `mixup` / `cutmix` give the
    Beta-distribution parameters of timm's MixUp and CutMix (`mixing.MixUpCutMix`: one or the
    other per batch where both are on; 0 = off), drawn from `seed`; `reprob` is timm's random erasing (`random_erasing.RandomErasing`), each
    image's chance of a box of noise in the model's normalized space
    (`pixel_statistics`: the model's `(mean, std)`), before the mixing, as timm
    erases each image before it mixes the batch. `three_augment` is DeiT III's
    3-Augment (`three_augment.ThreeAugment`, timm's `--aa 3a`) with `color_jitter`
    (timm's `--color-jitter`; 0.3 where None), in place of RandAugment: timm's `--aa`
    takes one policy.
    """
    from keras_vit.data.mixing import MixUpCutMix  # Keras layers: keras_vit.data itself imports no Keras
    from keras_vit.data.random_erasing import RandomErasing

    check_policies(randaugment, three_augment, color_jitter)
    layers = []
    if three_augment:
        layers.append(ThreeAugment(0.3 if color_jitter is None else color_jitter))
    if randaugment:
        num_ops, magnitude = randaugment
        layers.append(RandAugment(num_ops=num_ops, magnitude=magnitude))
    if reprob:
        mean, std = pixel_statistics or ((0.5,) * 3, (0.5,) * 3)
        layers.append(RandomErasing(probability=reprob, mean=mean, std=std, seed=seed))
    if mixup or cutmix:
        layers.append(MixUpCutMix(mixup_alpha=mixup or 0.0, cutmix_alpha=cutmix or 0.0, seed=seed))
    return layers


def check_policies(randaugment=None, three_augment=False, color_jitter=None):
    """Refuse RandAugment beside 3-Augment, or a colour jitter without 3-Augment."""
    if randaugment and three_augment:
        raise ValueError("RandAugment and 3-Augment are both on; timm's --aa takes one policy: give --randaugment or "
                         "--three-augment.")
    if color_jitter and not three_augment:
        raise ValueError(f"color_jitter {color_jitter!r} (--color-jitter) is applied with 3-Augment, as DeiT III's "
                         "recipe and timm's --aa 3a apply it: add --three-augment, or leave --color-jitter out.")


def per_example_augmenter(augmenters):
    """`(policy, batched)`: the `RandAugment` or `ThreeAugment` among `augmenters` (or None) and the Keras layers."""
    policies = [a for a in augmenters if isinstance(a, PER_EXAMPLE)]
    if len(policies) > 1:
        raise ValueError(f"{len(policies)} per-example policies among the augmenters "
                         f"({', '.join(type(a).__name__ for a in policies)}); give one.")
    return (policies or [None])[0], [a for a in augmenters if not isinstance(a, PER_EXAMPLE)]
