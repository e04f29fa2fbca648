"""Everything `import keras_vit` gives: the models, checkpoint readers, layers and tools.

`keras_vit/__init__` imports this module, except in the `keras-vit` command,
which imports it once its flags are parsed and its backend chosen
(`keras_vit.startup`). Importing it registers every class a `.keras` file of
keras_vit names, so that `keras.saving.load_model` finds them.
"""

from keras_vit import layers
from keras_vit.applications.pretrained import from_pretrained
from keras_vit.applications.vit import (
    ViT,
    ViT_B8,
    ViT_B16,
    ViT_B32,
    ViT_H14,
    ViT_L16,
    ViT_L32,
    ViT_R26_B32,
    ViT_R26_S32,
    ViT_R50_B16,
    ViT_R50_L32,
    ViT_S16,
    ViT_S32,
    ViT_Ti16,
)
from keras_vit.checkpoints import Checkpoint, CheckpointError, available_weights
from keras_vit.data.imagenet import decode_predictions, preprocess_input
from keras_vit.data.preprocessing import EvalTransform
from keras_vit.layers import kernels, resnet  # noqa: F401 (registers the layers a .keras file names)
from keras_vit.layers.position_embedding import resize_patch_embedding, resize_position_embeddings
from keras_vit.model.architecture import Architecture
from keras_vit.model.lora import enable_lora, merge_lora
from keras_vit.model.variants import VARIANTS, Variant, decode_variant
from keras_vit.model.vision_transformer import eval_transform
from keras_vit.tools import analysis
from keras_vit.tools.features import feature_extractor, naflex_feature_maps
from keras_vit.tools.timm_names import create_model, list_models
from keras_vit.training import distribute, durable, recipes  # recipes registers the optimizers saved in .keras files
from keras_vit.training.distillation import Distiller
from keras_vit.training.masked_patch import MaskedPatchPretrainer, PatchCorruption, mean_colour_bins

# Modules that moved into subpackages (issue 46), still reachable as `keras_vit.<name>` since the guides import
# them so (`from keras_vit import recipes`): `keras_vit.training.{recipes,distribute,durable}`,
# `keras_vit.tools.analysis` and `keras_vit.layers.{kernels,resnet}` are their homes.
MOVED_MODULES = ["analysis", "distribute", "durable", "kernels", "recipes", "resnet"]

__all__ = MOVED_MODULES + [
    "Checkpoint",
    "CheckpointError",
    "Distiller",
    "MaskedPatchPretrainer",
    "PatchCorruption",
    "Architecture",
    "EvalTransform",
    "VARIANTS",
    "ViT",
    "Variant",
    "available_weights",
    "decode_predictions",
    "decode_variant",
    "enable_lora",
    "eval_transform",
    "create_model",
    "feature_extractor",
    "list_models",
    "naflex_feature_maps",
    "from_pretrained",
    "layers",
    "mean_colour_bins",
    "merge_lora",
    "preprocess_input",
    "resize_patch_embedding",
    "resize_position_embeddings",
    *VARIANTS,
]
