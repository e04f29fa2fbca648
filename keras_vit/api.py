"""Everything `import keras_vit` gives: the models, checkpoint readers, layers and tools.

`keras_vit/__init__` imports this module, except in the `keras-vit` command,
which imports it once its flags are parsed and its backend chosen
(`keras_vit.startup`). Importing it registers every class a `.keras` file of
keras_vit names, so that `keras.saving.load_model` finds them.
"""

from keras_vit import analysis, kernels, layers, recipes, resnet  # recipes registers the optimizers saved in .keras files
from keras_vit.checkpoints import Checkpoint, CheckpointError, available_weights
from keras_vit.features import feature_extractor
from keras_vit.functional import eval_transform
from keras_vit.imagenet import decode_predictions, preprocess_input
from keras_vit.lora import enable_lora, merge_lora
from keras_vit.masked_patch import MaskedPatchPretrainer, PatchCorruption, mean_colour_bins
from keras_vit.models import (
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
from keras_vit.position_embedding import resize_patch_embedding, resize_position_embeddings
from keras_vit.preprocessing import EvalTransform
from keras_vit.pretrained import from_pretrained
from keras_vit.architecture import Architecture
from keras_vit.variants import VARIANTS, Variant, decode_variant


__all__ = [
    "Checkpoint",
    "CheckpointError",
    "MaskedPatchPretrainer",
    "PatchCorruption",
    "Architecture",
    "EvalTransform",
    "VARIANTS",
    "ViT",
    "Variant",
    "analysis",
    "available_weights",
    "decode_predictions",
    "decode_variant",
    "enable_lora",
    "eval_transform",
    "feature_extractor",
    "from_pretrained",
    "kernels",
    "layers",
    "mean_colour_bins",
    "merge_lora",
    "preprocess_input",
    "recipes",
    "resnet",
    "resize_patch_embedding",
    "resize_position_embeddings",
    *VARIANTS,
]
