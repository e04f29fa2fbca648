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

As for transformers' ViT (`transformers_layout`), every config field is
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
import re

import numpy as np

from keras_vit.checkpoints.source import CheckpointError, architecture_from_state, preview, source_from_state
from keras_vit.checkpoints.timm_layout import read_state_dict, torch_to_keras
from keras_vit.checkpoints.transformers_layout import (
    QKV,
    check_sizes,
    check_tensors,
    configured_grid,
    fuse_qkv,
    settings,
    transformers_fields,
)

MODEL_TYPES = ("dinov2", "dinov2_with_registers")
# The fields of transformers' Dinov2Config and Dinov2WithRegistersConfig that the reader computes or checks, with
# transformers' defaults (the other fields are in transformers_layout.INFERENCE_IRRELEVANT).
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
    "mlp.fc1.weight": "mlp_hidden/kernel",
    "mlp.fc1.bias": "mlp_hidden/bias",
    "mlp.fc2.weight": "mlp_output/kernel",
    "mlp.fc2.bias": "mlp_output/bias",
    "mlp.weights_in.weight": "mlp_hidden/kernel",  # use_swiglu_ffn: silu(first half) * second half
    "mlp.weights_in.bias": "mlp_hidden/bias",
    "mlp.weights_out.weight": "mlp_output/kernel",
    "mlp.weights_out.bias": "mlp_output/bias",
    "layer_scale2.lambda1": "mlp_layer_scale",
}
_TOP = {
    "embeddings.cls_token": "class_token/cls",
    "embeddings.register_tokens": "register_tokens/registers",
    "embeddings.position_embeddings": "position_embedding/pos_embedding",
    "embeddings.patch_embeddings.projection.weight": "embedding/kernel",
    "embeddings.patch_embeddings.projection.bias": "embedding/bias",
    "layernorm.weight": "encoder_norm/gamma",
    "layernorm.bias": "encoder_norm/beta",
}
_QKV_PROJECTION = re.compile(r"attention\.attention\.(query|key|value)\.(weight|bias)")


def from_dinov2(tensors, description="checkpoint", expected=None):
    """keras_vit's state (class token's position folded in) from a transformers DINOv2 state dict.

    `expected`: the configured model's tensors (`check_tensors`), where a config.json describes it.
    """
    names = list(tensors)
    tensors = {name.removeprefix("dinov2."): np.asarray(value) for name, value in tensors.items()}
    tensors.pop("embeddings.mask_token", None)  # Only for masked image modelling.
    state, qkv, unknown = {}, {}, []
    for name, value in tensors.items():
        parts = name.split(".", 3)
        if name in _TOP:
            state[_TOP[name]] = torch_to_keras(name, value)
        elif name.startswith("encoder.layer.") and len(parts) == 4 and parts[2].isdigit() and parts[3] in _BLOCK:
            state[f"encoderblock_{int(parts[2])}/{_BLOCK[parts[3]]}"] = torch_to_keras(parts[3], value)
        elif name.startswith("encoder.layer.") and len(parts) == 4 and parts[2].isdigit() \
                and _QKV_PROJECTION.fullmatch(parts[3]):
            qkv.setdefault(int(parts[2]), {})[_QKV_PROJECTION.fullmatch(parts[3]).groups()] = \
                torch_to_keras(parts[3], value)
        else:
            unknown.append(name)
    if unknown:
        raise CheckpointError(f"{description} has {len(unknown)} tensors that are not in transformers' DINOv2 "
                              f"layout: {preview(unknown, 5)}.")
    if expected:
        check_tensors(description, names, expected, "dinov2.")
    fuse_qkv(qkv, state, description)
    table, cls = state.get("position_embedding/pos_embedding"), state.get("class_token/cls")
    if table is None or cls is None or table.ndim != 3:
        raise CheckpointError(f"{description} lacks the class token or the position embeddings of a DINOv2 model.")
    state["class_token/cls"] = cls + table[:, :1]
    state["position_embedding/pos_embedding"] = table[:, 1:]
    return state


def _dinov2_tensors(model_type, fields):
    """The tensors of the DINOv2 `fields` of `model_type` describe, as `check_tensors` takes them."""
    mlp = ("weights_in", "weights_out") if fields["use_swiglu_ffn"] else ("fc1", "fc2")
    biases = ("weight", "bias") if fields["qkv_bias"] else ("weight",)
    block = [name for name in _BLOCK if not name.startswith("mlp.") or name.split(".")[1] in mlp]
    block += [f"attention.attention.{kind}.{field}" for kind in QKV for field in biases]
    required = [f"encoder.layer.{index}.{name}" for index in range(fields["num_hidden_layers"]) for name in block]
    registers = model_type == "dinov2_with_registers"
    required += [name for name in _TOP if registers or name != "embeddings.register_tokens"]
    keys = ("model_type", "num_hidden_layers", "qkv_bias", "use_swiglu_ffn")
    return required, [("embeddings.mask_token",)], settings(dict(fields, model_type=model_type), *keys)


def _mlp_width(where, fields):
    """`(field, value, MLP width)` of transformers' Dinov2MLP or Dinov2SwiGLUFFN (gate and value together)."""
    ratio = fields["mlp_ratio"]
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or ratio <= 0:
        raise CheckpointError(f"{where}: mlp_ratio is {ratio!r}; expected a positive number.")
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
    state = from_dinov2(read_state_dict(weights, budget), weights, _dinov2_tensors(model_type, fields))
    check_sizes(where, fields, state, _mlp_width(where, fields))
    if "num_register_tokens" in fields and state["register_tokens/registers"].shape[1] != fields["num_register_tokens"]:
        raise CheckpointError(f"{where}: num_register_tokens is {fields['num_register_tokens']!r}, but the file "
                              f"holds {state['register_tokens/registers'].shape[1]} register tokens "
                              "(embeddings.register_tokens).")
    grid = configured_grid(fields, state["position_embedding/pos_embedding"].shape[1])
    architecture = architecture_from_state(state, grid, mlp_activation=fields["hidden_act"],
                                           layer_norm_epsilon=fields["layer_norm_eps"],
                                           class_token_position_embedding=False, layer_scale=1.0)
    source = source_from_state(weights, state, grid, fields["num_attention_heads"], architecture)
    source.position_resize = POSITION_RESIZE[model_type]
    return source
