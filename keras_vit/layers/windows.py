"""SAM's attention parts (Kirillov et al., 2023; ViTDet's): windowed attention, decomposed relative positions and the
convolutional neck.

- `window_partition` / `window_unpartition`: a block with `window_size`
  attends within non-overlapping windows of its patch grid, the grid padded
  with zero tokens (after the block's norm) to whole windows, as timm's
  `window_partition` pads; the padding takes part in attention as timm's
  does, and is cropped afterwards.
- `decomposed_relative_bias`: MViTv2's decomposed relative positions, a
  bias that depends on the query: `q . Rh[qh - kh] + q . Rw[qw - kw]` from a
  table of row offsets and one of column offsets (`rel_pos_h`, `rel_pos_w`,
  `(2 s - 1, head_dim)`); `resize_decomposed_table` is timm's linear resize
  of such a table to another size.
- `SamNeck`: the 1x1 convolution, LayerNorm, 3x3 convolution, LayerNorm
  that maps the last block's grid to SAM's image embedding (or one
  LayerNorm).

Uses `keras.ops` only in the model.

Example:
>>> import numpy as np
>>> windows, padded = window_partition(np.zeros((2, 36, 8), "float32"), (6, 6), 4)
>>> tuple(windows.shape), padded
((8, 16, 8), (8, 8))
"""

import keras
import numpy as np
from keras import ops

from keras_vit.layers.norm import LayerNorm
from keras_vit.layers.position_embedding import interpolation_matrix


def window_partition(tokens, grid, window):
    """`(batch, h*w, c)` tokens of an `(h, w)` grid as `(batch * windows, window**2, c)`, zero-padded to whole windows;
    also the padded grid."""
    batch, channels = ops.shape(tokens)[0], tokens.shape[-1]
    height, width = grid
    padded = (height + (-height) % window, width + (-width) % window)
    x = ops.reshape(tokens, (batch, height, width, channels))
    if padded != (height, width):
        x = ops.pad(x, ((0, 0), (0, padded[0] - height), (0, padded[1] - width), (0, 0)))
    x = ops.reshape(x, (batch, padded[0] // window, window, padded[1] // window, window, channels))
    x = ops.transpose(x, (0, 1, 3, 2, 4, 5))
    return ops.reshape(x, (-1, window * window, channels)), padded


def window_unpartition(windows, grid, window, padded):
    """The inverse of `window_partition`: `(batch, h*w, c)`, the padding cropped."""
    channels = windows.shape[-1]
    rows, cols = padded[0] // window, padded[1] // window
    x = ops.reshape(windows, (-1, rows, cols, window, window, channels))
    x = ops.reshape(ops.transpose(x, (0, 1, 3, 2, 4, 5)), (-1, padded[0], padded[1], channels))
    x = x[:, :grid[0], :grid[1]]
    return ops.reshape(x, (-1, grid[0] * grid[1], channels))


def offset_index(size):
    """`(size, size)` int32: the row of each (query, key) offset in a `(2 size - 1)`-row table, as timm's `get_rel_pos`
    for equal query and key sizes."""
    return (np.arange(size)[:, None] - np.arange(size)[None, :] + size - 1).astype("int32")


def decomposed_relative_bias(query, grid, table_h, table_w):
    """`(batch, heads, h*w, h*w)` float32: SAM's decomposed relative positions for `query` `(batch, h*w, heads,
    head_dim)` (unscaled) on an `(h, w)` grid, from `table_h` `(2h - 1, head_dim)` and `table_w` `(2w - 1, ...)`."""
    height, width = grid
    batch, heads, dim = ops.shape(query)[0], query.shape[2], query.shape[3]
    q = ops.reshape(ops.cast(query, "float32"), (batch, height, width, heads, dim))
    rows = ops.take(ops.cast(table_h, "float32"), ops.convert_to_tensor(offset_index(height)), axis=0)  # (h, h, d)
    cols = ops.take(ops.cast(table_w, "float32"), ops.convert_to_tensor(offset_index(width)), axis=0)
    bias_h = ops.einsum("bhwnc,hkc->bnhwk", q, rows)
    bias_w = ops.einsum("bhwnc,wkc->bnhwk", q, cols)
    bias = bias_h[:, :, :, :, :, None] + bias_w[:, :, :, :, None, :]
    return ops.reshape(bias, (batch, heads, height * width, height * width))


def resize_decomposed_table(table, size):
    """A `(rows, head_dim)` table of offsets for `size` rows, as timm's `get_rel_pos` resizes it (torch's linear
    `interpolate`, half-pixel centres)."""
    table = np.asarray(table, "float32")
    if table.shape[0] == size:
        return table
    return (interpolation_matrix(table.shape[0], size, "bilinear") @ table.astype("float64")).astype("float32")


@keras.saving.register_keras_serializable(package="keras_vit")
class SamNeck(keras.layers.Layer):
    """SAM's neck on `(batch, h*w, c)` tokens of a `grid_size` grid: 1x1 convolution to `channels`, LayerNorm, 3x3
    convolution (zero padding), LayerNorm; `(batch, h*w, channels)` out. The convolutions have no bias (timm's
    `neck`). With `channels` 0 (timm's `neck_chans=None`), one LayerNorm of the tokens. Its LayerNorms' epsilon
    is timm's `LayerNorm2d`'s, 1e-6, whatever the blocks' (SAM's are 1e-5).

    Example:
    >>> import numpy as np
    >>> SamNeck(4, (2, 3))(np.zeros((1, 6, 8))).shape
    (1, 6, 4)
    """

    def __init__(self, channels, grid_size, layer_norm_epsilon=1e-6, **kwargs):
        super().__init__(**kwargs)
        self.channels = int(channels)
        self.grid_size = tuple(int(side) for side in grid_size)
        self.layer_norm_epsilon = float(layer_norm_epsilon)

    def build(self, input_shape):
        grid = (input_shape[0], *self.grid_size)
        if not self.channels:  # timm's neck_chans=None: the embedding's LayerNorm2d alone
            self.norm = LayerNorm(epsilon=self.layer_norm_epsilon, name="norm", dtype=self.dtype_policy)
            self.norm.build((*grid, input_shape[-1]))
            return
        self.reduce = keras.layers.Conv2D(self.channels, 1, use_bias=False, name="reduce", dtype=self.dtype_policy)
        self.reduce_norm = LayerNorm(epsilon=self.layer_norm_epsilon, name="reduce_norm", dtype=self.dtype_policy)
        self.mix = keras.layers.Conv2D(self.channels, 3, padding="same", use_bias=False, name="mix",
                                       dtype=self.dtype_policy)
        self.mix_norm = LayerNorm(epsilon=self.layer_norm_epsilon, name="mix_norm", dtype=self.dtype_policy)
        self.reduce.build((*grid, input_shape[-1]))
        for layer in (self.reduce_norm, self.mix, self.mix_norm):
            layer.build((*grid, self.channels))

    def call(self, tokens):
        if not self.channels:
            return self.norm(tokens)
        x = ops.reshape(tokens, (-1, *self.grid_size, tokens.shape[-1]))
        x = self.mix_norm(self.mix(self.reduce_norm(self.reduce(x))))
        return ops.reshape(x, (-1, self.grid_size[0] * self.grid_size[1], self.channels))

    def compute_output_shape(self, input_shape):
        return (input_shape[0], self.grid_size[0] * self.grid_size[1], self.channels or input_shape[-1])

    def get_config(self):
        config = super().get_config()
        config.update(channels=self.channels, grid_size=list(self.grid_size),
                      layer_norm_epsilon=self.layer_norm_epsilon)
        return config
