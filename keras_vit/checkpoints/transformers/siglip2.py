"""transformers' SigLIP 2 vision towers (`Siglip2VisionModel`, and the vision tower of `Siglip2Model`), read.

A folder holds `config.json` beside `model.safetensors`: a vision model
(`model_type` `siglip2_vision_model`) or a whole image-text model
(`siglip2`), whose `vision_config` and `vision_model.*` tensors are read and
whose text tower is left aside. SigLIP 2 is NaFlex only in transformers:
it takes pre-cut patches (`pixel_values`, `spatial_shapes`,
`pixel_attention_mask`), so the file is read as a NaFlex model
(`WeightsSource.naflex`). Its tensors keep SigLIP's names
(`transformers.clip`) but two:

- `embeddings.patch_embedding` is a Linear on each patch's pixels in
  (row, column, channel) order, the order of `Siglip2ImageProcessor` and of
  keras_vit's NaFlex batches, so its `(width, patch * patch * channels)`
  weight is keras_vit's `(patch, patch, channels, width)` kernel reshaped;
- `embeddings.position_embedding` holds `num_patches` rows, a square grid
  that transformers resizes to each image's grid, bilinear with antialias
  (`Siglip2VisionEmbeddings.resize_positional_embeddings`), as keras_vit's
  NaFlex position embedding does with `position_resize` `("bilinear", True)`.

The rest is SigLIP's: tanh GELU, epsilon 1e-6, `post_layernorm`, then
attention pooling (`head.*`), which `vision_use_head: false` leaves out: such
a tower has no pooled output in transformers, so `from_pretrained` builds
it with `pooling=None` (its `last_hidden_state`). The same weights also run
on whole images (`from_pretrained(folder, naflex=False)`): a fixed-size or
dynamic-resolution ViT, whose position table is resized to its grid the
same way, computes what the NaFlex model does on an image of that grid.
`loading.read_folder` adds the pixel statistics and the patch budget of the
folder's `preprocessor_config.json` (`WeightsSource.naflex_preprocessing`).

Example:
>>> from keras_vit import checkpoints
>>> source = checkpoints.read_weights("siglip2-base-patch16-naflex")  # doctest: +SKIP
"""

import dataclasses
import math

from keras_vit.checkpoints.source import CheckpointError, architecture_from_state, source_from_state
from keras_vit.checkpoints.state_dict_files import read_state_dict
from keras_vit.checkpoints.tensor_layout import keras_to_torch, settings
from keras_vit.checkpoints.transformers.clip import LAYOUT as SIGLIP_LAYOUT
from keras_vit.checkpoints.transformers.clip import from_vision_tower, vision_config, without_head
from keras_vit.checkpoints.transformers.vit import check_sizes, transformers_fields
from keras_vit.model.architecture import Architecture

# model_type -> whether the folder is a whole image-text model.
MODEL_TYPES = {"siglip2_vision_model": False, "siglip2": True}
# The fields of transformers' Siglip2VisionConfig and Siglip2Config that the reader computes or checks, with
# transformers' defaults (the other fields are in transformers.vit.INFERENCE_IRRELEVANT).
CONFIG_DEFAULTS = {
    "siglip2_vision_model": dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                                 num_attention_heads=12, num_channels=3, patch_size=16,
                                 hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6, vision_use_head=True,
                                 num_patches=256),
    "siglip2": dict(vision_config=None),
}
LAYOUT = dataclasses.replace(SIGLIP_LAYOUT, name="transformers' SigLIP 2 vision layout")


def _patch_kernel(state, fields, weights, where):
    """The Linear patch embedding `(patch * patch * channels, width)` as keras_vit's `(patch, patch, channels,
    width)` kernel, refused where `fields`' patch_size and num_channels do not make its width."""
    kernel = state["embedding/kernel"]
    patch, channels = fields["patch_size"], fields["num_channels"]
    if kernel.ndim != 2 or kernel.shape[0] != patch * patch * channels:
        shape = list(keras_to_torch("embeddings.patch_embedding.weight", kernel).shape)
        raise CheckpointError(f"{weights}: embeddings.patch_embedding.weight has shape {shape}, but {where}'s "
                              f"patch_size {patch} and num_channels {channels} make a Linear of "
                              f"{patch * patch * channels} inputs (SigLIP 2 embeds each {patch}x{patch}x{channels} "
                              "patch): set them to the file's.")
    return kernel.reshape(patch, patch, channels, kernel.shape[-1])


def _grid(state, fields, weights, where):
    """The square grid of the position table, which transformers reshapes it to; refused where none or where
    `fields`' num_patches is another."""
    rows = int(state["position_embedding/pos_embedding"].shape[1])
    side = math.isqrt(rows)
    if side * side != rows:
        raise CheckpointError(f"{weights}: embeddings.position_embedding.weight has {rows} rows, which are no square "
                              "grid; SigLIP 2 reshapes its position table to a square (num_patches a square number), "
                              "so this is no SigLIP 2 checkpoint.")
    if fields["num_patches"] != rows:
        raise CheckpointError(f"{where}: num_patches is {fields['num_patches']}, but the file's position table has "
                              f"{rows} rows; set it to {rows}.")
    return (side, side)


def read_siglip2_folder(folder, config, budget=None):
    """A transformers SigLIP 2 folder (its parsed `config`) as the `WeightsSource` of its vision tower (NaFlex)."""
    model_type = config.get("model_type")
    vision, where = vision_config(folder, config, "vision_config" if MODEL_TYPES[model_type] else None)
    weights, fields = transformers_fields(folder, vision, CONFIG_DEFAULTS["siglip2_vision_model"], where)
    head = fields["vision_use_head"]
    expected = (Architecture(class_token=False, classifier="map" if head else "gap"), fields["num_hidden_layers"],
                settings(dict(fields, model_type=model_type), "model_type", "num_hidden_layers", "vision_use_head"))
    state = from_vision_tower(read_state_dict(weights, budget), weights, expected, LAYOUT)
    state["embedding/kernel"] = _patch_kernel(state, fields, weights, where)
    check_sizes(where, fields, state)
    grid = _grid(state, fields, weights, where)
    architecture = architecture_from_state(state, grid, mlp_activation=fields["hidden_act"],
                                           layer_norm_epsilon=fields["layer_norm_eps"])
    source = source_from_state(weights, state, grid, fields["num_attention_heads"], architecture)
    source.position_resize = ("bilinear", True)  # Siglip2VisionEmbeddings.resize_positional_embeddings
    source.naflex = True
    return without_head(source, head)
