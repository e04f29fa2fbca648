"""transformers' DINOv2 layout: `Dinov2Model` and `Dinov2WithRegistersModel` folders, read.

A folder holds `config.json` (`model_type: "dinov2"` or
`"dinov2_with_registers"`) beside `model.safetensors`. transformers keeps q,
k and v apart (fused here into one kernel), layer scale as
`layer_scale{1,2}.lambda1`, and one position embedding for the class token
and the patches; registers, inserted after the class token, get none. So
the class token's position embedding is added to the class token here and
the model is built with `class_token_position_embedding=False`: the same
function, at every resolution (transformers resizes the patch rows only).
`Dinov2Model`'s pooled output is the normed class token, which
`from_pretrained` gives for these headless folders.

As for transformers' ViT (`transformers.vit`), every config field is
computed, checked against the tensors or `INFERENCE_IRRELEVANT`:
`mlp_ratio` and `use_swiglu_ffn` must give the file's MLP, `qkv_bias` its
biases, `num_register_tokens` its register tokens. Loaded at another size,
the patch rows of the position table are resized bicubic as transformers'
`interpolate_pos_encoding`: without antialias for DINOv2, with antialias
for DINOv2 with registers.

Example:
>>> from keras_vit import checkpoints
>>> source = checkpoints.read_dinov2_folder("dinov2-small", config)  # doctest: +SKIP
"""

import os

from keras_vit.checkpoints.source import CheckpointError, architecture_from_state, source_from_state
from keras_vit.checkpoints.state_dict_files import read_state_dict
from keras_vit.checkpoints.tensor_layout import QKV, TensorLayout, settings
from keras_vit.checkpoints.transformers.vit import check_sizes, configured_grid, transformers_fields
from keras_vit.model.architecture import Architecture

MODEL_TYPES = ("dinov2", "dinov2_with_registers")
# The fields of transformers' Dinov2Config and Dinov2WithRegistersConfig that the reader computes or checks, with
# transformers' defaults (the other fields are in transformers.vit.INFERENCE_IRRELEVANT).
_COMMON = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, mlp_ratio=4, hidden_act="gelu",
               layer_norm_eps=1e-6, image_size=224, num_channels=3, qkv_bias=True, use_swiglu_ffn=False)
CONFIG_DEFAULTS = {"dinov2": dict(_COMMON, patch_size=14),
                   "dinov2_with_registers": dict(_COMMON, patch_size=16, num_register_tokens=4)}
# model_type -> (interpolation, antialias) of its interpolate_pos_encoding.
POSITION_RESIZE = {"dinov2": ("bicubic", False), "dinov2_with_registers": ("bicubic", True)}
# transformers name (after "encoder.layer.{i}.") -> keras_vit name (after "encoderblock_{i}/").
_BLOCK = {
    "norm1.weight": "attention_norm/gamma",
    "norm1.bias": "attention_norm/beta",
    "attention.output.dense.weight": "attention_output/kernel",
    "attention.output.dense.bias": "attention_output/bias",
    "layer_scale1.lambda1": "attention_layer_scale",
    "norm2.weight": "mlp_norm/gamma",
    "norm2.bias": "mlp_norm/beta",
    "layer_scale2.lambda1": "mlp_layer_scale",
}
# The MLP's two layers: Dinov2MLP's, or (use_swiglu_ffn) Dinov2SwiGLUFFN's: silu(first half) * second half.
_MLP = {False: ("fc1", "fc2"), True: ("weights_in", "weights_out")}
_TOP = {
    "embeddings.cls_token": "class_token/cls",
    "embeddings.register_tokens": "register_tokens/registers",
    "embeddings.position_embeddings": "position_embedding/pos_embedding",
    "embeddings.patch_embeddings.projection.weight": "embedding/kernel",
    "embeddings.patch_embeddings.projection.bias": "embedding/bias",
    "layernorm.weight": "encoder_norm/gamma",
    "layernorm.bias": "encoder_norm/beta",
}


def _mlp_names():
    """Dinov2MLP's names, and (use_swiglu_ffn) Dinov2SwiGLUFFN's, each where the architecture has that MLP."""
    names = {}
    for swiglu, (hidden, output) in _MLP.items():
        def when(architecture, swiglu=swiglu):
            return (architecture.mlp_activation == "swiglu") == swiglu
        for field, ours in (("weight", "kernel"), ("bias", "bias")):
            names[f"mlp.{hidden}.{field}"] = (f"mlp_hidden/{ours}", when)
            names[f"mlp.{output}.{field}"] = (f"mlp_output/{ours}", when)
    return names


