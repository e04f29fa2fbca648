"""transformers' DINOv3 layout: `DINOv3ViTModel` folders (`model_type: "dinov3_vit"`), read.

DINOv3 has a class token and registers, no position table, and RoPE in
every attention (pixel-centre coordinates in [-1, 1], periods
`rope_theta ** (4k / head_dim)`, half-split rotation): keras_vit's
`rope="dinov3"`. transformers keeps q, k and v apart (the keys without a
bias unless `key_bias`), layer scale as `layer_scale{1,2}.lambda1`, and the
MLP as `up_proj`/`down_proj` or, with `use_gated_mlp`, SiLU-gated
(`gate_proj`, `up_proj`). The pooled output is the normed class token, as
`DINOv3ViTModel`'s `pooler_output`. Every config field is computed, checked
against the tensors, or in `transformers.vit.INFERENCE_IRRELEVANT` or
`TRAINING_ONLY` here (the train-time coordinate augmentations, which
transformers applies only in training mode). The pixel statistics are
ImageNet's (DINOv3's image processor), unless the folder's
`preprocessor_config.json` says otherwise.

Example:
>>> from keras_vit import checkpoints
>>> source = checkpoints.read_dinov3_folder("dinov3-vits16-pretrain-lvd1689m", config)  # doctest: +SKIP
"""

import os

import numpy as np

from keras_vit.checkpoints.source import CheckpointError, source_from_state
from keras_vit.checkpoints.state_dict_files import read_state_dict
from keras_vit.checkpoints.tensor_layout import BlockRule, TensorLayout, settings
from keras_vit.checkpoints.transformers.vit import check_sizes, transformers_fields
from keras_vit.model.architecture import IMAGENET_PIXEL_STATISTICS, Architecture

MODEL_TYPES = ("dinov3_vit",)
# DINOv3ViTConfig's fields that the reader computes or checks, with transformers' defaults.
CONFIG_DEFAULTS = dict(hidden_size=384, num_hidden_layers=12, num_attention_heads=6, intermediate_size=1536,
                       hidden_act="gelu", layer_norm_eps=1e-5, rope_theta=100.0, image_size=224, patch_size=16,
                       num_channels=3, query_bias=True, key_bias=False, value_bias=True, proj_bias=True, mlp_bias=True,
                       use_gated_mlp=False, num_register_tokens=0)
# Train-time RoPE coordinate augmentations (transformers applies them in training mode only) and backbone outputs.
TRAINING_ONLY = ("pos_embed_shift", "pos_embed_jitter", "pos_embed_rescale", "out_features", "out_indices",
                 "stage_names", "reshape_hidden_states")
_TOP = {
    "embeddings.cls_token": "class_token/cls",
    "embeddings.register_tokens": "register_tokens/registers",
    "embeddings.patch_embeddings.weight": "embedding/kernel",
    "embeddings.patch_embeddings.bias": "embedding/bias",
    "norm.weight": "encoder_norm/gamma",
    "norm.bias": "encoder_norm/beta",
}
_BLOCK = {
    "norm1.weight": "attention_norm/gamma",
    "norm1.bias": "attention_norm/beta",
    "attention.o_proj.weight": "attention_output/kernel",
    "attention.o_proj.bias": "attention_output/bias",
    "layer_scale1.lambda1": "attention_layer_scale",
    "norm2.weight": "mlp_norm/gamma",
    "norm2.bias": "mlp_norm/beta",
    "layer_scale2.lambda1": "mlp_layer_scale",
    "mlp.down_proj.weight": "mlp_output/kernel",
    "mlp.down_proj.bias": "mlp_output/bias",
}
_QKV = {"attention.q_proj.weight": ("query", "weight"), "attention.k_proj.weight": ("key", "weight"),
        "attention.v_proj.weight": ("value", "weight")}
_BIASES = {"attention.q_proj.bias": ("query", "bias"), "attention.k_proj.bias": ("key", "bias"),
           "attention.v_proj.bias": ("value", "bias")}
# The gated MLP's first layer: silu(gate) * up, keras_vit's SwiGLU halves in that order.
_GATED = {"mlp.gate_proj.weight": ("mlp_hidden/kernel", 0, 2), "mlp.up_proj.weight": ("mlp_hidden/kernel", 1, 2),
          "mlp.gate_proj.bias": ("mlp_hidden/bias", 0, 2), "mlp.up_proj.bias": ("mlp_hidden/bias", 1, 2)}
