"""TensorFlow's stateless random draws in Python, bit for bit: the Inception crop and the flip of tf.data's pipeline.

`tf.image.stateless_sample_distorted_bounding_box` and
`tf.random.stateless_uniform` draw from Philox4x32-10 (Salmon et al., 2011),
started from their `seed` pair by `GenerateKey` in TensorFlow's
`stateless_random_ops.cc`. This module computes the same generator and the
same crop sampler (`GenerateRandomCrop` in `sample_distorted_bounding_box_op.cc`,
in its float32 arithmetic), so the numpy pipeline (`keras_vit.data.array_batches`)
cuts the boxes and flips the images that tf.data does for the same
`(seed, epoch, example)`, where TensorFlow is not installed.

Example:
>>> sample_crop(300, 400, seed=(7, 0))  # (top, left, height, width)
(84, 40, 193, 229)
"""

import math
import struct

_MASK32, _MASK64 = 0xFFFFFFFF, (1 << 64) - 1
_MULTIPLIERS = (0xD2511F53, 0xCD9E8D57)
_KEY_STEPS = (0x9E3779B9, 0xBB67AE85)
_SCRAMBLE_KEY = (0x3EC8F720, 0x02461E29)  # GenerateKey's fixed key, which mixes a seed pair into key and counter


def philox(counter, key):
    """The four 32-bit words of Philox4x32-10 for a 4-word `counter` and a 2-word `key` (TensorFlow's `PhiloxRandom`)."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for _ in range(10):
        p0, p1 = _MULTIPLIERS[0] * c0, _MULTIPLIERS[1] * c2
        c0, c1, c2, c3 = ((p1 >> 32) ^ c1 ^ k0) & _MASK32, p1 & _MASK32, ((p0 >> 32) ^ c3 ^ k1) & _MASK32, p0 & _MASK32
        k0, k1 = (k0 + _KEY_STEPS[0]) & _MASK32, (k1 + _KEY_STEPS[1]) & _MASK32
    return c0, c1, c2, c3


def float32(value):
    """`value` rounded to the nearest float32 (as a Python float). One rounding of an exact double product, quotient,
    sum or square root of float32s gives float32's own result: 53 bits are more than twice 24 plus 2."""
    return struct.unpack("f", struct.pack("f", value))[0]


class Stream:
    """The 32-bit words a stateless TensorFlow op draws from its `seed` pair, one after another (`SimplePhilox`)."""

    def __init__(self, seed):
        first, second = (int(s) & _MASK64 for s in seed)
        mixed = philox((first & _MASK32, first >> 32, second & _MASK32, second >> 32), _SCRAMBLE_KEY)
        self.key, self.counter, self.words = mixed[:2], [0, 0, mixed[2], mixed[3]], []

    def bits(self):
        """The next 32-bit word."""
        if not self.words:
            self.words = list(philox(self.counter, self.key))[::-1]
            for index in range(4):  # the 128-bit counter steps by one
                self.counter[index] = (self.counter[index] + 1) & _MASK32
                if self.counter[index]:
                    break
        return self.words.pop()

    def uniform(self):
        """A float32 in [0, 1) from the next word's low 23 bits (`Uint32ToFloat`)."""
        return struct.unpack("f", struct.pack("I", 0x3F800000 | (self.bits() & 0x7FFFFF)))[0] - 1.0

    def below(self, count):
        """An integer in [0, count), rejecting the words that would favour small ones (`ExactUniformInt`)."""
        if count & (count - 1) == 0:
            return self.bits() & (count - 1)
        rejected = _MASK32 % count + 1
        while True:
            word = self.bits()
            if word >= rejected:
                return word % count


def stateless_uniform(seed):
    """`tf.random.stateless_uniform([], seed)`: its one float32 in [0, 1)."""
    return Stream(seed).uniform()


def sample_crop(height, width, seed, area_range=(0.05, 1.0), aspect_range=(3 / 4, 4 / 3), max_attempts=100):
    """`(top, left, crop_height, crop_width)`: the box `tf.image.stateless_sample_distorted_bounding_box` gives for an
    image of `height` x `width` with `seed`, the whole image as its bounding box and `min_object_covered=0`."""
    stream = Stream(seed)
    low, high = float32(aspect_range[0]), float32(aspect_range[1])
    min_fraction, max_fraction = float32(area_range[0]), float32(area_range[1])
    for _ in range(max_attempts):
        aspect = float32(float32(stream.uniform() * float32(high - low)) + low)
        box = _random_crop(height, width, min_fraction, max_fraction, aspect, stream)
        if box is not None:
            return box
    return 0, 0, height, width


def _random_crop(height, width, min_fraction, max_fraction, aspect, stream):
    """One attempt of `GenerateRandomCrop`: a box of `aspect` whose area is within the fractions, or None."""
    min_area = float32(float32(min_fraction * width) * height)
    max_area = float32(float32(max_fraction * width) * height)
    crop_height = round(float32(math.sqrt(float32(min_area / aspect))))  # lrintf: half to even, as round
    max_height = round(float32(math.sqrt(float32(max_area / aspect))))
    if round(float32(max_height * aspect)) > width:
        max_height = int((width + 0.5 - float32(1e-7)) / aspect)  # in double, as TensorFlow computes it
        max_height -= round(float32(max_height * aspect)) > width
    max_height = min(max_height, height)
    crop_height = min(crop_height, max_height)
    if crop_height < max_height:
        crop_height += stream.below(max_height - crop_height + 1)
    crop_width = round(float32(crop_height * aspect))
    area = float32(crop_width * crop_height)
    if area < min_area:
        crop_height += 1
        crop_width = round(float32(crop_height * aspect))
        area = float32(crop_width * crop_height)
    if area > max_area:
        crop_height -= 1
        crop_width = round(float32(crop_height * aspect))
        area = float32(crop_width * crop_height)
    if not (min_area <= area <= max_area and 0 < crop_width <= width and 0 < crop_height <= height):
        return None
    top = stream.below(height - crop_height) if crop_height < height else 0
    left = stream.below(width - crop_width) if crop_width < width else 0
    return top, left, crop_height, crop_width