LAYOUT = TensorLayout(
    "transformers' DINOv2 layout", top=_TOP, block_prefix="encoder.layer.", block={**_BLOCK, **_mlp_names()},
    strip=("dinov2.",), ignored=("embeddings.mask_token",),  # Only for masked image modelling.
    qkv={f"attention.attention.{kind}.{field}": (kind, field) for kind in QKV for field in ("weight", "bias")})


def from_dinov2(tensors, description="checkpoint", expected=None):
    """keras_vit's state (class token's position folded in) from a transformers DINOv2 state dict.

    `expected`: `(architecture, depth, settings)` of the model a config.json describes, whose tensors the file
    must hold exactly.
    """
    state = LAYOUT.read(tensors, description, expected)
    table, cls = state.get("position_embedding/pos_embedding"), state.get("class_token/cls")
    if table is None or cls is None or table.ndim != 3:
        raise CheckpointError(f"{description} lacks the class token or the position embeddings of a DINOv2 model.")
    state["class_token/cls"] = cls + table[:, :1]
    state["position_embedding/pos_embedding"] = table[:, 1:]
    return state


def _dinov2_tensors(model_type, fields):
    """The model `fields` of `model_type` describe, as `TensorLayout.read` checks it: `(architecture, depth, settings)`."""
    # Dinov2WithRegistersModel always has embeddings.register_tokens; read_dinov2_folder checks their count.
    architecture = Architecture(
        register_tokens=int(model_type == "dinov2_with_registers"),
        qkv_bias=fields["qkv_bias"], layer_scale=1.0, mlp_activation="swiglu" if fields["use_swiglu_ffn"] else "gelu")
    keys = ("model_type", "num_hidden_layers", "qkv_bias", "use_swiglu_ffn")
    return architecture, fields["num_hidden_layers"], settings(dict(fields, model_type=model_type), *keys)


def _mlp_width(fields):
    """`(field, value, MLP width)` of transformers' Dinov2MLP or Dinov2SwiGLUFFN (gate and value together)."""
    ratio = fields["mlp_ratio"]
    width = int(fields["hidden_size"] * ratio)
    if fields["use_swiglu_ffn"]:
        width = 2 * ((int(width * 2 / 3) + 7) // 8 * 8)
    return "mlp_ratio", ratio, width


def read_dinov2_folder(folder, config, budget=None):
    """A transformers DINOv2 folder (its parsed `config`) as a `WeightsSource`."""
    model_type = config.get("model_type")
    if config.get("use_swiglu_ffn") is True:  # Dinov2SwiGLUFFN gates with SiLU, whatever hidden_act says.
        config = dict(config, hidden_act="gelu")
    weights, fields = transformers_fields(folder, config, CONFIG_DEFAULTS[model_type])
    where = os.path.join(folder, "config.json")
    tensors = read_state_dict(weights, budget)
    state = from_dinov2(tensors, weights, _dinov2_tensors(model_type, fields))
    check_sizes(where, fields, state, _mlp_width(fields))
    if "num_register_tokens" in fields and state["register_tokens/registers"].shape[1] != fields["num_register_tokens"]:
        raise CheckpointError(f"{where}: num_register_tokens is {fields['num_register_tokens']!r}, but the file "
                              f"holds {state['register_tokens/registers'].shape[1]} register tokens "
                              "(embeddings.register_tokens).")
    # The file's table has the class token's row too, which the reader folds into the class token.
    grid = configured_grid(fields, state["position_embedding/pos_embedding"].shape[1], where, 1)
    architecture = architecture_from_state(state, grid, mlp_activation=fields["hidden_act"],
                                           layer_norm_epsilon=fields["layer_norm_eps"],
                                           class_token_position_embedding=False, layer_scale=1.0)
    source = source_from_state(weights, state, grid, fields["num_attention_heads"], architecture)
    source.origins = LAYOUT.origins(tensors)
    if isinstance(source.origins.get("position_embedding/pos_embedding"), str):  # its class token's row is not ours
        source.origins["position_embedding/pos_embedding"] = (source.origins["position_embedding/pos_embedding"],)
    source.position_resize = POSITION_RESIZE[model_type]
    return source
