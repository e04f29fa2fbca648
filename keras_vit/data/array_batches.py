"""Batches from arrays and image files without TensorFlow: `keras_vit.data`'s pipeline as a `keras.utils.PyDataset`.

Where TensorFlow is not installed (`pip install "keras-vision-transformer[jax]"`
or `[torch]`), `keras_vit.data.make_dataset` and `training_stream` give
these instead of tf.data. The steps are the same ones, computed in numpy,
with the same draws: the epoch's order of the examples (`example_order`), the
Inception crop's box and the flip that tf.data draws for the same `(seed,
epoch, example)` (`keras_vit.data.philox` computes TensorFlow's stateless
sampler), `keras_vit.data.arrays.resize` (tf.image.resize's bilinear, bit for
bit), keras_vit's RandAugment on each example (in the workers too), the
Keras augmentation layers on each batch, and pixels to [-1, 1]. For arrays
and PNG, GIF or BMP folders the two pipelines give the same training
batches before the Keras layers (each file decoded as `arrays.decode_image`
decodes it); JPEGs differ by a few levels (Pillow's decoder and
TensorFlow's), and MixUp and CutMix draw from their layer's own seed, the
same distribution but not the same draws. A resumed run sees the
batches an uninterrupted one would.

An image file that cannot be decoded mid-epoch is skipped with a note
naming it: in training the next example of the epoch's order takes its
place (batches stay full, and equal on both pipelines); in evaluation it is
left out.

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
>>> from keras_vit import data
>>> from keras_vit.data import arrays
>>> (x, y), _ = arrays.digits(image_size=16)
>>> images, labels = ArrayBatches(data.from_arrays(x, y), (16, 16), 32, training=True)[0]
>>> images.shape, labels.shape
((32, 16, 16, 3), (32,))
"""

import collections
import functools
import logging
import math
import mmap
import multiprocessing
import warnings
import weakref

import keras
import numpy as np

from keras_vit.data import arrays, philox, preprocessing, randaugment

logger = logging.getLogger("keras_vit")

# An example's crop is drawn from the seed pair (seed * EPOCH_STRIDE + epoch, its position in the epoch), its flip
# from the same pair with FLIP_OFFSET added to the position, on both pipelines.
EPOCH_STRIDE, FLIP_OFFSET = 1_000_003, 1 << 40
ORDER_DOMAIN = 0x4F524452  # "ORDR": the order's hash differs from RandAugment's draws for the same key
SKIPPED = "note: skipped {}, which cannot be decoded as an image"


def epoch_key(seed, epoch):
    """The first half of the seed pairs of epoch `epoch`'s crops and flips."""
    return int(seed) * EPOCH_STRIDE + int(epoch)


REPEATED_ROUND = 256  # timm's RepeatAugSampler keeps whole multiples of 256 examples an epoch


def epoch_length(count, aug_repeats=0):
    """Examples in a training epoch of `count`: all of them, or with timm's repeated augmentation (`aug_repeats`,
    `--aug-repeats`) its `RepeatAugSampler`'s `count // 256 * 256` where there are 256 or more."""
    return count // REPEATED_ROUND * REPEATED_ROUND if aug_repeats and count >= REPEATED_ROUND else count


@functools.lru_cache(maxsize=4)
def example_order(count, seed, epoch, aug_repeats=0):
    """Epoch `epoch`'s order of `count` examples: sorted by a 64-bit hash of `(seed, epoch, example)` (SplitMix64,
    `keras_vit.data.randaugment.mix`), which tf.data computes alike (`keras_vit.data.tf_data_steps.example_order`). Read-only.

    With `aug_repeats` (timm's repeated augmentation, DeiT's), each example of
    that order comes `aug_repeats` times in a row, each time at a position of its
    own and so with a crop and augmentations of its own, and the epoch is cut to
    `epoch_length` examples, as timm's `RepeatAugSampler` cuts it.
    """
    state = np.uint64(randaugment.epoch_state(seed, epoch, ORDER_DOMAIN))
    order = np.argsort(randaugment.mix(state ^ np.arange(count, dtype="uint64")).view("int64"), kind="stable")
    order = repeated(order, aug_repeats)
    order.flags.writeable = False
    return order


def repeated(order, aug_repeats=0):
    """`order` with each example `aug_repeats` times in a row, cut to `epoch_length`, as timm's `RepeatAugSampler`
    lays out its permutation on one replica; `order` itself where `aug_repeats` is 0."""
    if not aug_repeats:
        return order
    return np.repeat(order, aug_repeats)[:epoch_length(len(order), aug_repeats)]


