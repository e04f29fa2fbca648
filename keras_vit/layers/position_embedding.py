"""Resizing learned embeddings: position tables to a new patch grid, patch kernels to a new patch size.

One function, `resize_position_embeddings`, serves the checkpoint loader, the
`AddPositionEmbedding` layer (dynamic resolution) and users. It resamples the
patch part of a `(1, prefix + H * W, D)` table as an `H x W` image, leaving the
prefix tokens (the class token's slot) untouched. `resize_patch_embedding`
is FlexiViT's pseudo-inverse resize of a patch-embedding kernel, built on the
same interpolation matrices. The `AddPositionEmbedding` layer (also exported
by `keras_vit.layers`) lives here, beside the resize it calls on every grid
change.

Interpolation is written as two small matrices (one per axis) built in numpy
from the grid sizes, then applied with `keras.ops.einsum` inside a model (a
dynamic-resolution table) or in float64 numpy to a numpy table (at load
time, off the device's matrix-product precision). That keeps the result
identical on every backend and lets us reproduce two references exactly:

* `interpolation="bilinear", align_corners=True` is `scipy.ndimage.zoom(order=1)`,
  which the original vision_transformer repository used;
* `align_corners=False` ("half-pixel") with `"bilinear"` or `"bicubic"` is
  `torch.nn.functional.interpolate` (cubic coefficient -0.75, clamped borders),
  and `antialias=True` is its anti-aliased variant (as used by timm).
"""

import math
import numbers

import keras
import numpy as np
from keras import ops

from keras_vit.utils.shapes import as_pair

INTERPOLATIONS = ("bilinear", "bicubic")


def _cubic(x, a):
    """Keys' cubic convolution kernel with coefficient `a`."""
    x = np.abs(x)
    near = ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
    far = ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a
    return np.where(x < 1.0, near, np.where(x < 2.0, far, 0.0))


def _scale(in_size, out_size, align_corners):
    if align_corners:
        return (in_size - 1) / (out_size - 1) if out_size > 1 else 0.0
    return in_size / out_size


def _plain_matrix(in_size, out_size, interpolation, align_corners):
    """Interpolation without anti-aliasing, as torch's upsample kernels."""
    scale = _scale(in_size, out_size, align_corners)
    out_index = np.arange(out_size, dtype=np.float64)
    if align_corners:
        source = scale * out_index
    else:
        source = scale * (out_index + 0.5) - 0.5
    matrix = np.zeros((out_size, in_size), dtype=np.float64)
    rows = np.arange(out_size)
    if interpolation == "bilinear":
        source = np.maximum(source, 0.0)
        lower = np.floor(source).astype(np.int64)
        lower = np.minimum(lower, in_size - 1)
        upper = np.minimum(lower + 1, in_size - 1)
        frac = source - lower
        np.add.at(matrix, (rows, lower), 1.0 - frac)
        np.add.at(matrix, (rows, upper), frac)
        return matrix
    lower = np.floor(source).astype(np.int64)
    frac = source - lower
    for tap in (-1, 0, 1, 2):
        weight = _cubic(frac - tap, a=-0.75)
        index = np.clip(lower + tap, 0, in_size - 1)
        np.add.at(matrix, (rows, index), weight)
    return matrix


def _antialiased_matrix(in_size, out_size, interpolation, align_corners):
    """Anti-aliased interpolation, as torch's `antialias=True` kernels.

    The filter widens by the downsampling factor and the taps that fall
    outside the input are dropped and the rest renormalised.
    """
    scale = _scale(in_size, out_size, align_corners)
    if interpolation == "bilinear":
        taps, kernel = 2, lambda x: np.maximum(0.0, 1.0 - np.abs(x))
    else:
        taps, kernel = 4, lambda x: _cubic(x, a=-0.5)
    support = taps / 2 * scale if scale >= 1.0 else taps / 2
    inverse_scale = 1.0 / scale if scale >= 1.0 else 1.0
    matrix = np.zeros((out_size, in_size), dtype=np.float64)
    for row in range(out_size):
        center = scale * (row + 0.5)
        start = max(int(center - support + 0.5), 0)
        stop = min(int(center + support + 0.5), in_size)
        index = np.arange(start, stop)
        weights = kernel((index - center + 0.5) * inverse_scale)
        total = weights.sum()
        matrix[row, start:stop] = weights / total if total != 0 else weights
    return matrix


