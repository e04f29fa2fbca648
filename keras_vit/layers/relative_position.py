"""Relative position bias: a bias per head on each attention logit, from the two tokens' offset on the patch grid.

Three forms (`RELATIVE_POSITION_FORMS`), each of timm's:

- `"table"`: a learned table of `(2h - 1)(2w - 1)` rows, one per offset
  between two of an `h x w` grid's patches, and one column per head; with
  a class token three more rows (to a patch, from a patch, to itself).
  BEiT's, and timm's `RelPosBias`.
- `"mlp"`: a two-layer ReLU MLP from each offset's log-spaced coordinates
  (`sign(d) log(1 + |d|)`) to the heads' biases, timm's `RelPosMlp` (its
  `"cr"` mode, `vit_relpos_*`); a prefix token gets no bias.
- `"mlp_swin"`: Swin v2's: coordinates scaled to [-8, 8] and
  `log2(1 + |d|) / 3`, the MLP's output through `16 sigmoid`.

`relative_position_index` gives each (query, key) pair its row, as timm's
`gen_relative_position_index`. `RelativePositions` makes one bias's
weights and computes it, `(1, heads, tokens, tokens)`: a block holds its
own (the switch `relative_position_bias`), or the model one for every
block (`RelativePositionBias`, the switch
`shared_relative_position_bias`), or both, added.
`resize_relative_position_table` moves a table to another grid, as timm's
load or transformers' forward does; an MLP needs none. Uses `keras.ops`
only in the model; the index, the coordinates and the resize are numpy,
computed once.

Example:
>>> relative_position_index((2, 2)).shape, relative_table_rows((2, 2))
((5, 5), 12)
"""

import keras
import numpy as np
from keras import ops

from keras_vit.layers.position_embedding import interpolation_matrix

RELATIVE_POSITION_FORMS = ("table", "mlp", "mlp_swin")
# The rows after the patch offsets: class token to a patch, a patch to the class token, class token to itself.
CLASS_TOKEN_ROWS = 3
# How a table is resized to another grid: as timm's load does, or as transformers' forward does.
RESIZE_METHODS = ("timm", "transformers")
# The width of the MLP forms' hidden layer where a model does not say (timm's RelPosMlp hidden_dim).
MLP_DIM = 128


def relative_position_form(value, field):
    """`value` as one of `RELATIVE_POSITION_FORMS` or None (`True` is `"table"`, `False` None), else a ValueError."""
    if value is True:
        return "table"
    if value is False or value is None:
        return None
    if value not in RELATIVE_POSITION_FORMS:
        raise ValueError(f"Unknown {field} {value!r}; expected one of {RELATIVE_POSITION_FORMS} or None.")
    return value


def relative_table_rows(grid, class_token=True):
    """The rows of a table for an `(h, w)` grid: one per offset between two patches, then a class token's three."""
    return (2 * grid[0] - 1) * (2 * grid[1] - 1) + (CLASS_TOKEN_ROWS if class_token else 0)


def relative_position_index(grid, class_token=True):
    """The table row of each (query, key) pair, as timm's: `(h*w, h*w)` int32, and with `class_token` the class
    token first, `(1 + h*w, 1 + h*w)`."""
    rows, cols = np.meshgrid(np.arange(grid[0]), np.arange(grid[1]), indexing="ij")
    coords = np.stack([rows.ravel(), cols.ravel()])  # (2, h*w), row-major as the patch tokens
    offsets = coords[:, :, None] - coords[:, None, :]
    index = ((offsets[0] + grid[0] - 1) * (2 * grid[1] - 1) + offsets[1] + grid[1] - 1).astype("int32")
    if not class_token:
        return index
    patches = relative_table_rows(grid) - CLASS_TOKEN_ROWS
    full = np.empty((index.shape[0] + 1,) * 2, "int32")
    full[1:, 1:] = index
    full[0, :] = patches  # the class token to a patch
    full[:, 0] = patches + 1  # a patch to the class token
    full[0, 0] = patches + 2
    return full