class ArrayBatches(keras.utils.PyDataset):
    """One pass over a `keras_vit.data.Source` that holds arrays or files, in batches of `(images, labels)`.

    The arguments are `keras_vit.data.make_dataset`'s; `images_only` drops
    the labels. Training shuffles by `(seed, epoch)`; evaluation keeps the
    source's order and applies `eval_transform` (a `keras_vit.data.preprocessing.EvalTransform`; by default
    keras_vit's own resize, with `crop_fraction` then a centre crop).
    """

    def __init__(self, source, size, batch_size, training, seed=0, epoch=0, crop_fraction=None, augmenters=(),
                 num_classes=None, one_hot=False, drop_remainder=None, min_crop_area=0.05, flip=True,
                 images_only=False, eval_transform=None, randaugment=None, aug_repeats=0):
        super().__init__()
        check_label_mixing(augmenters, one_hot)
        # A per-example policy (keras_vit.data.randaugment.RandAugment or three_augment.ThreeAugment), after the flip.
        self.randaugment = randaugment
        self.aug_repeats = int(aug_repeats or 0) if training else 0
        # Evaluation: the model's checkpoint's preprocessing, else keras_vit's own resize (and crop_fraction).
        self.eval_transform = (eval_transform or preprocessing.keras_vit(crop_fraction)).fitted_to(size)
        self.images, self.labels = source.examples
        self.size, self.batch_size, self.training = tuple(size), int(batch_size), training
        self.key = (int(seed), int(epoch))
        self.augmenters, self.min_crop_area, self.flip = augmenters, min_crop_area, flip
        self.num_classes, self.one_hot, self.images_only = num_classes or source.num_classes, one_hot, images_only
        self.count = epoch_length(len(self.labels), self.aug_repeats)
        drop = training if drop_remainder is None else drop_remainder
        self.batches = self.count // self.batch_size if drop else math.ceil(self.count / self.batch_size)

    @property
    def order(self):
        """The source rows in this pass's order: `example_order` in training, the source's in evaluation."""
        count = len(self.labels)
        return example_order(count, *self.key, self.aug_repeats) if self.training else np.arange(count)

    def __len__(self):
        return self.batches

    def __getitem__(self, index):
        return self.finish(*self.examples_of(index), index)

    @property
    def pixel_dtype(self):
        """The dtype of `examples_of`'s pixels: RandAugment's uint8 in training with it, else float32."""
        return np.dtype("uint8" if self.training and self.randaugment is not None else "float32")

    def examples_of(self, index):
        """Batch `index` before the batched steps: pixels in [0, 255] of `size` (`pixel_dtype`), and labels."""
        if not 0 <= index < self.batches:
            raise IndexError(f"batch {index} of {self.batches}")
        positions = range(index * self.batch_size, min((index + 1) * self.batch_size, self.count))
        examples = [self.example(position) for position in positions]
        examples = [example for example in examples if example is not None]  # evaluation leaves out broken files
        if not examples and positions:  # a batch of no rows, whose loss Keras' mean makes NaN for the whole pass
            raise ValueError(f"No image of evaluation batch {index} can be decoded "
                             f"({', '.join(str(self.images[position]) for position in positions)}); remove them "
                             "from the set.")
        images = np.stack([image for image, _ in examples])
        labels = self.labels[[row for _, row in examples]]
        if self.one_hot:
            labels = np.eye(self.num_classes, dtype="float32")[labels]
        return images, labels

    def finish(self, images, labels, index=None):
        """The batched steps on `examples_of`'s batch `index`: the augmenters (keyed by `(seed, epoch, index)` in
        training), then pixels to [-1, 1]."""
        key = (*self.key, int(index)) if self.training and index is not None else None
        for augmenter in self.augmenters:
            images, labels = apply_augmenter(augmenter, np.asarray(images, "float32"), labels, key)
        # In place where the batch is a float32 array of its own.
        images = arrays.minus_one_to_one(images, overwrite=images.dtype == np.float32 and images.flags.writeable)
        return (images,) if self.images_only else (images, labels)

    def example(self, position):
        """The `position`-th example of this pass as `(pixels in [0, 255] of size, its source row)`; None in
        evaluation for a file that cannot be decoded."""
        if not self.training:
            try:
                image = self.images[position] if self.in_memory else arrays.open_rgb(self.images[position])
            except arrays.UndecodableImage as error:
                logger.warning("%s (%s); left out of the evaluation", SKIPPED.format(error.path), error.reason)
                return None
            return self.eval_transform.pixels(image), position
        image, row = self.decodable(position)
        top, left, height, width = philox.sample_crop(*image.shape[:2], (epoch_key(*self.key), position),
                                                      (self.min_crop_area, 1.0))
        flip = self.flip and philox.stateless_uniform((epoch_key(*self.key), position + FLIP_OFFSET)) < 0.5
        image = arrays.resize(image[top:top + height, left:left + width], self.size, mirror=flip)
        return (image if self.randaugment is None else self.randaugment.apply(image, *self.key, position)), row

    @property
    def in_memory(self):
        return isinstance(self.images, np.ndarray)

    def decodable(self, position):
        """`(pixels, row)` of the training example at `position`: its row in the order, or where that file cannot be
        decoded, the next row in the order that can (a note names each file skipped), as tf.data picks it."""
        order = self.order
        for step in range(len(order)):
            row = int(order[(position + step) % len(order)])
            if self.in_memory:
                return self.images[row], row
            try:
                return arrays.decode_image(self.images[row]), row
            except arrays.UndecodableImage as error:
                logger.warning("%s (%s); the next example of the epoch took its place", SKIPPED.format(error.path),
                               error.reason)
        raise ValueError(f"None of the {len(order)} image files can be decoded; the first is {self.images[0]}.")


