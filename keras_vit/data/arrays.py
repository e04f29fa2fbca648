"""Images as numpy arrays, without TensorFlow: image files, bilinear resizing and the embedded digits.

The eager counterparts of `keras_vit.data`'s tf.data steps, so that the
digits data, `predict` and `inspect` run on a JAX or PyTorch install that
has no TensorFlow. `resize` computes what `tf.image.resize(method="bilinear")`
computes (half-pixel centres, no antialiasing), bit for bit.

Example:
>>> (x, y), (x_test, y_test) = digits(image_size=16)
>>> x.shape, x.dtype, resize(x[0], (8, 8)).shape
((1437, 16, 16, 3), dtype('uint8'), (8, 8, 3))
"""

import functools
import math
import os
import struct
import zlib

import numpy as np

DIGITS_FILE = os.path.join(os.path.dirname(__file__), "digits.npz")


def decode_image(file):
    """An image file (JPEG, PNG, GIF's first frame, BMP, ...; a path or a binary file object) as uint8
    `(height, width, 3)`: the pixels of transformers' `load_image`.

    Pillow decodes it, turns it upright by its EXIF orientation
    (`ImageOps.exif_transpose`, as transformers' `load_image` and photo
    viewers do, so that a phone's portrait photo is seen upright; timm's
    loader does not), then converts it with `convert("RGB")`, as timm's and
    transformers' loaders do: alpha dropped, not blended; a palette's colours;
    CMYK by Pillow's formula; 16-bit grey clipped at 255, as Pillow converts
    it. tf.data gives the same pixels (`keras_vit.data.tf_data_steps.decode`).
    A file that cannot be decoded is an `UndecodableImage` naming it.
    """
    return np.asarray(open_rgb(file))


def open_rgb(file):
    """An image file as the RGB Pillow image whose pixels `decode_image` gives."""
    image = _opened(file)
    if image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")  # the palette's colours, as convert("RGB") gives them, without its warning
    return image if image.mode == "RGB" else image.convert("RGB")


# What Pillow raises for a file it cannot decode: a broken stream or checksum, a truncated file, an unknown format.
DECODE_ERRORS = (OSError, SyntaxError, ValueError, EOFError, struct.error, zlib.error)


def _opened(file):
    """The decoded Pillow image of a file (its first frame), turned upright; `UndecodableImage` where Pillow cannot
    decode it."""
    try:
        from PIL import Image, ImageOps
    except ImportError as error:
        raise ImportError("Reading image files needs Pillow, a dependency of keras-vision-transformer: "
                          "pip install pillow.") from error
    try:
        with Image.open(file) as image:
            image.load()
            ImageOps.exif_transpose(image, in_place=True)
            return image
    except FileNotFoundError:
        raise
    except (*DECODE_ERRORS, Image.DecompressionBombError) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise UndecodableImage(file if isinstance(file, (str, os.PathLike)) else "the image", reason) from None


class UndecodableImage(ValueError):
    """A file that cannot be decoded as an image; the one-line message names it, `reason` is the decoder's."""

    def __init__(self, path, reason):
        super().__init__(f"{path} cannot be decoded as an image ({reason}); remove or replace the file.")
        self.path, self.reason = path, reason


@functools.lru_cache(maxsize=4096)
def bilinear_taps(in_size, out_size):
    """`(low, high, weight)` of 1-D bilinear resampling with half-pixel centres, edges clamped.

    Output pixel `i` is `input[low[i]] + (input[high[i]] - input[low[i]]) * weight[i]`:
    the two taps per output pixel of `tf.image.resize(method="bilinear")`, with
    its float32 coordinates.
    """
    scale = np.float32(in_size) / np.float32(out_size)
    source = (np.arange(out_size, dtype="float32") + np.float32(0.5)) * scale - np.float32(0.5)
    floor = np.floor(source)
    low = np.clip(floor.astype("int64"), 0, in_size - 1)
    high = np.clip(floor.astype("int64") + 1, 0, in_size - 1)
    taps = low, high, (source - floor).astype("float32")
    for array in taps:
        array.flags.writeable = False  # shared by every call for these sizes
    return taps


def _lerp(low, high, weight):
    """`low + (high - low) * weight` in float32, tf.image.resize's order of operations, in one new array."""
    out = np.subtract(high, low, dtype="float32")
    out *= weight
    return np.add(out, low, out=out, dtype="float32")


