"""Checkpoints: where published weights live, each file layout, and loading into a model.

- `source`: `WeightsSource`, the one internal state every layout is read into;
- `tensor_layout`: layouts as declared tables, and the one converter that applies them;
- `config_fields`: the kind of every config field read from timm and transformers;
- `state_dict_files`: `.safetensors` and PyTorch files as `{name: array}`;
- `flax_npz`: the original Flax `.npz` layout (vision_transformer, big_vision), read and written;
- `keras_files`: Keras' `.keras` and `.weights.h5` files;
- `loading`: `read_weights` for any name or path, and `load_into`, which adapts
  heads and position embeddings and assigns all or nothing;
- `timm/`: timm's layouts: `layout` (its `VisionTransformer`), `eva_layout` (its `Eva`), `families` and
  `eva_families` (what an architecture name sets), `hybrid` (ResNet and conv stems), `config` (its
  `config.json`), `writer` (`save_timm`);
- `transformers/`: `vit`, `clip` (CLIP and SigLIP vision towers), `dinov2`, `dinov3`;
- `hub/`: `registry` (the named published checkpoints, `available_weights`) and `download` (the cache).

Imports run one way: this package reads `keras_vit.model` and never imports
`keras_vit.applications`, where the model is built and handed in.

Example:
>>> from keras_vit import checkpoints
>>> source = checkpoints.read_weights("ViT-B_16.npz", "ViT_B16", (224, 224))  # doctest: +SKIP
>>> source.sizes, source.classes  # doctest: +SKIP
"""

from keras_vit.checkpoints.flax_npz import from_flax, read_npz, save_npz, to_flax
from keras_vit.checkpoints.hub.registry import (
    Checkpoint,
    available_weights,
    cache_dir,
    fetch,
    find_checkpoint,
    register,
)
from keras_vit.checkpoints.keras_files import load_keras, read_keras, read_weights_h5, source_of_saved
from keras_vit.checkpoints.loading import check_finite, load_into, read_folder, read_weights
from keras_vit.checkpoints.source import CheckpointError, WeightsSource, state_of
from keras_vit.checkpoints.timm.folders import read_timm_folder
from keras_vit.checkpoints.timm.layout import from_timm, read_timm
from keras_vit.checkpoints.timm.writer import save_timm, timm_arguments, to_timm
from keras_vit.checkpoints.transformers.clip import from_vision_tower, read_vision_tower_folder
from keras_vit.checkpoints.transformers.dinov2 import from_dinov2, read_dinov2_folder
from keras_vit.checkpoints.transformers.beit import read_beit_folder
from keras_vit.checkpoints.transformers.dinov3 import read_dinov3_folder
from keras_vit.checkpoints.transformers.gemma4 import read_gemma4_vision_folder
from keras_vit.checkpoints.transformers.sam import read_sam_vision_folder
from keras_vit.checkpoints.transformers.vit import from_transformers, read_transformers_folder
from keras_vit.model.description import architecture_of

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
    "read_beit_folder",
    "read_dinov3_folder",
    "read_gemma4_vision_folder",
    "read_sam_vision_folder",
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
