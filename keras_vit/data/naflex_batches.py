"""NaFlex batches from a `keras_vit.data.Source`: `NaFlexBatches` (training), `NaFlexEvaluationBatches`, PyDatasets.

timm's NaFlex loader, in keras_vit's pipeline: every training batch draws
one sequence length from `seq_lens` (and, with `patch_sizes`, one patch
size, FlexiViT-style), holds `max_tokens // seq_len` images, so that every
batch costs about the same, and each image keeps its aspect ratio: an
Inception crop and a flip (the draws of `keras_vit.data.array_batches` for
the same `(seed, epoch, example)`), then `naflex_batch`'s resize to the
largest grid within the sequence length. A batch is padded to exactly its
sequence length, so XLA compiles one program per (sequence length, patch
size, batch size): one per bucket. `loss_scale` weighs every image of a
batch by its batch size over the smallest batch's (`"linear"`, or its
`"sqrt"`), timm's `--naflex-loss-scale`, handed to `model.fit` as sample
weights. `as_tf_dataset` hands the same batches to tf.data (for
`TPUStrategy`).

`NaFlexEvaluationBatches` is evaluation's pass: each example whole, keeping
its aspect ratio, with as many patches as the budget allows; the examples
grouped by the bucket their patch count pads to, in batches of
`batch_size` of one sequence length. A bucket's last batch holds only its
remaining examples (no filler rows, which Keras' `metrics` and the loss's
mean would count), so each bucket compiles at most two steps: its full
batch and its remainder. Its batches are `(naflex batch, labels (one-hot
with one_hot=True))`; an image file that cannot be decoded is left out of
its batch, with a note naming it (a batch none of whose files decode is
refused: Keras' loss would be NaN).

Example:
>>> from keras_vit import data
>>> (x, y), _ = data.digits(image_size=32)
>>> batches = NaFlexBatches(data.from_arrays(x, y), patch_size=4, seq_lens=(16, 32), max_tokens=256)
>>> inputs, labels = batches[0]
>>> sorted(inputs), inputs["patches"].shape[1] in (16, 32)
(['patch_grid', 'patch_mask', 'patches'], True)
>>> images, labels = np.zeros((3, 40, 60, 3), "uint8"), np.array([0, 1, 1])
>>> x, y = NaFlexEvaluationBatches(data.from_arrays(images, labels), 4, batch_size=2)[1]
>>> x["patches"].shape, x["patch_grid"].tolist(), y.tolist()
((1, 256, 48), [[13, 19]], [1])
"""

import collections
import logging
import math

import keras
import numpy as np

from keras_vit.data import arrays, philox
from keras_vit.data.array_batches import FLIP_OFFSET, SKIPPED, epoch_key, example_order
from keras_vit.data.naflex import bucket_length, naflex_batch, naflex_image_size, naflex_preprocessing, \
    sequence_lengths

logger = logging.getLogger("keras_vit")

LOSS_SCALES = ("none", "linear", "sqrt")
PLAN_OFFSET = 1 << 41  # a batch's sequence length and patch size are drawn from (epoch key, PLAN_OFFSET + batch)


