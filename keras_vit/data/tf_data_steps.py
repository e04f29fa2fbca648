"""The tf.data steps of `keras_vit.data`'s pipeline: Inception crop, resize, [-1, 1] pixels, batching.

TensorFlow ops that run inside tf.data (`keras_vit.data.array_batches` computes
the same steps in numpy where TensorFlow is not installed).
"""

import io
import struct
import sys

import numpy as np
import tensorflow as tf

from keras_vit.data import array_batches, arrays, preprocessing, randaugment
from keras_vit.data.array_batches import check_label_mixing, mixes_labels


def crop_window(shape, seed, area_range=(0.05, 1.0)):
    """`(begin, size)`, each `(rows, columns)`: the Inception crop's window in an image of `shape`."""
    begin, crop_size, _ = tf.image.stateless_sample_distorted_bounding_box(
        shape,
        bounding_boxes=tf.constant([0.0, 0.0, 1.0, 1.0], shape=(1, 1, 4)),
        seed=seed,
        min_object_covered=0.0,
        aspect_ratio_range=(3 / 4, 4 / 3),
        area_range=area_range,
        use_image_if_no_bounding_boxes=True,
    )
    return begin[:2], crop_size[:2]


def inception_crop(image, size, seed, area_range=(0.05, 1.0)):
    """Random crop of 5-100% of the area and 3/4-4/3 aspect, resized to `size`."""
    begin, crop_size = crop_window(tf.shape(image), seed, area_range)
    crop = image[begin[0]:begin[0] + crop_size[0], begin[1]:begin[1] + crop_size[1]]
    return tf.image.resize(crop, size, method="bilinear")


def decode_and_inception_crop(encoded, size, seed, area_range=(0.05, 1.0)):
    """`inception_crop` of an encoded image file's bytes, decoding only the crop window of a JPEG.

    As big_vision's `decode_jpeg_and_inception_crop`: the window is sampled
    from the JPEG header's size (`extract_jpeg_shape`) and only it is decoded
    (`decode_and_crop_jpeg`). Other formats are decoded whole, then cropped.
    The window is the one `inception_crop` samples from the decoded image.
    A JPEG that Pillow decodes (`decoded_by_tensorflow`: CMYK, or turned by its
    EXIF orientation) is decoded whole.
    """
    by_tensorflow = _by_tensorflow(encoded)

    def jpeg():
        shape = tf.image.extract_jpeg_shape(encoded)
        begin, crop_size = crop_window(shape, seed, area_range)
        # libjpeg upsamples the colour of a window's first and last columns from the window alone; decoding
        # 16 more columns each side (a block of 4:2:0 colour) gives the window the pixels of a whole decode.
        left = tf.maximum(begin[1] - 16, 0)
        right = tf.minimum(begin[1] + crop_size[1] + 16, shape[1])
        wide = tf.image.decode_and_crop_jpeg(encoded, tf.stack([begin[0], left, crop_size[0], right - left]), channels=3)
        return wide[:, begin[1] - left:begin[1] - left + crop_size[1]]

    def other():
        image = _decoded(encoded, by_tensorflow)
        begin, crop_size = crop_window(tf.shape(image), seed, area_range)
        return image[begin[0]:begin[0] + crop_size[0], begin[1]:begin[1] + crop_size[1]]

    crop = tf.cond(tf.logical_and(tf.io.is_jpeg(encoded), by_tensorflow), jpeg, other)
    return tf.image.resize(crop, size, method="bilinear")


def resize(image, size):
    """keras_vit's evaluation resize: bilinear, not antialiased (`keras_vit.data.arrays.resize` is its numpy twin)."""
    return tf.image.resize(image, size, method="bilinear")


def eval_step(image, transform):
    """A `keras_vit.data.preprocessing.EvalTransform` in a tf.data map: `tf.image.resize` where it computes it, else
    the transform's Pillow resize and crop through `tf.numpy_function`. Float pixels in [0, 255]."""
    if transform.computed_by_tf_image_resize:
        (height, width), (top, left) = transform.plan(*transform.image_size)  # a squash: the same for every image
        crop_h, crop_w = transform.image_size
        return resize(image, (height, width))[top:top + crop_h, left:left + crop_w]
    pixels = tf.numpy_function(lambda array: transform.pixels(array).astype("float32"), [image], tf.float32)
    return tf.reshape(pixels, (*transform.image_size, 3))


