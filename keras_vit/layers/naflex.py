"""NaFlex (SigLIP 2's native-flexible ViT): images of any aspect ratio and size in one padded batch of patches.

A NaFlex batch is three tensors, the layout of timm's NaFlex collator and
transformers' `Siglip2ImageProcessor`:

- `patches`, `(batch, max_patches, patch * patch * 3)`: each image cut into
  patches, each flattened in (row, column, channel) order, the image's
  patches first in row-major order, then padding;
- `patch_grid`, `(batch, 2)` int32: each image's `(rows, columns)` of patches;
- `patch_mask`, `(batch, max_patches)` bool: True on the image's
  `rows * columns` patches, False on the padding. The model reads its
  length; which tokens are valid it reads from `patch_grid`, the one
  place that says it (`NaFlexTokenMask`).

A NaFlex model takes a plain image batch `(batch, height, width, 3)` too,
as timm's `NaFlexVit` does (its standard mode): `NaFlexImagePatches` cuts
it into this layout, every image on its whole grid.

`NaFlexPatchEmbedding` projects the cut patches with the kernel of
`PatchEmbedding` (the same weight, so a fixed-size model's weights run
here unchanged); `NaFlexPositionEmbedding` resizes the position table to
each image's own grid, inside the batch (`NaFlexFactorizedPositionEmbedding`
a table of rows and one of columns); `NaFlexRotaryPositions` gives
RoPE each image's own grid. Attention (`TransformerBlock(key_mask=...)`)
and pooling (`TokenPooling`, `AttentionPooling` with `NaFlexTokenMask`'s
mask, which is each image's grid, not the mask's values) leave the padding
out, so no valid token depends on what the padding holds.

Example:
>>> import numpy as np
>>> grid = np.array([[2, 3], [1, 4]], "int32")
>>> token_grid_indices(np.zeros((2, 6, 8)), grid)[1][1].tolist()  # the column of each token of image 1
[0.0, 1.0, 2.0, 3.0, 0.0, 1.0]
"""

import math

import keras
from keras import ops

from keras_vit.layers.position_embedding import INTERPOLATIONS, interpolation_weights, resize_patch_embedding
from keras_vit.layers.rope import GRID_INDEXINGS, ROPE_FORMS, axis_coordinates
from keras_vit.utils.shapes import as_pair

# The inputs of a NaFlex model, in order.
NAFLEX_INPUTS = ("patches", "patch_grid", "patch_mask")
# Tables with at most this many positions resize with one dense product per token (any filter); larger ones
# (RADIO's 128 x 128) gather each token's few taps, which needs a filter without anti-aliasing.
_DENSE_TABLE_POSITIONS = 4096


def token_grid_indices(tokens, patch_grid):
    """`(rows, cols)`, each `(batch, tokens)` float32: every patch token's place on its own image's grid.

    Padding tokens (past `rows * cols`) get the last row, any column: their values reach no valid token.
    """
    # A running count, not `arange(count)`: jax2onnx writes an arange of a symbolic length as one of length 0.
    index = ops.cumsum(ops.ones_like(tokens[:1, :, 0], dtype="float32"), axis=1) - 1.0
    grid = ops.cast(patch_grid, "float32")
    rows, cols = grid[:, 0:1], grid[:, 1:2]
    row = ops.floor(index / cols)
    return ops.minimum(row, rows - 1.0), index - row * cols


