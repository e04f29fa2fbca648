"""Rotary position embeddings (RoPE) for a ViT: EVA-02's, Naver's mixed and DINOv3's.

RoPE rotates each head's queries and keys by angles that grow with the
token's position on the patch grid, so attention sees relative positions;
the prefix tokens (class, registers) are not rotated. The three forms of
timm's `Eva` class differ in the grid coordinates and the frequencies:

* `"axial"` (timm's `RotaryEmbeddingCat`; EVA-02, SBB, Perception
  Encoder, Naver's axial): patch indices (plus an offset; rescaled to a
  reference grid where the weights were trained at another size), each
  axis rotating a quarter of the head by `temperature ** (-k / (head_dim / 4))`.
* `"mixed"` (`RotaryEmbeddingMixed`; Naver's mixed): patch indices and
  learned frequencies per block and head, `theta = t_x f_x + t_y f_y`.
* `"dinov3"` (`RotaryEmbeddingDinoV3`): pixel-centre coordinates
  normalised to [-1, 1] per axis, periods `temperature ** (4k / head_dim)`,
  angles `2 pi c / period`.

`RotaryPositions` computes the coordinates once per model from the patch
grid (any size: RoPE has no table to resize); each `TransformerBlock`
turns them into angles with its frequencies (`rotate_queries_and_keys`).
The angles are products, never matrix products, so no device computes them
in reduced precision.

Example:
>>> import numpy as np
>>> positions = RotaryPositions((2, 3), num_prefix_tokens=1)(np.zeros((1, 7, 8)))
>>> np.asarray(positions).tolist()[:3]
[[0.0, 0.0], [0.0, 0.0], [0.0, 1.0]]
"""

import math

import keras
import numpy as np
from keras import ops

# Rotary position embeddings (`keras_vit.layers.rope`): EVA-02's axial, Naver's mixed (learned), DINOv3's.
ROPE_FORMS = ("axial", "mixed", "dinov3")


GRID_INDEXINGS = ("ij", "xy")


