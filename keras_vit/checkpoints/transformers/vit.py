"""Hugging Face transformers' layout: `ViTForImageClassification` and `ViTModel` folders, read.

DeiT's distilled folders (`model_type: "deit"`, `DeiTForImageClassificationWithTeacher`)
are the same layout under `deit.`, with a distillation token and two heads,
`cls_classifier` and `distillation_classifier` (keras_vit's `head` and
`head_dist`).

A folder holds `config.json` (`model_type: "vit"`) beside `model.safetensors`
(or `pytorch_model.bin`). transformers keeps q, k and v as three `(out, in)`
projections, which keras_vit fuses into one `(in, 3 * out)` kernel; its
`layer_norm_eps` (1e-12 in `google/vit-*`) and `hidden_act` are honoured, and
`id2label` names the classes (`WeightsSource.class_names`).

The config and the tensors must agree. Each field of transformers' config
class is computed (the heads, the activation, the epsilon, the grid),
checked against the tensors (the sizes, `qkv_bias`, the pooler), or does
not change what a loaded model computes (`INFERENCE_IRRELEVANT`, with the
reason); `CONFIG_DEFAULTS` lists the fields read, with transformers'
defaults. A config field keras_vit cannot compute (`hidden_act: "relu"`, a
`pooler_act` other than tanh) is refused. The tensors must be exactly the
configured model's: every block, norm and embedding, and nothing the
config rules out. Keys that are not fields of the config class are
ignored, as transformers' model ignores them. Loaded at another size, the position table is resized as transformers'
`ViTEmbeddings.interpolate_pos_encoding` does: bicubic, no antialias.

Example:
>>> from keras_vit import checkpoints
>>> source = checkpoints.read_transformers_folder("vit-base-patch16-224")  # doctest: +SKIP
"""

import dataclasses
import os

from keras_vit.checkpoints.config_fields import check_table_fits, checked_fields
from keras_vit.checkpoints.source import (
    CheckpointError,
    architecture_from_state,
    class_names_in_order,
    source_from_state,
)
from keras_vit.checkpoints.state_dict_files import folder_weights, read_state_dict
from keras_vit.checkpoints.tensor_layout import QKV, TensorLayout, settings
from keras_vit.model.architecture import Architecture

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
# transformers' hidden_act -> keras_vit's mlp_activation.
_ACTIVATIONS = {"gelu": "gelu", "gelu_python": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                "quick_gelu": "quick_gelu"}
# The fields of transformers' config classes (ViT, DINOv2, CLIP, SigLIP, and PreTrainedConfig's own) that do not
# change what a loaded model computes, and why.
INFERENCE_IRRELEVANT = {
    "hidden_dropout_prob": "dropout, off at inference",
    "attention_probs_dropout_prob": "dropout, off at inference",
    "attention_dropout": "dropout, off at inference",
    "drop_path_rate": "stochastic depth, off at inference",
    "initializer_range": "initialisation; the file holds the weights",
    "initializer_factor": "initialisation; the file holds the weights",
    "layerscale_value": "the initial value of layer scale; the file holds the learned lambda1",
    "use_mask_token": "the mask token of masked image modelling, not read",
    "encoder_stride": "the decoder of ViTForMaskedImageModeling, not read",
    "projection_dim": "CLIP's visual_projection into the image-text space, not read",
    "logit_scale_init_value": "the image-text logit scale, not read",
    "text_config": "the text tower, not read",
    "out_features": "Dinov2Backbone's choice of feature maps",
    "out_indices": "Dinov2Backbone's choice of feature maps",
    "stage_names": "Dinov2Backbone's names of feature maps",
    "apply_layernorm": "the feature maps of the Backbone classes (Dinov2Backbone, DINOv3ViTBackbone)",
    "reshape_hidden_states": "Dinov2Backbone's feature maps",
    "label2id": "the inverse of id2label",
    "architectures": "the class that saved the file; its tensors show the head",
    "transformers_version": "the version that saved the file",
    "dtype": "the precision the tensors were saved in; keras_vit computes in its own dtype",
    "output_hidden_states": "what transformers' forward returns",
    "return_dict": "what transformers' forward returns",
    "chunk_size_feed_forward": "computes the MLP in chunks, to the same result",
    "is_encoder_decoder": "a flag of text models",
    "problem_type": "the training loss",
}
# The fields of transformers' ViTConfig that the reader computes or checks, with transformers' defaults.
CONFIG_DEFAULTS = {"vit": dict(
    hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072, hidden_act="gelu",
    layer_norm_eps=1e-12, image_size=224, patch_size=16, num_channels=3, qkv_bias=True, pooler_output_size=None,
    pooler_act="tanh", id2label=None)}


