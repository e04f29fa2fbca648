"""Low-rank adaptation (LoRA) of a ViT's blocks with Keras' own `Dense.enable_lora`, and merging it back.

`enable_lora` adds rank-`r` adapters to the chosen dense layers of every
`TransformerBlock` and freezes everything else except the classifier head,
so fine-tuning trains a small fraction of the weights. A LoRA model saves and
reloads as `.keras` (Keras saves each adapted kernel merged, and the
adapters restart at zero). `merge_lora` returns a plain model with the
adapters folded into the kernels, for export.

Example:
>>> import keras_vit
>>> model = keras_vit.ViT(image_size=32, patch_size=8, hidden_size=32, num_layers=2, num_heads=2,
...                       mlp_dim=64, classes=3)
>>> _ = enable_lora(model, rank=4)
>>> sorted({w.path.split("/")[-1] for w in model.trainable_weights})
['bias', 'kernel', 'lora_kernel_a', 'lora_kernel_b']
"""

import numbers

import keras

from keras_vit.layers import TransformerBlock
from keras_vit.utils.keras_internals import stored_kernel

LORA_TARGETS = ("qkv", "attention_output", "mlp_hidden", "mlp_output")
# Layers that stay trainable: the task's new head.
_HEAD = ("head", "head_dist", "pre_logits")


def _blocks(model):
    blocks = [layer for layer in model.layers if isinstance(layer, TransformerBlock)]
    if not blocks:
        raise ValueError(f"{model.name} has no TransformerBlock layers to adapt; pass a keras_vit model.")
    return blocks


def enable_lora(model, rank, targets=("qkv",), alpha=None):
    """Add LoRA adapters of `rank` to the dense layers `targets` of every block; train only them and the head.

    Args:
        model: a built keras_vit model.
        rank: the adapters' rank, a positive int.
        targets: dense layers of each block to adapt, among `LORA_TARGETS`
            (`"qkv"`, `"attention_output"`, `"mlp_hidden"`, `"mlp_output"`).
        alpha: scale of the adapters' update (`alpha / rank`); default `rank`.

    Returns the model, changed in place.
    """
    if isinstance(targets, str):
        targets = (targets,)
    targets = tuple(targets)
    unknown = [name for name in targets if name not in LORA_TARGETS]
    if unknown or not targets:
        raise ValueError(f"Unknown LoRA targets {unknown or list(targets)}; choose among {list(LORA_TARGETS)}.")
    repeated = sorted({name for name in targets if targets.count(name) > 1})
    if repeated:
        raise ValueError(f"LoRA targets {list(targets)} name {repeated} more than once; name each dense layer once.")
    if isinstance(rank, bool) or not isinstance(rank, numbers.Integral) or rank < 1:
        raise ValueError(f"rank must be a positive int, got {rank!r}.")
    if alpha is not None and (isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) or not alpha > 0):
        raise ValueError(f"alpha must be a positive number (or None for rank), got {alpha!r}.")
    rank, alpha = int(rank), None if alpha is None else float(alpha)
    blocks = _blocks(model)
    # Everything is checked before anything changes: a refused call leaves the model as it was.
    adapted = [f"{block.name}/{name}" for block in blocks for name in LORA_TARGETS
               if getattr(getattr(block, name), "lora_enabled", False)]
    if any(block.lora_rank for block in blocks) or adapted:
        where = ", ".join(adapted[:3]) + (", ..." if len(adapted) > 3 else "")
        raise ValueError(f"{model.name} already has LoRA adapters ({where}); call merge_lora first to add new ones.")
    trainable = {id(layer): layer.trainable for layer in model.layers}
    try:
        for layer in model.layers:
            layer.trainable = layer.name in _HEAD or isinstance(layer, TransformerBlock)
        for block in blocks:
            for name in targets:
                getattr(block, name).enable_lora(rank, lora_alpha=alpha)
            block.lora_rank, block.lora_targets = rank, targets
            block.freeze_all_but_lora()
    except BaseException:
        for layer in model.layers:  # Keras cannot remove adapters, but the training flags go back.
            layer.trainable = trainable[id(layer)]
        raise
    return model


def merge_lora(model):
    """A new model with every LoRA adapter folded into its kernel and no adapters left; outputs equal."""
    blocks = _blocks(model)
    merged_kernels = {}
    for block in blocks:
        for name in block.lora_targets:
            dense = getattr(block, name)
            merged_kernels[stored_kernel(dense).path] = keras.ops.convert_to_numpy(dense.kernel)  # kernel merges the adapters
    config = model.get_config()
    for layer in config["layers"]:
        layer["config"].pop("lora_rank", None)
        layer["config"].pop("lora_targets", None)
    plain = model.__class__.from_config(config)
    # Copies, not the variables: on JAX, assigning one variable to another shares its array, which the
    # other model's next fit or predict may delete (donate).
    values = {variable.path: keras.ops.convert_to_numpy(variable) for variable in model.weights}
    for variable in plain.weights:
        variable.assign(merged_kernels.get(variable.path, values[variable.path]))
    return plain
