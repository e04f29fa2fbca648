"""`keras_vit.randaugment`'s ops in TensorFlow, per example inside tf.data, from the same draws as the numpy path.

Each op computes what Pillow computes, in the same arithmetic: lookup
tables and histograms in integers, the enhance blends in float32 truncated
to uint8 (Pillow's `Image.blend`), the Sharpness kernel's rounding, and
bilinear affine transforms in float64 with Pillow's pixel centres, edge
clamping and fill outside the image. A round's op is picked by
`tf.switch_case`, so only the chosen op runs.

Example (in a tf.data map):
>>> policy = randaugment.RandAugment(num_ops=2, magnitude=9)
>>> dataset.enumerate().map(lambda i, image: apply(policy, image, seed=0, epoch=0, position=i))
"""

import functools
import math
import types

import tensorflow as tf

from keras_vit import randaugment

_MATH = types.SimpleNamespace(floor=tf.floor, minimum=tf.minimum, maximum=tf.maximum, where=tf.where)


def _u64(value):
    return tf.constant(value, tf.uint64)


def mix(value):
    """`randaugment.mix` on a uint64 tensor (wrapping arithmetic, as Python's masked ints)."""
    z = value + _u64(randaugment.GOLDEN)
    z = (z ^ tf.bitwise.right_shift(z, _u64(randaugment.SHIFTS[0]))) * _u64(randaugment.MULTIPLIERS[0])
    z = (z ^ tf.bitwise.right_shift(z, _u64(randaugment.SHIFTS[1]))) * _u64(randaugment.MULTIPLIERS[1])
    return z ^ tf.bitwise.right_shift(z, _u64(randaugment.SHIFTS[2]))


def epoch_state(seed, epoch, domain=randaugment.DOMAIN):
    """`randaugment.epoch_state` as a uint64 tensor, of an epoch that may be an int64 tensor."""
    seed_state = randaugment.mix((int(seed) & randaugment.MASK) ^ domain)
    return mix(_u64(seed_state) ^ tf.bitcast(tf.cast(epoch, tf.int64), tf.uint64))


def example_words(epoch_state, position, count):
    """`randaugment.example_words` from a uint64 `epoch_state` tensor and an int64 `position` one: `count` words."""
    position = tf.bitcast(tf.cast(position, tf.int64), tf.uint64)
    state = mix(epoch_state ^ position)
    return mix(state + tf.constant(list(range(count)), tf.uint64))


def _uniform(word):
    return tf.cast(tf.bitwise.right_shift(word, _u64(11)), tf.float64) * 2.0**-53


def rounds(policy, seed, epoch, position):
    """`policy.rounds` as tensors: `(op int32, applied bool, magnitude float64, negate bool)` per round."""
    return _rounds(policy, _u64(randaugment.epoch_state(seed, epoch)), position)


def _rounds(policy, epoch_state, position):
    words = example_words(epoch_state, position, randaugment.WORDS_PER_ROUND * policy.num_ops)
    draws = []
    for index in range(policy.num_ops):
        op, apply, first, second, sign = tf.unstack(words[randaugment.WORDS_PER_ROUND * index:][:5])
        op = tf.bitwise.right_shift(tf.bitwise.right_shift(op, _u64(32)) * _u64(len(randaugment.OPS)), _u64(32))
        normal = tf.sqrt(-2.0 * tf.math.log(1.0 - _uniform(first))) * tf.cos((2.0 * math.pi) * _uniform(second))
        magnitude = tf.clip_by_value(float(policy.magnitude) + float(policy.magnitude_std) * normal, 0.0,
                                     float(randaugment.MAX_MAGNITUDE))
        draws.append((tf.cast(op, tf.int32), _uniform(apply) < policy.probability, magnitude, _uniform(sign) < 0.5))
    return draws


def apply(policy, image, seed, epoch, position):
    """Example `position` (an int64 tensor) of epoch `epoch` (an int or int64 tensor) augmented: float32
    `(height, width, 3)`, whole numbers in [0, 255]. A float `image` is rounded to uint8 first (half to even, as the
    numpy path)."""
    image = tf.convert_to_tensor(image)
    augment = _augment_function(policy, tuple(image.shape), image.dtype)
    return augment(image, epoch_state(seed, epoch), tf.cast(position, tf.int64))


