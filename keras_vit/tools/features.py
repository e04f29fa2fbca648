"""Intermediate block outputs as feature maps, for dense tasks (segmentation, detection, depth).

`feature_extractor` turns any keras_vit model (fixed or dynamic resolution,
plain or hybrid, with or without its top) into a `keras.Model` whose outputs
are chosen blocks' patch tokens, laid out as `(batch, rows, cols, hidden)`
maps: what timm's `forward_intermediates` returns, as a Keras model that
trains, saves and exports like any other.

A NaFlex model's images each have their own grid, so one batch has no one
map shape: as timm's `forward_intermediates` does for NaFlex inputs (NLC
only), its features are `(batch, patches, hidden)` sequences (prefix
tokens dropped, padding positions kept) from its three inputs, and
`naflex_feature_maps(features, patch_grid)` lays each image's valid
patches out as its own `(rows, cols, hidden)` map.
"""

import numbers

import keras
import numpy as np
from keras import ops

from keras_vit.model.description import architecture_of, is_naflex, native_grid


@keras.saving.register_keras_serializable(package="keras_vit")
class PatchTokens(keras.layers.Layer):
    """Drop the prefix tokens and, with `spatial=True`, lay the patch tokens out as their grid.

    The grid is `grid_size`, or with dynamic resolution the `(rows, cols)`
    of `patch_grid`, the patch embedding's 4-D output passed to the call.

    Example:
    >>> import numpy as np
    >>> PatchTokens(num_prefix_tokens=1, grid_size=(2, 3))(np.zeros((4, 7, 8))).shape
    (4, 2, 3, 8)
    """

    def __init__(self, num_prefix_tokens=1, grid_size=None, spatial=True, **kwargs):
        super().__init__(**kwargs)
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.grid_size = None if grid_size is None else tuple(int(side) for side in grid_size)
        self.spatial = bool(spatial)

    def call(self, tokens, patch_grid=None):
        patches = tokens[:, self.num_prefix_tokens:]
        if not self.spatial:
            return patches
        rows, cols = self.grid_size if patch_grid is None else tuple(ops.shape(patch_grid)[1:3])
        return ops.reshape(patches, (ops.shape(patches)[0], rows, cols, ops.shape(patches)[-1]))

    def compute_output_shape(self, tokens_shape, patch_grid_shape=None):
        batch, tokens, hidden = tokens_shape
        if not self.spatial:
            return (batch, None if tokens is None else tokens - self.num_prefix_tokens, hidden)
        rows, cols = self.grid_size if patch_grid_shape is None else tuple(patch_grid_shape[1:3])
        return (batch, rows, cols, hidden)

    def get_config(self):
        config = super().get_config()
        config.update(num_prefix_tokens=self.num_prefix_tokens, grid_size=self.grid_size, spatial=self.spatial)
        return config


