"""Checkpoints: where published weights live, each file layout, and loading into a model.

- `registry`: the named published checkpoints (`available_weights`) and their download;
- `source`: `WeightsSource`, the one internal state every layout is read into;
- `flax_npz`: the original Flax `.npz` layout (vision_transformer, big_vision), read and written;
- `keras_files`: Keras' `.keras` and `.weights.h5` files;
- `timm_layout`: timm's ViT state dicts (`.safetensors`, `.bin`/`.pth`) and Hub folders, read;
- `timm_writer`: `save_timm`, written in timm's names, and the `timm.create_model` keywords that rebuild a model;
- `timm_families`: what a timm architecture name says that its tensors cannot (heads, activation, epsilon);
- `transformers_layout`: Hugging Face transformers' `ViTForImageClassification` / `ViTModel` folders;
- `dinov2_layout`: transformers' `Dinov2Model` / `Dinov2WithRegistersModel` folders;
- `clip_layout`: the vision towers of transformers' CLIP and SigLIP folders;
- `loading`: `read_weights` for any name or path, and `load_into`, which adapts
  heads and position embeddings and assigns all or nothing.

This package never imports `keras_vit.models`: the model is built there and
handed in.

Example:
>>> from keras_vit import checkpoints
>>> source = checkpoints.read_weights("ViT-B_16.npz", "ViT_B16", (224, 224))  # doctest: +SKIP
>>> source.sizes, source.classes  # doctest: +SKIP
"""

from keras_vit.checkpoints.flax_npz import from_flax, read_npz, save_npz, to_flax
from keras_vit.checkpoints.keras_files import load_keras, read_keras, read_weights_h5, source_of_saved
from keras_vit.checkpoints.loading import check_finite, load_into, read_folder, read_weights
from keras_vit.checkpoints.registry import (
    Checkpoint,
    available_weights,
    cache_dir,
    fetch,
    find_checkpoint,
    register,
)
from keras_vit.checkpoints.clip_layout import from_vision_tower, read_vision_tower_folder
from keras_vit.checkpoints.dinov2_layout import from_dinov2, read_dinov2_folder
from keras_vit.checkpoints.source import CheckpointError, WeightsSource, architecture_of, state_of
from keras_vit.checkpoints.dinov3_layout import read_dinov3_folder
from keras_vit.checkpoints.timm_layout import from_timm, read_timm, read_timm_folder
from keras_vit.checkpoints.timm_writer import save_timm, timm_arguments, to_timm
from keras_vit.checkpoints.transformers_layout import from_transformers, read_transformers_folder

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "WeightsSource",
    "architecture_of",
    "available_weights",
    "cache_dir",
    "check_finite",
    "fetch",
    "find_checkpoint",
    "from_dinov2",
    "from_flax",
    "from_timm",
    "from_transformers",
    "from_vision_tower",
    "load_into",
    "load_keras",
    "read_keras",
    "read_npz",
    "read_dinov3_folder",
    "read_timm",
    "read_dinov2_folder",
    "read_folder",
    "read_timm_folder",
    "read_transformers_folder",
    "read_vision_tower_folder",
    "read_weights",
    "read_weights_h5",
    "register",
    "save_npz",
    "save_timm",
    "source_of_saved",
    "state_of",
    "timm_arguments",
    "to_flax",
    "to_timm",
]
