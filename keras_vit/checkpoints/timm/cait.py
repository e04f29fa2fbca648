"""timm's `Cait` class (CaiT, Touvron et al., 2021): its architectures and state dict layout, read and written.

A `Cait` runs its patches (with a position table of the patches alone)
through talking-heads blocks (`blocks.N.attn.qkv`, `attn.proj_l` and
`attn.proj_w`, the heads' mixing maps; layer scales `gamma_1`/`gamma_2`),
then brings in the class token, which class-attention blocks update alone
(`blocks_token_only.N.attn.q`, `k`, `v`, `proj`, their `gamma_1`/`gamma_2`),
and pools the class token (or the patches' mean) after the final norm.
keras_vit builds it with `talking_heads=True` and `class_attention_blocks`
(`keras_vit.layers.class_attention`). `CAIT_ARCHITECTURES` holds what each
of timm's model functions sets; `tests/test_timm_registry.py` audits it.

Example:
>>> fields = cait_switches_to_architecture(CAIT_ARCHITECTURES["cait_s24_224"].switches)
>>> fields["class_attention_blocks"], fields["talking_heads"], fields["layer_scale"]
(2, True, 1e-05)
"""

import dataclasses

import numpy as np

from keras_vit.checkpoints.source import CheckpointError, source_from_state
from keras_vit.checkpoints.state_dict_files import read_state_dict
from keras_vit.checkpoints.tensor_layout import settings
from keras_vit.checkpoints.timm import eva_layout
from keras_vit.checkpoints.timm.class_common import size_arguments, state_without_adapters
from keras_vit.checkpoints.config_fields import check_table_fits
from keras_vit.checkpoints.timm.config import (
    built_image_size,
    check_head,
    configured_class_architecture,
    configured_eval_transform,
)
from keras_vit.checkpoints.timm.families import (
    INFERENCE_NEUTRAL_KEYWORDS,
    SIZE_KEYWORDS,
    TimmArchitecture,
    timm_mlp_ratio,
)
from keras_vit.checkpoints.timm.layout import LAYOUT as VISION_TRANSFORMER_LAYOUT
from keras_vit.model.description import architecture_of

# timm's Cait keywords that keras_vit computes, as model_args (and the table) spell them.
CAIT_KEYWORDS = ("global_pool", "qkv_bias", "init_values", "depth_token_only", "mlp_ratio_token_only")
CAIT_ARGUMENTS = frozenset({*CAIT_KEYWORDS, *SIZE_KEYWORDS, *INFERENCE_NEUTRAL_KEYWORDS})
POOLS = {"token": "token", "avg": "gap"}
# timm's Cait img_size where neither model_args nor a fixed pretrained_cfg.input_size sets it (its model functions
# set none: the pretrained configs' fixed_input_size does).
CAIT_DEFAULT_IMAGE_SIZE = (224, 224)


def _cait(image_size, embed_dim, depth, num_heads, init_values):
    return TimmArchitecture(16, (image_size, image_size), embed_dim, depth, num_heads, 4.0,
                            dict(init_values=init_values))


CAIT_ARCHITECTURES = {
    "cait_m36_384": _cait(384, 768, 36, 16, 1e-6),
    "cait_m48_448": _cait(448, 768, 48, 16, 1e-6),
    "cait_s24_224": _cait(224, 384, 24, 8, 1e-5),
    "cait_s24_384": _cait(384, 384, 24, 8, 1e-5),
    "cait_s36_384": _cait(384, 384, 36, 8, 1e-6),
    "cait_xs24_384": _cait(384, 288, 24, 6, 1e-5),
    "cait_xxs24_224": _cait(224, 192, 24, 4, 1e-5),
    "cait_xxs24_384": _cait(384, 192, 24, 4, 1e-5),
    "cait_xxs36_224": _cait(224, 192, 36, 4, 1e-5),
    "cait_xxs36_384": _cait(384, 192, 36, 4, 1e-5),
}


def cait_switches_to_architecture(switches):
    """keras_vit `Architecture` fields for timm `Cait` keywords, with its defaults: talking heads, two
    class-attention blocks (MLP ratio 4), class-token pooling, q/k/v biases, layer scale 1e-4 (always made, 0
    too), exact GELU, LayerNorm epsilon 1e-6."""
    return dict(
        class_token=True,
        class_token_position_embedding=False,
        classifier=POOLS[switches.get("global_pool", "token")],
        qkv_bias=bool(switches.get("qkv_bias", True)),
        layer_scale=float(switches.get("init_values", 1e-4)),
        mlp_activation="gelu",
        layer_norm_epsilon=1e-6,
        talking_heads=True,
        class_attention_blocks=int(switches.get("depth_token_only", 2)),
        class_attention_mlp_ratio=float(switches.get("mlp_ratio_token_only", 4.0)),
    )


def _dense(timm, ours):
    return {f"{timm}.weight": f"{ours}/kernel", f"{timm}.bias": f"{ours}/bias"}


def _norm(timm, ours):
    return {f"{timm}.weight": f"{ours}/gamma", f"{timm}.bias": f"{ours}/beta"}


