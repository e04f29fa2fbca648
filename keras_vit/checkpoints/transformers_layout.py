"""Hugging Face transformers' layout: `ViTForImageClassification` and `ViTModel` folders, read.

A folder holds `config.json` (`model_type: "vit"`) beside `model.safetensors`
(or `pytorch_model.bin`). transformers keeps q, k and v as three `(out, in)`
projections, which keras_vit fuses into one `(in, 3 * out)` kernel; its
`layer_norm_eps` (1e-12 in `google/vit-*`) and `hidden_act` are honoured, and
`id2label` names the classes (`WeightsSource.class_names`).

Example:
>>> from keras_vit import checkpoints
>>> source = checkpoints.read_transformers_folder("vit-base-patch16-224")  # doctest: +SKIP
"""

import math
import os

import numpy as np

from keras_vit.checkpoints.source import (
    CheckpointError,
    architecture_from_state,
    class_names_in_order,
    positive_int_field,
    preview,
    source_from_state,
)
from keras_vit.checkpoints.timm_layout import read_state_dict, torch_to_keras

# transformers name (after "encoder.layer.{i}.") -> keras_vit name (after "encoderblock_{i}/").
_BLOCK = {
    "layernorm_before.weight": "attention_norm/gamma",
    "layernorm_before.bias": "attention_norm/beta",
    "attention.output.dense.weight": "attention_output/kernel",
    "attention.output.dense.bias": "attention_output/bias",
    "layernorm_after.weight": "mlp_norm/gamma",
    "layernorm_after.bias": "mlp_norm/beta",
    "intermediate.dense.weight": "mlp_hidden/kernel",
    "intermediate.dense.bias": "mlp_hidden/bias",
    "output.dense.weight": "mlp_output/kernel",
    "output.dense.bias": "mlp_output/bias",
}
_QKV = ("query", "key", "value")
_TOP = {
    "embeddings.cls_token": "class_token/cls",
    "embeddings.position_embeddings": "position_embedding/pos_embedding",
    "embeddings.patch_embeddings.projection.weight": "embedding/kernel",
    "embeddings.patch_embeddings.projection.bias": "embedding/bias",
    "layernorm.weight": "encoder_norm/gamma",
    "layernorm.bias": "encoder_norm/beta",
    "pooler.dense.weight": "pre_logits/kernel",
    "pooler.dense.bias": "pre_logits/bias",
    "classifier.weight": "head/kernel",
    "classifier.bias": "head/bias",
}
# transformers' activation names -> keras_vit's approximate_gelu.
# transformers' hidden_act -> keras_vit's mlp_activation.
_ACTIVATIONS = {"gelu": "gelu", "gelu_python": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                "quick_gelu": "quick_gelu"}


def fuse_qkv(qkv, state, description, zero_bias=True):
    """Put the `{block: {(query|key|value, weight|bias): array}}` projections into `state` as fused `qkv`.

    Missing biases are zeros with `zero_bias` (equal outputs), else the block has none.
    """
    for index, parts in qkv.items():
        missing = [f"{kind}.weight" for kind in _QKV if (kind, "weight") not in parts]
        if missing:
            raise CheckpointError(f"{description}: encoder.layer.{index} lacks attention {missing}.")
        kernel = np.concatenate([parts[(kind, "weight")] for kind in _QKV], axis=-1)
        state[f"encoderblock_{index}/qkv/kernel"] = kernel
        if zero_bias or all((kind, "bias") in parts for kind in _QKV):
            state[f"encoderblock_{index}/qkv/bias"] = np.concatenate(
                [parts.get((kind, "bias"), np.zeros(kernel.shape[0], kernel.dtype)) for kind in _QKV])


def transformers_fields(folder, config):
    """`(weights path, patch size, heads, (height, width), epsilon, activation)` of a transformers config, checked."""
    weights = next((os.path.join(folder, name) for name in ("model.safetensors", "pytorch_model.bin")
                    if os.path.exists(os.path.join(folder, name))), None)
    if weights is None:
        raise CheckpointError(f"{folder} has a transformers config.json but no model.safetensors or pytorch_model.bin.")
    where = os.path.join(folder, "config.json")
    activation = config.get("hidden_act", "gelu")
    if not isinstance(activation, str) or activation not in _ACTIVATIONS:
        raise CheckpointError(f"{folder}: hidden_act {activation!r} is not a GELU; keras_vit's blocks compute GELU "
                              f"({', '.join(_ACTIVATIONS)}).")
    patch = positive_int_field(config, "patch_size", where) or 16
    num_heads = positive_int_field(config, "num_attention_heads", where)
    size = config.get("image_size", 224)
    sides = tuple(size) if isinstance(size, (list, tuple)) else (size, size)
    if len(sides) != 2 or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in sides):
        raise CheckpointError(f"{where}: image_size is {size!r}; expected a positive int or [height, width].")
    epsilon = config.get("layer_norm_eps", 1e-12)
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not 0 < epsilon < 1:
        raise CheckpointError(f"{where}: layer_norm_eps is {epsilon!r}; expected a small positive number.")
    return weights, patch, num_heads, sides, float(epsilon), _ACTIVATIONS[activation]


def from_transformers(tensors, description="checkpoint"):
    """keras_vit's state from a transformers ViT state dict (`vit.` prefix or none) of numpy arrays."""
    tensors = {name.removeprefix("vit."): np.asarray(value) for name, value in tensors.items()}
    tensors.pop("embeddings.mask_token", None)  # Only for masked image modelling; unused in inference.
    state, qkv, unknown = {}, {}, []
    for name, value in tensors.items():
        if name in _TOP:
            state[_TOP[name]] = torch_to_keras(name, value)
            continue
        parts = name.split(".", 3)
        if name.startswith("encoder.layer.") and parts[2].isdigit():
            index, rest = int(parts[2]), parts[3]
            if rest in _BLOCK:
                state[f"encoderblock_{index}/{_BLOCK[rest]}"] = torch_to_keras(rest, value)
                continue
            kind, _, field = rest.removeprefix("attention.attention.").rpartition(".")
            if rest.startswith("attention.attention.") and kind in _QKV and field in ("weight", "bias"):
                qkv.setdefault(index, {})[(kind, field)] = torch_to_keras(rest, value)
                continue
        unknown.append(name)
    if unknown:
        raise CheckpointError(f"{description} has {len(unknown)} tensors that are not in transformers' ViT layout: "
                              f"{preview(unknown, 5)}.")
    fuse_qkv(qkv, state, description)
    if "pre_logits/kernel" in state and "head/kernel" in state:
        raise CheckpointError(f"{description} has both a pooler and a classifier, which no transformers ViT has.")
    return state


def read_transformers_folder(folder, config, budget=None):
    """A transformers ViT folder (its parsed `config`) as a `WeightsSource`."""
    weights, patch, num_heads, sides, epsilon, activation = transformers_fields(folder, config)
    state = from_transformers(read_state_dict(weights, budget), description=weights)
    grid = (sides[0] // patch, sides[1] // patch)
    positions = state["position_embedding/pos_embedding"].shape[1] - 1
    if grid[0] * grid[1] != positions:
        side = math.isqrt(positions)
        grid = (side, side) if side * side == positions else None
    architecture = architecture_from_state(state, grid, mlp_activation=activation, layer_norm_epsilon=epsilon,
                                           class_token_position_embedding=True)
    source = source_from_state(weights, state, grid, num_heads, architecture)
    source.class_names = class_names_in_order(config.get("id2label"), state)
    return source