class NaFlexBatches(keras.utils.PyDataset):
    """One training pass over `source` (arrays or image files) in NaFlex batches `(inputs, labels[, weights])`.

    Args:
        source: a `keras_vit.data.Source` that keeps `examples` (arrays, folders).
        patch_size: the pixels of one patch; `patch_sizes` draws one per training batch instead.
        seq_lens: the sequence lengths (buckets) a batch draws from.
        max_tokens: patches per batch (`batch size = max_tokens // seq_len`).
        seed, epoch: the key of every draw; a resumed run sees the batches an uninterrupted one would.
        rule, interpolation: `naflex_batch`'s resize (default timm's rule and its bicubic filter).
        min_crop_area, flip: the Inception crop's smallest area and the random horizontal flip.
        loss_scale: `"none"`, `"linear"` or `"sqrt"` (timm's `--naflex-loss-scale`): yields sample weights.
        one_hot, num_classes: labels as one-hot rows.
    """

    def __init__(self, source, patch_size=16, seq_lens=(128, 256, 576), max_tokens=4096, seed=0, epoch=0,
                 rule="timm", interpolation=None, min_crop_area=0.08, flip=True,
                 loss_scale="none", patch_sizes=None, one_hot=False, num_classes=None):
        super().__init__()
        if source.examples is None:
            raise ValueError(f"NaFlex batches read arrays or image folders; {source.name or 'this source'} keeps "
                             "no examples (a tensorflow-datasets split): use keras_vit.data.from_folder or from_arrays.")
        if loss_scale not in LOSS_SCALES:
            raise ValueError(f"Unknown loss_scale {loss_scale!r}; expected one of {LOSS_SCALES}.")
        self.seq_lens = tuple(sorted(int(length) for length in seq_lens))
        self.patch_sizes = tuple(int(size) for size in (patch_sizes or (patch_size,)))
        if not self.seq_lens or min(self.seq_lens) < 1 or min(self.patch_sizes) < 1:
            raise ValueError(f"seq_lens {tuple(seq_lens)} and patch sizes {self.patch_sizes} must be positive.")
        if max_tokens < max(self.seq_lens):
            raise ValueError(f"max_tokens {max_tokens} holds no image of the longest sequence {max(self.seq_lens)}; "
                             f"pass max_tokens={max(self.seq_lens)} or more.")
        self.images, self.labels = source.examples
        self.patch_size, self.max_tokens = int(patch_size), int(max_tokens)
        self.key = (int(seed), int(epoch))
        self.rule, self.interpolation = rule, interpolation
        self.min_crop_area, self.flip, self.loss_scale = min_crop_area, flip, loss_scale
        self.one_hot, self.num_classes = one_hot, num_classes or source.num_classes
        self.plan = self._plan()

    def _draw(self, batch, choices, offset):
        draw = philox.stateless_uniform((epoch_key(*self.key), PLAN_OFFSET + 2 * batch + offset))
        return choices[min(int(draw * len(choices)), len(choices) - 1)]

    def _plan(self):
        """`(first example, count, sequence length, patch size)` of every batch of this pass."""
        count, plan, start = len(self.labels), [], 0
        while True:
            length = self._draw(len(plan), self.seq_lens, 0)
            size = self.max_tokens // length
            if start + size > count:  # the epoch's remainder is dropped, as a training pass drops it
                return plan
            plan.append((start, size, length, self._draw(len(plan), self.patch_sizes, 1)))
            start += size

    def __len__(self):
        return len(self.plan)

    @property
    def smallest_batch(self):
        return self.max_tokens // max(self.seq_lens)

    def __getitem__(self, index):
        if not 0 <= index < len(self.plan):
            raise IndexError(f"batch {index} of {len(self.plan)}")
        start, count, length, patch = self.plan[index]
        examples = [self.example(position) for position in range(start, start + count)]
        examples = [example for example in examples if example is not None]
        batch = naflex_batch([image for image, _ in examples], patch, length, self.rule, self.interpolation,
                             buckets=())
        labels = self.labels[[row for _, row in examples]]
        if self.one_hot:
            labels = np.eye(self.num_classes, dtype="float32")[labels]
        if self.loss_scale == "none":
            return batch, labels
        scale = len(examples) / self.smallest_batch
        scale = math.sqrt(scale) if self.loss_scale == "sqrt" else scale
        return batch, labels, np.full(len(examples), scale, "float32")

    def example(self, position):
        """`(uint8 pixels, source row)` of the `position`-th example of this pass: its crop and flip."""
        order = example_order(len(self.labels), *self.key)
        row = int(order[position])
        image = self.images[row] if self.in_memory else arrays.decode_image(self.images[row])
        top, left, height, width = philox.sample_crop(*image.shape[:2], (epoch_key(*self.key), position),
                                                      (self.min_crop_area, 1.0))
        crop = image[top:top + height, left:left + width]
        if self.flip and philox.stateless_uniform((epoch_key(*self.key), position + FLIP_OFFSET)) < 0.5:
            crop = crop[:, ::-1]
        return np.ascontiguousarray(crop), row

    @property
    def in_memory(self):
        return isinstance(self.images, np.ndarray)


def naflex_training_stream(source, epochs, initial_epoch=0, seed=0, **options):
    """Epochs `initial_epoch .. epochs-1` of `NaFlexBatches` as one dataset for `model.fit(steps_per_epoch=...)`.

    Returns `(dataset, steps_per_epoch)`; each epoch is drawn from `(seed, epoch)` alone, and every epoch is cut to
    the shortest epoch's number of batches, so that `fit` sees the same number of steps in each.
    """
    passes = [NaFlexBatches(source, seed=seed, epoch=epoch, **options)
              for epoch in range(initial_epoch, epochs)]
    steps = min(len(batches) for batches in passes)
    if steps < 1:
        raise ValueError(f"{len(source.examples[1])} examples fill no NaFlex batch of "
                         f"{options.get('max_tokens', 4096)} tokens; lower max_tokens.")
    return _Concatenated(passes, steps), steps