def interpolation_matrix(
    in_size, out_size, interpolation="bicubic", align_corners=False, antialias=False
):
    """The `(out_size, in_size)` matrix that resamples one axis.

    Example:
    >>> interpolation_matrix(2, 3, "bilinear", align_corners=True)[1]
    array([0.5, 0.5])
    """
    if interpolation not in INTERPOLATIONS:
        raise ValueError(
            f"Unknown interpolation {interpolation!r}; expected one of {INTERPOLATIONS}."
        )
    if in_size < 1 or out_size < 1:
        raise ValueError(f"Grid sizes must be positive, got {in_size} -> {out_size}.")
    if in_size == out_size:
        return np.eye(out_size)
    build = _antialiased_matrix if antialias else _plain_matrix
    return build(in_size, out_size, interpolation, align_corners)


def _traced_cubic(x, a):
    x = ops.abs(x)
    near = ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
    far = ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a
    return ops.where(x < 1.0, near, ops.where(x < 2.0, far, ops.zeros_like(x)))


def traced_interpolation_matrix(in_size, out_size, interpolation="bicubic", antialias=False):
    """`interpolation_matrix` (half-pixel) for an `out_size` known only when a traced graph runs.

    The same formulas in `keras.ops` (`interpolation_weights`), as a dense
    `(out_size, in_size)` float32 matrix: a TensorFlow graph traced with
    unknown image sizes builds its resize here. Equal to
    `interpolation_matrix` to float32 rounding (tested).
    """
    out_index = ops.arange(0, out_size, 1, dtype="float32")
    # The size counted from the graph's own tensor: a symbolic size made a tensor is fixed by torch's exporter.
    return interpolation_weights(in_size, out_index, ops.sum(ops.ones_like(out_index)), interpolation, antialias)


def interpolation_weights(in_size, out_index, out_size, interpolation="bicubic", antialias=False,
                          align_corners=False):
    """The rows `out_index` of `interpolation_matrix(in_size, out_size)`, for tensors known only when a graph runs.

    `out_index` and `out_size` are float32 tensors of one broadcastable shape
    `S` (a NaFlex batch gives every token its own row of its own image's
    grid); the result is `(*S, in_size)` float32. `align_corners` applies
    without anti-aliasing only (as every reference uses it).
    """
    if interpolation not in INTERPOLATIONS:
        raise ValueError(f"Unknown interpolation {interpolation!r}; expected one of {INTERPOLATIONS}.")
    if align_corners and antialias:
        raise ValueError("align_corners=True resizes without anti-aliasing; pass antialias=False.")
    out_index = ops.expand_dims(ops.cast(out_index, "float32"), -1)
    out_size = ops.expand_dims(ops.cast(out_size, "float32"), -1)
    in_index = ops.arange(0, in_size, 1, dtype="float32")
    last = float(in_size - 1)
    if align_corners:
        scale = ops.where(out_size > 1.0, last / ops.maximum(out_size - 1.0, 1.0), 0.0)
    else:
        scale = float(in_size) / out_size
    if antialias:
        taps, kernel = (2, lambda x: ops.maximum(0.0, 1.0 - ops.abs(x))) if interpolation == "bilinear" else (
            4, lambda x: _traced_cubic(x, -0.5))
        shrinking = scale >= 1.0
        support = ops.where(shrinking, taps / 2 * scale, taps / 2)
        inverse_scale = ops.where(shrinking, 1.0 / scale, 1.0)
        center = scale * (out_index + 0.5)
        start = ops.maximum(ops.floor(center - support + 0.5), 0.0)
        stop = ops.minimum(ops.floor(center + support + 0.5), float(in_size))
        inside = ops.logical_and(in_index >= start, in_index < stop)
        weights = ops.where(inside, kernel((in_index - center + 0.5) * inverse_scale), 0.0)
        total = ops.sum(weights, axis=-1, keepdims=True)
        return weights / ops.where(total == 0.0, 1.0, total)
    source = scale * out_index if align_corners else scale * (out_index + 0.5) - 0.5
    if interpolation == "bilinear":
        source = ops.maximum(source, 0.0)
        lower = ops.minimum(ops.floor(source), last)
        upper = ops.minimum(lower + 1.0, last)
        frac = source - lower
        return ops.where(in_index == lower, 1.0 - frac, 0.0) + ops.where(in_index == upper, frac, 0.0)
    lower = ops.floor(source)
    frac = source - lower
    matrix = 0.0
    for tap in (-1, 0, 1, 2):
        index = ops.clip(lower + tap, 0.0, last)
        matrix = matrix + ops.where(in_index == index, _traced_cubic(frac - tap, -0.75), 0.0)
    return matrix