@functools.lru_cache(maxsize=None)
def _augment_function(policy, shape, dtype):
    """`apply` for one policy and image shape as one `tf.function`, traced once: training_stream maps every epoch
    with it (the epoch enters as its hash state), where tracing the 15 ops anew took most of a second an epoch."""

    signature = [tf.TensorSpec(shape, dtype), tf.TensorSpec([], tf.uint64), tf.TensorSpec([], tf.int64)]

    @tf.function(input_signature=signature)
    def augment(image, epoch_state, position):
        if image.dtype != tf.uint8:
            image = tf.cast(tf.clip_by_value(tf.round(image), 0.0, 255.0), tf.uint8)
        for op, applied, magnitude, negate in _rounds(policy, epoch_state, position):
            branches = [_branch(name, image, magnitude, negate, policy.fill) for name in randaugment.OPS]
            unchanged = len(branches)  # a last branch for a round that does not apply
            branches.append(lambda image=image: image)
            image = tf.ensure_shape(tf.switch_case(tf.where(applied, op, unchanged), branches), image.shape)
        return tf.cast(image, tf.float32)

    return augment


def _branch(name, image, magnitude, negate, fill):
    def run():
        value = randaugment.argument(name, magnitude, negate, _MATH)
        return op(image, name, value, fill)

    return run


def op(image, name, value, fill=128):
    """Op `name` with argument `value` (a float64 tensor, or None) on a uint8 `(height, width, 3)` image."""
    if name == "AutoContrast":
        return auto_contrast(image)
    if name == "Equalize":
        return equalize(image)
    if name == "Invert":
        return 255 - image
    if name == "Rotate":
        return rotate(image, value, fill)
    if name == "PosterizeIncreasing":
        shift = 8 - tf.cast(value, tf.int32)
        mask = tf.bitwise.left_shift(tf.bitwise.right_shift(tf.constant(255), shift), shift)
        return tf.bitwise.bitwise_and(image, tf.cast(mask, tf.uint8))
    pixels = tf.cast(image, tf.int32)
    if name == "SolarizeIncreasing":
        return tf.cast(tf.where(pixels < tf.cast(value, tf.int32), pixels, 255 - pixels), tf.uint8)
    if name == "SolarizeAdd":
        return tf.cast(tf.where(pixels < 128, tf.minimum(pixels + tf.cast(value, tf.int32), 255), pixels), tf.uint8)
    if name == "ColorIncreasing":
        return blend(tf.repeat(luminance(image), 3, axis=-1), image, value)
    if name == "ContrastIncreasing":
        mean = tf.floor(tf.reduce_mean(tf.cast(luminance(image), tf.float64)) + 0.5)
        return blend(tf.fill(tf.shape(image), tf.cast(mean, tf.int32)), image, value)
    if name == "BrightnessIncreasing":
        return blend(tf.zeros_like(pixels), image, value)
    if name == "SharpnessIncreasing":
        return blend(smooth(image), image, value)
    height, width = image.shape[0], image.shape[1]
    matrices = {
        "ShearX": lambda: (1.0, value, 0.0, 0.0, 1.0, 0.0),
        "ShearY": lambda: (1.0, 0.0, 0.0, value, 1.0, 0.0),
        "TranslateXRel": lambda: (1.0, 0.0, value * float(width), 0.0, 1.0, 0.0),
        "TranslateYRel": lambda: (1.0, 0.0, 0.0, 0.0, 1.0, value * float(height)),
    }
    if name in matrices:
        return affine(image, matrices[name](), fill)
    raise ValueError(f"Unknown RandAugment op {name!r}; the ops are {list(randaugment.OPS)}.")


def luminance(image):
    """Pillow's RGB to L: `(299 R + 587 G + 114 B) / 1000` in 16-bit fixed point, int32 `(height, width, 1)`."""
    pixels = tf.cast(image, tf.int32)
    weighted = pixels[..., 0:1] * 19595 + pixels[..., 1:2] * 38470 + pixels[..., 2:3] * 7471 + 0x8000
    return tf.bitwise.right_shift(weighted, 16)


def blend(degenerate, image, factor):
    """Pillow's `Image.blend(degenerate, image, factor)`: float32 `d + factor (i - d)`, truncated, clipped."""
    low = tf.cast(degenerate, tf.float32)
    mixed = low + tf.cast(factor, tf.float32) * (tf.cast(image, tf.float32) - low)
    return tf.cast(tf.clip_by_value(tf.floor(mixed), 0.0, 255.0), tf.uint8)


def smooth(image):
    """Pillow's `ImageFilter.SMOOTH` (3x3, centre 5, the rest 1, over 13, rounded); the border pixels kept."""
    pixels = tf.cast(image, tf.int32)
    height, width = image.shape[0], image.shape[1]
    total = 4 * pixels[1:-1, 1:-1]
    for dy in range(3):
        for dx in range(3):
            total += pixels[dy:dy + height - 2, dx:dx + width - 2]
    inner = (2 * total + 13) // 26  # round(total / 13); never a tie
    inner = tf.pad(inner, [[1, 1], [1, 1], [0, 0]])
    border = tf.pad(tf.zeros((height - 2, width - 2, 1), tf.bool), [[1, 1], [1, 1], [0, 0]], constant_values=True)
    return tf.cast(tf.where(border, pixels, inner), tf.uint8)


