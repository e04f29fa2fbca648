"""Batches from arrays and image files without TensorFlow: `keras_vit.data`'s pipeline as a `keras.utils.PyDataset`.

Where TensorFlow is not installed (`pip install "keras-vision-transformer[jax]"`
or `[torch]`), `keras_vit.data.make_dataset` and `training_stream` give
these instead of tf.data. The steps are the same ones, computed in numpy:
an Inception crop sampled as `tf.image.sample_distorted_bounding_box`
samples it (a uniform aspect ratio, then a uniform height, up to 100
attempts, else the whole image), a horizontal flip with probability 1/2,
`keras_vit.arrays.resize`, keras_vit's RandAugment on each example (in the
workers too), the Keras augmentation layers on each batch, and pixels to
[-1, 1]. Randomness is keyed by `(seed, epoch, example)`, so a resumed run
sees the batches an uninterrupted one would.

`training_batches(..., workers=N)` decodes and crops in N worker processes
(a forked `multiprocessing` pool, in batch order with a bounded look-ahead,
writing pixels into memory shared with the caller) and applies the batched
Keras layers (MixUp, CutMix) in the calling process, in order, so the
batches are the ones a single process gives.
Not `keras.utils.PyDataset`'s `workers`: its enqueuer runs the whole
`__getitem__` in the workers, so the Keras layers would run backend ops in
forked processes (JAX and TensorFlow are not fork-safe) and each worker would
draw from its own copy of a layer's seed, and a finite dataset's enqueuer
restarts at batch 0 every epoch, where this stream spans all epochs. Nor
Grain: the same ordered pool, for one more dependency.

Example:
>>> from keras_vit import arrays, data
>>> (x, y), _ = arrays.digits(image_size=16)
>>> images, labels = ArrayBatches(data.from_arrays(x, y), (16, 16), 32, training=True)[0]
>>> images.shape, labels.shape
((32, 16, 16, 3), (32,))
"""

import collections
import math
import mmap
import multiprocessing
import sys
import warnings

import keras
import numpy as np

from keras_vit import arrays, preprocessing


def sample_crop(height, width, rng, area_range=(0.05, 1.0), aspect_range=(3 / 4, 4 / 3), max_attempts=100):
    """`(top, left, crop_height, crop_width)` as TensorFlow's `sample_distorted_bounding_box` samples it."""
    min_area, max_area = area_range[0] * height * width, area_range[1] * height * width
    for _ in range(max_attempts):
        aspect = rng.uniform(*aspect_range)
        low = int(np.rint(math.sqrt(min_area / aspect)))
        high = int(np.rint(math.sqrt(max_area / aspect)))
        if np.rint(high * aspect) > width:
            high = int((width + 0.5 - 1e-7) / aspect)
            high -= int(np.rint(high * aspect) > width)
        high = min(high, height)
        low = min(low, high)
        crop_height = low + (int(rng.integers(0, high - low + 1)) if low < high else 0)
        crop_width = int(np.rint(crop_height * aspect))
        if crop_width * crop_height < min_area:
            crop_height += 1
            crop_width = int(np.rint(crop_height * aspect))
        if crop_width * crop_height > max_area:
            crop_height -= 1
            crop_width = int(np.rint(crop_height * aspect))
        area = crop_width * crop_height
        if min_area <= area <= max_area and 0 < crop_width <= width and 0 < crop_height <= height:
            # TensorFlow draws the offset from [0, room), never the last position (unless there is no room).
            top = int(rng.integers(0, height - crop_height)) if crop_height < height else 0
            left = int(rng.integers(0, width - crop_width)) if crop_width < width else 0
            return top, left, crop_height, crop_width
    return 0, 0, height, width


