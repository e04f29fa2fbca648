"""RandAugment (Cubuk et al., 2019) as timm's `rand-m9-mstd0.5-inc1` defines it, per example, keyed like the crops.

The policy, its random draws and its Pillow ops, for both pipelines: the
numpy one (`keras_vit.data.array_batches`) calls `RandAugment.apply`, and tf.data
calls it through `tf.numpy_function` (`keras_vit.data.tf_data_steps`).

Why not `keras.layers.RandAugment`: it computes every one of its 11 ops on
the whole batch, for each of its `num_ops` rounds, and keeps the chosen one
with `where`, so a batch costs 22 full transforms where two are wanted; and it
picks the ops once per batch, not per image (`benchmarks/README.md` has
the rates).

The ops are timm's "increasing" set (`_RAND_INCREASING_TRANSFORMS` in
`timm/data/auto_augment.py`), each with its argument at magnitude `m` on
timm's 0-10 scale (`level = m / 10`):

| op | argument |
|---|---|
| AutoContrast, Equalize, Invert | none |
| Rotate | ±30·level degrees |
| PosterizeIncreasing | keep 4 - int(4·level) bits |
| SolarizeIncreasing | invert from 256 - min(256, int(256·level)) up |
| SolarizeAdd | add min(128, int(110·level)) below 128 |
| Color/Contrast/Brightness/SharpnessIncreasing | enhance by max(0.1, 1 ± 0.9·level) |
| ShearX, ShearY | ±0.3·level |
| TranslateXRel, TranslateYRel | ±0.45·level of the width or height |

Each of `num_ops` rounds picks one op uniformly (with replacement) and
applies it with `probability`, at a magnitude drawn from
N(`magnitude`, `magnitude_std`) clipped to [0, 10], with a random sign for the
signed ops. Rotations, shears and translations are bilinear with
`fill` gray outside the image (timm fills with the model's mean pixel: 128
for a ViT's mean of 0.5). At magnitude 10, PosterizeIncreasing keeps 0
bits: a black image, as timm gave with Pillow before 13, whose
`ImageOps.posterize` refuses 0 bits.

The draws of example `position` of epoch `epoch` come from a 64-bit hash
(SplitMix64) of `(seed, epoch, position)`, not from a random generator's
state, so parallel workers, both pipelines and a resumed run pick the same
ops, magnitudes and signs for an example as one uninterrupted process.

Example:
>>> policy = RandAugment(num_ops=2, magnitude=9)
>>> image = np.zeros((32, 48, 3), "uint8")
>>> policy.apply(image, seed=0, epoch=0, position=5).shape
(32, 48, 3)
"""

import dataclasses
import math
import numbers

import numpy as np

OPS = (
    "AutoContrast", "Equalize", "Invert", "Rotate", "PosterizeIncreasing", "SolarizeIncreasing", "SolarizeAdd",
    "ColorIncreasing", "ContrastIncreasing", "BrightnessIncreasing", "SharpnessIncreasing",
    "ShearX", "ShearY", "TranslateXRel", "TranslateYRel",
)

# Each op's argument as timm's level function computes it from `level = magnitude / 10`: (kind, scale).
ARGUMENTS = {
    "Rotate": ("signed", 30.0),
    "PosterizeIncreasing": ("bits", 4.0),
    "SolarizeIncreasing": ("threshold", 256.0),
    "SolarizeAdd": ("addition", 110.0),
    **dict.fromkeys(("ColorIncreasing", "ContrastIncreasing", "BrightnessIncreasing", "SharpnessIncreasing"),
                    ("enhance", 0.9)),
    **dict.fromkeys(("ShearX", "ShearY"), ("signed", 0.3)),
    **dict.fromkeys(("TranslateXRel", "TranslateYRel"), ("signed", 0.45)),
}

MAX_MAGNITUDE = 10  # timm's _LEVEL_DENOM: magnitudes are clipped to [0, 10]
WORDS_PER_ROUND = 5  # the op, whether it applies, two for the magnitude's normal draw, the sign


