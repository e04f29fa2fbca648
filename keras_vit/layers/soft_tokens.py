"""Gemma 4's soft tokens: the patch grid pooled in k x k cells and scaled by sqrt(hidden) (`SoftTokenPooling`).

Gemma 4's vision tower hands its language model one "soft token" per cell
of `kernel_size x kernel_size` patches: the cell's mean, times
`sqrt(hidden)`, in row-major order of the cells (timm's and transformers'
`Gemma4VisionPooler`). The 31B model's tower standardises them too,
`(x - std_bias) * std_scale`, with two buffers of its checkpoint.
"""

import math
import numbers

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_vit")
class SoftTokenPooling(keras.layers.Layer):
    """`(batch, rows * cols, hidden)` patch tokens to `(batch, rows/k * cols/k, hidden)` soft tokens, in float32.

    The tokens are on `grid_size`, or on the grid of `patch_grid` (dynamic
    resolution); both sides must be multiples of `kernel_size`. With
    `standardize`, the non-trainable weights `std_bias` and `std_scale`
    (`(hidden,)`, a checkpoint's buffers) standardise the result.

    Example:
    >>> import numpy as np
    >>> tokens = np.arange(36.0, dtype="float32").reshape(1, 36, 1)
    >>> np.asarray(SoftTokenPooling(3, (6, 6))(tokens))[0, :, 0].tolist()
    [7.0, 10.0, 25.0, 28.0]
    """

    def __init__(self, kernel_size, grid_size, standardize=False, **kwargs):
        super().__init__(**kwargs)
        # === Config ===
        self.kernel_size = int(kernel_size)
        self.grid_size = tuple(int(side) for side in grid_size)
        self.standardize = bool(standardize)
        if self.kernel_size < 1:
            raise ValueError(f"kernel_size must be a whole number >= 1, got {kernel_size!r}.")

    def build(self, input_shape):
        if self.standardize:
            hidden = (input_shape[-1],)
            self.std_bias = self.add_weight(name="std_bias", shape=hidden, initializer="zeros", trainable=False,
                                            autocast=False)
            self.std_scale = self.add_weight(name="std_scale", shape=hidden, initializer="ones", trainable=False,
                                             autocast=False)

    def _check(self, rows, cols):
        k = self.kernel_size
        if any(isinstance(side, numbers.Integral) and side % k for side in (rows, cols)):
            raise ValueError(f"Gemma 4's soft tokens pool {k}x{k} cells of patches, but the patch grid is {rows}x"
                             f"{cols}: give an image whose sides are multiples of the patch size times {k}.")

    def call(self, tokens, patch_grid=None):
        rows, cols = self.grid_size if patch_grid is None else tuple(ops.shape(patch_grid)[1:3])
        self._check(rows, cols)
        k = self.kernel_size
        hidden = tokens.shape[-1]
        cells = ops.reshape(ops.cast(tokens, "float32"), (-1, rows // k, k, cols // k, k, hidden))
        pooled = ops.reshape(ops.mean(cells, axis=(2, 4)), (-1, (rows // k) * (cols // k), hidden))
        pooled = pooled * math.sqrt(hidden)
        if self.standardize:
            pooled = (pooled - ops.cast(self.std_bias, "float32")) * ops.cast(self.std_scale, "float32")
        return ops.cast(pooled, self.compute_dtype)

    def compute_output_spec(self, tokens, patch_grid=None):
        rows, cols = self.grid_size if patch_grid is None else (None, None)
        self._check(rows, cols)
        count = None if rows is None else (rows // self.kernel_size) * (cols // self.kernel_size)
        return keras.KerasTensor((tokens.shape[0], count, tokens.shape[-1]), dtype=self.compute_dtype)

    def get_config(self):
        config = super().get_config()
        config.update(kernel_size=self.kernel_size, grid_size=list(self.grid_size), standardize=self.standardize)
        return config