@keras.saving.register_keras_serializable(package="keras_vit")
class NaFlexImagePatches(keras.layers.Layer):
    """A plain image batch `(batch, height, width, channels)` as a NaFlex batch: each image on its whole grid.

    timm's `NaFlexVit` standard mode (`batch_patchify`): the patches in
    row-major order, each flattened in (row, column, channel) order, every
    image's grid `(height / P, width / P)`, no padding. The sizes must be
    whole patches (timm's linear patch embedding refuses others; the
    model's input check names them).

    Example:
    >>> import numpy as np
    >>> batch = NaFlexImagePatches(patch_size=4)(np.zeros((2, 8, 12, 3)))
    >>> tuple(batch["patches"].shape), np.asarray(batch["patch_grid"]).tolist(), tuple(batch["patch_mask"].shape)
    ((2, 6, 48), [[2, 3], [2, 3]], (2, 6))
    """

    def __init__(self, patch_size, **kwargs):
        super().__init__(**kwargs)
        # === Config ===
        self.patch_size = as_pair(patch_size, "patch_size")

    def call(self, images):
        (height, width), shape = self.patch_size, ops.shape(images)  # sizes a traced graph knows only at run time
        rows, cols, channels = shape[1] // height, shape[2] // width, shape[3]
        blocks = ops.reshape(images, (-1, rows, height, cols, width, channels))
        patches = ops.reshape(ops.transpose(blocks, (0, 1, 3, 2, 4, 5)), (-1, rows * cols, height * width * channels))
        ones = ops.ones_like(patches[:, :, 0], dtype="int32")
        grid = ops.stack([ones[:, 0] * rows, ones[:, 0] * cols], axis=1)
        return {"patches": patches, "patch_grid": grid, "patch_mask": ops.cast(ones, "bool")}

    def compute_output_spec(self, images):
        batch, image_height, image_width, channels = images.shape
        (height, width) = self.patch_size
        count = None if image_height is None or image_width is None else \
            (image_height // height) * (image_width // width)
        return {"patches": keras.KerasTensor((batch, count, height * width * channels), dtype=images.dtype),
                "patch_grid": keras.KerasTensor((batch, 2), dtype="int32"),
                "patch_mask": keras.KerasTensor((batch, count), dtype="bool")}

    def get_config(self):
        config = super().get_config()
        config.update(patch_size=self.patch_size)
        return config


@keras.saving.register_keras_serializable(package="keras_vit")
class NaFlexPatchEmbedding(keras.layers.Layer):
    """Project pre-cut patches `(batch, count, P * P * channels)` to `(batch, count, hidden_size)`.

    The convolution of `PatchEmbedding` written as one product: its kernel
    `(P, P, channels, hidden)`, flattened in the patches' (row, column,
    channel) order, is this layer's weight, under the same name. Patches of
    the other `patch_sizes` get the kernel resampled to theirs by FlexiViT's
    pseudo-inverse resize (`resize_patch_embedding`), as timm's NaFlex
    training with random patch sizes does; any other size is refused.

    Example:
    >>> import numpy as np
    >>> NaFlexPatchEmbedding(patch_size=4, hidden_size=8)(np.zeros((2, 5, 48))).shape
    (2, 5, 8)
    """

    def __init__(self, patch_size, hidden_size, use_bias=True, kernel_initializer="lecun_normal", channels=3,
                 patch_sizes=None, **kwargs):
        super().__init__(**kwargs)
        # === Config ===
        self.patch_size = as_pair(patch_size, "patch_size")
        # The square patch sizes it takes: its own, and those it resamples its kernel to (FlexiViT).
        self.patch_sizes = tuple(sorted({self.patch_size[0], *(int(size) for size in (patch_sizes or ()))}))
        self.hidden_size = int(hidden_size)
        self.use_bias = bool(use_bias)
        self.channels = int(channels)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)

    @property
    def patch_width(self):
        """The length of one flattened patch, `P * P * channels`."""
        return self.patch_size[0] * self.patch_size[1] * self.channels

    def build(self, input_shape):
        self.kernel = self.add_weight(name="kernel", shape=(*self.patch_size, self.channels, self.hidden_size),
                                      initializer=self.kernel_initializer)
        self.bias = self.add_weight(name="bias", shape=(self.hidden_size,), initializer="zeros") \
            if self.use_bias else None

    def patch_size_of(self, width):
        """The patch size (one of `patch_sizes`) whose flattened patches have `width` values, or a ValueError."""
        side = math.isqrt(max(int(width) // self.channels, 0))
        if side not in self.patch_sizes or side * side * self.channels != width:
            raise ValueError(f"NaFlex patches of {width} values are none of the {self.patch_sizes}-pixel patches this "
                             f"model takes (patch_size * patch_size * {self.channels} values); cut the images with "
                             "one of them, or build the model with naflex_patch_sizes= the sizes to resample to.")
        return side

    def call(self, patches):
        width = patches.shape[-1]
        kernel = self.kernel
        if width is not None and width != self.patch_width:  # FlexiViT: the kernel resampled to the patches' size
            kernel = resize_patch_embedding(kernel, self.patch_size_of(width))
            width = int(width)
        else:
            width = self.patch_width
        projected = ops.matmul(ops.cast(patches, self.compute_dtype), ops.reshape(kernel, (width, self.hidden_size)))
        return projected + self.bias if self.use_bias else projected

    def compute_output_shape(self, input_shape):
        return (*input_shape[:-1], self.hidden_size)

    def get_config(self):
        config = super().get_config()
        if len(self.patch_sizes) > 1:
            config.update(patch_sizes=list(self.patch_sizes))
        config.update(patch_size=self.patch_size, hidden_size=self.hidden_size, use_bias=self.use_bias,
                      channels=self.channels, kernel_initializer=keras.initializers.serialize(self.kernel_initializer))
        return config


@keras.saving.register_keras_serializable(package="keras_vit")
class NaFlexPositionEmbedding(keras.layers.Layer):
    """Add learned position embeddings, the table resized to each image's own grid inside a NaFlex batch.

    The weight is `AddPositionEmbedding`'s, `(1, prefix + rows * cols, D)`
    for `grid_size`: the first `num_prefix_tokens` rows go to the prefix
    tokens unchanged, the rest is resampled as an image, per image, as the
    source library does: `interpolation` and `antialias` as
    `torch.nn.functional.interpolate` (SigLIP 2: bilinear, anti-aliased;
    timm's NaFlexVit: bicubic, anti-aliased), `aspect_preserving` (timm's
    `pos_embed_ar_preserving`: a square of the longer side, then its
    top-left corner; on the table's own grid the table unchanged, as timm
    skips the resize there) and `align_corners` (RADIO v3).

    Example:
    >>> import numpy as np
    >>> layer = NaFlexPositionEmbedding((4, 4), num_prefix_tokens=0, interpolation="bilinear", antialias=True)
    >>> layer(np.zeros((2, 6, 8)), np.array([[2, 3], [1, 4]])).shape
    (2, 6, 8)
    """

    def __init__(self, grid_size, num_prefix_tokens=0, interpolation="bicubic", antialias=False,
                 aspect_preserving=False, align_corners=False, initializer=None, **kwargs):
        super().__init__(**kwargs)
        if interpolation not in INTERPOLATIONS:
            raise ValueError(f"Unknown interpolation {interpolation!r}; expected one of {INTERPOLATIONS}.")
        if align_corners and antialias:
            raise ValueError("align_corners=True resizes without anti-aliasing; pass antialias=False.")
        self.grid_size = as_pair(grid_size, "grid_size")
        if antialias and self.grid_size[0] * self.grid_size[1] > _DENSE_TABLE_POSITIONS:
            raise ValueError(f"An anti-aliased NaFlex resize of a {self.grid_size[0]}x{self.grid_size[1]} position "
                             f"table is not supported (at most {_DENSE_TABLE_POSITIONS} positions); pass "
                             "antialias=False, as the references do for tables this large.")
        # === Config ===
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.interpolation = interpolation
        self.antialias = bool(antialias)
        self.aspect_preserving = bool(aspect_preserving)
        self.align_corners = bool(align_corners)
        self.initializer = keras.initializers.get(initializer or keras.initializers.RandomNormal(stddev=0.02))

    def build(self, tokens_shape, patch_grid_shape=None):
        rows, cols = self.grid_size
        self.pos_embedding = self.add_weight(name="pos_embedding", initializer=self.initializer,
                                             shape=(1, self.num_prefix_tokens + rows * cols, tokens_shape[-1]))

    def _weights(self, in_size, index, size):
        return interpolation_weights(in_size, index, size, self.interpolation, self.antialias, self.align_corners)

    def call(self, tokens, patch_grid):
        prefix = self.num_prefix_tokens
        table = ops.cast(self.pos_embedding, "float32")
        patches = tokens[:, prefix:]
        row, col = token_grid_indices(patches, patch_grid)
        grid = ops.cast(patch_grid, "float32")
        out_rows, out_cols = grid[:, 0:1], grid[:, 1:2]
        (in_rows, in_cols), width = self.grid_size, ops.shape(table)[-1]
        if self.aspect_preserving:  # a square of the longer side, but the table unchanged on its own grid, as timm
            longer = ops.maximum(out_rows, out_cols)
            own = ops.logical_and(ops.equal(out_rows, in_rows), ops.equal(out_cols, in_cols))
            out_rows, out_cols = ops.where(own, out_rows, longer), ops.where(own, out_cols, longer)
        row_weights = self._weights(in_rows, row, out_rows)  # (batch, tokens, in_rows)
        col_weights = self._weights(in_cols, col, out_cols)
        patch_table = table[0, prefix:]
        if in_rows * in_cols <= _DENSE_TABLE_POSITIONS:
            weights = ops.expand_dims(row_weights, -1) * ops.expand_dims(col_weights, -2)
            weights = ops.reshape(weights, (ops.shape(weights)[0], ops.shape(weights)[1], in_rows * in_cols))
            positions = ops.einsum("bnk,kd->bnd", weights, patch_table)  # tf2onnx mis-sizes TF's batched matmul
        else:  # Without anti-aliasing each axis has at most 4 taps: gather them instead of a product over the table.
            taps = 2 if self.interpolation == "bilinear" else 4
            _, row_taps = ops.top_k(ops.abs(row_weights), taps)
            _, col_taps = ops.top_k(ops.abs(col_weights), taps)
            # Each tap's weight picked by a one-hot product: torch.export fixes the shapes of `take_along_axis`.
            row_tap_weights = ops.einsum("bnk,bntk->bnt", row_weights, ops.one_hot(row_taps, in_rows))
            col_tap_weights = ops.einsum("bnk,bntk->bnt", col_weights, ops.one_hot(col_taps, in_cols))
            index = ops.expand_dims(row_taps, -1) * in_cols + ops.expand_dims(col_taps, -2)
            weights = ops.expand_dims(row_tap_weights, -1) * ops.expand_dims(col_tap_weights, -2)
            batch, count = ops.shape(index)[0], ops.shape(index)[1]
            gathered = ops.take(patch_table, ops.reshape(index, (batch, count, taps * taps)), axis=0)
            positions = ops.einsum("bnk,bnkd->bnd", ops.reshape(weights, (batch, count, taps * taps)), gathered)
        positions = ops.reshape(positions, (ops.shape(positions)[0], ops.shape(positions)[1], width))
        if prefix:
            prefix_rows = ops.broadcast_to(table[:, :prefix], (ops.shape(positions)[0], prefix, width))
            positions = ops.concatenate([prefix_rows, positions], axis=1)
        return tokens + ops.cast(positions, tokens.dtype)

    def compute_output_shape(self, tokens_shape, patch_grid_shape=None):
        return tokens_shape

    def get_config(self):
        config = super().get_config()
        config.update(grid_size=self.grid_size, num_prefix_tokens=self.num_prefix_tokens,
                      interpolation=self.interpolation, antialias=self.antialias,
                      aspect_preserving=self.aspect_preserving, align_corners=self.align_corners,
                      initializer=keras.initializers.serialize(self.initializer))
        return config


@keras.saving.register_keras_serializable(package="keras_vit")
class NaFlexFactorizedPositionEmbedding(keras.layers.Layer):
    """Add factorized position embeddings: a table of rows and one of columns, each resized to an image's grid.

    NaViT's factorized tables, timm's NaFlexVit `pos_embed='factorized'`:
    weights `(1, rows, D)` and `(1, cols, D)` for `grid_size`. For an image
    of `h x w` patches the row table is resized to `h` rows and the column
    table to `w` (with `aspect_preserving`, timm's `pos_embed_ar_preserving`:
    both to `max(h, w)`, then the first `h` and `w` taken), linearly, as
    `torch.nn.functional.interpolate(mode="linear")` without aligned corners
    or anti-aliasing (timm's one resize for these tables); the token in row
    `r`, column `c` gets row `r` plus column `c`. The tables are for the
    patches alone: prefix tokens come after them.

    Example:
    >>> import numpy as np
    >>> layer = NaFlexFactorizedPositionEmbedding((4, 4), aspect_preserving=True)
    >>> layer(np.zeros((2, 6, 8)), np.array([[2, 3], [1, 4]])).shape
    (2, 6, 8)
    """

    # The resize, fixed: the attributes NaFlexPositionEmbedding has, so that code reading a NaFlex table's resize
    # (a .keras file's source, save_timm) reads this layer's alike.
    interpolation, antialias, align_corners, num_prefix_tokens = "bilinear", False, False, 0

    def __init__(self, grid_size, aspect_preserving=False, initializer=None, **kwargs):
        super().__init__(**kwargs)
        self.grid_size = as_pair(grid_size, "grid_size")
        self.aspect_preserving = bool(aspect_preserving)
        self.initializer = keras.initializers.get(initializer or keras.initializers.RandomNormal(stddev=0.02))

    def build(self, tokens_shape, patch_grid_shape=None):
        rows, cols = self.grid_size
        self.pos_embedding_rows = self.add_weight(name="pos_embedding_rows", initializer=self.initializer,
                                                  shape=(1, rows, tokens_shape[-1]))
        self.pos_embedding_cols = self.add_weight(name="pos_embedding_cols", initializer=self.initializer,
                                                  shape=(1, cols, tokens_shape[-1]))

    def call(self, tokens, patch_grid):
        row, col = token_grid_indices(tokens, patch_grid)
        grid = ops.cast(patch_grid, "float32")
        out_rows, out_cols = grid[:, 0:1], grid[:, 1:2]
        if self.aspect_preserving:
            out_rows = out_cols = ops.maximum(out_rows, out_cols)
        in_rows, in_cols = self.grid_size
        row_weights = interpolation_weights(in_rows, row, out_rows, "bilinear")  # (batch, tokens, in_rows)
        col_weights = interpolation_weights(in_cols, col, out_cols, "bilinear")
        positions = ops.einsum("bnk,kd->bnd", row_weights, ops.cast(self.pos_embedding_rows[0], "float32")) + \
            ops.einsum("bnk,kd->bnd", col_weights, ops.cast(self.pos_embedding_cols[0], "float32"))
        return tokens + ops.cast(positions, tokens.dtype)

    def compute_output_shape(self, tokens_shape, patch_grid_shape=None):
        return tokens_shape

    def get_config(self):
        config = super().get_config()
        config.update(grid_size=self.grid_size, aspect_preserving=self.aspect_preserving,
                      initializer=keras.initializers.serialize(self.initializer))
        return config


@keras.saving.register_keras_serializable(package="keras_vit")
class NaFlexRotaryPositions(keras.layers.Layer):
    """`RotaryPositions` for a NaFlex batch: `(batch, prefix + count, 2)`, each image's tokens on its own grid.

    Example:
    >>> import numpy as np
    >>> positions = NaFlexRotaryPositions(num_prefix_tokens=1)(np.zeros((1, 7, 8)), np.array([[2, 3]]))
    >>> np.asarray(positions)[0, :4].tolist()
    [[0.0, 0.0], [0.0, 0.0], [0.0, 1.0], [0.0, 2.0]]
    """

    def __init__(self, form="axial", num_prefix_tokens=0, offset=0.0, reference_grid=None, indexing="ij", **kwargs):
        super().__init__(**kwargs)
        if form not in ROPE_FORMS:
            raise ValueError(f"Unknown RoPE form {form!r}; expected one of {ROPE_FORMS}.")
        if indexing not in GRID_INDEXINGS:
            raise ValueError(f"Unknown RoPE grid indexing {indexing!r}; expected one of {GRID_INDEXINGS}.")
        # === Config ===
        self.form = form
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.offset = float(offset)
        self.reference_grid = None if reference_grid is None else tuple(float(side) for side in reference_grid)
        self.indexing = indexing

    def call(self, tokens, patch_grid):
        prefix = self.num_prefix_tokens
        row, col = token_grid_indices(tokens[:, prefix:], patch_grid)
        grid = ops.cast(patch_grid, "float32")
        reference = self.reference_grid or (None, None)
        row = axis_coordinates(row, grid[:, 0:1], self.form, self.offset, reference[0])
        col = axis_coordinates(col, grid[:, 1:2], self.form, self.offset, reference[1])
        coordinates = ops.stack([row, col] if self.indexing == "ij" else [col, row], axis=-1)
        if prefix:
            coordinates = ops.concatenate([ops.zeros((ops.shape(coordinates)[0], prefix, 2), "float32"),
                                           coordinates], axis=1)
        return coordinates

    def compute_output_spec(self, tokens, patch_grid):
        return keras.KerasTensor((tokens.shape[0], tokens.shape[1], 2), dtype="float32")

    def get_config(self):
        config = super().get_config()
        config.update(form=self.form, num_prefix_tokens=self.num_prefix_tokens, offset=self.offset,
                      indexing=self.indexing,
                      reference_grid=None if self.reference_grid is None else list(self.reference_grid))
        return config


@keras.saving.register_keras_serializable(package="keras_vit")
class NaFlexTokenMask(keras.layers.Layer):
    """`(batch, prefix + count)` bool: the prefix tokens (always valid), then each image's first `rows * cols`
    patches by its `patch_grid`; what attention and pooling keep.

    Derived from the grid, as the positions are: `patch_mask` gives the
    sequence length only, so a mask that disagrees with its grid (which
    `check_naflex_batch` refuses in numpy batches, and nothing can check in a
    tf.data or DataLoader pipeline's tensors without leaving the graph)
    cannot make a padding token count, nor leave a patch out. Called without
    the grid (a `.keras` model saved before), it keeps the mask's values.

    Example:
    >>> import numpy as np
    >>> mask = NaFlexTokenMask(num_prefix_tokens=1)(np.ones((1, 4), bool), np.array([[1, 2]]))
    >>> np.asarray(mask).tolist()
    [[True, True, True, False, False]]
    """

    def __init__(self, num_prefix_tokens=0, **kwargs):
        super().__init__(**kwargs)
        # === Config ===
        self.num_prefix_tokens = int(num_prefix_tokens)

    def call(self, patch_mask, patch_grid=None):
        if patch_grid is None:  # a model saved before the mask came from the grid: the mask's values, as then
            mask = ops.cast(patch_mask, "bool")
        else:  # a running count, not `arange(length)`, as in `token_grid_indices`
            index = ops.cumsum(ops.ones_like(ops.cast(patch_mask[:1], "float32")), axis=1) - 1.0
            grid = ops.cast(patch_grid, "float32")
            mask = index < grid[:, 0:1] * grid[:, 1:2]
        if not self.num_prefix_tokens:
            return mask
        prefix = ops.ones((ops.shape(mask)[0], self.num_prefix_tokens), "bool")
        return ops.concatenate([prefix, mask], axis=1)

    def compute_output_spec(self, patch_mask, patch_grid=None):
        count = None if patch_mask.shape[1] is None else patch_mask.shape[1] + self.num_prefix_tokens
        return keras.KerasTensor((patch_mask.shape[0], count), dtype="bool")

    def get_config(self):
        config = super().get_config()
        config.update(num_prefix_tokens=self.num_prefix_tokens)
        return config