def feature_extractor(model, blocks, spatial=True, norm=False, name=None):
    """A `keras.Model` from `model`'s images to the outputs of its encoder `blocks`.

    Args:
        model: a keras_vit model (`keras_vit.ViT` and the named variants,
            `include_top` or not, fixed or `image_size=(None, None)`).
        blocks: 0-based block indices, e.g. `(3, 5, 7, 11)`; negative ones
            count from the last block.
        spatial: shape each output `(batch, rows, cols, hidden)`; otherwise
            `(batch, rows * cols, hidden)`. Prefix (class) tokens are dropped.
        norm: pass each output through the model's final LayerNorm.
        name: the new model's name (default `"<model>_features"`).

    The new model shares `model`'s layers and weights. It has one output
    per block, in the order given (Keras makes a single one a plain tensor).

    Example:
    >>> import keras_vit
    >>> vit = keras_vit.ViT(image_size=64, patch_size=16, hidden_size=32, num_layers=4,
    ...                     num_heads=2, mlp_dim=64)
    >>> [tuple(o.shape) for o in feature_extractor(vit, (1, 3)).outputs]
    [(None, 4, 4, 32), (None, 4, 4, 32)]
    """
    depth = sum(1 for layer in getattr(model, "layers", ()) if layer.name.startswith("encoderblock_"))
    if not depth:
        raise ValueError(f"{getattr(model, 'name', model)!r} has no encoder blocks (encoderblock_0, ...); "
                         "feature_extractor takes a keras_vit model.")
    example = "pass block indices, e.g. (3, 5, 7, 11) or -1 for the last block"
    if isinstance(blocks, numbers.Integral) and not isinstance(blocks, bool):
        blocks = (blocks,)
    try:
        if isinstance(blocks, (str, bytes)):
            raise TypeError
        blocks = tuple(blocks)
    except TypeError:
        raise ValueError(f"blocks is {blocks!r}; {example}.") from None
    if not blocks:
        raise ValueError("blocks is empty; pass the indices of the blocks whose outputs you want, e.g. (3, 5, 7, 11).")
    chosen = []
    for index in blocks:
        if not isinstance(index, numbers.Integral) or isinstance(index, bool):
            raise ValueError(f"Block index {index!r} is a {type(index).__name__}, not an int; {example}.")
        if not -depth <= index < depth:
            raise ValueError(
                f"Block index {index!r} is out of range for a model with {depth} encoder blocks; "
                f"use 0 to {depth - 1} (or -{depth} to -1 from the end)."
            )
        chosen.append(int(index) % depth)
    naflex = is_naflex(model)
    if naflex and spatial:
        raise ValueError(f"{model.name!r} is a NaFlex model, whose images each have their own grid: pass "
                         "spatial=False for (batch, patches, hidden) features, and lay each image's out with "
                         "keras_vit.naflex_feature_maps(features, batch['patch_grid']).")
    grid_size = native_grid(model)
    embedding = model.get_layer("embedding")
    dynamic = len(embedding.output.shape) == 4  # The dynamic model's patch grid, read on every call.
    tokens = PatchTokens(architecture_of(model).block_prefix_tokens, None if dynamic else grid_size, spatial,
                         name=f"{model.name}_patch_tokens")
    outputs = []
    for index in chosen:
        features = model.get_layer(f"encoderblock_{index}").output
        if norm and any(layer.name == "encoder_norm" for layer in model.layers):  # fc_norm models have none
            features = model.get_layer("encoder_norm")(features)
        outputs.append(tokens(features, patch_grid=embedding.output) if dynamic else tokens(features))
    inputs = model.input if naflex else model.inputs[0] if len(model.inputs) == 1 else model.inputs
    return keras.Model(inputs, outputs, name=name or f"{model.name}_features")


def naflex_feature_maps(features, patch_grid):
    """Each image's `(rows, cols, hidden)` map, a list of numpy arrays, from a NaFlex model's features.

    `features` is `(batch, patches, hidden)`, one output of
    `feature_extractor(naflex_model, blocks, spatial=False)`; `patch_grid`
    the batch's `(batch, 2)` grids. An image's map holds its first
    `rows * cols` patches (the valid ones), row-major.

    Example:
    >>> [m.shape for m in naflex_feature_maps(np.zeros((2, 6, 8)), np.array([[2, 3], [1, 4]]))]
    [(2, 3, 8), (1, 4, 8)]
    """
    features = np.asarray(keras.ops.convert_to_numpy(features))
    grids = np.asarray(keras.ops.convert_to_numpy(patch_grid)).reshape(-1, 2).tolist()
    if features.ndim != 3 or len(grids) != len(features):
        raise ValueError(f"naflex_feature_maps takes (batch, patches, hidden) features and the batch's (batch, 2) "
                         f"patch_grid; got features of shape {features.shape} and {len(grids)} grids.")
    too_long = [index for index, (rows, cols) in enumerate(grids) if rows * cols > features.shape[1]]
    if too_long:
        rows, cols = grids[too_long[0]]
        raise ValueError(f"patch_grid of image {too_long[0]} is ({rows}, {cols}), more than the {features.shape[1]} "
                         "patches of its features; pass the patch_grid of the batch the features came from.")
    return [image[: rows * cols].reshape(rows, cols, -1) for image, (rows, cols) in zip(features, grids)]