def argument(name, magnitude, negate):
    """Op `name`'s argument at `magnitude` (signed ops negated where `negate`), in float64, as timm computes it.

    None for the ops without one.
    """
    if name not in ARGUMENTS:
        return None
    kind, scale = ARGUMENTS[name]
    value = magnitude / 10.0 * scale
    if kind == "signed":
        return np.where(negate, -value, value)
    if kind == "enhance":
        return np.maximum(1.0 + np.where(negate, -value, value), 0.1)
    if kind == "bits":
        return 4.0 - np.floor(value)
    if kind == "threshold":
        return 256.0 - np.minimum(np.floor(value), 256.0)
    return np.minimum(np.floor(value), 128.0)


# SplitMix64 (Steele, Lea and Flood, 2014): a 64-bit mixing function of integer multiplies, shifts and xors.
MASK = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
MULTIPLIERS = (0xBF58476D1CE4E5B9, 0x94D049BB133111EB)
SHIFTS = (30, 27, 31)
DOMAIN = 0x52414E44  # "RAND": these draws differ from any other use of the same key


def mix(value):
    """SplitMix64's output for a 64-bit state `value` (a Python int)."""
    z = (value + GOLDEN) & MASK
    z = ((z ^ (z >> SHIFTS[0])) * MULTIPLIERS[0]) & MASK
    z = ((z ^ (z >> SHIFTS[1])) * MULTIPLIERS[1]) & MASK
    return z ^ (z >> SHIFTS[2])


def epoch_state(seed, epoch, domain=DOMAIN):
    """The hash state of `(seed, epoch)`; an example's state mixes in its position (`example_words`). Another
    `domain` gives other draws from the same key (`keras_vit.data.array_batches.example_order`'s)."""
    return mix(mix((int(seed) & MASK) ^ domain) ^ (int(epoch) & MASK))


def example_words(seed, epoch, position, count, domain=DOMAIN):
    """`count` 64-bit words for example `position`: `mix(state + i)` of its state (in `domain`)."""
    state = mix(epoch_state(seed, epoch, domain) ^ (int(position) & MASK))
    return [mix((state + i) & MASK) for i in range(count)]


BATCH_DOMAIN = 0x42415443  # "BATC": the batched augmentations' draws


def batch_seeds(seed, epoch, index, count):
    """`count` 32-bit seeds for batch `index` of epoch `epoch`: the keyed draws of the batched augmentations
    (random erasing, MixUp/CutMix), so both pipelines, worker processes and a resumed run draw alike for a batch."""
    return [word & 0xFFFFFFFF for word in example_words(seed, epoch, index, count, BATCH_DOMAIN)]


def keyed_seeds(layer, seed, count):
    """The seeds of `count` draws of `layer`: from a `(seed, epoch, batch)` key where the pipelines give one
    (`randaugment.batch_seeds`), else the layer's own seed generator (or `seed`'s) for each."""
    if isinstance(seed, tuple):
        return batch_seeds(*seed, count)
    return [seed or layer._get_seed_generator(layer.backend._backend)] * count


def uniform(word):
    """A float64 in [0, 1) from a word's top 53 bits."""
    return (word >> 11) * 2.0**-53


def below(word, count):
    """An integer in [0, count) from a word's top 32 bits (multiply and shift)."""
    return ((word >> 32) * count) >> 32


@dataclasses.dataclass(frozen=True)
class Round:
    """One round's draws: the op (an index into `OPS`), whether it applies, its magnitude and sign."""

    op: int
    applied: bool
    magnitude: float
    negate: bool

    @property
    def name(self):
        return OPS[self.op]


