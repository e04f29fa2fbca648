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
  transformers' `pooler_output` is None: `from_pretrained` builds such a
  tower with `pooling=None`, its `last_hidden_state` (`without_head`, which
  SigLIP 2's reader shares); a `classifier` or `pooling` asks for another.
The pixel statistics come from the folder's `preprocessor_config.json`.
As for transformers' ViT (`transformers.vit`), every config field is
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

from keras_vit.checkpoints.config_fields import checked_fields
from keras_vit.checkpoints.source import CheckpointError, architecture_from_state, source_from_state
from keras_vit.checkpoints.state_dict_files import read_state_dict
from keras_vit.checkpoints.tensor_layout import TensorLayout, settings, torch_to_keras
from keras_vit.checkpoints.transformers.vit import check_sizes, configured_grid, transformers_fields
from keras_vit.model.architecture import Architecture

# model_type -> (family, whether the folder is a whole image-text model).
MODEL_TYPES = {"clip_vision_model": ("clip", False), "clip": ("clip", True),
               "siglip_vision_model": ("siglip", False), "siglip": ("siglip", True)}
# The fields of transformers' CLIP and SigLIP configs that the reader computes or checks, with transformers'
# defaults (the other fields are in transformers.vit.INFERENCE_IRRELEVANT).
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
# Tensors of a whole image-text model that are not its vision tower.
_OTHER_TOWER = ("text_model.", "text_projection.", "visual_projection.", "logit_scale", "logit_bias")


def _split_in_projection(field):
    """nn.MultiheadAttention's packed in-projection (columns query | key | value) as query and key/value."""
    def split(value):
        packed = torch_to_keras(f"in_proj.{'weight' if field == 'kernel' else 'bias'}", value)
        width = packed.shape[-1] // 3
        return {f"attention_pool/query/{field}": packed[..., :width],
                f"attention_pool/key_value/{field}": packed[..., width:]}
    return split, (f"attention_pool/query/{field}", f"attention_pool/key_value/{field}")


LAYOUT = TensorLayout(
    "transformers' CLIP or SigLIP vision layout", top=_TOP, block_prefix="encoder.layers.", block=_BLOCK,
    strip=("vision_model.",), other_model=_OTHER_TOWER,
    ignored=("embeddings.position_ids",),  # A buffer of indices that older transformers saved.
    qkv={f"self_attn.{kind[0]}_proj.{field}": (kind, field) for kind in ("query", "key", "value")
         for field in ("weight", "bias")},
    reshaped={
        "embeddings.class_embedding": (lambda value: {"class_token/cls": value.reshape(1, 1, -1)}, ("class_token/cls",)),
        "embeddings.position_embedding.weight":  # an nn.Embedding: (rows, width)
            (lambda value: {"position_embedding/pos_embedding": value[None]}, ("position_embedding/pos_embedding",)),
        "head.attention.in_proj_weight": _split_in_projection("kernel"),
        "head.attention.in_proj_bias": _split_in_projection("bias"),
    })


def from_vision_tower(tensors, description="checkpoint", expected=None, layout=LAYOUT):
    """keras_vit's state from a transformers CLIP or SigLIP vision tower's state dict (text tower ignored).

    `expected`: `(architecture, depth, settings)` of the tower a config.json describes, whose tensors the file
    must hold exactly. `layout`: SigLIP 2's keeps this one's names (`transformers.siglip2`).
    """
    state = layout.read(tensors, description, expected)
    if "embedding/kernel" not in state or "position_embedding/pos_embedding" not in state:
        raise CheckpointError(f"{description} holds no vision tower (no vision_model patch or position embedding).")
    return state


def without_head(source, head):
    """`source`, which `from_pretrained` builds as transformers does a SigLIP tower whose `vision_use_head` (`head`)
    is false: with no pooled output, as its token sequence (`last_hidden_state`)."""
    if not head:
        source.layout = dict(include_top=False, pooling=None)
    return source


def _tower_tensors(model_type, fields):
    """The tower `fields` describe, as `TensorLayout.read` checks it: `(architecture, depth, settings)`."""
    family = MODEL_TYPES[model_type][0]
    if family == "clip":  # CLIPVisionEmbeddings: a class embedding, no patch bias; CLIP's pre_layrnorm
        architecture = Architecture(norm_pre=True, patch_bias=False)
    else:
        architecture = Architecture(class_token=False, classifier="map" if fields["vision_use_head"] else "gap")
    keys = ("model_type", "num_hidden_layers") + (("vision_use_head",) if family == "siglip" else ())
    return architecture, fields["num_hidden_layers"], settings(dict(fields, model_type=model_type), *keys)


def vision_config(folder, config, key="vision_config"):
    """`(fields, where)`: the vision tower's fields of a folder's parsed `config` (under `key` in a whole
    image-text model's; `key=None`: the config itself), and how errors name them."""
    where = os.path.join(folder, "config.json")
    if key is None:
        return config, where
    vision = checked_fields({key: config.get(key)}, where)[key] or {}
    if not isinstance(vision, dict):
        raise CheckpointError(f"{folder}: {key} is a JSON {type(vision).__name__}; transformers writes an "
                              "object of the vision tower's settings.")
    return vision, f"{where} ({key})"


def read_vision_tower_folder(folder, config, budget=None):
    """A transformers CLIP or SigLIP folder (its parsed `config`) as the `WeightsSource` of its vision tower."""
    model_type = config.get("model_type")
    family, whole = MODEL_TYPES[model_type]
    # CLIPConfig builds the tower from vision_config_dict alone where an older file has one.
    key = "vision_config_dict" if family == "clip" and config.get("vision_config_dict") is not None \
        else "vision_config"
    vision, where = vision_config(folder, config, key if whole else None)
    weights, fields = transformers_fields(folder, vision, CONFIG_DEFAULTS[f"{family}_vision_model"], where)
    tensors = read_state_dict(weights, budget)
    state = from_vision_tower(tensors, weights, _tower_tensors(model_type, fields))
    check_sizes(where, fields, state)
    table = state["position_embedding/pos_embedding"]
    prefix_rows = int("class_token/cls" in state)
    grid = configured_grid(fields, table.shape[1] - prefix_rows, where, prefix_rows)
    architecture = architecture_from_state(state, grid, mlp_activation=fields["hidden_act"],
                                           layer_norm_epsilon=fields["layer_norm_eps"],
                                           class_token_position_embedding=True)
    source = source_from_state(weights, state, grid, fields["num_attention_heads"], architecture)
    source.origins = LAYOUT.origins(tensors)
    source.position_resize = ("bicubic", False)  # CLIP's and SigLIP's interpolate_pos_encoding
    return without_head(source, family == "clip" or fields["vision_use_head"])
