"""NaFlex evaluation batches from arrays and image files: a `keras.utils.PyDataset` of `naflex_batch`es.

Each example keeps its aspect ratio and gets as many patches as the budget
allows (`keras_vit.data.naflex`). The examples are grouped by the bucket
their patch count pads to, so that every batch has one sequence length, and
every batch has `batch_size` rows: a bucket's last batch is filled with
rows of one zero patch and weight 0. On JAX, TensorFlow and XLA, each step then
compiles once per bucket, never once per image shape or batch size.

A batch is `(naflex batch, one-hot labels, weights)`: weight 1 for an
example, 0 for a filler row or an image file that cannot be decoded (left
out of the evaluation, with a note naming it), so Keras' metrics count each
example once.

Example:
>>> from keras_vit import data
>>> images, labels = np.zeros((3, 40, 60, 3), "uint8"), np.array([0, 1, 1])
>>> batches = NaflexBatches(data.from_arrays(images, labels), 4, batch_size=2)
>>> x, y, weights = batches[1]
>>> x["patches"].shape, x["patch_grid"].tolist(), weights.tolist()
((2, 256, 48), [[13, 19], [1, 1]], [1.0, 0.0])
"""

import collections
import logging

import keras
import numpy as np

from keras_vit.data import arrays
from keras_vit.data.array_batches import SKIPPED
from keras_vit.data.naflex import bucket_length, naflex_batch, naflex_image_size, naflex_preprocessing, \
    sequence_lengths

logger = logging.getLogger("keras_vit")


class NaflexBatches(keras.utils.PyDataset):
    """One evaluation pass over a `keras_vit.data.Source` of arrays or files, as NaFlex batches (the module's).

    `preprocessing` is `naflex_batch`'s keywords (`{"rule", "max_patches",
    "interpolation"}`, a NaFlex model's `naflex_preprocessing`; None:
    keras_vit's own); `buckets` as `naflex_batch`'s.
    """

    def __init__(self, source, patch_size, batch_size, preprocessing=None, buckets=None, num_classes=None):
        super().__init__()
        if source.examples is None:
            raise ValueError(f"NaFlex evaluation reads arrays and image folders; {source.name!r} is a "
                             "tensorflow-datasets split: save its images into a folder of class sub-folders.")
        self.images, self.labels = source.examples
        if batch_size < 1:
            raise ValueError(f"eval_batch_size must be at least 1, got {batch_size}.")
        # No larger than the data: a small set pads no rows.
        self.patch_size, self.batch_size = patch_size, min(int(batch_size), max(1, len(self.labels)))
        self.preprocessing = naflex_preprocessing(preprocessing)
        self.buckets = sequence_lengths(self.preprocessing["max_patches"], buckets)
        self.num_classes = num_classes or source.num_classes
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
        """`{sequence length: number of batches}`: the step shapes this pass compiles."""
        return dict(collections.Counter(bucket for bucket, _ in self.plan))

    def __len__(self):
        return len(self.plan)

    def __getitem__(self, index):
        if not 0 <= index < len(self.plan):
            raise IndexError(f"batch {index} of {len(self.plan)}")
        bucket, rows = self.plan[index]
        cut = [self._cut(row, bucket) for row in rows]
        weights = np.array([batch is not None for batch in cut] + [False] * (self.batch_size - len(rows)), "float32")
        filler = {"patches": np.zeros((1, bucket, self.patch_size ** 2 * 3), "float32"),
                  "patch_grid": np.ones((1, 2), "int32"), "patch_mask": np.arange(bucket)[None] < 1}  # one patch
        cut = [filler if batch is None else batch for batch in cut] + [filler] * (self.batch_size - len(rows))
        batch = {key: np.concatenate([one[key] for one in cut]) for key in filler}
        labels = np.zeros((self.batch_size, self.num_classes), "float32")
        labels[np.arange(len(rows)), self.labels[rows]] = 1.0
        return batch, labels, weights

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
