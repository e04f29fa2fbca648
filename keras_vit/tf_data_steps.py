"""The tf.data steps of `keras_vit.data`'s pipeline: Inception crop, resize, [-1, 1] pixels, batching.

TensorFlow ops that run inside tf.data (`keras_vit.array_batches` computes
the same steps in numpy where TensorFlow is not installed).
"""

import tensorflow as tf

from keras_vit import preprocessing, tf_randaugment
from keras_vit.array_batches import check_label_mixing, mixes_labels




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
    """

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
        image = tf.io.decode_image(encoded, channels=3, expand_animations=False)
        begin, crop_size = crop_window(tf.shape(image), seed, area_range)
        return image[begin[0]:begin[0] + crop_size[0], begin[1]:begin[1] + crop_size[1]]

    crop = tf.cond(tf.io.is_jpeg(encoded), jpeg, other)
    return tf.image.resize(crop, size, method="bilinear")


def resize(image, size, crop_fraction=None):
    """Resize for evaluation; with `crop_fraction`, resize then take the central crop."""
    if crop_fraction:
        larger = [int(round(s / crop_fraction)) for s in size]
        image = tf.image.resize(image, larger, method="bilinear")
        top, left = (larger[0] - size[0]) // 2, (larger[1] - size[1]) // 2
        return image[top : top + size[0], left : left + size[1]]
    return tf.image.resize(image, size, method="bilinear")


def eval_step(image, transform):
    """A `keras_vit.preprocessing.EvalTransform` in a tf.data map: `tf.image.resize` where it computes it, else
    the transform's Pillow resize and crop through `tf.numpy_function`. Float pixels in [0, 255]."""
    if transform.computed_by_tf_image_resize:
        fraction = transform.crop_fraction if transform.crop_fraction < 1.0 else None
        return resize(image, transform.image_size, fraction)
    pixels = tf.numpy_function(lambda array: transform.pixels(array).astype("float32"), [image], tf.float32)
    return tf.reshape(pixels, (*transform.image_size, 3))


def value_range(image, low=-1.0, high=1.0):
    """Map [0, 255] pixels to [low, high]."""
    return tf.cast(image, "float32") / 255.0 * (high - low) + low


def examples(source, size, training, seed, epoch, crop_fraction, min_crop_area, flip, eval_transform=None,
             randaugment=None):
    """Per-example preprocessing: uint8 images of `size` (not yet scaled) and labels.

    Training applies `randaugment` (a `keras_vit.randaugment.RandAugment`) after the crop and flip, keyed by
    `(seed, epoch, example)` as the numpy pipeline keys it.
    """
    dataset = source.dataset
    if not training:
        transform = (eval_transform or preprocessing.keras_vit(crop_fraction)).fitted_to(size)
        return dataset.map(lambda image, label: (tf.ensure_shape(eval_step(image, transform), (*size, 3)), label),
                           num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    epoch_seed = int(seed) * 1_000_003 + int(epoch)
    # A folder's training examples are file names until the step: each reads its file and decodes its crop window.
    files = source.files is not None
    dataset = source.files if files else dataset
    dataset = dataset.shuffle(
        min(source.num_examples or 10_000, 10_000), seed=epoch_seed, reshuffle_each_iteration=False
    )

    def train_step(index, example):
        image, label = example
        key = tf.stack([tf.constant(epoch_seed, tf.int64), index])
        crop_seed, flip_seed = key, key + tf.constant([0, 1 << 40], tf.int64)
        if files:
            image = decode_and_inception_crop(tf.io.read_file(image), size, crop_seed, (min_crop_area, 1.0))
        else:
            image = inception_crop(image, size, crop_seed, area_range=(min_crop_area, 1.0))
        if flip:
            image = tf.image.stateless_random_flip_left_right(image, flip_seed)
        if randaugment is not None:
            image = tf_randaugment.apply(randaugment, tf.ensure_shape(image, (*size, 3)), seed, epoch, index)
        return tf.ensure_shape(image, (*size, 3)), label

    return dataset.enumerate().map(train_step, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def batched(dataset, batch_size, drop_remainder, num_classes, one_hot, augmenters):
    """Batch, then the batched steps: one-hot labels, augmenters, pixels to [-1, 1]."""
    check_label_mixing(augmenters, one_hot)
    dataset = dataset.batch(batch_size, drop_remainder=drop_remainder)
    if one_hot:
        dataset = dataset.map(lambda x, y: (x, tf.one_hot(y, num_classes)))
    for augmenter in augmenters:
        dataset = dataset.map(apply_augmenter(augmenter), num_parallel_calls=tf.data.AUTOTUNE)
    dataset = dataset.map(lambda x, y: (value_range(x), y), num_parallel_calls=tf.data.AUTOTUNE)
    return dataset.prefetch(tf.data.AUTOTUNE)


def apply_augmenter(augmenter):
    """Run a Keras (or keras-cv) augmentation layer on a batch of [0, 255] images."""

    def apply(images, labels):
        if mixes_labels(augmenter):
            out = augmenter({"images": images, "labels": labels}, training=True)
            return out["images"], out["labels"]
        return augmenter(images, training=True), labels

    return apply
