"""What the readers and writers of timm's other ViT classes (Beit, VisionTransformerRelPos, Cait,
VisionTransformerSAM) share: a model's sizes as timm's keywords, and its state without LoRA adapters.

Example:
>>> import keras_vit
>>> model = keras_vit.ViT(image_size=32, patch_size=8, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=32)
>>> size_arguments(model)["mlp_ratio"], size_arguments(model)["num_classes"]
(2.0, 1000)
"""

from keras_vit.checkpoints.source import CheckpointError, state_of
from keras_vit.checkpoints.timm.families import timm_mlp_ratio
from keras_vit.model.description import native_image_size


def size_arguments(model, switches=None):
    """`timm.create_model`'s size keywords of `model` (`img_size`, `patch_size`, `embed_dim`, `depth`, `num_heads`,
    `mlp_ratio` as timm builds the MLP with `switches`, `num_classes`: 0 without a head)."""
    block = model.get_layer("encoderblock_0")
    embed = int(model.get_layer("embedding").kernel.shape[-1])
    patch = tuple(model.get_layer("embedding").kernel.shape[:2])
    head = [layer for layer in model.layers if layer.name == "head"]
    return dict(img_size=native_image_size(model, patch), patch_size=patch[0], embed_dim=embed,
                depth=sum(layer.name.startswith("encoderblock_") for layer in model.layers),
                num_heads=int(block.num_heads), mlp_ratio=timm_mlp_ratio(embed, block.mlp_dim, switches or {}),
                num_classes=int(head[0].kernel.shape[-1]) if head else 0)


def state_without_adapters(model, timm_class):
    """`model`'s state (`state_of`), refused while it has LoRA adapters, which timm's `timm_class` does not have."""
    state = state_of(model)
    if any("lora_" in name for name in state):
        raise CheckpointError(f"{model.name} has LoRA adapters, which timm's {timm_class} does not have: call "
                              "keras_vit.merge_lora(model) first, then save_timm.")
    return state


def gives_tokens(model):
    """Whether `model` has neither a head nor a pooling: its output is its token sequence (`pooling=None`)."""
    names = {layer.name for layer in model.layers}
    return "head" not in names and not names & {"pool", "attention_pool", "pool_average"}
