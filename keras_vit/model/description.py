"""What a built keras_vit model is: its `Architecture`, its `Variant` sizes and its native patch grid.

A model that `keras_vit.model.graph` builds carries them in its config
(`describe` writes them, `read_description` reads them back, a `.keras`
file keeps them); `architecture_of`, `sizes_of` and `native_grid` return
them. A `.keras` file saved before models carried them (December 2026), or a
model composed from a ViT's layers, is read from its layers instead.
"""

import dataclasses
import re

from keras_vit.layers.naflex import NAFLEX_INPUTS
from keras_vit.model.architecture import POOLINGS, RESNET_EPSILONS, Architecture
from keras_vit.model.variants import Variant


def describe(architecture, sizes, grid):
    """The config entries with which a model carries its description (JSON: lists for tuples)."""
    return {"architecture": _as_json(dataclasses.asdict(architecture)), "sizes": _as_json(dataclasses.asdict(sizes)),
            "native_grid": list(grid)}


def read_description(config):
    """`(Architecture, Variant, grid)` from the entries `describe` wrote (popped from `config`), or Nones."""
    entries = {key: config.pop(key, None) for key in ("architecture", "sizes", "native_grid")}
    if entries["architecture"] is None or entries["sizes"] is None:
        return None, None, None
    found = []
    for kind, fields in ((Architecture, entries["architecture"]), (Variant, entries["sizes"])):
        unknown = set(fields) - {field.name for field in dataclasses.fields(kind)}
        if unknown:
            raise ValueError(f"The model's saved {kind.__name__} has fields {sorted(unknown)} that this keras_vit "
                             "does not know: it was saved by a newer keras_vit; upgrade keras_vit to load it.")
        found.append(kind(**_as_tuples(fields)))
    grid = entries["native_grid"]
    return found[0], found[1], None if grid is None else tuple(int(side) for side in grid)


def _as_json(value):
    if isinstance(value, (tuple, list)):
        return [_as_json(item) for item in value]
    if isinstance(value, dict):
        return {key: _as_json(item) for key, item in value.items()}
    return value


def _as_tuples(value):
    if isinstance(value, list):
        return tuple(_as_tuples(item) for item in value)
    if isinstance(value, dict):
        return {key: _as_tuples(item) for key, item in value.items()}
    return value


def architecture_of(model):
    """The `Architecture` of a built keras_vit model: the one it carries, else read from its layers.

    Example:
    >>> import keras_vit
    >>> model = keras_vit.ViT(image_size=32, patch_size=8, hidden_size=16, num_layers=1, num_heads=2,
    ...                       mlp_dim=32, register_tokens=2)
    >>> architecture_of(model).num_prefix_tokens
    3
    """
    if isinstance(getattr(model, "architecture", None), Architecture):
        return model.architecture
    layers = {layer.name: layer for layer in model.layers}
    block, embedding = layers.get("encoderblock_0"), layers.get("embedding")
    if block is None or embedding is None or not hasattr(block, "switches"):
        raise ValueError(f"{getattr(model, 'name', model)!r} is not a keras_vit ViT (it has no layers named "
                         "'embedding' and 'encoderblock_0').")
    class_token, distillation_token = "class_token" in layers, "distillation_token" in layers
    register_tokens = layers["register_tokens"].count if "register_tokens" in layers else 0
    position = layers.get("position_embedding")
    prefix = int(class_token) + int(distillation_token) + register_tokens
    pool = layers.get("pool")
    if getattr(model, "classifier", None) in POOLINGS:  # Kept by the model: its pooling layers may be absent.
        classifier = model.classifier
    elif "attention_pool" in layers:
        classifier = "map"
    elif pool is not None:
        classifier = pool.method
    else:
        classifier = "token" if class_token else "gap"
    blocks = [layer for layer in model.layers if layer.name.startswith("encoderblock_")]
    kv_heads = tuple(getattr(layer, "num_kv_heads", layer.num_heads) for layer in blocks)
    return Architecture(
        **dataclasses.asdict(block.switches),
        num_kv_heads=None if set(kv_heads) == {block.num_heads} else kv_heads,
        class_token=class_token,
        register_tokens=register_tokens,
        distillation_token=distillation_token,
        class_token_position_embedding=not prefix or position is None or position.num_prefix_tokens == prefix,
        classifier=classifier,
        fc_norm="fc_norm" in layers,
        final_norm="fc_norm" in layers or "encoder_norm" in layers,
        norm_pre="pre_norm" in layers,
        patch_bias=getattr(embedding, "use_bias", True),
        pool_include_prefix=bool(prefix) and classifier != "token" and getattr(
            layers.get("attention_pool") or pool, "num_prefix_tokens", prefix) == 0,
        patch_norm="patch_norm" in layers,
        position_embedding=position is not None,
        shared_relative_position_bias=getattr(layers.get("relative_position_bias"), "form", None),
        **_sam_settings(layers.get("neck"), blocks),
        **_class_attention_settings([layer for name, layer in layers.items() if name.startswith("class_attention_")],
                                    block, embedding),
        **_rope_settings(layers.get("rotary_positions")),
        **_attention_pool_settings(layers.get("attention_pool"), block, embedding),
        **_pixel_statistics(layers.get("input_normalization")),
        **_resnet_epsilons(layers.get("conv_root"), layers.get("gn_root")),
    )


