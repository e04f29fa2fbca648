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

import keras

from keras_vit.layers import TransformerBlock

LORA_TARGETS = ("qkv", "attention_output", "mlp_hidden", "mlp_output")
# Layers that stay trainable: the task's new head.
_HEAD = ("head", "pre_logits")


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
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"rank must be a positive int, got {rank!r}.")
    blocks = _blocks(model)
    if any(block.lora_rank for block in blocks):
        raise ValueError(f"{model.name} already has LoRA adapters; call merge_lora first to add new ones.")
    for layer in model.layers:
        layer.trainable = layer.name in _HEAD or isinstance(layer, TransformerBlock)
    for block in blocks:
        for name in targets:
            getattr(block, name).enable_lora(rank, lora_alpha=alpha)
        block.lora_rank, block.lora_targets = rank, targets
        block.freeze_all_but_lora()
    return model


def merge_lora(model):
    """A new model with every LoRA adapter folded into its kernel and no adapters left; outputs equal."""
    blocks = _blocks(model)
    merged_kernels = {}
    for block in blocks:
        for name in block.lora_targets:
            dense = getattr(block, name)
            merged_kernels[dense._kernel.path] = keras.ops.convert_to_numpy(dense.kernel)  # kernel merges the adapters
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