def transformers_fields(folder, config, defaults, where=None):
    """`(weights path, fields)` of a transformers folder: its config's `defaults` keys (transformers' default where
    absent or null), the ones every reader reads checked; errors name `where` (default the folder's config.json).

    Each field is of its kind (`config_fields.FIELD_KINDS`): `fields["image_size"]` is `(height, width)`,
    `fields["patch_size"]` an int; `fields["hidden_act"]` is keras_vit's `mlp_activation`.
    """
    weights = folder_weights(folder, "transformers")
    where = where or os.path.join(folder, "config.json")
    fields = {key: default if config.get(key) is None else config[key] for key, default in defaults.items()}
    fields = checked_fields(fields, where)
    activation = fields["hidden_act"]
    if activation not in _ACTIVATIONS:
        raise CheckpointError(f"{where}: hidden_act {activation!r} is not a GELU; keras_vit's blocks compute GELU "
                              f"({', '.join(_ACTIVATIONS)}).")
    fields["hidden_act"] = _ACTIVATIONS[activation]
    return weights, fields


def check_sizes(where, fields, state, mlp=None):
    """Refuse config.json `fields` that contradict the tensors (keras_vit's `state`), naming the field and the file's.

    `mlp` is `(field, its value, the MLP width it makes)`, default `intermediate_size`.
    """
    kernel = state["embedding/kernel"]  # (patch, patch, channels, width)
    patch, width, channels = fields["patch_size"], int(kernel.shape[-1]), int(kernel.shape[2])
    if fields["hidden_size"] != width:
        raise CheckpointError(f"{where}: hidden_size is {fields['hidden_size']}, but the file's patch embedding is "
                              f"{width} wide.")
    if fields["num_channels"] != channels:
        raise CheckpointError(f"{where}: num_channels is {fields['num_channels']}, but the file's patch embedding "
                              f"takes {channels} channels.")
    if tuple(kernel.shape[:2]) != (patch, patch):
        raise CheckpointError(f"{where}: patch_size is {patch}, but the file's patch embedding kernel is "
                              f"{kernel.shape[0]}x{kernel.shape[1]}.")
    if width % fields["num_attention_heads"]:
        raise CheckpointError(f"{where}: num_attention_heads is {fields['num_attention_heads']}, which does not "
                              f"divide hidden_size {width}.")
    key, value, expected = mlp or ("intermediate_size", fields["intermediate_size"], fields["intermediate_size"])
    widths = sorted({int(array.shape[-1]) for name, array in state.items() if name.endswith("mlp_hidden/kernel")})
    if widths != [expected]:
        raise CheckpointError(f"{where}: {key} is {value} (an MLP of width {expected}), but the file's MLP "
                              f"{'layers are' if len(widths) > 1 else 'is'} {' and '.join(map(str, widths))} wide.")


LAYOUT = TensorLayout(
    "transformers' ViT layout", top=_TOP, block_prefix="encoder.layer.", block=_BLOCK, strip=("vit.",),
    ignored=("embeddings.mask_token",),  # Only for masked image modelling; unused in inference.
    qkv={f"attention.attention.{kind}.{field}": (kind, field) for kind in QKV for field in ("weight", "bias")})