def randaugment_step(policy, image, seed, epoch, position):
    """`policy.apply` (a `keras_vit.data.randaugment.RandAugment`: Pillow's ops) on example `position` of epoch `epoch`
    (ints or int64 tensors) through `tf.numpy_function`: the numpy pipeline's code and pixels, and faster than the same ops
    written as TensorFlow graph ops, each a switch over 15 branches per example (`benchmarks/README.md`)."""
    augmented = tf.numpy_function(lambda pixels, epoch, index: policy.apply(pixels, seed, int(epoch), int(index)),
                                  [image, tf.cast(epoch, tf.int64), position], tf.uint8, stateful=False)
    return tf.cast(tf.ensure_shape(augmented, image.shape), tf.float32)


def value_range(image, low=-1.0, high=1.0):
    """Map [0, 255] pixels to [low, high]."""
    return tf.cast(image, "float32") / 255.0 * (high - low) + low


def _u64(value):
    return tf.constant(value, tf.uint64)


def mix(value):
    """`keras_vit.data.randaugment.mix` (SplitMix64) on a uint64 tensor: wrapping arithmetic, as Python's masked ints."""
    z = value + _u64(randaugment.GOLDEN)
    z = (z ^ tf.bitwise.right_shift(z, _u64(randaugment.SHIFTS[0]))) * _u64(randaugment.MULTIPLIERS[0])
    z = (z ^ tf.bitwise.right_shift(z, _u64(randaugment.SHIFTS[1]))) * _u64(randaugment.MULTIPLIERS[1])
    return z ^ tf.bitwise.right_shift(z, _u64(randaugment.SHIFTS[2]))


def example_order(count, seed, epoch, aug_repeats=0):
    """`keras_vit.data.array_batches.example_order` in TensorFlow (int32 rows), of an int or int64 tensor `epoch`."""
    seed_state = randaugment.mix((int(seed) & randaugment.MASK) ^ array_batches.ORDER_DOMAIN)
    state = mix(_u64(seed_state) ^ tf.bitcast(tf.cast(epoch, tf.int64), tf.uint64))  # randaugment.epoch_state
    keys = mix(state ^ tf.bitcast(tf.range(count, dtype=tf.int64), tf.uint64))
    order = tf.argsort(tf.bitcast(keys, tf.int64), stable=True)
    if aug_repeats:
        order = tf.repeat(order, aug_repeats)[:array_batches.epoch_length(count, aug_repeats)]
    return order


def decode(encoded):
    """An encoded image file's bytes as uint8 `(height, width, 3)`: `keras_vit.data.arrays.decode_image`'s pixels.

    TensorFlow's decoder where it gives them (`decoded_by_tensorflow`), else
    Pillow's decode through `tf.numpy_function`.
    """
    return _decoded(encoded, _by_tensorflow(encoded))


def _decoded(encoded, by_tensorflow):
    def pillow():
        pixels = tf.numpy_function(_pillow_pixels, [encoded], tf.uint8, stateful=False)
        return tf.ensure_shape(pixels, (None, None, 3))

    return tf.cond(by_tensorflow, lambda: tf.io.decode_image(encoded, channels=3, expand_animations=False), pillow)


def _by_tensorflow(encoded):
    return tf.ensure_shape(tf.numpy_function(decoded_by_tensorflow, [encoded], tf.bool, stateful=False), ())


def _pillow_pixels(encoded):
    """`arrays.decode_image` of a file's bytes; an undecodable file is the InvalidArgumentError TensorFlow's decoders
    raise, which tf.data's `ignore_errors` skips."""
    try:
        return arrays.decode_image(io.BytesIO(_as_bytes(encoded)))
    except arrays.UndecodableImage as error:
        raise tf.errors.InvalidArgumentError(None, None, error.reason) from None


def _as_bytes(encoded):
    """A string tensor's bytes as `tf.numpy_function` hands them: bytes in a graph, a 0-d object array eagerly."""
    return encoded.item() if isinstance(encoded, np.ndarray) else encoded