@dataclasses.dataclass(frozen=True)
class RandAugment:
    """timm's RandAugment `rand-m{magnitude}-n{num_ops}-mstd{magnitude_std}-p{probability}-inc1` on uint8 images.

    `data.make_augmenters(randaugment=(num_ops, magnitude))` makes one;
    the pipelines apply it to each training example after its crop and flip.
    """

    num_ops: int = 2
    magnitude: int = 9
    magnitude_std: float = 0.5
    probability: float = 0.5
    fill: int = 128

    def __post_init__(self):
        if isinstance(self.num_ops, bool) or not isinstance(self.num_ops, numbers.Integral) or self.num_ops < 1:
            raise ValueError(f"RandAugment num_ops must be a whole number of at least 1, got {self.num_ops!r}.")
        if (isinstance(self.magnitude, bool) or not isinstance(self.magnitude, numbers.Real)
                or self.magnitude != int(self.magnitude) or not 0 <= self.magnitude <= MAX_MAGNITUDE):
            raise ValueError(
                f"RandAugment magnitude is timm's M, a whole number from 0 to {MAX_MAGNITUDE} (rand-m9: 9), got "
                f"{self.magnitude!r}; keras.layers.RandAugment's factor in [0, 1] is not this scale.")
        if not isinstance(self.magnitude_std, numbers.Real) or not 0 <= self.magnitude_std < math.inf:
            raise ValueError(f"RandAugment magnitude_std must be a finite number of at least 0, "
                             f"got {self.magnitude_std!r}.")
        if not isinstance(self.probability, numbers.Real) or not 0 <= self.probability <= 1:
            raise ValueError(f"RandAugment probability must be in [0, 1], got {self.probability!r}.")
        if isinstance(self.fill, bool) or not isinstance(self.fill, numbers.Integral) or not 0 <= self.fill <= 255:
            raise ValueError(f"RandAugment fill must be a gray level from 0 to 255, got {self.fill!r}.")

    def rounds(self, seed, epoch, position):
        """The draws of example `position` of epoch `epoch`, one `Round` per op."""
        words = example_words(seed, epoch, position, WORDS_PER_ROUND * self.num_ops)
        rounds = []
        for index in range(self.num_ops):
            op, apply, first, second, sign = words[WORDS_PER_ROUND * index:WORDS_PER_ROUND * (index + 1)]
            normal = math.sqrt(-2.0 * math.log(1.0 - uniform(first))) * math.cos((2.0 * math.pi) * uniform(second))
            magnitude = min(max(self.magnitude + self.magnitude_std * normal, 0.0), float(MAX_MAGNITUDE))
            rounds.append(Round(below(op, len(OPS)), uniform(apply) < self.probability, magnitude,
                                uniform(sign) < 0.5))
        return rounds

    def apply(self, image, seed, epoch, position):
        """Example `position` of epoch `epoch` augmented with Pillow: uint8 `(height, width, 3)`. A float `image` (a
        crop's resized pixels) is rounded to uint8 first, half to even."""
        from PIL import Image

        if image.dtype != np.uint8:
            image = np.rint(image)
            image = np.clip(image, 0, 255, out=image).astype("uint8")
        applied = [draw for draw in self.rounds(seed, epoch, position) if draw.applied]
        if not applied:  # a quarter of the examples at timm's probability of 0.5 and 2 ops
            return image
        picture = Image.fromarray(np.ascontiguousarray(image))
        for draw in applied:
            value = argument(draw.name, draw.magnitude, draw.negate)
            picture = pillow_op(picture, draw.name, None if value is None else float(value), self.fill)
        return np.asarray(picture)


def pillow_op(picture, name, value, fill=128):
    """Op `name` with argument `value` on an RGB Pillow image, as timm computes it (Pillow's ImageOps, ImageEnhance
    and bilinear affine transforms)."""
    from PIL import Image, ImageEnhance, ImageOps

    def affine(matrix):
        return picture.transform(picture.size, Image.Transform.AFFINE, matrix, resample=Image.Resampling.BILINEAR,
                                 fillcolor=(fill,) * 3)

    width, height = picture.size
    if name == "AutoContrast":
        return ImageOps.autocontrast(picture)
    if name == "Equalize":
        return ImageOps.equalize(picture)
    if name == "Invert":
        return ImageOps.invert(picture)
    if name == "Rotate":
        return picture.rotate(value, resample=Image.Resampling.BILINEAR, fillcolor=(fill,) * 3)
    if name == "PosterizeIncreasing":
        bits = int(value)
        return ImageOps.posterize(picture, bits) if bits else Image.new("RGB", picture.size)
    if name == "SolarizeIncreasing":
        return ImageOps.solarize(picture, int(value))
    if name == "SolarizeAdd":
        return picture.point([min(255, i + int(value)) if i < 128 else i for i in range(256)] * 3)
    if name.endswith("Increasing"):
        enhancer = getattr(ImageEnhance, name[:-len("Increasing")])
        return enhancer(picture).enhance(value)
    if name == "ShearX":
        return affine((1, value, 0, 0, 1, 0))
    if name == "ShearY":
        return affine((1, 0, 0, value, 1, 0))
    if name == "TranslateXRel":
        return affine((1, 0, value * width, 0, 1, 0))
    if name == "TranslateYRel":
        return affine((1, 0, 0, 0, 1, value * height))
    raise ValueError(f"Unknown RandAugment op {name!r}; the ops are {list(OPS)}.")
