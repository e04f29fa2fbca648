"""transformers' CLIP and SigLIP vision towers (SigLIP keeps CLIP's layout), read.

A folder holds `config.json` beside `model.safetensors`: a vision model
(`model_type` `clip_vision_model` or `siglip_vision_model`), or a whole
image-text model (`clip`, `siglip`), whose `vision_config` and
`vision_model.*` tensors are read and whose text tower is left aside, as
`CLIPVisionModel.from_pretrained` does with such a folder. transformers
keeps q, k and v apart (fused here). The model is the vision tower's
`pooler_output`:
- CLIP: a class token sharing the position table, a LayerNorm before the
  blocks (`pre_layrnorm`), no patch bias, QuickGELU, epsilon 1e-5; the
  pooled output is the class token after `post_layernorm`. CLIP's
  `visual_projection` into the joint image-text space is not part of it.
- SigLIP: no class token, tanh GELU, epsilon 1e-6, the tokens normed by
  `post_layernorm`, then attention pooling (`head.*`, whose packed
  `nn.MultiheadAttention` projection is split into query and key/value).
  With `vision_use_head: false` (PaliGemma's towers) there is no head and
  transformers' `pooler_output` is None; keras_vit pools the mean of the
  normed tokens (timm's `*_siglip_gap`), which are its `last_hidden_state`.
The pixel statistics come from the folder's `preprocessor_config.json`.
As for transformers' ViT (`transformers_layout`), every config field is
computed, checked against the tensors or `INFERENCE_IRRELEVANT`, and the
tensors must be exactly the configured tower's (CLIP's `pre_layrnorm`,
SigLIP's head where `vision_use_head` says so). Loaded at another size,
the position table is resized bicubic without antialias, as both
towers' `interpolate_pos_encoding`.

Example:
>>> from keras_vit import checkpoints
>>> source = checkpoints.read_vision_tower_folder("clip-vit-base-patch16", config)  # doctest: +SKIP
"""

import os
import re

import numpy as np

from keras_vit.checkpoints.source import CheckpointError, architecture_from_state, preview, source_from_state
from keras_vit.checkpoints.timm_layout import read_state_dict, torch_to_keras
from keras_vit.checkpoints.transformers_layout import (
    check_sizes,
    check_tensors,
    configured_grid,
    fuse_qkv,
    settings,
    transformers_fields,
)

# model_type -> (family, whether the folder is a whole image-text model).
MODEL_TYPES = {"clip_vision_model": ("clip", False), "clip": ("clip", True),
               "siglip_vision_model": ("siglip", False), "siglip": ("siglip", True)}
# The fields of transformers' CLIP and SigLIP configs that the reader computes or checks, with transformers'
# defaults (the other fields are in transformers_layout.INFERENCE_IRRELEVANT).
_VISION = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
               num_channels=3, image_size=224)
CONFIG_DEFAULTS = {
    "clip_vision_model": dict(_VISION, patch_size=32, hidden_act="quick_gelu", layer_norm_eps=1e-5),
    "siglip_vision_model": dict(_VISION, patch_size=16, hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6,
                                vision_use_head=True),
    "clip": dict(vision_config=None),
    "siglip": dict(vision_config=None),
}
# transformers name (after "encoder.layers.{i}.") -> keras_vit name (after "encoderblock_{i}/").
_BLOCK = {
    "layer_norm1.weight": "attention_norm/gamma",
    "layer_norm1.bias": "attention_norm/beta",
    "self_attn.out_proj.weight": "attention_output/kernel",
    "self_attn.out_proj.bias": "attention_output/bias",
    "layer_norm2.weight": "mlp_norm/gamma",
    "layer_norm2.bias": "mlp_norm/beta",
    "mlp.fc1.weight": "mlp_hidden/kernel",
    "mlp.fc1.bias": "mlp_hidden/bias",
    "mlp.fc2.weight": "mlp_output/kernel",
    "mlp.fc2.bias": "mlp_output/bias",
}
_TOP = {
    "embeddings.patch_embedding.weight": "embedding/kernel",
    "embeddings.patch_embedding.bias": "embedding/bias",
    "pre_layrnorm.weight": "pre_norm/gamma",
    "pre_layrnorm.bias": "pre_norm/beta",
    "post_layernorm.weight": "encoder_norm/gamma",
    "post_layernorm.bias": "encoder_norm/beta",
    "head.probe": "attention_pool/probe",
    "head.attention.out_proj.weight": "attention_pool/attention_output/kernel",
    "head.attention.out_proj.bias": "attention_pool/attention_output/bias",
    "head.layernorm.weight": "attention_pool/mlp_norm/gamma",
    "head.layernorm.bias": "attention_pool/mlp_norm/beta",
    "head.mlp.fc1.weight": "attention_pool/mlp_hidden/kernel",
    "head.mlp.fc1.bias": "attention_pool/mlp_hidden/bias",
    "head.mlp.fc2.weight": "attention_pool/mlp_output/kernel",
    "head.mlp.fc2.bias": "attention_pool/mlp_output/bias",
}
_QKV_PROJECTION = re.compile(r"self_attn\.([qkv])_proj\.(weight|bias)")
# Tensors of a whole image-text model that are not its vision tower.
_OTHER_TOWER = ("text_model.", "text_projection.", "visual_projection.", "logit_scale", "logit_bias")


