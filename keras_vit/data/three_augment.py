"""DeiT III's 3-Augment (Touvron et al., 2022) and colour jitter, per example, as timm's `--aa 3a --color-jitter 0.3`.

Each training example, after its crop and flip, gets one of three ops,
picked uniformly, then torchvision's `ColorJitter(j, j, j)`:

| op | timm's `3a` policy (`auto_augment_policy_3a`) | here |
|---|---|---|
| solarize | `Solarize` at magnitude 5: threshold 128 | `ImageOps.solarize(image, 128)` |
| grayscale | `Desaturate` at 10: colour enhanced by 0 | `ImageEnhance.Color(image).enhance(0)` |
| blur | `GaussianBlurRand` at 10: radius U(0.1, 2.0) | `ImageFilter.GaussianBlur(radius)` |

then brightness, contrast and saturation, in an order drawn uniformly
from the six, each enhanced by a factor drawn from U(1 - j, 1 + j)
(`ImageEnhance.Brightness`, `Contrast` and `Color`, as torchvision computes
them on Pillow images). DeiT's own `new_data_aug_generator` computes the
same three ops.

Why not Keras' layers: `RandomGrayscale`, `Solarization` and
`RandomGaussianBlur` compute each op on every image of the batch and pick
none of them one-of; `RandomGaussianBlur` blurs with a fixed 3x3 kernel where
Pillow's radius reaches 2; and `RandomColorJitter` adds to the brightness
(torchvision multiplies), takes each channel's own mean for the contrast
(torchvision the gray image's), scales saturation in HSV (torchvision blends
with the gray image) and applies them in one fixed order.

The draws of example `position` of epoch `epoch` come from the hash of
`(seed, epoch, position)` that RandAugment's come from (another domain of it),
so both pipelines and a resumed run give an example the same op and factors.

Example:
>>> policy = ThreeAugment(color_jitter=0.3)
>>> image = np.zeros((32, 48, 3), "uint8")
>>> policy.apply(image, seed=0, epoch=0, position=5).shape
(32, 48, 3)
"""

import dataclasses
import itertools
import numbers

import numpy as np

from keras_vit.data.randaugment import below, example_words, uniform

OPS = ("Grayscale", "Solarize", "GaussianBlur")
JITTERS = ("Brightness", "Contrast", "Saturation")
ORDERS = tuple(itertools.permutations(range(len(JITTERS))))
SOLARIZE_THRESHOLD = 128  # timm's Solarize at magnitude 5, Pillow's default
BLUR_RADII = (0.1, 2.0)  # timm's GaussianBlurRand at magnitude 10; DeiT's GaussianBlur
DOMAIN = 0x33415547  # "3AUG": these draws differ from RandAugment's and the order's for the same key


@dataclasses.dataclass(frozen=True)
class Draws:
    """One example's draws: its op (an index into `OPS`), the blur's radius, the jitter's order and factors."""

    op: int
    radius: float
    order: tuple
    factors: tuple  # brightness, contrast, saturation

    @property
    def name(self):
        return OPS[self.op]


@dataclasses.dataclass(frozen=True)
class ThreeAugment:
    """timm's `--aa 3a` with `--color-jitter color_jitter` (0: no jitter) on uint8 images.

    `data.make_augmenters(three_augment=True, color_jitter=0.3)` makes one;
    the pipelines apply it to each training example after its crop and flip.
    """

    color_jitter: float = 0.3

    def __post_init__(self):
        if (isinstance(self.color_jitter, bool) or not isinstance(self.color_jitter, numbers.Real)
                or not 0 <= self.color_jitter <= 1):
            raise ValueError(f"color_jitter must be in [0, 1] (0.3: DeiT III's; 0: none), got {self.color_jitter!r}.")

    def draws(self, seed, epoch, position):
        """The draws of example `position` of epoch `epoch`."""
        op, radius, order, *factors = example_words(seed, epoch, position, 6, DOMAIN)
        low, high = BLUR_RADII
        jitter = float(self.color_jitter)
        return Draws(below(op, len(OPS)), low + (high - low) * uniform(radius), ORDERS[below(order, len(ORDERS))],
                     tuple(max(0.0, 1.0 - jitter) + 2.0 * jitter * uniform(word) for word in factors))

    def apply(self, image, seed, epoch, position):
        """Example `position` of epoch `epoch` augmented with Pillow: uint8 `(height, width, 3)`. A float `image` (a
        crop's resized pixels) is rounded to uint8 first, half to even."""
        from PIL import Image

        if image.dtype != np.uint8:
            image = np.rint(image)
            image = np.clip(image, 0, 255, out=image).astype("uint8")
        picture = pillow_ops(Image.fromarray(np.ascontiguousarray(image)), self.draws(seed, epoch, position),
                             self.color_jitter)
        return np.asarray(picture)


def pillow_ops(picture, draws, color_jitter):
    """`draws`' op, then the jitter (where `color_jitter`), on an RGB Pillow image, as timm and torchvision compute
    them."""
    from PIL import ImageEnhance, ImageFilter, ImageOps

    if draws.name == "Grayscale":
        picture = ImageEnhance.Color(picture).enhance(0.0)
    elif draws.name == "Solarize":
        picture = ImageOps.solarize(picture, SOLARIZE_THRESHOLD)
    else:
        picture = picture.filter(ImageFilter.GaussianBlur(radius=draws.radius))
    if color_jitter:
        enhancers = (ImageEnhance.Brightness, ImageEnhance.Contrast, ImageEnhance.Color)
        for index in draws.order:
            picture = enhancers[index](picture).enhance(draws.factors[index])
    return picture