_ORIENTATION = 0x0112  # EXIF's Orientation tag
_TURNED = range(2, 9)  # the orientations `ImageOps.exif_transpose` turns or mirrors


# The text chunks where Pillow finds a PNG's orientation (ImageMagick's EXIF, XMP's tiff:Orientation).
_PNG_ORIENTATION_TEXTS = (b"Raw profile type exif", b"XML:com.adobe.xmp")


def decoded_by_tensorflow(encoded):
    """Whether `tf.io.decode_image(encoded, channels=3)` gives `arrays.decode_image`'s pixels for a file's bytes.

    A JPEG (the same pixels within a few levels, as libjpeg builds differ) in
    YCbCr or grey, not CMYK (Pillow rounds where TensorFlow floors), and a PNG
    that is not 16-bit grey (TensorFlow keeps the high byte where Pillow
    clips), each without an EXIF orientation to apply. Not BMP (TensorFlow
    reads a palette's indices as grey) or GIF (it blacks out transparent
    pixels). A file Pillow cannot identify is left to TensorFlow's decoder,
    which gives its own error.
    """
    from PIL import Image

    encoded = _as_bytes(encoded)
    try:
        with Image.open(io.BytesIO(encoded)) as image:  # reads the header only
            if image.format in ("JPEG", "MPO"):  # MPO: a phone's JPEG with more pictures after the first
                return image.mode in ("RGB", "L") and image.getexif().get(_ORIENTATION, 1) not in _TURNED
            return image.format == "PNG" and not image.mode.startswith("I") and not _png_orientation_chunk(encoded)
    except Image.UnidentifiedImageError:
        return True
    except (*arrays.DECODE_ERRORS, Image.DecompressionBombError):
        return False  # Pillow's decode refuses it too, with its reason


def _png_orientation_chunk(encoded):
    """Whether a PNG holds a chunk that may give an orientation: eXIf, or a text chunk of `_PNG_ORIENTATION_TEXTS`,
    before or after the pixels. Walks the chunk headers only."""
    position = 8
    while position + 8 <= len(encoded):
        length, kind = struct.unpack_from(">I4s", encoded, position)
        if kind == b"eXIf":
            return True
        if kind in (b"tEXt", b"zTXt", b"iTXt"):
            if encoded[position + 8:position + 8 + min(length, 80)].split(b"\0", 1)[0] in _PNG_ORIENTATION_TEXTS:
                return True
        if kind == b"IEND":
            break
        position += length + 12
    return False


def _note(files, rows, suffix):
    """Print `array_batches.SKIPPED` for each of the `files` at `rows` (a tf.data map cannot log); returns True."""
    before, after = array_batches.SKIPPED.split("{}")
    lines = tf.strings.join([before, tf.gather(files, rows), after + suffix])
    with tf.control_dependencies([tf.print(tf.strings.reduce_join(lines, separator="\n"), output_stream=sys.stderr)]):
        return tf.constant(True)


def decoded_files(files, labels):
    """Evaluation's `(image, label)` of each image file, decoded whole. A file that cannot be decoded gets a note
    naming it and comes as a 1x1 black image labelled -1, which `batched(..., left_out=True)` leaves out: one element
    a file, so that Keras sees the count (with an unknown one, it warns of running out of data)."""

    def one(file, label):
        decoded = tf.data.Dataset.from_tensors(file).map(lambda name: (decode(tf.io.read_file(name)), label))
        # Reached only where the decode failed.
        left_out = tf.data.Dataset.from_tensors(file).map(lambda name: (tf.zeros((1, 1, 3), tf.uint8), tf.where(
            _note(name[None], [0], "; left out of the evaluation"), tf.constant(-1, label.dtype), label)))
        return decoded.ignore_errors().concatenate(left_out).take(1)

    names = tf.data.Dataset.from_tensor_slices((files, labels))
    return names.interleave(one, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).apply(
        tf.data.experimental.assert_cardinality(len(files)))