def log_coordinates(grid, form):
    """`((2h - 1)(2w - 1), 2)` float32: each offset's coordinates as the MLP `form` takes them (timm's
    `gen_relative_log_coords`)."""
    offsets = np.stack(np.meshgrid(np.arange(-(grid[0] - 1), grid[0]), np.arange(-(grid[1] - 1), grid[1]),
                                   indexing="ij"), -1).astype("float32")
    if form == "mlp_swin":
        offsets = offsets / np.maximum(np.array(grid, "float32") - 1, 1) * 8
        return (np.sign(offsets) * np.log2(1.0 + np.abs(offsets)) / np.log2(8)).reshape(-1, 2).astype("float32")
    return (np.sign(offsets) * np.log(1.0 + np.abs(offsets))).reshape(-1, 2).astype("float32")


class RelativePositions:
    """One relative position bias of `form` for a `grid` of patches after `prefix_tokens`: its weights and its
    `(1, heads, tokens, tokens)` float32 bias.

    `make_weights(add_weight)` makes the weights with `add_weight(name,
    shape, initializer)` (a layer's, or a block's) and `bias(owner)` reads
    them back as `owner`'s attributes of the same names (`WEIGHTS`).
    """

    WEIGHTS = {"table": ("relative_position_bias_table",),
               "mlp": ("relative_position_mlp_hidden_kernel", "relative_position_mlp_hidden_bias",
                       "relative_position_mlp_output_kernel", "relative_position_mlp_output_bias"),
               "mlp_swin": ("relative_position_mlp_hidden_kernel", "relative_position_mlp_hidden_bias",
                            "relative_position_mlp_output_kernel")}
    NAMES = tuple(dict.fromkeys(name for names in WEIGHTS.values() for name in names))

    def __init__(self, form, grid, num_heads, prefix_tokens, mlp_dim=MLP_DIM, where="relative position bias"):
        self.form, self.grid, self.num_heads = form, tuple(int(side) for side in grid), int(num_heads)
        self.prefix_tokens, self.mlp_dim = int(prefix_tokens), int(mlp_dim or MLP_DIM)
        if self.prefix_tokens < 0:
            raise ValueError(f"{where}: a relative position bias of a {grid[0]}x{grid[1]} patch grid takes at least "
                             f"its {grid[0] * grid[1]} patches, got {grid[0] * grid[1] + self.prefix_tokens} tokens.")
        if form == "table" and self.prefix_tokens > 1:
            raise ValueError(f"{where}: a relative position bias table has three rows for a class token and none "
                             f"for other prefix tokens, but the tokens have {self.prefix_tokens} before the patches.")
        self.class_token = form == "table" and self.prefix_tokens == 1
        self.index = relative_position_index(self.grid, self.class_token)
        self.coordinates = None if form == "table" else log_coordinates(self.grid, form)

    def make_weights(self, add_weight):
        if self.form == "table":
            add_weight("relative_position_bias_table", (relative_table_rows(self.grid, self.class_token),
                                                        self.num_heads), "zeros")
            return
        hidden, output = self.WEIGHTS[self.form][0], self.WEIGHTS[self.form][2]
        add_weight(hidden, (2, self.mlp_dim), "glorot_uniform")
        add_weight(self.WEIGHTS[self.form][1], (self.mlp_dim,), "zeros")
        add_weight(output, (self.mlp_dim, self.num_heads), "glorot_uniform")
        if self.form == "mlp":
            add_weight(self.WEIGHTS[self.form][3], (self.num_heads,), "zeros")

    def _offset_biases(self, owner):
        """`(rows, heads)` float32: each offset's bias (the table, or the MLP on the coordinates)."""
        weights = [ops.cast(getattr(owner, name), "float32") for name in self.WEIGHTS[self.form]]
        if self.form == "table":
            return weights[0]
        hidden = ops.relu(ops.matmul(ops.convert_to_tensor(self.coordinates), weights[0]) + weights[1])
        output = ops.matmul(hidden, weights[2])
        return output + weights[3] if self.form == "mlp" else output

    def bias(self, owner):
        tokens = self.index.shape[0]
        looked_up = ops.take(self._offset_biases(owner), ops.convert_to_tensor(self.index.reshape(-1)), axis=0)
        bias = ops.transpose(ops.reshape(looked_up, (tokens, tokens, self.num_heads)), (2, 0, 1))
        if self.form == "mlp_swin":
            bias = 16.0 * ops.sigmoid(bias)
        prefix = 0 if self.form == "table" else self.prefix_tokens
        if prefix:  # no bias to or from a prefix token
            bias = ops.pad(bias, ((0, 0), (prefix, 0), (prefix, 0)))
        return ops.expand_dims(bias, 0)


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
    """A `(rows, heads)` table of `old_grid` for `new_grid`, as its library resizes it; a class token's three rows
    (the rows after the offsets') are kept.

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
    offset_rows = relative_table_rows(old_grid, class_token=False)
    if table.ndim != 2 or table.shape[0] not in (offset_rows, offset_rows + CLASS_TOKEN_ROWS):
        raise ValueError(f"a relative position bias table of a {old_grid[0]}x{old_grid[1]} grid has {offset_rows} "
                         f"rows, {offset_rows + CLASS_TOKEN_ROWS} with a class token's (one column per head), got "
                         f"shape {table.shape}.")
    if method not in RESIZE_METHODS:
        raise ValueError(f"Unknown relative position table resize {method!r}; expected one of {RESIZE_METHODS}.")
    if old_grid == new_grid:
        return table
    extra = table[offset_rows:]
    source = (2 * old_grid[0] - 1, 2 * old_grid[1] - 1)
    target = (2 * new_grid[0] - 1, 2 * new_grid[1] - 1)
    if method == "transformers":  # its table read as (2w - 1, 2h - 1), resized to (2h' - 1, 2w' - 1)
        offsets = table[:offset_rows].reshape(source[1], source[0], -1).astype("float64")
        rows = interpolation_matrix(source[1], target[0], "bilinear")
        cols = interpolation_matrix(source[0], target[1], "bilinear")
        resized = np.einsum("ra,cb,abh->rch", rows, cols, offsets)
    else:
        offsets = table[:offset_rows].reshape(*source, -1).astype("float64")
        new_rows = np.arange(-(target[0] // 2), target[0] // 2 + 0.1, 1.0)
        new_cols = np.arange(-(target[1] // 2), target[1] // 2 + 0.1, 1.0)
        # Bilinear on a rectangular grid is linear along one axis, then along the other.
        resized = _interpolate(offsets, _geometric_offsets(source[0], target[0]), new_rows)
        resized = np.moveaxis(_interpolate(np.moveaxis(resized, 1, 0), _geometric_offsets(source[1], target[1]),
                                           new_cols), 0, 1)
    return np.concatenate([resized.reshape(-1, table.shape[1]).astype("float32"), extra])


@keras.saving.register_keras_serializable(package="keras_vit")
class RelativePositionBias(keras.layers.Layer):
    """One relative position bias for every block (BEiT's shared `rel_pos_bias`, timm's `shared_rel_pos`):
    `(1, heads, t, t)`, of one of `RELATIVE_POSITION_FORMS`.

    Called on the tokens the first block takes (any prefix tokens, then the
    `grid_size` patches); its output is each block's `attention_bias`.

    Example:
    >>> import numpy as np
    >>> RelativePositionBias((2, 3), num_heads=4)(np.zeros((1, 7, 8))).shape
    (1, 4, 7, 7)
    """

    def __init__(self, grid_size, num_heads, form="table", mlp_dim=None, **kwargs):
        super().__init__(**kwargs)
        self.grid_size = tuple(int(side) for side in grid_size)
        self.num_heads = int(num_heads)
        self.form = relative_position_form(form, "form")
        self.mlp_dim = None if mlp_dim is None else int(mlp_dim)

    def build(self, input_shape):
        self.positions = RelativePositions(self.form, self.grid_size, self.num_heads,
                                           input_shape[1] - self.grid_size[0] * self.grid_size[1], self.mlp_dim,
                                           self.name)
        self.positions.make_weights(lambda name, shape, initializer: setattr(self, name, self.add_weight(
            name=name, shape=shape, initializer=initializer, autocast=False)))

    def call(self, tokens):
        return self.positions.bias(self)

    def compute_output_shape(self, input_shape):
        return (1, self.num_heads, input_shape[1], input_shape[1])

    def get_config(self):
        config = super().get_config()
        config.update(grid_size=list(self.grid_size), num_heads=self.num_heads, form=self.form)
        if self.mlp_dim is not None:
            config.update(mlp_dim=self.mlp_dim)
        return config