def rope_frequencies(form, head_dim, temperature):
    """The fixed frequencies of each coordinate axis, `(head_dim // 4,)` float32 (not for `"mixed"`, whose are learned).

    Example:
    >>> rope_frequencies("axial", 8, 100.0).tolist()
    [1.0, 0.10000000149011612]
    """
    count = head_dim // 4
    steps = np.arange(count, dtype=np.float32)
    if form == "axial":
        return (np.float32(1.0) / np.float32(temperature) ** (steps / np.float32(count))).astype("float32")
    if form == "dinov3":
        periods = np.float32(temperature) ** (np.float32(2.0) * steps / np.float32(head_dim // 2))
        return (2.0 * math.pi / periods.astype("float64")).astype("float32")
    raise ValueError(f"Unknown RoPE form {form!r} for fixed frequencies; expected 'axial' or 'dinov3'.")


def initial_mixed_frequencies(num_heads, head_dim, temperature, seed=None):
    """Mixed RoPE's frequencies for a new model, `(2, num_heads, head_dim // 2)`: the axial magnitudes turned by a
    random angle per head (Heo et al., 2024), as timm's `init_random_2d_freqs` draws them."""
    magnitudes = 1.0 / temperature ** (np.arange(0, head_dim, 4, dtype="float64") / head_dim)
    angles = np.random.default_rng(seed).uniform(0.0, 2.0 * math.pi, (num_heads, 1))
    along_x = np.concatenate([magnitudes * np.cos(angles), magnitudes * np.cos(angles + math.pi / 2)], -1)
    along_y = np.concatenate([magnitudes * np.sin(angles), magnitudes * np.sin(angles + math.pi / 2)], -1)
    return np.stack([along_x, along_y]).astype("float32")


def axis_coordinates(steps, size, form, offset, reference):
    """The coordinates of patch indices `steps` on an axis of `size` patches (tensors that broadcast together):
    the indices (plus `offset`, rescaled to a `reference` grid), or DINOv3's centred ones in [-1, 1]."""
    steps, size = ops.cast(steps, "float32"), ops.cast(size, "float32")
    if form == "dinov3":
        return 2.0 * ((steps + (0.5 + offset)) / size) - 1.0
    steps = steps + offset
    if reference is not None:  # EVA-02's rescale of positions to the grid the weights were trained on
        steps = steps / size * float(reference)
    return steps


def _axis(size, form, offset, reference):
    """One axis' coordinates: `size` patch indices, or DINOv3's centred ones in [-1, 1]."""
    return axis_coordinates(ops.arange(0, size, 1), size, form, offset, reference)


def grid_coordinates(rows, cols, form="axial", offset=0.0, reference_grid=None, indexing="ij"):
    """The `(rows * cols, 2)` float32 coordinates of a patch grid in row-major order.

    The channels are `(row, column)` for `"ij"` indexing and `(column, row)`
    for `"xy"`, as timm's `_build_grid` lays them out.
    """
    reference = reference_grid or (None, None)
    row = _axis(rows, form, offset, reference[0])
    col = _axis(cols, form, offset, reference[1])
    row = ops.reshape(ops.broadcast_to(ops.expand_dims(row, 1), (rows, cols)), (-1,))
    col = ops.reshape(ops.broadcast_to(ops.expand_dims(col, 0), (rows, cols)), (-1,))
    return ops.stack([row, col] if indexing == "ij" else [col, row], axis=-1)


@keras.saving.register_keras_serializable(package="keras_vit")
class RotaryPositions(keras.layers.Layer):
    """The position of every token that RoPE rotates by: `(tokens, 2)` float32, `(0, 0)` (no rotation) for the prefix.

    Called on the token sequence (whose grid is `grid_size`), or with
    `patch_grid`, the `(batch, rows, cols, hidden)` patches of a model with
    dynamic resolution, whose grid is read on every call. `grid_size` is
    also the grid the model was built at (`native_image_size`).
    """

    def __init__(self, grid_size, form="axial", num_prefix_tokens=0, offset=0.0, reference_grid=None,
                 indexing="ij", **kwargs):
        super().__init__(**kwargs)
        # === Config ===
        if form not in ROPE_FORMS:
            raise ValueError(f"Unknown RoPE form {form!r}; expected one of {ROPE_FORMS}.")
        if indexing not in GRID_INDEXINGS:
            raise ValueError(f"Unknown RoPE grid indexing {indexing!r}; expected one of {GRID_INDEXINGS}.")
        self.grid_size = tuple(int(side) for side in grid_size)
        self.form = form
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.offset = float(offset)
        self.reference_grid = None if reference_grid is None else tuple(float(side) for side in reference_grid)
        self.indexing = indexing

    def call(self, tokens, patch_grid=None):
        rows, cols = self.grid_size if patch_grid is None else tuple(ops.shape(patch_grid)[1:3])
        coordinates = grid_coordinates(rows, cols, self.form, self.offset, self.reference_grid, self.indexing)
        if self.num_prefix_tokens:
            coordinates = ops.concatenate([ops.zeros((self.num_prefix_tokens, 2), "float32"), coordinates], axis=0)
        return coordinates

    def compute_output_spec(self, tokens, patch_grid=None):
        count = tokens.shape[1] if patch_grid is None else None
        return keras.KerasTensor((count, 2), dtype="float32")

    def get_config(self):
        config = super().get_config()
        config.update(grid_size=list(self.grid_size), form=self.form, num_prefix_tokens=self.num_prefix_tokens,
                      offset=self.offset, indexing=self.indexing,
                      reference_grid=None if self.reference_grid is None else list(self.reference_grid))
        return config


def _layout(values, rotate_half):
    """Per-frequency values `(..., head_dim // 2)` laid out over the head: `[a, a]` (half) or `[a0, a0, a1, a1, ...]`."""
    if rotate_half:
        return ops.concatenate([values, values], axis=-1)
    shape = ops.shape(values)  # stack, not repeat: Keras' torch backend cannot run repeat on its meta device
    return ops.reshape(ops.stack([values, values], axis=-1), (*shape[:-1], shape[-1] * 2))


def _rotated(x, rotate_half):
    """`x` turned a quarter: `[-x2, x1]` of its halves, or `[-x1, x0, -x3, x2, ...]` of its pairs."""
    if rotate_half:
        first, second = ops.split(x, 2, axis=-1)
        return ops.concatenate([-second, first], axis=-1)
    shape = ops.shape(x)
    pairs = ops.reshape(x, (*shape[:-1], shape[-1] // 2, 2))
    return ops.reshape(ops.stack([-pairs[..., 1], pairs[..., 0]], axis=-1), shape)


def rotation_angles(positions, frequencies):
    """Angles `([batch,] tokens, heads or 1, head_dim // 2)` from positions `([batch,] tokens, 2)`.

    `frequencies` is `(head_dim // 4,)` (the same for both axes and every
    head: the first half of the angles is the first axis') or, for mixed
    RoPE, `(2, heads, head_dim // 2)`. Positions with a batch axis are a
    NaFlex batch's, each image on its own grid.
    """
    first, second = positions[..., 0:1], positions[..., 1:2]
    if len(frequencies.shape) == 1:
        return ops.expand_dims(ops.concatenate([first * frequencies, second * frequencies], axis=-1), -2)
    frequencies = ops.cast(frequencies, "float32")
    return ops.expand_dims(first, -1) * frequencies[0] + ops.expand_dims(second, -1) * frequencies[1]


def rotate_queries_and_keys(query, key, positions, frequencies, rotate_half, axis_halves=False):
    """`query` and `key` `(batch, tokens, heads, head_dim)` rotated by their tokens' angles, in float32, then cast
    back to their dtype (as timm's `apply_rot_embed`).

    With `axis_halves` each coordinate axis turns its own half of the head,
    halves rotated within it (Gemma 4's `apply_multidimensional_rope`: the
    first axis' angles `[a, a]` over the first half, the second's over the
    second); otherwise the angles of both axes are laid over the whole head.
    """
    angles = rotation_angles(positions, frequencies)
    if axis_halves:  # (..., head_dim // 2) -> (..., 2, head_dim // 4): one row of angles per axis and half
        angles = ops.reshape(angles, (*ops.shape(angles)[:-1], 2, ops.shape(angles)[-1] // 2))
    cos, sin = _layout(ops.cos(angles), rotate_half), _layout(ops.sin(angles), rotate_half)

    def rotate(x):
        wide = ops.cast(x, "float32")
        if axis_halves:
            shape = ops.shape(wide)
            halves = ops.reshape(wide, (*shape[:-1], 2, shape[-1] // 2))
            turned = halves * cos + _rotated(halves, rotate_half) * sin
            return ops.cast(ops.reshape(turned, shape), x.dtype)
        return ops.cast(wide * cos + _rotated(wide, rotate_half) * sin, x.dtype)

    return rotate(query), rotate(key)
