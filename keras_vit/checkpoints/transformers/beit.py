"""transformers' BEiT layout: `BeitModel` and `BeitForImageClassification` folders (`model_type: "beit"`), read.

transformers' BEiT is timm's `Beit` (`keras_vit.checkpoints.timm.beit`)
under other names: q, k and v apart, the keys without a bias
(`attention.attention.query`, `key`, `value`), layer scales as `lambda_1`
and `lambda_2`, relative position bias tables in each layer
(`attention.attention.relative_position_bias`) or one in the encoder
(`encoder.relative_position_bias`). With `use_mean_pooling` the patch
tokens' mean goes through `pooler.layernorm` (keras_vit's `fc_norm`), else
the final `layernorm` is applied and the class token is the pooled output.
The pixel statistics are the image processor's, 0.5 unless the folder's
`preprocessor_config.json` says otherwise; LayerNorm epsilon 1e-12.

Example:
>>> from keras_vit import checkpoints
>>> source = checkpoints.read_beit_folder("beit-base-patch16-224", config)  # doctest: +SKIP
"""

import os

import numpy as np

from keras_vit.checkpoints.source import CheckpointError, class_names_in_order, source_from_state
from keras_vit.checkpoints.state_dict_files import read_state_dict
from keras_vit.checkpoints.tensor_layout import BlockRule, TensorLayout, settings
from keras_vit.checkpoints.transformers.vit import LAYOUT as VIT_LAYOUT
from keras_vit.checkpoints.transformers.vit import check_sizes, configured_grid, transformers_fields
from keras_vit.layers.relative_position import relative_table_rows
from keras_vit.model.architecture import Architecture

MODEL_TYPES = ("beit",)
# BeitConfig's fields that the reader computes or checks, with transformers' defaults.
CONFIG_DEFAULTS = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                       hidden_act="gelu", layer_norm_eps=1e-12, image_size=224, patch_size=16, num_channels=3,
                       use_absolute_position_embeddings=False, use_relative_position_bias=False,
                       use_shared_relative_position_bias=False, layer_scale_init_value=0.1, use_mean_pooling=True,
                       id2label=None)
# BeitConfig's fields of its other heads (segmentation, masked image modelling) and backbone outputs, not read.
OTHER_HEADS = ("vocab_size", "use_auxiliary_head", "auxiliary_loss_weight", "auxiliary_channels",
               "auxiliary_num_convs", "auxiliary_concat_input", "semantic_loss_ignore_index", "pool_scales",
               "add_fpn", "out_features", "out_indices", "stage_names", "reshape_hidden_states", "use_mask_token")
_TABLE = "relative_position_bias.relative_position_bias_table"
_TOP = {
    "embeddings.cls_token": "class_token/cls",
    "embeddings.position_embeddings": "position_embedding/pos_embedding",
    "embeddings.patch_embeddings.projection.weight": "embedding/kernel",
    "embeddings.patch_embeddings.projection.bias": "embedding/bias",
    f"encoder.{_TABLE}": "relative_position_bias/relative_position_bias_table",
    "layernorm.weight": "encoder_norm/gamma",
    "layernorm.bias": "encoder_norm/beta",
    "pooler.layernorm.weight": "fc_norm/gamma",
    "pooler.layernorm.bias": "fc_norm/beta",
    "classifier.weight": "head/kernel",
    "classifier.bias": "head/bias",
}
# transformers' ViT block, with BEiT's table and layer scales.
_BLOCK = {**VIT_LAYOUT.block, f"attention.attention.{_TABLE}": "relative_position_bias_table",
          "lambda_1": "attention_layer_scale", "lambda_2": "mlp_layer_scale"}