def mixes_labels(augmenter):
    """Whether a Keras augmentation layer mixes labels as well as images (MixUp, CutMix)."""
    return type(augmenter).__name__ in ("MixUp", "CutMix", "MixUpCutMix")


def check_label_mixing(augmenters, one_hot):
    """Refuse MixUp and CutMix on integer labels: Keras' layers mix one-hot labels, and would mix integer ones
    into a `(batch, batch)` matrix."""
    for augmenter in augmenters:
        if mixes_labels(augmenter) and not one_hot:
            raise ValueError(f"{type(augmenter).__name__} mixes one-hot labels, but one_hot=False gives integer labels "
                             "(mixed into a (batch, batch) matrix): pass one_hot=True, with a categorical loss.")


def apply_augmenter(augmenter, images, labels, key=None):
    """A Keras augmentation layer on a numpy batch of [0, 255] images (MixUp and CutMix mix the labels too).

    keras_vit's random erasing and MixUp/CutMix (`keyed` layers) draw from the batch's `(seed, epoch, index)`
    `key` where one is given, not from their seed generator's state, which a resumed run would start afresh:
    tf.data applies them here too (`tf_data_steps.batched`).
    """
    if key is not None and getattr(augmenter, "keyed", False):
        mixes = mixes_labels(augmenter)
        transformation = augmenter.get_random_transformation(
            {"images": images, "labels": labels} if mixes else images, training=True, seed=tuple(key))
        images = keras.ops.convert_to_numpy(augmenter.transform_images(images, transformation, training=True))
        if mixes:
            labels = keras.ops.convert_to_numpy(augmenter.transform_labels(labels, transformation, training=True))
        return images, labels
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
    dtype = passes[0].pixel_dtype  # uint8 after RandAugment: a quarter of float32's bytes
    ring = mmap.mmap(-1, slots * batch_size * size[0] * size[1] * 3 * dtype.itemsize)
    buffers = np.frombuffer(ring, dtype).reshape(slots, batch_size, *size, 3)
    plain = [ArrayBatches(source, size, batch_size, True, seed, batches.key[1], drop_remainder=True,
                          **dict(options, augmenters=())) for batches in passes]
    with warnings.catch_warnings():
        # JAX warns of any fork; these workers run numpy and Pillow only, never a JAX (or TensorFlow) op.
        warnings.filterwarnings("ignore", "os.fork", RuntimeWarning)
        pool = multiprocessing.get_context("fork").Pool(workers, initializer=_start_worker, initargs=(plain, buffers))
    # A stream dropped unfinished (a script's global) is closed only while the interpreter tears its modules down,
    # too late for `pool.terminate` (its modules are gone; the pool's own `__del__` then fails, and both printed
    # "Exception ignored" after a successful run): `weakref.finalize` stops the pool at exit, before that, once.
    stop = weakref.finalize(pool, pool.terminate)
    try:
        pending = collections.deque()
        for position, (number, index) in enumerate(keys):
            slot = position % slots
            pending.append((number, index, slot, pool.apply_async(_worker_examples, (number, index, slot))))
            if len(pending) == slots - 1:
                yield _read(passes, buffers, *pending.popleft())
        while pending:
            yield _read(passes, buffers, *pending.popleft())
    finally:
        stop()


def _read(passes, buffers, number, index, slot, result):
    """A worker's batch, once it is done: its pixels copied out of the ring, then the batched steps."""
    labels = result.get()  # first: the slot holds the pixels only once the worker has returned
    return passes[number].finish(buffers[slot].copy(), labels, index)


_WORKER_PASSES, _WORKER_BUFFERS = None, None  # a worker process's `ArrayBatches` (one per epoch), the ring


def _start_worker(passes, buffers):
    global _WORKER_PASSES, _WORKER_BUFFERS
    _WORKER_PASSES, _WORKER_BUFFERS = passes, buffers


def _worker_examples(number, index, slot):
    """Batch `index` of pass `number`: its pixels written into the ring's `slot`, its labels returned."""
    images, labels = _WORKER_PASSES[number].examples_of(index)
    _WORKER_BUFFERS[slot] = images
    return labels