def resize(image, size, mirror=False):
    """`(height, width, channels)` or `(batch, height, width, channels)` resized bilinearly to `size`, as float32.

    Bit-equal to `tf.image.resize(method="bilinear")`: the columns, then
    the rows, each from two source pixels per output pixel, so a 4000x3000
    photo takes milliseconds and is never converted to floats whole. Crops
    for evaluation are planned by `keras_vit.EvalTransform`. `mirror` flips
    the result left to right, as a contiguous array (numpy's operations on a
    reversed view cost several times as much).

    Example:
    >>> resize(np.array([[[0], [255]]], "uint8"), (1, 4))[0, :, 0]
    array([  0.  ,  63.75, 191.25, 255.  ], dtype=float32)
    """
    size = tuple(int(s) for s in size)
    image = np.asarray(image)
    *batch, height, width, channels = image.shape
    # Each row as one run of `width * channels` values: gathering single values is numpy's fast path, where
    # gathering whole pixels of `channels` bytes is a copy call each.
    rows = image.reshape(*batch, height, width * channels)
    low, high, weight = (taps[::-1] if mirror else taps for taps in bilinear_taps(width, size[1]))
    within = np.arange(channels)
    columns = _lerp(*(rows[..., (taps[:, None] * channels + within).ravel()] for taps in (low, high)),
                    np.repeat(weight, channels))
    low, high, weight = bilinear_taps(height, size[0])
    return _lerp(columns[..., low, :], columns[..., high, :], weight[:, None]).reshape(*batch, *size, channels)


def minus_one_to_one(pixels, overwrite=False):
    """Pixels in [0, 255] (uint8 or float) as float32 in [-1, 1]: the input of every keras_vit model.

    `x / 127.5 - 1` in float32, as tf.data's steps compute it; the one home
    of that scaling in numpy (`keras_vit.preprocess_input` is its public
    name). `overwrite=True` scales a writeable float32 array in place.

    Example:
    >>> minus_one_to_one(np.array([0, 255], "uint8")).tolist()
    [-1.0, 1.0]
    """
    pixels = np.asarray(pixels)
    in_place = overwrite and pixels.dtype == np.float32 and pixels.flags.writeable
    scaled = np.divide(pixels, np.float32(127.5), out=pixels if in_place else None, dtype="float32")
    scaled -= np.float32(1.0)
    return scaled


def stratified_split(labels, test_fraction, seed):
    """`(train, test)` index arrays, each class split in proportion (largest remainders), shuffled by `seed`."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be between 0 and 1, got {test_fraction!r}.")
    rng = np.random.default_rng(seed)
    classes, counts = np.unique(labels, return_counts=True)
    test_total = int(math.ceil(test_fraction * len(labels)))
    exact = counts * test_total / len(labels)
    per_class = np.floor(exact).astype("int64")
    per_class[np.argsort(per_class - exact, kind="stable")[:test_total - per_class.sum()]] += 1
    test = np.concatenate([rng.permutation(np.flatnonzero(labels == label))[:count]
                           for label, count in zip(classes, per_class)])
    train = np.setdiff1d(np.arange(len(labels)), test)
    return rng.permutation(train), rng.permutation(test)


def digits(image_size=32, test_fraction=0.2, seed=0):
    """The 1,797 8x8 handwritten digits that ship with keras_vit, upsampled to RGB `image_size` images.

    Returns `(train, test)` pairs of `(uint8 images (N, S, S, 3), int64
    labels)`, split per class (1,437 / 360 with the defaults). No download
    and no other package: the images are UCI's, as scikit-learn ships them
    (`keras_vit/data/digits_NOTICE.txt`).

    Example:
    >>> (x, y), (x_test, y_test) = digits(image_size=32)
    >>> x.shape, x_test.shape
    ((1437, 32, 32, 3), (360, 32, 32, 3))
    """
    with np.load(DIGITS_FILE) as stored:
        images, labels = stored["images"], stored["labels"].astype("int64")
    images = resize(images[..., None].astype("float64") * (255.0 / 16.0), (image_size, image_size))
    images = np.repeat(np.clip(np.round(images), 0, 255).astype("uint8"), 3, axis=-1)
    train, test = stratified_split(labels, test_fraction, seed)
    return (images[train], labels[train]), (images[test], labels[test])