def layout_of(class_attention_blocks):
    """The `TensorLayout` of a `Cait` with this many class-attention blocks (`blocks_token_only.N`)."""
    top = dict(VISION_TRANSFORMER_LAYOUT.top)
    for index in range(class_attention_blocks):
        timm, ours = f"blocks_token_only.{index}.", f"class_attention_{index}/"
        top.update({**_norm(timm + "norm1", ours + "attention_norm"), **_norm(timm + "norm2", ours + "mlp_norm"),
                    **{name: path for part, target in (("q", "query"), ("k", "key"), ("v", "value"),
                                                       ("proj", "attention_output"))
                       for name, path in _dense(f"{timm}attn.{part}", ours + target).items()},
                    **_dense(timm + "mlp.fc1", ours + "mlp_hidden"), **_dense(timm + "mlp.fc2", ours + "mlp_output"),
                    timm + "gamma_1": ours + "attention_layer_scale", timm + "gamma_2": ours + "mlp_layer_scale"})
    block = {name: path for name, path in VISION_TRANSFORMER_LAYOUT.block.items() if not name.startswith(("ls1.",
                                                                                                          "ls2."))}
    block.update({"gamma_1": "attention_layer_scale", "gamma_2": "mlp_layer_scale",
                  "attn.proj_l.weight": "talking_heads_logit_kernel", "attn.proj_l.bias": "talking_heads_logit_bias",
                  "attn.proj_w.weight": "talking_heads_weight_kernel", "attn.proj_w.bias": "talking_heads_weight_bias"})
    return dataclasses.replace(VISION_TRANSFORMER_LAYOUT, name="timm's Cait layout", top=top, block=block,
                               hint="; keras_vit reads timm Cait state dicts (blocks.N.attn.proj_l.weight, "
                                    "blocks_token_only.N.attn.q.weight, ...)")


def configured_cait_architecture(config, where):
    """`(entry, model_args, switches, pretrained_cfg, Architecture)` of a timm `config.json` (parsed, read from
    `where`) naming one of `CAIT_ARCHITECTURES`: the model it describes, before any tensor is read."""
    return configured_class_architecture(config, where, "Cait", CAIT_ARCHITECTURES, CAIT_ARGUMENTS, CAIT_KEYWORDS,
                                         cait_switches_to_architecture, POOLS)


def read_timm_cait(path, budget, config, where):
    """Read a timm `Cait` state dict whose `config.json` (parsed as `config`, read from `where`) names one of
    `CAIT_ARCHITECTURES` into a `WeightsSource`."""
    name = config.get("architecture")
    entry, args, switches, pretrained, architecture = configured_cait_architecture(config, where)
    transform = configured_eval_transform(config, where)
    tensors = read_state_dict(path, budget)
    layout = layout_of(architecture.class_attention_blocks)
    state = layout.read(tensors, path)
    if "embedding/kernel" not in state or "encoderblock_0/mlp_hidden/kernel" not in state:
        raise CheckpointError(f"{path} lacks timm's patch embedding or first block (patch_embed.proj.weight, "
                              "blocks.0.mlp.fc1.weight). Nothing was loaded.")
    sizes = eva_layout.checked_eva_sizes(state, entry, args, switches, name, path, where,
                                          resamples_patches=False)  # timm loads the kernel as it is
    layout.check_complete(list(tensors), architecture, sizes["depth"], settings(dict(
        sizes, architecture=name, depth_token_only=architecture.class_attention_blocks), "architecture", "depth",
        "depth_token_only"), path)
    width = int(sizes["embed_dim"] * architecture.class_attention_mlp_ratio)
    found = int(state["class_attention_0/mlp_hidden/kernel"].shape[-1]) if architecture.class_attention_blocks \
        else width
    if found != width:
        raise CheckpointError(f"{path}: blocks_token_only.0.mlp.fc1.weight is {found} wide, but the config's "
                              f"mlp_ratio_token_only gives {width}. Nothing was loaded.")
    check_head(state, args.get("num_classes", config.get("num_classes")), path, where)
    # timm's Cait filter resamples no table: the file's is the one grid timm builds, or timm refuses it.
    size, field = built_image_size(args, pretrained, CAIT_DEFAULT_IMAGE_SIZE, where)
    patch = sizes["patch_size"]
    check_table_fits(int(state["position_embedding/pos_embedding"].shape[1]), 0, size, patch, field)
    source = source_from_state(path, state, (size[0] // patch, size[1] // patch), sizes["num_heads"], architecture)
    source.origins = layout.origins(tensors)
    source.eval_transform = transform
    return source


def cait_arguments(model, architecture):
    """The keywords of `timm.create_model(architecture, **kwargs)` with the sizes and switches of `model`, for a
    name of timm's `Cait` class (`writer.timm_arguments` checks that they rebuild it)."""
    found = architecture_of(model)
    class_blocks = [layer for layer in model.layers if layer.name.startswith("class_attention_")]
    sizes = size_arguments(model)
    return dict(**sizes, global_pool={"gap": "avg"}.get(found.classifier, found.classifier), qkv_bias=found.qkv_bias,
                init_values=found.layer_scale, depth_token_only=len(class_blocks),
                mlp_ratio_token_only=timm_mlp_ratio(sizes["embed_dim"], class_blocks[0].mlp_dim, {}) if class_blocks
                else 4.0)


def to_timm_cait(model, architecture):
    """`model`'s weights as the state dict of timm's `Cait` `architecture` (numpy arrays, PyTorch's shapes)."""
    state = state_without_adapters(model, "Cait")
    found = architecture_of(model)
    tensors = layout_of(found.class_attention_blocks).write(state, architecture=found)
    return {name: np.ascontiguousarray(value) for name, value in tensors.items()}