_PLAIN_MLP = {"mlp.up_proj.weight": "mlp_hidden/kernel", "mlp.up_proj.bias": "mlp_hidden/bias"}
_QUERY_VALUE_BIASES = BlockRule(
    {"attention.q_proj.bias": ("qkv/bias",), "attention.v_proj.bias": ("qkv/bias",)},
    lambda parts, block: {"qkv/bias": np.concatenate([parts["attention.q_proj.bias"],
                                                      np.zeros_like(parts["attention.q_proj.bias"]),
                                                      parts["attention.v_proj.bias"]])},
    None, when=lambda a: a.qkv_bias and not a.key_bias,
    shapes=lambda width: {"attention.q_proj.bias": (width,), "attention.v_proj.bias": (width,)})


def _layout(gated, key_bias):
    return TensorLayout(
        "transformers' DINOv3 layout", top=_TOP, block_prefix="layer.", ignored=("embeddings.mask_token",),
        block={**_BLOCK, **({} if gated else _PLAIN_MLP)}, qkv={**_QKV, **(_BIASES if key_bias else {})},
        packed=_GATED if gated else {}, rules=() if key_bias else (_QUERY_VALUE_BIASES,),
        hint="; keras_vit reads DINOv3ViTModel folders (layer.N.attention.q_proj.weight, ...)")


def read_dinov3_folder(folder, config, budget=None):
    """A transformers `DINOv3ViTModel` folder (its parsed `config`) as a `WeightsSource`."""
    where = os.path.join(folder, "config.json")
    gated = config.get("use_gated_mlp") is True
    if gated and config.get("hidden_act", "gelu") not in ("silu", "swish"):
        raise CheckpointError(f"{where}: use_gated_mlp with hidden_act {config.get('hidden_act', 'gelu')!r}; keras_vit "
                              "computes the SiLU-gated MLP (hidden_act 'silu') of DINOv3's large models.")
    weights, fields = transformers_fields(folder, dict(config, hidden_act="gelu") if gated else config,
                                          CONFIG_DEFAULTS)
    flags = {key: fields[key] for key in ("query_bias", "key_bias", "value_bias", "proj_bias", "mlp_bias",
                                          "use_gated_mlp")}
    if flags["query_bias"] != flags["value_bias"] or (flags["key_bias"] and not flags["query_bias"]):
        raise CheckpointError(f"{where}: query_bias {flags['query_bias']}, key_bias {flags['key_bias']} and value_bias "
                              f"{flags['value_bias']}; keras_vit computes q and v biases together, with or without "
                              "one on the keys.")
    for key in ("proj_bias", "mlp_bias"):
        if not flags[key]:
            raise CheckpointError(f"{where}: {key} is false; expected true (keras_vit computes DINOv3's biases on the "
                                  "attention output and both MLP layers).")
    architecture = Architecture(
        register_tokens=int(fields["num_register_tokens"]), position_embedding=False, layer_scale=1.0,
        qkv_bias=flags["query_bias"], key_bias=flags["key_bias"] or not flags["query_bias"],
        mlp_activation="swiglu" if gated else fields["hidden_act"], layer_norm_epsilon=fields["layer_norm_eps"],
        rope="dinov3", rope_temperature=float(fields["rope_theta"]), rope_rotate_half=True,
        **IMAGENET_PIXEL_STATISTICS)
    tensors = read_state_dict(weights, budget)
    registers = tensors.get("embeddings.register_tokens")
    if registers is not None and registers.shape[1:2] == (0,):  # DINOv3ViTEmbeddings keeps one, empty, without any
        del tensors["embeddings.register_tokens"]
    layout = _layout(gated, architecture.key_bias)
    state = layout.read(tensors, weights, expected=(architecture, fields["num_hidden_layers"], settings(
        fields, "num_hidden_layers", "num_register_tokens", "use_gated_mlp", "query_bias", "key_bias")))
    registers = state.get("register_tokens/registers")
    if (0 if registers is None else registers.shape[1]) != fields["num_register_tokens"]:
        raise CheckpointError(f"{where}: num_register_tokens is {fields['num_register_tokens']!r}, but the file holds "
                              f"{0 if registers is None else registers.shape[1]} (embeddings.register_tokens).")
    mlp_width = fields["intermediate_size"] * (2 if gated else 1)
    check_sizes(where, fields, state, ("intermediate_size", fields["intermediate_size"], mlp_width))
    grid = tuple(side // fields["patch_size"] for side in fields["image_size"])
    source = source_from_state(weights, state, grid, fields["num_attention_heads"], architecture)
    source.origins = layout.origins(tensors)
    source.layout = dict(include_top=False, pooling="token")
    return source