class ArrayBatches(keras.utils.PyDataset):
    """One pass over a `keras_vit.data.Source` that holds arrays or files, in batches of `(images, labels)`.

    The arguments are `keras_vit.data.make_dataset`'s; `images_only` drops
    the labels. Training shuffles by `(seed, epoch)`; evaluation keeps the
    source's order and applies `eval_transform` (a `keras_vit.preprocessing.EvalTransform`; by default
    keras_vit's own resize, with `crop_fraction` then a centre crop).
    """

    def __init__(self, source, size, batch_size, training, seed=0, epoch=0, crop_fraction=None, augmenters=(),
                 num_classes=None, one_hot=False, drop_remainder=None, min_crop_area=0.05, flip=True,
                 images_only=False, eval_transform=None, randaugment=None):
        super().__init__()
        check_label_mixing(augmenters, one_hot)
        self.randaugment = randaugment  # a keras_vit.randaugment.RandAugment, applied per example after the flip
        # Evaluation: the model's checkpoint's preprocessing, else keras_vit's own resize (and crop_fraction).
        self.eval_transform = (eval_transform or preprocessing.keras_vit(crop_fraction)).fitted_to(size)
        self.images, self.labels = source.examples
        self.size, self.batch_size, self.training = tuple(size), int(batch_size), training
        self.key = (int(seed), int(epoch))
        self.crop_fraction, self.augmenters, self.min_crop_area, self.flip = crop_fraction, augmenters, min_crop_area, flip
        self.num_classes, self.one_hot, self.images_only = num_classes or source.num_classes, one_hot, images_only
        count = len(self.labels)
        self.order = np.random.default_rng(self.key).permutation(count) if training else np.arange(count)
        drop = training if drop_remainder is None else drop_remainder
        self.batches = count // self.batch_size if drop else math.ceil(count / self.batch_size)

    def __len__(self):
        return self.batches

    def __getitem__(self, index):
        return self.finish(*self.examples_of(index))

    def examples_of(self, index):
        """Batch `index` before the batched steps: float pixels in [0, 255] of `size`, and labels."""
        if not 0 <= index < self.batches:
            raise IndexError(f"batch {index} of {self.batches}")
        rows = self.order[index * self.batch_size:(index + 1) * self.batch_size]
        images = np.stack([self.example(position, row) for position, row in
                           zip(range(index * self.batch_size, index * self.batch_size + len(rows)), rows)])
        labels = self.labels[rows]
        if self.one_hot:
            labels = np.eye(self.num_classes, dtype="float32")[labels]
        return images, labels

    def finish(self, images, labels):
        """The batched steps on `examples_of`'s batch: the augmenters, then pixels to [-1, 1]."""
        for augmenter in self.augmenters:
            images, labels = apply_augmenter(augmenter, images, labels)
        images = np.asarray(images, "float32") / 127.5 - 1.0
        return (images,) if self.images_only else (images, labels)

    def example(self, position, row):
        """The `position`-th example of this pass (source row `row`), as float pixels in [0, 255] of `size`."""
        if not self.training:
            image = self.images[row] if isinstance(self.images, np.ndarray) else arrays.open_rgb(self.images[row])
            return self.eval_transform.pixels(image)
        image = self.images[row] if isinstance(self.images, np.ndarray) else arrays.decode_image(self.images[row])
        rng = np.random.default_rng((*self.key, int(position)))
        top, left, height, width = sample_crop(image.shape[0], image.shape[1], rng, (self.min_crop_area, 1.0))
        image = arrays.resize(image[top:top + height, left:left + width], self.size)
        image = image[:, ::-1] if self.flip and rng.uniform() < 0.5 else image
        return image if self.randaugment is None else self.randaugment.apply(image, *self.key, position)


def mixes_labels(augmenter):
    """Whether a Keras augmentation layer mixes labels as well as images (MixUp, CutMix)."""
    return type(augmenter).__name__ in ("MixUp", "CutMix")


def check_label_mixing(augmenters, one_hot):
    """Refuse MixUp and CutMix on integer labels: Keras' layers mix one-hot labels, and would mix integer ones
    into a `(batch, batch)` matrix."""
    for augmenter in augmenters:
        if mixes_labels(augmenter) and not one_hot:
            raise ValueError(f"{type(augmenter).__name__} mixes one-hot labels, but one_hot=False gives integer labels "
                             "(mixed into a (batch, batch) matrix): pass one_hot=True, with a categorical loss.")


