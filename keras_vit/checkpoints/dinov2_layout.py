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

Example:
>>> from keras_vit import checkpoints
>>> source = checkpoints.read_dinov2_folder("dinov2-small", config)  # doctest: +SKIP
"""

import numpy as np

from keras_vit.checkpoints.source import CheckpointError, architecture_from_state, preview, source_from_state
from keras_vit.checkpoints.timm_layout import read_state_dict, torch_to_keras
from keras_vit.checkpoints.transformers_layout import fuse_qkv, transformers_fields

MODEL_TYPES = ("dinov2", "dinov2_with_registers")
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


def from_dinov2(tensors, description="checkpoint"):
    """keras_vit's state (class token's position folded in) from a transformers DINOv2 state dict."""
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
                and parts[3].startswith("attention.attention."):
            kind, _, field = parts[3].removeprefix("attention.attention.").rpartition(".")
            qkv.setdefault(int(parts[2]), {})[(kind, field)] = torch_to_keras(parts[3], value)
        else:
            unknown.append(name)
    if unknown:
        raise CheckpointError(f"{description} has {len(unknown)} tensors that are not in transformers' DINOv2 "
                              f"layout: {preview(unknown, 5)}.")
    fuse_qkv(qkv, state, description, zero_bias=False)
    table, cls = state.get("position_embedding/pos_embedding"), state.get("class_token/cls")
    if table is None or cls is None or table.ndim != 3:
        raise CheckpointError(f"{description} lacks the class token or the position embeddings of a DINOv2 model.")
    state["class_token/cls"] = cls + table[:, :1]
    state["position_embedding/pos_embedding"] = table[:, 1:]
    return state


def read_dinov2_folder(folder, config, budget=None):
    """A transformers DINOv2 folder (its parsed `config`) as a `WeightsSource`."""
    weights, patch, num_heads, sides, epsilon, activation = transformers_fields(folder, config)
    state = from_dinov2(read_state_dict(weights, budget), description=weights)
    grid = (sides[0] // patch, sides[1] // patch)
    if grid[0] * grid[1] != state["position_embedding/pos_embedding"].shape[1]:
        grid = None  # A table of another grid: its own square one.
    architecture = architecture_from_state(state, grid, mlp_activation=activation, layer_norm_epsilon=epsilon,
                                           class_token_position_embedding=False, layer_scale=1.0)
    return source_from_state(weights, state, grid, num_heads, architecture)