def resize_position_embeddings(
    pos_embedding,
    new_grid_size,
    old_grid_size=None,
    num_prefix_tokens=1,
    interpolation="bicubic",
    align_corners=False,
    antialias=False,
):
    """Resample a `(1, prefix + H * W, D)` position-embedding table to a new grid.

    Args:
        pos_embedding: array or tensor of shape `(1, num_prefix_tokens + H * W, D)`.
        new_grid_size: int or `(height, width)` of the target patch grid; inside
            a traced graph its entries may be scalar tensors (a dynamic-resolution
            model), with `align_corners=False`.
        old_grid_size: int or `(height, width)` of the table's grid; `None`
            means square.
        num_prefix_tokens: leading rows (the class token's) copied unchanged.
        interpolation: `"bicubic"` (default, as in the paper) or `"bilinear"`.
        align_corners: `True` maps corner to corner (`scipy.ndimage.zoom`);
            `False` uses half-pixel centres (`torch.nn.functional.interpolate`).
        antialias: widen the filter when shrinking, as torch's `antialias=True`.

    Returns:
        The resized table, a numpy array if `pos_embedding` was one, else a
        backend tensor, of shape `(1, num_prefix_tokens + H' * W', D)`.

    Example:
    >>> import numpy as np
    >>> table = np.zeros((1, 1 + 14 * 14, 8), "float32")
    >>> resize_position_embeddings(table, (24, 32)).shape
    (1, 769, 8)
    """
    was_numpy = isinstance(pos_embedding, np.ndarray)
    shape = tuple(pos_embedding.shape)
    if len(shape) != 3 or shape[0] != 1:
        raise ValueError(
            f"pos_embedding must have shape (1, tokens, dim), got {shape}."
        )
    num_patches = shape[1] - num_prefix_tokens
    if old_grid_size is None:
        side = math.isqrt(max(num_patches, 0))
        if side * side != num_patches:
            raise ValueError(
                f"Cannot infer a square grid from {num_patches} patch positions "
                f"({shape[1]} tokens, {num_prefix_tokens} prefix); pass old_grid_size."
            )
        old_grid_size = side
    old_h, old_w = as_pair(old_grid_size, "old_grid_size")
    traced = isinstance(new_grid_size, (tuple, list)) and not all(
        isinstance(v, numbers.Integral) for v in new_grid_size)
    new_h, new_w = new_grid_size if traced else as_pair(new_grid_size, "new_grid_size")
    if old_h * old_w != num_patches:
        raise ValueError(
            f"old_grid_size {(old_h, old_w)} has {old_h * old_w} positions but the "
            f"table holds {num_patches} after {num_prefix_tokens} prefix tokens."
        )
    dtype = pos_embedding.dtype
    if was_numpy and not traced:  # at load: float64 on the host, not the device's float32 matrix products
        return _resize_on_host(pos_embedding, num_prefix_tokens, (old_h, old_w), (new_h, new_w),
                               dict(interpolation=interpolation, align_corners=align_corners, antialias=antialias))
    table = ops.cast(ops.convert_to_tensor(pos_embedding), "float32")
    prefix = table[:, :num_prefix_tokens]
    grid = ops.reshape(table[:, num_prefix_tokens:], (old_h, old_w, shape[2]))
    if traced:
        if align_corners:
            raise ValueError("A grid size known only when the graph runs needs align_corners=False.")
        rows = traced_interpolation_matrix(old_h, new_h, interpolation, antialias)
        cols = traced_interpolation_matrix(old_w, new_w, interpolation, antialias)
    elif (old_h, old_w) != (new_h, new_w):
        options = dict(
            interpolation=interpolation, align_corners=align_corners, antialias=antialias
        )
        rows = ops.convert_to_tensor(interpolation_matrix(old_h, new_h, **options).astype("float32"))
        cols = ops.convert_to_tensor(interpolation_matrix(old_w, new_w, **options).astype("float32"))
    if traced or (old_h, old_w) != (new_h, new_w):
        grid = ops.einsum("ph,hwd->pwd", rows, grid)
        grid = ops.einsum("qw,pwd->pqd", cols, grid)
    patches = ops.reshape(grid, (1, -1, shape[2]))
    resized = ops.concatenate([prefix, patches], axis=1)
    if was_numpy:
        return ops.convert_to_numpy(resized).astype(dtype)
    return ops.cast(resized, dtype)