def sizes_of(model):
    """The `Variant` sizes of a built keras_vit model: the ones it carries, else read from its layers."""
    if isinstance(getattr(model, "sizes", None), Variant):
        return model.sizes
    embedding, block = model.get_layer("embedding"), model.get_layer("encoderblock_0")
    depth = sum(1 for layer in model.layers if layer.name.startswith("encoderblock_"))
    paths = {variable.path: variable for variable in model.weights}
    resnet = {}
    if "conv_root/kernel" in paths:
        resnet = dict(resnet_layers=resnet_layers_of(paths),
                      resnet_width=int(paths["conv_root/kernel"].shape[-1]))
    if "conv_stem_0/kernel" in paths:
        resnet = dict(conv_stem_widths=conv_stem_widths_of(paths))
    if mbconv_of(paths) is not None:
        resnet = dict(zip(("mbconv_widths", "mbconv_depths"), mbconv_of(paths)))
    return Variant(embedding.patch_size[0], embedding.hidden_size, depth, block.num_heads, block.mlp_dim, **resnet)


def native_grid(model):
    """The patch grid a keras_vit model was built at: the one it carries, else its position table's or RoPE's."""
    if getattr(model, "native_grid", None) is not None:
        return tuple(model.native_grid)
    names = {layer.name for layer in model.layers}
    layer = model.get_layer("position_embedding" if "position_embedding" in names else "rotary_positions")
    return tuple(layer.grid_size)


def is_naflex(model):
    """Whether `model` takes NaFlex batches (`keras_vit.layers.naflex`) rather than images."""
    return sorted(str(getattr(tensor, "name", None)) for tensor in model.inputs) == sorted(NAFLEX_INPUTS)


def native_image_size(model, step):
    """`[height, width]` of the images a keras_vit model takes: its input's, or with dynamic resolution (or NaFlex)
    its native grid's times `step`, the `(height, width)` of the pixels one patch covers."""
    size = (None, None) if is_naflex(model) else tuple(model.input_shape[1:3])
    if None in size:
        size = tuple(side * pixels for side, pixels in zip(native_grid(model), step))
    return [int(side) for side in size]


def _sam_settings(neck, blocks):
    """SAM's fields of `Architecture` its blocks' windows and its neck hold (empty without)."""
    windows = [getattr(layer, "window_size", 0) for layer in blocks]
    settings = {}
    if any(windows):
        settings.update(window_size=max(windows), global_attention_blocks=tuple(
            index for index, window in enumerate(windows) if not window))
    if neck is not None:
        settings.update(neck_channels=neck.channels)
    return settings


