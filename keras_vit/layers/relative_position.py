"""BEiT's relative position bias: a learned bias per head on each attention logit, from the two tokens' offset.

A table of `(2h - 1)(2w - 1) + 3` rows (one per offset between two of an
`h x w` grid's patches, then three for the class token: to a patch, from a
patch, to itself) and one column per head. `relative_position_index`
gives each (query, key) pair its row, as timm's
`gen_relative_position_index`; `relative_position_bias` looks the pairs up,
`(1, heads, tokens, tokens)`. A block holds its own table (the switch
`relative_position_bias`), or the model one for every block
(`RelativePositionBias`, the switch `shared_relative_position_bias`), or
both, added. `resize_relative_position_table` moves a table to another
grid, as timm's load or transformers' forward does. Uses `keras.ops`
only in the model; the index and the resize are numpy, computed once.

Example:
>>> relative_position_index((2, 2)).shape, relative_table_rows((2, 2))
((5, 5), 12)
"""

import keras
import numpy as np
from keras import ops

from keras_vit.layers.position_embedding import interpolation_matrix

# The rows after the patch offsets: class token to a patch, a patch to the class token, class token to itself.
CLASS_TOKEN_ROWS = 3
# How a table is resized to another grid: as timm's load does, or as transformers' forward does.
RESIZE_METHODS = ("timm", "transformers")


def relative_table_rows(grid):
    """The rows of a table for an `(h, w)` grid: one per offset between two patches, then the class token's three."""
    return (2 * grid[0] - 1) * (2 * grid[1] - 1) + CLASS_TOKEN_ROWS


def relative_position_index(grid):
    """`(1 + h*w, 1 + h*w)` int32: the table row of each (query, key) pair, the class token first, as timm's."""
    rows, cols = np.meshgrid(np.arange(grid[0]), np.arange(grid[1]), indexing="ij")
    coords = np.stack([rows.ravel(), cols.ravel()])  # (2, h*w), row-major as the patch tokens
    offsets = coords[:, :, None] - coords[:, None, :]
    index = (offsets[0] + grid[0] - 1) * (2 * grid[1] - 1) + offsets[1] + grid[1] - 1
    patches = relative_table_rows(grid) - CLASS_TOKEN_ROWS
    full = np.empty((index.shape[0] + 1,) * 2, "int32")
    full[1:, 1:] = index
    full[0, :] = patches  # the class token to a patch
    full[:, 0] = patches + 1  # a patch to the class token
    full[0, 0] = patches + 2
    return full


def relative_position_bias(table, index):
    """`(1, heads, tokens, tokens)` float32: the rows of `table` (`(rows, heads)`) that `index` names."""
    tokens = index.shape[0]
    looked_up = ops.take(ops.cast(table, "float32"), ops.convert_to_tensor(index.reshape(-1)), axis=0)
    return ops.expand_dims(ops.transpose(ops.reshape(looked_up, (tokens, tokens, -1)), (2, 0, 1)), 0)


def check_relative_grid(grid, tokens, where):
    """Refuse `tokens` that are not the class token and the `grid`'s patches, which the table's rows describe."""
    if tokens is not None and tokens != grid[0] * grid[1] + 1:
        raise ValueError(f"{where}: a relative position bias table of a {grid[0]}x{grid[1]} patch grid takes the "
                         f"class token and {grid[0] * grid[1]} patches, got {tokens} tokens.")