def _resize_on_host(pos_embedding, num_prefix_tokens, old_grid, new_grid, options):
    """`resize_position_embeddings` of a numpy table, in float64 numpy.

    A TPU's default float32 matrix product is one bfloat16 pass and a recent
    GPU's TF32, which would round the resampled table; this runs at load
    time on the host instead, and the table is rounded once, to its dtype.
    """
    table = np.asarray(pos_embedding, dtype=np.float64)
    grid = table[0, num_prefix_tokens:].reshape(*old_grid, table.shape[-1])
    if old_grid != tuple(new_grid):
        grid = np.einsum("ph,hwd->pwd", interpolation_matrix(old_grid[0], new_grid[0], **options), grid)
        grid = np.einsum("qw,pwd->pqd", interpolation_matrix(old_grid[1], new_grid[1], **options), grid)
    patches = grid.reshape(1, -1, table.shape[-1])
    return np.concatenate([table[:, :num_prefix_tokens], patches], axis=1).astype(pos_embedding.dtype)


def resize_patch_embedding(kernel, new_patch_size, interpolation="bicubic", antialias=True):
    """FlexiViT's pseudo-inverse resize of a `(ph, pw, channels, hidden)` patch-embedding kernel.

    Resizing a patch `x` to the new size is a linear map `B`; the returned
    kernel is `pinv(B^T) w`, so that a patch upsampled from `x` gives the
    same embedding as `x` did: `<x, w> == <B x, resize_patch_embedding(w)>`
    (Beyer et al., 2023, "FlexiViT"; timm's `resample_patch_embed`). The
    resize is separable, so the pseudo-inverse is taken per axis.

    Args:
        kernel: array or tensor of shape `(ph, pw, channels, hidden)`.
        new_patch_size: int or `(height, width)` of the new patches.
        interpolation: `"bicubic"` (default, as timm) or `"bilinear"`.
        antialias: resize as torch's `antialias=True` kernels (default, as timm).

    Returns:
        The kernel of shape `(new_ph, new_pw, channels, hidden)`, a numpy
        array if `kernel` was one, else a backend tensor.

    Example:
    >>> import numpy as np
    >>> resize_patch_embedding(np.ones((16, 16, 3, 8), "float32"), 8).shape
    (8, 8, 3, 8)
    """
    was_numpy = isinstance(kernel, np.ndarray)
    shape = tuple(kernel.shape)
    if len(shape) != 4:
        raise ValueError(f"kernel must have shape (patch_height, patch_width, channels, hidden), got {shape}.")
    new_h, new_w = as_pair(new_patch_size, "new_patch_size")
    if (new_h, new_w) == shape[:2]:
        return kernel
    options = dict(interpolation=interpolation, antialias=antialias)
    # Pseudo-inverses in float64: a downsizing map is rank-deficient and its small singular values matter.
    rows = np.linalg.pinv(interpolation_matrix(shape[0], new_h, **options).T).astype("float32")
    cols = np.linalg.pinv(interpolation_matrix(shape[1], new_w, **options).T).astype("float32")
    dtype = kernel.dtype
    resized = ops.einsum(
        "ph,qw,hwcd->pqcd",
        ops.convert_to_tensor(rows),
        ops.convert_to_tensor(cols),
        ops.cast(ops.convert_to_tensor(kernel), "float32"),
    )
    if was_numpy:
        return ops.convert_to_numpy(resized).astype(dtype)
    return ops.cast(resized, dtype)