_QKV = {f"attention.attention.{kind}.weight": (kind, "weight") for kind in ("query", "key", "value")}
# The q and v biases as keras_vit's fused bias, the keys' zero (transformers' key projection has no bias).
_QUERY_VALUE_BIASES = BlockRule(
    {"attention.attention.query.bias": ("qkv/bias",), "attention.attention.value.bias": ("qkv/bias",)},
    lambda parts, block: {"qkv/bias": np.concatenate([parts["attention.attention.query.bias"],
                                                      np.zeros_like(parts["attention.attention.query.bias"]),
                                                      parts["attention.attention.value.bias"]])},
    None, when=lambda a: a.qkv_bias and not a.key_bias,
    shapes=lambda width: {"attention.attention.query.bias": (width,), "attention.attention.value.bias": (width,)})
LAYOUT = TensorLayout(
    "transformers' BEiT layout", top=_TOP, block_prefix="encoder.layer.", block=_BLOCK, strip=("beit.",),
    ignored=("embeddings.mask_token",), qkv=_QKV, rules=(_QUERY_VALUE_BIASES,),
    hint="; keras_vit reads BeitModel and BeitForImageClassification folders (encoder.layer.N.attention.attention."
         "query.weight, ...)")


def read_beit_folder(folder, config, budget=None):
    """A transformers `BeitModel` or `BeitForImageClassification` folder (its parsed `config`) as a
    `WeightsSource`."""
    where = os.path.join(folder, "config.json")
    weights, fields = transformers_fields(folder, config, CONFIG_DEFAULTS)
    mean_pooling = bool(fields["use_mean_pooling"])
    architecture = Architecture(
        position_embedding=bool(fields["use_absolute_position_embeddings"]),
        classifier="gap" if mean_pooling else "token", fc_norm=mean_pooling, key_bias=False,
        layer_scale=float(fields["layer_scale_init_value"]) if fields["layer_scale_init_value"] > 0 else None,
        mlp_activation=fields["hidden_act"], layer_norm_epsilon=fields["layer_norm_eps"],
        relative_position_bias=bool(fields["use_relative_position_bias"]),
        shared_relative_position_bias=bool(fields["use_shared_relative_position_bias"]))
    tensors = read_state_dict(weights, budget)
    state = LAYOUT.read(tensors, weights, expected=(architecture, fields["num_hidden_layers"], settings(
        fields, "num_hidden_layers", "use_absolute_position_embeddings", "use_relative_position_bias",
        "use_shared_relative_position_bias", "layer_scale_init_value", "use_mean_pooling")))
    check_sizes(where, fields, state)
    patches = (fields["image_size"][0] // fields["patch_size"]) * (fields["image_size"][1] // fields["patch_size"])
    table = state.get("position_embedding/pos_embedding")
    grid = configured_grid(fields, patches if table is None else table.shape[1] - 1, where, 1)
    rows = relative_table_rows(grid)
    for name, value in tensors.items():
        if name.endswith(_TABLE) and value.shape[0] != rows:
            raise CheckpointError(f"{weights}: {name} has {value.shape[0]} rows, but image_size "
                                  f"{list(fields['image_size'])} and patch_size {fields['patch_size']} make a "
                                  f"{grid[0]}x{grid[1]} grid, whose table has {rows}. Nothing was loaded.")
    labels = fields["id2label"]
    if "head/kernel" in state and isinstance(labels, (dict, list)) and len(labels) != state["head/kernel"].shape[-1]:
        raise CheckpointError(f"{where}: id2label names {len(labels)} classes, but the file's classifier has "
                              f"{state['head/kernel'].shape[-1]} outputs.")
    source = source_from_state(weights, state, grid, fields["num_attention_heads"], architecture)
    source.origins = LAYOUT.origins(tensors)
    source.class_names = class_names_in_order(labels, state)
    source.relative_position_resize = "transformers"  # BeitRelativePositionBias(interpolate_pos_encoding=True)
    source.position_resize = ("bicubic", False)  # BeitEmbeddings.interpolate_pos_encoding
    if "head/kernel" not in state:  # BeitModel's pooler_output
        source.layout = dict(include_top=False, pooling=architecture.classifier)
    return source
