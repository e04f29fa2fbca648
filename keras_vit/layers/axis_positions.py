"""Gemma 4's position embeddings, a learned table per axis read at each patch's column and row: `AxisPositionEmbedding`.

Gemma 4's vision tower (timm's `Gemma4PatchEmbed`, transformers'
`Gemma4VisionPatchEmbedder`) holds `position_embedding_table`, `(2, size,
hidden)`: the first table is indexed by a patch's column, the second by its
row, and the two rows read are summed onto the patch. Any grid up to `size`
patches a side reads the same tables, so nothing is resized: a larger image
reads further down them.
"""

import numbers

import keras
from keras import ops

from keras_vit.utils.shapes import as_pair


@keras.saving.register_keras_serializable(package="keras_vit")
class AxisPositionEmbedding(keras.layers.Layer):
    """Add `table[0][column] + table[1][row]` to each of `rows * cols` patch tokens (no prefix tokens).

    `table` is the weight `table`, `(2, table_size, hidden)`. The tokens are
    on `grid_size`, or on the grid of `patch_grid`, the `(batch, rows, cols,
    hidden)` patches they came from (dynamic resolution).

    Example:
    >>> import numpy as np
    >>> layer = AxisPositionEmbedding(grid_size=(2, 3), table_size=8)
    >>> tuple(layer(np.zeros((1, 6, 4))).shape)
    (1, 6, 4)
    >>> [tuple(weight.shape) for weight in layer.weights]
    [(2, 8, 4)]
    """

    def __init__(self, grid_size, table_size=10240, **kwargs):
        super().__init__(**kwargs)
        # === Config ===
        self.grid_size = as_pair(grid_size, "grid_size")
        self.table_size = int(table_size)
        if self.table_size < 1:
            raise ValueError(f"table_size must be a whole number >= 1, got {table_size!r}.")

    def build(self, input_shape):
        self.table = self.add_weight(name="table", shape=(2, self.table_size, input_shape[-1]),
                                     initializer=keras.initializers.TruncatedNormal(stddev=0.02))

    def call(self, tokens, patch_grid=None):
        rows, cols = self.grid_size if patch_grid is None else tuple(ops.shape(patch_grid)[1:3])
        too_long = [side for side in (rows, cols) if isinstance(side, numbers.Integral) and side > self.table_size]
        if too_long:
            raise ValueError(f"A {rows}x{cols} patch grid is beyond the position tables' {self.table_size} entries "
                             "per axis: give a smaller image.")
        table = ops.cast(self.table, tokens.dtype)
        by_column = ops.take(table[0], ops.arange(0, cols, 1), axis=0)  # (cols, hidden)
        by_row = ops.take(table[1], ops.arange(0, rows, 1), axis=0)  # (rows, hidden)
        grid = ops.expand_dims(by_column, 0) + ops.expand_dims(by_row, 1)  # (rows, cols, hidden), row-major
        return tokens + ops.reshape(grid, (1, -1, ops.shape(table)[-1]))

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(grid_size=list(self.grid_size), table_size=self.table_size)
        return config