@keras.saving.register_keras_serializable(package="keras_vit")
class AddPositionEmbedding(keras.layers.Layer):
    """Add learned 1-D position embeddings to `prefix + rows * cols` tokens.

    The table is built for `grid_size`. Called on a sequence from another
    grid (dynamic resolution), it resizes the table on the fly with
    `resize_position_embeddings`; pass `grid_size=(rows, cols)` to the call
    for non-square grids, or `patch_grid`, the `(batch, rows, cols, hidden)`
    patches the tokens came from, whose sizes may be known only when a
    traced graph runs. Otherwise a square grid is assumed.

    Example:
    >>> import numpy as np
    >>> layer = AddPositionEmbedding(grid_size=(14, 14))
    >>> layer(np.zeros((2, 197, 32))).shape
    (2, 197, 32)
    >>> layer(np.zeros((2, 1 + 24 * 32, 32)), grid_size=(24, 32)).shape
    (2, 769, 32)
    """

    def __init__(
        self,
        grid_size,
        num_prefix_tokens=1,
        interpolation="bicubic",
        antialias=False,
        initializer=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if interpolation not in INTERPOLATIONS:
            raise ValueError(
                f"Unknown interpolation {interpolation!r}; expected one of {INTERPOLATIONS}."
            )
        # === Config ===
        self.grid_size = as_pair(grid_size, "grid_size")
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.interpolation = interpolation
        self.antialias = bool(antialias)
        self.initializer = keras.initializers.get(
            initializer or keras.initializers.RandomNormal(stddev=0.02)
        )

    @property
    def num_positions(self):
        return self.num_prefix_tokens + self.grid_size[0] * self.grid_size[1]

    def build(self, input_shape):
        self.pos_embedding = self.add_weight(
            name="pos_embedding",
            shape=(1, self.num_positions, input_shape[-1]),
            initializer=self.initializer,
        )

    def _input_grid(self, num_tokens, grid_size):
        if grid_size is not None:
            grid_size = as_pair(grid_size, "grid_size")
        elif num_tokens == self.num_positions:
            grid_size = self.grid_size
        else:
            side = math.isqrt(max(num_tokens - self.num_prefix_tokens, 0))
            grid_size = (side, side)
        if self.num_prefix_tokens + grid_size[0] * grid_size[1] != num_tokens:
            raise ValueError(
                f"{num_tokens} tokens do not form {self.num_prefix_tokens} prefix tokens "
                f"plus a {grid_size} patch grid; pass grid_size=(rows, cols) for "
                "non-square images."
            )
        return grid_size

    def call(self, tokens, grid_size=None, patch_grid=None):
        num_tokens = tokens.shape[1]
        if patch_grid is not None:
            grid_size = tuple(ops.shape(patch_grid)[1:3])
        traced = grid_size is not None and not all(isinstance(size, numbers.Integral) for size in grid_size)
        if traced:
            grid = grid_size  # Known only when the traced graph runs: always resized (equal sizes give identity).
        elif num_tokens is None:
            raise ValueError(
                "AddPositionEmbedding needs a static number of tokens, or the patch_grid they came from; "
                "build the model with a fixed image size or image_size=(None, None)."
            )
        else:
            grid = self._input_grid(num_tokens, grid_size)
        table = self.pos_embedding
        if traced or grid != self.grid_size:
            table = resize_position_embeddings(
                table,
                new_grid_size=grid,
                old_grid_size=self.grid_size,
                num_prefix_tokens=self.num_prefix_tokens,
                interpolation=self.interpolation,
                antialias=self.antialias,
            )
        return tokens + ops.cast(table, tokens.dtype)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            grid_size=self.grid_size,
            num_prefix_tokens=self.num_prefix_tokens,
            interpolation=self.interpolation,
            antialias=self.antialias,
            initializer=keras.initializers.serialize(self.initializer),
        )
        return config