def as_tf_dataset(batches):
    """`batches` (`NaFlexBatches` or `naflex_training_stream`'s) as a prefetched `tf.data.Dataset`, for
    `tf.distribute` strategies (TPUStrategy) that take tf.data only: the same batches, in order, with the batch
    and sequence axes left unknown so that one signature holds every bucket."""
    import tensorflow as tf

    first = batches[0]
    inputs = {"patches": tf.TensorSpec((None, None, None), tf.float32),
              "patch_grid": tf.TensorSpec((None, 2), tf.int32), "patch_mask": tf.TensorSpec((None, None), tf.bool)}
    rest = tuple(tf.TensorSpec((None, *np.shape(part)[1:]), tf.as_dtype(np.asarray(part).dtype))
                 for part in first[1:])
    return tf.data.Dataset.from_generator(lambda: (batches[i] for i in range(len(batches))),
                                          output_signature=(inputs, *rest)).prefetch(2)


class _Concatenated(keras.utils.PyDataset):
    def __init__(self, passes, steps):
        super().__init__()
        self.passes, self.steps = passes, steps

    def __len__(self):
        return self.steps * len(self.passes)

    def __getitem__(self, index):
        return self.passes[index // self.steps][index % self.steps]


class NaFlexEvaluationBatches(keras.utils.PyDataset):
    """One evaluation pass over a `keras_vit.data.Source` of arrays or files, as NaFlex batches (the module's).

    `preprocessing` is `naflex_batch`'s keywords (`{"rule", "max_patches",
    "interpolation"}`, a NaFlex model's `naflex_preprocessing`; None:
    keras_vit's own); `buckets` as `naflex_batch`'s.
    """

    def __init__(self, source, patch_size, batch_size, preprocessing=None, buckets=None, num_classes=None,
                 one_hot=False):
        super().__init__()
        if source.examples is None:
            raise ValueError(f"NaFlex evaluation reads arrays and image folders; {source.name!r} is a "
                             "tensorflow-datasets split: save its images into a folder of class sub-folders.")
        self.images, self.labels = source.examples
        if batch_size < 1:
            raise ValueError(f"eval_batch_size must be at least 1, got {batch_size}.")
        self.patch_size, self.batch_size = patch_size, int(batch_size)
        self.preprocessing = naflex_preprocessing(preprocessing)
        self.buckets = sequence_lengths(self.preprocessing["max_patches"], buckets)
        self.num_classes, self.one_hot = num_classes or source.num_classes, bool(one_hot)
        groups = {}
        for row in range(len(self.labels)):
            length = self._length(row)
            if length is not None:
                groups.setdefault(bucket_length([length], self.buckets), []).append(row)
        # (bucket, rows) of each batch, bucket by bucket in increasing length, each in the source's order.
        self.plan = [(bucket, rows[start:start + self.batch_size]) for bucket, rows in sorted(groups.items())
                     for start in range(0, len(rows), self.batch_size)]

    @property
    def bucket_counts(self):
        """`{sequence length: number of batches}` of this pass."""
        return dict(collections.Counter(bucket for bucket, _ in self.plan))

    def __len__(self):
        return len(self.plan)

    def __getitem__(self, index):
        if not 0 <= index < len(self.plan):
            raise IndexError(f"batch {index} of {len(self.plan)}")
        bucket, rows = self.plan[index]
        cut = [(row, self._cut(row, bucket)) for row in rows]
        cut = [(row, batch) for row, batch in cut if batch is not None]  # a file that cannot be decoded: left out
        if not cut:  # a batch of no rows, whose loss Keras' mean makes NaN for the whole pass
            raise ValueError(f"No image of NaFlex evaluation batch {index} can be decoded "
                             f"({', '.join(map(str, np.asarray(self.images)[rows]))}); remove them from the set.")
        batch = {key: np.concatenate([one[key] for _, one in cut]) for key in cut[0][1]}
        labels = self.labels[[row for row, _ in cut]]
        if self.one_hot:
            labels = np.eye(self.num_classes, dtype="float32")[labels]
        return batch, labels

    def _length(self, row):
        """The patch count of example `row` (from a file's header), or None for a file Pillow cannot open."""
        if isinstance(self.images, np.ndarray):
            height, width = self.images.shape[1:3]
        else:
            from PIL import Image

            try:
                with Image.open(self.images[row]) as image:
                    width, height = image.size
            except (OSError, SyntaxError, ValueError) as error:
                logger.warning("%s (%s); left out of the evaluation", SKIPPED.format(self.images[row]), error)
                return None
        rows, columns = (side // self.patch_size for side in naflex_image_size(
            height, width, self.patch_size, self.preprocessing["max_patches"], self.preprocessing["rule"]))
        return rows * columns

    def _cut(self, row, bucket):
        """Example `row` as a NaFlex batch of one padded to `bucket`; None for a file that cannot be decoded."""
        if isinstance(self.images, np.ndarray):
            image = self.images[row]
        else:
            try:
                image = arrays.decode_image(self.images[row])
            except arrays.UndecodableImage as error:
                logger.warning("%s (%s); left out of the evaluation", SKIPPED.format(error.path), error.reason)
                return None
        return naflex_batch([image], self.patch_size, buckets=(bucket,), **self.preprocessing)