def from_vision_tower(tensors, description="checkpoint", expected=None):
    """keras_vit's state from a transformers CLIP or SigLIP vision tower's state dict (text tower ignored).

    `expected`: the configured tower's tensors (`check_tensors`), where a config.json describes it.
    """
    names = [name for name in tensors if not name.startswith(_OTHER_TOWER)]
    tensors = {name.removeprefix("vision_model."): np.asarray(tensors[name]) for name in names}
    tensors.pop("embeddings.position_ids", None)  # A buffer of indices that older transformers saved.
    state, qkv, unknown = {}, {}, []
    for name, value in tensors.items():
        parts = name.split(".", 3)
        if name in _TOP:
            state[_TOP[name]] = torch_to_keras(name, value)
        elif name == "embeddings.class_embedding":
            state["class_token/cls"] = value.reshape(1, 1, -1)
        elif name == "embeddings.position_embedding.weight":  # an nn.Embedding: (rows, width)
            state["position_embedding/pos_embedding"] = value[None]
        elif name in ("head.attention.in_proj_weight", "head.attention.in_proj_bias"):
            packed = torch_to_keras(name.replace("in_proj_", ""), value)  # columns: query | key | value
            width = packed.shape[-1] // 3
            field = "kernel" if name.endswith("weight") else "bias"
            state[f"attention_pool/query/{field}"] = packed[..., :width]
            state[f"attention_pool/key_value/{field}"] = packed[..., width:]
        elif name.startswith("encoder.layers.") and len(parts) == 4 and parts[2].isdigit() and parts[3] in _BLOCK:
            state[f"encoderblock_{int(parts[2])}/{_BLOCK[parts[3]]}"] = torch_to_keras(parts[3], value)
        elif name.startswith("encoder.layers.") and len(parts) == 4 and parts[2].isdigit() \
                and _QKV_PROJECTION.fullmatch(parts[3]):
            projection, field = _QKV_PROJECTION.fullmatch(parts[3]).groups()
            kind = {"q": "query", "k": "key", "v": "value"}[projection]
            qkv.setdefault(int(parts[2]), {})[(kind, field)] = torch_to_keras(parts[3], value)
        else:
            unknown.append(name)
    if unknown:
        raise CheckpointError(f"{description} has {len(unknown)} tensors that are not in transformers' CLIP or "
                              f"SigLIP vision layout: {preview(unknown, 5)}.")
    if expected:
        check_tensors(description, names, expected, "vision_model.")
    if "embedding/kernel" not in state or "position_embedding/pos_embedding" not in state:
        raise CheckpointError(f"{description} holds no vision tower (no vision_model patch or position embedding).")
    fuse_qkv(qkv, state, description)
    return state


def _tower_tensors(model_type, fields):
    """The tensors of the CLIP or SigLIP vision tower `fields` describe, as `check_tensors` takes them."""
    family = MODEL_TYPES[model_type][0]
    block = [*_BLOCK, *(f"self_attn.{kind}_proj.{field}" for kind in "qkv" for field in ("weight", "bias"))]
    required = [f"encoder.layers.{index}.{name}" for index in range(fields["num_hidden_layers"]) for name in block]
    required += ["embeddings.patch_embedding.weight", "embeddings.position_embedding.weight", "post_layernorm.weight",
                 "post_layernorm.bias"]
    if family == "clip":  # CLIPVisionEmbeddings: a class embedding, no patch bias; CLIP's pre_layrnorm
        required += ["embeddings.class_embedding", "pre_layrnorm.weight", "pre_layrnorm.bias"]
    else:
        required.append("embeddings.patch_embedding.bias")
        if fields["vision_use_head"]:
            required += [name for name in _TOP if name.startswith("head.")]
            required += ["head.attention.in_proj_weight", "head.attention.in_proj_bias"]
    keys = ("model_type", "num_hidden_layers") + (("vision_use_head",) if family == "siglip" else ())
    return required, [("embeddings.position_ids",)], settings(dict(fields, model_type=model_type), *keys)


def read_vision_tower_folder(folder, config, budget=None):
    """A transformers CLIP or SigLIP folder (its parsed `config`) as the `WeightsSource` of its vision tower."""
    model_type = config.get("model_type")
    family, whole = MODEL_TYPES[model_type]
    where = os.path.join(folder, "config.json")
    vision = config
    if whole:  # CLIPConfig builds the tower from vision_config_dict alone where an older file has one.
        key = "vision_config_dict" if family == "clip" and config.get("vision_config_dict") is not None \
            else "vision_config"
        vision, where = config.get(key) or {}, f"{where} ({key})"
        if not isinstance(vision, dict):
            raise CheckpointError(f"{folder}: {key} is a JSON {type(vision).__name__}; transformers writes an "
                                  "object of the vision tower's settings.")
    weights, fields = transformers_fields(folder, vision, CONFIG_DEFAULTS[f"{family}_vision_model"], where)
    state = from_vision_tower(read_state_dict(weights, budget), weights, _tower_tensors(model_type, fields))
    check_sizes(where, fields, state)
    table = state["position_embedding/pos_embedding"]
    grid = configured_grid(fields, table.shape[1] - ("class_token/cls" in state))
    architecture = architecture_from_state(state, grid, mlp_activation=fields["hidden_act"],
                                           layer_norm_epsilon=fields["layer_norm_eps"],
                                           class_token_position_embedding=True)
    source = source_from_state(weights, state, grid, fields["num_attention_heads"], architecture)
    source.position_resize = ("bicubic", False)  # CLIP's and SigLIP's interpolate_pos_encoding
    return source