def _geometric_offsets(source, target):
    """The source offsets of timm's resize: spaced geometrically so that the outermost reach the target's."""
    left, right = 1.01, 1.5
    while right - left > 1e-6:
        ratio = (left + right) / 2.0
        reach = (1.0 - ratio ** (source // 2)) / (1.0 - ratio)
        if reach > target // 2:
            right = ratio
        else:
            left = ratio
    distances, step = [], 1.0
    for power in range(source // 2):
        distances.append(step)
        step += ratio ** (power + 1)
    return np.array([-d for d in reversed(distances)] + [0.0] + distances)


def _interpolate(values, positions, targets):
    """Linear interpolation of `values` along axis 0 from `positions` (increasing) to `targets`; a target beyond the
    outermost position takes its value (timm's `RegularGridInterpolator`)."""
    if len(positions) == 1:  # a grid of one patch on this axis: its one offset, everywhere
        return np.repeat(values, len(targets), axis=0)
    targets = np.clip(targets, positions[0], positions[-1])
    upper = np.clip(np.searchsorted(positions, targets, side="right"), 1, len(positions) - 1)
    lower = upper - 1
    fraction = ((targets - positions[lower]) / (positions[upper] - positions[lower])).reshape(
        -1, *(1,) * (values.ndim - 1))
    return values[lower] * (1.0 - fraction) + values[upper] * fraction


def resize_relative_position_table(table, old_grid, new_grid, method="timm"):
    """A `(rows, heads)` table of `old_grid` for `new_grid`, as its library resizes it; the class token's three rows
    are kept.

    `"timm"` (its `resize_rel_pos_bias_table` without scipy): the patch
    offsets are placed at geometrically spaced positions whose outermost
    reach the new grid's (as far as a ratio of 1.5 takes them), then read
    by bilinear interpolation at the new whole offsets, the edge values
    beyond. `"transformers"` (its `BeitRelativePositionBias`): torch's
    bilinear `interpolate` (half-pixel centres, no anti-aliasing) of the
    offsets laid out as transformers lays them, `(2w - 1, 2h - 1)`.

    Example:
    >>> table = np.arange(relative_table_rows((2, 2)) * 2, dtype="float32").reshape(-1, 2)
    >>> resize_relative_position_table(table, (2, 2), (3, 3)).shape
    (28, 2)
    """
    table = np.asarray(table, "float32")
    old_grid, new_grid = tuple(old_grid), tuple(new_grid)
    if table.ndim != 2 or table.shape[0] != relative_table_rows(old_grid):
        raise ValueError(f"a relative position bias table of a {old_grid[0]}x{old_grid[1]} grid has "
                         f"{relative_table_rows(old_grid)} rows (one column per head), got shape {table.shape}.")
    if method not in RESIZE_METHODS:
        raise ValueError(f"Unknown relative position table resize {method!r}; expected one of {RESIZE_METHODS}.")
    if old_grid == new_grid:
        return table
    source = (2 * old_grid[0] - 1, 2 * old_grid[1] - 1)
    target = (2 * new_grid[0] - 1, 2 * new_grid[1] - 1)
    if method == "transformers":  # its table read as (2w - 1, 2h - 1), resized to (2h' - 1, 2w' - 1)
        offsets = table[:-CLASS_TOKEN_ROWS].reshape(source[1], source[0], -1).astype("float64")
        rows = interpolation_matrix(source[1], target[0], "bilinear")
        cols = interpolation_matrix(source[0], target[1], "bilinear")
        resized = np.einsum("ra,cb,abh->rch", rows, cols, offsets)
        return np.concatenate([resized.reshape(-1, table.shape[1]).astype("float32"), table[-CLASS_TOKEN_ROWS:]])
    offsets = table[:-CLASS_TOKEN_ROWS].reshape(*source, -1).astype("float64")
    rows = _geometric_offsets(source[0], target[0])
    cols = _geometric_offsets(source[1], target[1])
    new_rows = np.arange(-(target[0] // 2), target[0] // 2 + 0.1, 1.0)
    new_cols = np.arange(-(target[1] // 2), target[1] // 2 + 0.1, 1.0)
    # Bilinear on a rectangular grid is linear along one axis, then along the other.
    resized = _interpolate(offsets, rows, new_rows)
    resized = np.moveaxis(_interpolate(np.moveaxis(resized, 1, 0), cols, new_cols), 0, 1)
    return np.concatenate([resized.reshape(-1, table.shape[1]).astype("float32"), table[-CLASS_TOKEN_ROWS:]])


@keras.saving.register_keras_serializable(package="keras_vit")
class RelativePositionBias(keras.layers.Layer):
    """One relative position bias table for every block (BEiT's shared `rel_pos_bias`): `(1, heads, t, t)`.

    Called on the tokens the first block takes (the class token, then the
    `grid_size` patches); its output is each block's `attention_bias`.

    Example:
    >>> import numpy as np
    >>> RelativePositionBias((2, 3), num_heads=4)(np.zeros((1, 7, 8))).shape
    (1, 4, 7, 7)
    """

    def __init__(self, grid_size, num_heads, **kwargs):
        super().__init__(**kwargs)
        self.grid_size = tuple(int(side) for side in grid_size)
        self.num_heads = int(num_heads)
        self.index = relative_position_index(self.grid_size)

    def build(self, input_shape):
        check_relative_grid(self.grid_size, input_shape[1], self.name)
        self.relative_position_bias_table = self.add_weight(
            name="relative_position_bias_table", shape=(relative_table_rows(self.grid_size), self.num_heads),
            initializer="zeros", autocast=False)

    def call(self, tokens):
        return relative_position_bias(self.relative_position_bias_table, self.index)

    def compute_output_shape(self, input_shape):
        tokens = self.index.shape[0]
        return (1, self.num_heads, tokens, tokens)

    def get_config(self):
        config = super().get_config()
        config.update(grid_size=list(self.grid_size), num_heads=self.num_heads)
        return config