def apply_augmenter(augmenter, images, labels):
    """A Keras augmentation layer on a numpy batch of [0, 255] images (MixUp and CutMix mix the labels too)."""
    if mixes_labels(augmenter):
        out = augmenter({"images": images, "labels": labels}, training=True)
        return keras.ops.convert_to_numpy(out["images"]), keras.ops.convert_to_numpy(out["labels"])
    return keras.ops.convert_to_numpy(augmenter(images, training=True)), labels


def training_batches(source, size, batch_size, epochs, initial_epoch=0, seed=0, workers=0, **options):
    """Epochs `initial_epoch .. epochs-1` of `ArrayBatches`, one batch after another, as one generator.

    With `workers`, that many processes decode and crop ahead of the caller,
    which gets the same batches in the same order.
    """
    passes = [ArrayBatches(source, size, batch_size, True, seed, epoch, drop_remainder=True, **options)
              for epoch in range(initial_epoch, epochs)]  # made here, so that bad options fail at the call
    return _batches(passes, source, size, batch_size, seed, workers, options)


def _batches(passes, source, size, batch_size, seed, workers, options):
    """`training_batches`' generator."""
    keys = [(number, index) for number, batches in enumerate(passes) for index in range(len(batches))]
    if not workers or "fork" not in multiprocessing.get_all_start_methods():  # the workers share memory by forking
        for number, index in keys:
            yield passes[number][index]
        return
    # The workers get the passes without the Keras layers, which run here, batch after batch. They write the
    # pixels into a ring of batch-sized slots of memory shared with this process (pickling a batch of 224-px
    # float pixels through a pipe costs about what decoding it does), one slot for each batch in flight.
    slots = workers + 2  # a bounded look-ahead: a batch a worker, the next one queued, and the one read here
    ring = mmap.mmap(-1, slots * batch_size * size[0] * size[1] * 3 * 4)
    buffers = np.frombuffer(ring, "float32").reshape(slots, batch_size, *size, 3)
    plain = [ArrayBatches(source, size, batch_size, True, seed, batches.key[1], drop_remainder=True,
                          **dict(options, augmenters=())) for batches in passes]
    with warnings.catch_warnings():
        # JAX warns of any fork; these workers run numpy and Pillow only, never a JAX (or TensorFlow) op.
        warnings.filterwarnings("ignore", "os.fork", RuntimeWarning)
        pool = multiprocessing.get_context("fork").Pool(workers, initializer=_start_worker, initargs=(plain, buffers))
    try:
        pending = collections.deque()
        for position, (number, index) in enumerate(keys):
            slot = position % slots
            pending.append((number, slot, pool.apply_async(_worker_examples, (number, index, slot))))
            if len(pending) == slots - 1:
                yield _read(passes, buffers, *pending.popleft())
        while pending:
            yield _read(passes, buffers, *pending.popleft())
    finally:
        if not sys.is_finalizing():  # at exit, multiprocessing has stopped the pool itself
            pool.terminate()


def _read(passes, buffers, number, slot, result):
    """A worker's batch, once it is done: its pixels copied out of the ring, then the batched steps."""
    labels = result.get()  # first: the slot holds the pixels only once the worker has returned
    return passes[number].finish(buffers[slot].copy(), labels)


_WORKER_PASSES, _WORKER_BUFFERS = None, None  # a worker process's `ArrayBatches` (one per epoch), the ring


def _start_worker(passes, buffers):
    global _WORKER_PASSES, _WORKER_BUFFERS
    _WORKER_PASSES, _WORKER_BUFFERS = passes, buffers


def _worker_examples(number, index, slot):
    """Batch `index` of pass `number`: its pixels written into the ring's `slot`, its labels returned."""
    images, labels = _WORKER_PASSES[number].examples_of(index)
    _WORKER_BUFFERS[slot] = images
    return labels