# DeiT's layout: ViT's under "deit.", its distillation token and two heads (not DeiTForImageClassification's one
# head on the class token, nor DeiTModel's pooler, which keras_vit's distilled DeiT does not build).
DEIT_LAYOUT = dataclasses.replace(
    LAYOUT, name="transformers' DeiT layout", strip=("deit.",),
    top={**{name: path for name, path in _TOP.items() if not name.startswith(("classifier.", "pooler."))},
         "embeddings.distillation_token": "distillation_token/dist",
         "cls_classifier.weight": "head/kernel", "cls_classifier.bias": "head/bias",
         "distillation_classifier.weight": "head_dist/kernel", "distillation_classifier.bias": "head_dist/bias"},
    hint="; keras_vit reads DeiTForImageClassificationWithTeacher folders (cls_classifier and "
         "distillation_classifier) and headless ones")
# model_type -> (layout, the Architecture fields its tensors always have besides qkv_bias).
MODEL_TYPES = {"vit": (LAYOUT, {}), "deit": (DEIT_LAYOUT, {"distillation_token": True})}


def from_transformers(tensors, description="checkpoint", expected=None, layout=LAYOUT):
    """keras_vit's state from a transformers ViT state dict (`vit.` prefix or none) of numpy arrays.

    `expected`: `(architecture, depth, settings)` of the model a config.json describes, whose tensors the file
    must hold exactly.
    """
    state = layout.read(tensors, description, expected)
    if "pre_logits/kernel" in state and "head/kernel" in state:
        raise CheckpointError(f"{description} has both a pooler and a classifier, which no transformers ViT has.")
    return state


def configured_grid(fields, patches, where, prefix_rows=0):
    """The patch grid of the config's `image_size`, which the table's `patches` rows (after its `prefix_rows`)
    must fit, as transformers' own load requires; `where` names the config in the refusal."""
    (height, width), patch = fields["image_size"], fields["patch_size"]
    check_table_fits(patches + prefix_rows, prefix_rows, (height, width), patch, f"{where}: image_size")
    return (height // patch, width // patch)


def _vit_tensors(fields, switches):
    """The model `fields` describe, as `TensorLayout.read` checks it: `(architecture, depth, settings)`."""
    return (Architecture(qkv_bias=fields["qkv_bias"], **switches), fields["num_hidden_layers"],
            settings(fields, "num_hidden_layers", "qkv_bias"))


def read_transformers_folder(folder, config, budget=None):
    """A transformers ViT or DeiT folder (its parsed `config`) as a `WeightsSource`."""
    weights, fields = transformers_fields(folder, config, CONFIG_DEFAULTS["vit"])  # DeiTConfig's are ViTConfig's
    where = os.path.join(folder, "config.json")
    layout, switches = MODEL_TYPES[config.get("model_type", "vit")]
    tensors = read_state_dict(weights, budget)
    state = from_transformers(tensors, weights, _vit_tensors(fields, switches), layout)
    check_sizes(where, fields, state)
    if "pre_logits/kernel" in state:
        pooler = fields["pooler_output_size"] or fields["hidden_size"]
        if fields["pooler_act"] != "tanh":
            raise CheckpointError(f"{where}: pooler_act is {fields['pooler_act']!r}; keras_vit's pre-logits layer "
                                  "computes tanh.")
        if state["pre_logits/kernel"].shape[-1] != pooler:
            raise CheckpointError(f"{where}: pooler_output_size is {pooler}, but the file's pooler has "
                                  f"{state['pre_logits/kernel'].shape[-1]} outputs.")
    labels = fields["id2label"]
    if "head/kernel" in state and isinstance(labels, (dict, list)) and len(labels) != state["head/kernel"].shape[-1]:
        raise CheckpointError(f"{where}: id2label names {len(labels)} classes, but the file's classifier has "
                              f"{state['head/kernel'].shape[-1]} outputs.")
    prefix = 1 + len(switches)  # the class token, and DeiT's distillation token
    grid = configured_grid(fields, state["position_embedding/pos_embedding"].shape[1] - prefix, where, prefix)
    architecture = architecture_from_state(state, grid, mlp_activation=fields["hidden_act"],
                                           layer_norm_epsilon=fields["layer_norm_eps"],
                                           class_token_position_embedding=True)
    source = source_from_state(weights, state, grid, fields["num_attention_heads"], architecture)
    source.origins = layout.origins(tensors)
    source.class_names = class_names_in_order(labels, state)
    source.position_resize = ("bicubic", False)  # ViTEmbeddings.interpolate_pos_encoding
    return source