def examples(source, size, training, seed, epoch, crop_fraction, min_crop_area, flip, eval_transform=None,
             randaugment=None, aug_repeats=0):
    """Per-example preprocessing: float pixels in [0, 255] of `size` (not yet scaled) and labels, one pass."""
    if not training:
        transform = (eval_transform or preprocessing.keras_vit(crop_fraction)).fitted_to(size)
        return source.dataset.map(lambda image, label: (tf.ensure_shape(eval_step(image, transform), (*size, 3)), label),
                                  num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return training_examples(source, size, seed, [epoch], None, min_crop_area, flip, randaugment, aug_repeats)


def training_examples(source, size, seed, epochs, per_epoch, min_crop_area, flip, randaugment=None, aug_repeats=0):
    """The training examples of `epochs`, one epoch after another, the first `per_epoch` of each (None: all).

    Arrays and folders take `keras_vit.data.array_batches`' order, crop boxes and
    flips: the same draws for `(seed, epoch, example)`. A folder's examples
    are file names until the step, which reads the file and decodes only its
    crop window; a file that cannot be decoded is skipped with a note, the
    next example of the order taking its place, as the numpy pipeline does.
    A per-example policy (`randaugment`: a `keras_vit.data.randaugment.RandAugment` or
    `three_augment.ThreeAugment`) follows the crop and flip. `aug_repeats` is timm's repeated
    augmentation (`array_batches.example_order`). A
    tensorflow-datasets split is shuffled in a buffer of 10,000 examples (each example repeated in a row with
    `aug_repeats`); where it stores image files
    (`Source.encoded`), only each crop window is decoded, as from a folder.
    """
    area_range = (min_crop_area, 1.0)

    def seeds(epoch, position):
        """The crop's and the flip's seed pairs, as `array_batches` keys them."""
        first = tf.constant(int(seed) * array_batches.EPOCH_STRIDE, tf.int64) + tf.cast(epoch, tf.int64)
        key = tf.stack([first, position])
        return key, key + tf.constant([0, array_batches.FLIP_OFFSET], tf.int64)

    def finish(epoch, position, image, label):
        if flip:
            image = tf.image.stateless_random_flip_left_right(image, seeds(epoch, position)[1])
        if randaugment is not None:
            image = randaugment_step(randaugment, image, seed, epoch, position)
        return tf.ensure_shape(image, (*size, 3)), label

    if source.examples is None:
        dataset = None
        stream, crop = ((source.dataset, inception_crop) if source.encoded is None
                        else (source.encoded, decode_and_inception_crop))
        for epoch in epochs:
            shuffled = stream.shuffle(min(source.num_examples or 10_000, 10_000), reshuffle_each_iteration=False,
                                      seed=array_batches.epoch_key(seed, epoch))
            if aug_repeats:
                shuffled = shuffled.flat_map(lambda *example: tf.data.Dataset.from_tensors(example).repeat(aug_repeats))
            shuffled = shuffled.take(per_epoch or -1)
            one = shuffled.enumerate().map(lambda position, example, epoch=epoch: finish(epoch, position, crop(
                example[0], size, seeds(epoch, position)[0], area_range), example[1]),
                num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
            dataset = one if dataset is None else dataset.concatenate(one)
        return dataset

    images, labels = source.examples
    files = not isinstance(images, np.ndarray)
    count = array_batches.epoch_length(len(labels), aug_repeats)  # the epoch's order's length
    images, labels = tf.constant(images), tf.constant(labels)

    def crop(epoch, position, row):
        if files:
            return decode_and_inception_crop(tf.io.read_file(images[row]), size, seeds(epoch, position)[0], area_range)
        return inception_crop(images[row], size, seeds(epoch, position)[0], area_range)

    def epoch_examples(epoch):  # one function for every epoch, given as a tensor: traced and instantiated once
        order = example_order(len(labels), seed, epoch, aug_repeats)  # computed when the epoch starts

        def attempt(position, step):
            row = order[(position + step) % count]
            return position, row, crop(epoch, position, row)

        def first_decodable(position):  # the file at `position` of the order, else the next one that decodes
            first = tf.data.Dataset.from_tensors(position).map(lambda _: (*attempt(position, 0), True))
            # Reached only where the position's own file fails: the next files of the order, and a note.
            rest = tf.data.Dataset.range(1, count).map(lambda step: (step, *attempt(position, step)))
            rest = rest.ignore_errors().take(1).map(lambda step, *example: (*example, _note(images, tf.gather(
                order, (position + tf.range(step)) % count), "; the next example of the epoch took its place")))
            return first.ignore_errors().concatenate(rest).take(1)

        positions = tf.data.Dataset.range(per_epoch or count)
        if files:
            found = positions.interleave(first_decodable, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        else:
            found = positions.map(lambda position: (*attempt(position, 0), True), num_parallel_calls=tf.data.AUTOTUNE,
                                  deterministic=True)
        return found.map(lambda position, row, image, _: finish(epoch, position, image, labels[row]),
                         num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)

    epochs = list(epochs)
    dataset = tf.data.Dataset.from_tensor_slices(tf.constant(epochs, tf.int64)).flat_map(epoch_examples)
    # Keras counts the batches by the cardinality, which flat_map hides: without it, fit warned of running out of data.
    return dataset.apply(tf.data.experimental.assert_cardinality(len(epochs) * (per_epoch or count)))


def batched(dataset, batch_size, drop_remainder, num_classes, one_hot, augmenters, left_out=False, seed=0,
            first_epoch=0, steps_per_epoch=None):
    """Batch, then the batched steps: one-hot labels, augmenters, pixels to [-1, 1]. With `left_out`, the examples
    labelled -1 (`decoded_files`' undecodable files) are taken out of each batch, as the numpy pipeline leaves them.

    The dataset's `g`-th batch is batch `g % steps_per_epoch` of epoch `first_epoch + g // steps_per_epoch` (all of
    `first_epoch` where `steps_per_epoch` is None); that `(seed, epoch, index)` keys the draws of keras_vit's keyed
    layers (random erasing, MixUp/CutMix), run by the numpy pipeline's code (`array_batches.apply_augmenter`)
    through `tf.py_function`: the same draws on both pipelines, and in a resumed run.
    """
    check_label_mixing(augmenters, one_hot)
    dataset = dataset.batch(batch_size, drop_remainder=drop_remainder)
    if left_out:
        dataset = dataset.map(lambda x, y: (tf.boolean_mask(x, y >= 0), tf.boolean_mask(y, y >= 0)))
    if one_hot:
        dataset = dataset.map(lambda x, y: (x, tf.one_hot(y, num_classes)))
    dataset = dataset.enumerate().map(lambda g, batch: (*batch, g))
    for augmenter in augmenters:
        if getattr(augmenter, "keyed", False):
            step = keyed_augmenter(augmenter, seed, first_epoch, steps_per_epoch)
        else:
            step = (lambda apply: lambda x, y, g: (*apply(x, y), g))(apply_augmenter(augmenter))
        dataset = dataset.map(step, num_parallel_calls=tf.data.AUTOTUNE)
    dataset = dataset.map(lambda x, y, g: (value_range(x), y), num_parallel_calls=tf.data.AUTOTUNE)
    return dataset.prefetch(tf.data.AUTOTUNE)


def keyed_augmenter(augmenter, seed, first_epoch, steps_per_epoch):
    """A keyed layer's step on batch `g`: `array_batches.apply_augmenter` with the batch's key, eagerly."""

    def run(images, labels, epoch, index):
        out_images, out_labels = array_batches.apply_augmenter(
            augmenter, images.numpy(), labels.numpy(), (int(seed), int(epoch), int(index)))
        return np.asarray(out_images, "float32"), np.asarray(out_labels, labels.dtype.as_numpy_dtype)

    def step(images, labels, g):
        epoch, index = (first_epoch, g) if steps_per_epoch is None else (
            first_epoch + g // steps_per_epoch, g % steps_per_epoch)
        out_images, out_labels = tf.py_function(run, [images, labels, epoch, index], [tf.float32, labels.dtype])
        return tf.ensure_shape(out_images, images.shape), tf.ensure_shape(out_labels, labels.shape), g

    return step


def apply_augmenter(augmenter):
    """Run a Keras (or keras-cv) augmentation layer on a batch of [0, 255] images."""

    def apply(images, labels):
        if mixes_labels(augmenter):
            out = augmenter({"images": images, "labels": labels}, training=True)
            return out["images"], out["labels"]
        return augmenter(images, training=True), labels

    return apply