def _class_attention_settings(blocks, block, embedding):
    """CaiT's class-attention fields of `Architecture` its `ClassAttentionBlock`s hold (empty without)."""
    if not blocks:
        return {}
    ratio = None if blocks[0].mlp_dim == block.mlp_dim else blocks[0].mlp_dim / embedding.hidden_size
    return dict(class_attention_blocks=len(blocks), class_attention_mlp_ratio=ratio)


def _rope_settings(rotary):
    """The RoPE fields of `Architecture` that its `RotaryPositions` layer holds (empty without)."""
    if rotary is None:
        return {}
    return dict(rope_grid_offset=rotary.offset, rope_grid_indexing=rotary.indexing,
                rope_reference_grid=rotary.reference_grid)


def _attention_pool_settings(pool, block, embedding):
    """Attention pooling's heads and MLP ratio where they are not the blocks' (empty otherwise)."""
    if pool is None or (pool.num_heads, pool.mlp_dim) == (block.num_heads, block.mlp_dim):
        return {}
    return dict(attention_pool_heads=pool.num_heads, attention_pool_mlp_ratio=pool.mlp_dim / embedding.hidden_size)


def _resnet_epsilons(conv, norm):
    """`{"resnet_epsilons": key}` of a hybrid's root layers (empty for a plain ViT)."""
    if conv is None or norm is None:
        return {}
    found = (float(conv.epsilon), getattr(conv, "epsilon_added_to", "std"), float(norm.epsilon))
    for key, settings in RESNET_EPSILONS.items():
        if found == (settings["standardization_epsilon"], settings["epsilon_added_to"], settings["group_norm_epsilon"]):
            return {"resnet_epsilons": key}
    raise ValueError(f"The hybrid's ResNet standardises with epsilon {found[0]:g} added to the {found[1]} and "
                     f"normalises with GroupNorm epsilon {found[2]:g}, which matches none of {tuple(RESNET_EPSILONS)}.")


def _pixel_statistics(normalization):
    return {} if normalization is None else dict(input_mean=normalization.mean, input_std=normalization.std)


UNIT = re.compile(r"block(\d+)_unit(\d+)/")


def conv_stem_widths_of(state):
    """The widths of MobileCLIP's convolutional stem that keras_vit-named `state` holds (None: no such stem)."""
    kernels = [state.get(f"conv_stem_{index}/kernel") for index in range(2)]
    if any(kernel is None for kernel in kernels):
        return None
    return tuple(int(kernel.shape[-1]) for kernel in kernels)


MBCONV_BLOCK = re.compile(r"mbconv_stage(\d+)_block(\d+)/")


def mbconv_of(state):
    """`(widths, depths)` of ViTamin's MbConv stem that keras_vit-named `state` holds (None: no such stem): the
    stem's width then each stage's, and each stage's blocks."""
    stem = state.get("mbconv_stem_conv1/kernel")
    if stem is None:
        return None
    depths, widths = {}, {}
    for name in state:
        match = MBCONV_BLOCK.match(name)
        if match and name.endswith("/conv3/kernel"):
            stage, block = int(match.group(1)), int(match.group(2))
            depths[stage] = max(depths.get(stage, 0), block + 1)
            widths[stage] = int(state[name].shape[-1])
    return (int(stem.shape[-1]), *(widths[stage] for stage in sorted(widths))), tuple(depths[stage]
                                                                                      for stage in sorted(depths))


def resnet_layers_of(names):
    """The bottleneck units per ResNet stage that keras_vit variable `names` hold (None: no ResNet)."""
    if "conv_root/kernel" not in names:
        return None
    units = {}
    for match in map(UNIT.match, names):
        if match:
            stage, unit = int(match.group(1)), int(match.group(2))
            units[stage] = max(units.get(stage, 0), unit)
    return tuple(units[stage] for stage in sorted(units))