def _per_channel_lut(image, table):
    """`table[c, image[..., c]]` for an int32 `(3, 256)` table."""
    index = tf.cast(image, tf.int32) + tf.constant([0, 256, 512])
    return tf.cast(tf.gather(tf.reshape(table, [-1]), index), tf.uint8)


def auto_contrast(image):
    """`ImageOps.autocontrast`: each channel's range stretched to [0, 255] (`int(i * scale + offset)` in float64)."""
    pixels = tf.cast(image, tf.float64)
    low, high = tf.reduce_min(pixels, axis=(0, 1)), tf.reduce_max(pixels, axis=(0, 1))
    stretch = high > low
    scale = 255.0 / tf.where(stretch, high - low, 1.0)
    offset = -low * scale
    stretched = tf.clip_by_value(tf.cast(pixels * scale + offset, tf.int32), 0, 255)  # the cast truncates, as int()
    return tf.where(stretch, tf.cast(stretched, tf.uint8), image)


def equalize(image):
    """`ImageOps.equalize`: each channel's lookup table from its histogram, in integers as Pillow computes it."""
    values = tf.reshape(tf.cast(image, tf.int32) + tf.constant([0, 256, 512]), [-1])
    histogram = tf.reshape(tf.math.bincount(values, minlength=768, maxlength=768), (3, 256))
    total = tf.reduce_sum(histogram, axis=1)
    top = tf.gather(histogram, tf.reduce_max(tf.reshape(tf.cast(image, tf.int32), (-1, 3)), axis=0), batch_dims=1)
    step = (total - top) // 255
    used = tf.reduce_sum(tf.cast(histogram > 0, tf.int32), axis=1)
    below = tf.cumsum(histogram, axis=1, exclusive=True)
    safe = tf.maximum(step, 1)[:, None]
    table = tf.minimum((safe // 2 + below) // safe, 255)
    keep = ((used <= 1) | (step == 0))[:, None]
    return _per_channel_lut(image, tf.where(keep, tf.range(256)[None], table))


def rotate(image, degrees, fill):
    """`Image.rotate(degrees, BILINEAR, fillcolor)` about the centre, without expanding: Pillow's matrix."""
    height, width = image.shape[0], image.shape[1]
    angle = -(tf.math.floormod(degrees, 360.0) * (math.pi / 180.0))
    cos, sin = _round15(tf.cos(angle)), _round15(tf.sin(angle))
    centre_x, centre_y = width / 2.0, height / 2.0
    matrix = (cos, sin, cos * -centre_x + sin * -centre_y + centre_x,
              -sin, cos, -sin * -centre_x + cos * -centre_y + centre_y)
    return affine(image, matrix, fill)


def _round15(value):
    return tf.round(value * 1e15) / 1e15  # Pillow rounds its matrix to 15 decimals


def affine(image, matrix, fill):
    """Pillow's `Image.transform(size, AFFINE, matrix, BILINEAR, fillcolor)`.

    Output pixel `(x, y)` reads the input at `(a, b, c, d, e, f)` applied to
    its centre `(x + 0.5, y + 0.5)`; outside `[0, width) x [0, height)` it is
    `fill`, inside it interpolates the four nearest pixels, their indices
    clamped to the image, and truncates.
    """
    a, b, c, d, e, f = (tf.cast(v, tf.float64) for v in matrix)
    height, width = image.shape[0], image.shape[1]
    ys, xs = tf.meshgrid(tf.range(height, dtype=tf.float64) + 0.5, tf.range(width, dtype=tf.float64) + 0.5,
                         indexing="ij")
    source_x = a * xs + b * ys + c
    source_y = d * xs + e * ys + f
    inside = (source_x >= 0.0) & (source_x < width) & (source_y >= 0.0) & (source_y < height)
    x, y = source_x - 0.5, source_y - 0.5
    left, top = tf.floor(x), tf.floor(y)
    dx, dy = (x - left)[..., None], (y - top)[..., None]
    left, top = tf.cast(left, tf.int32), tf.cast(top, tf.int32)
    columns = tf.clip_by_value(left, 0, width - 1), tf.clip_by_value(left + 1, 0, width - 1)
    rows = tf.clip_by_value(top, 0, height - 1) * width, tf.clip_by_value(top + 1, 0, height - 1) * width
    flat = tf.reshape(tf.cast(image, tf.float64), (-1, 3))

    def row(offset):
        first, second = tf.gather(flat, offset + columns[0]), tf.gather(flat, offset + columns[1])
        return first + (second - first) * dx

    upper, lower = row(rows[0]), row(rows[1])
    value = tf.floor(upper + (lower - upper) * dy)
    return tf.where(inside[..., None], tf.cast(value, tf.uint8), tf.constant(fill, tf.uint8))
