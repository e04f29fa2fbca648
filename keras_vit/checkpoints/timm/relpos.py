"""timm's `VisionTransformerRelPos` class (`vit_relpos_*`, `vit_srelpos_*`): its architectures and state dict layout,
read and written.

A `VisionTransformerRelPos` is timm's `VisionTransformer` block (`ls1.gamma`,
`ls2.gamma`; `ResPostRelPosBlock`: post-norm, no layer scale) without a
position table, with a relative position bias in every attention
(`blocks.N.attn.rel_pos`) or one shared by all (`shared_rel_pos`): an MLP
over log-spaced offsets (`rel_pos_type='mlp'`, timm's `RelPosMlp` in its
`cr` mode; `'mlp_swin'`: Swin v2's) or a table (anything else: `RelPosBias`,
three more rows with a class token). No class token by default, and the
patch tokens' mean pooled. `RELPOS_ARCHITECTURES` holds what each of timm's
model functions sets, in timm's keywords; `tests/test_timm_registry.py`
audits it against timm's registry.

Example:
>>> fields = relpos_switches_to_architecture(RELPOS_ARCHITECTURES["vit_srelpos_small_patch16_224"].switches)
>>> fields["shared_relative_position_bias"], fields["relative_position_mlp_dim"], fields["classifier"]
('mlp', 384, 'gap')
"""

import dataclasses

import numpy as np

from keras_vit.checkpoints.source import CheckpointError, source_from_state
from keras_vit.checkpoints.state_dict_files import read_state_dict
from keras_vit.checkpoints.tensor_layout import settings
from keras_vit.checkpoints.timm import eva_layout
from keras_vit.checkpoints.timm.class_common import size_arguments, state_without_adapters
from keras_vit.checkpoints.timm.config import (
    check_head,
    check_relative_tables,
    configured_class_architecture,
    configured_eval_transform,
    configured_image_sizes,
)
from keras_vit.checkpoints.timm.families import (
    INFERENCE_NEUTRAL_KEYWORDS,
    SIZE_KEYWORDS,
    TimmArchitecture,
)
from keras_vit.checkpoints.timm.layout import LAYOUT as VISION_TRANSFORMER_LAYOUT
from keras_vit.layers.relative_position import MLP_DIM
from keras_vit.model.description import architecture_of

# timm's VisionTransformerRelPos keywords that keras_vit computes, as model_args (and the table) spell them.
RELPOS_KEYWORDS = ("class_token", "global_pool", "fc_norm", "qkv_bias", "qk_norm", "init_values", "rel_pos_type",
                   "rel_pos_dim", "shared_rel_pos", "block_fn")
# Keywords that change only how the weights start.
TRAINING_ONLY_KEYWORDS = ("weight_init", "fix_init")
RELPOS_ARGUMENTS = frozenset({*RELPOS_KEYWORDS, *TRAINING_ONLY_KEYWORDS, *SIZE_KEYWORDS, *INFERENCE_NEUTRAL_KEYWORDS})
BLOCKS = {"RelPosBlock": False, "ResPostRelPosBlock": True}  # -> post-norm
POOLS = {"avg": "gap", "token": "token"}


def _relpos(patch_size, image_size, embed_dim, depth, num_heads, mlp_ratio=4.0, **switches):
    return TimmArchitecture(patch_size, (image_size, image_size), embed_dim, depth, num_heads, mlp_ratio, switches)


RELPOS_ARCHITECTURES = {
    "test_vit_relpos": _relpos(16, 160, 96, 9, 3, mlp_ratio=2, fc_norm=True, qkv_bias=False),
    "vit_relpos_base_patch16_224": _relpos(16, 224, 768, 12, 12, fc_norm=True, qkv_bias=False),
    "vit_relpos_base_patch16_cls_224": _relpos(16, 224, 768, 12, 12, class_token=True, global_pool="token",
                                               qkv_bias=False),
    "vit_relpos_base_patch16_clsgap_224": _relpos(16, 224, 768, 12, 12, class_token=True, fc_norm=True,
                                                  qkv_bias=False),
    "vit_relpos_base_patch16_plus_240": _relpos(16, 240, 896, 12, 14),
    "vit_relpos_base_patch16_rpn_224": _relpos(16, 224, 768, 12, 12, block_fn="ResPostRelPosBlock", qkv_bias=False),
    "vit_relpos_base_patch32_plus_rpn_256": _relpos(32, 256, 896, 12, 14, block_fn="ResPostRelPosBlock"),
    "vit_relpos_medium_patch16_224": _relpos(16, 224, 512, 12, 8, fc_norm=True, qkv_bias=False),
    "vit_relpos_medium_patch16_cls_224": _relpos(16, 224, 512, 12, 8, class_token=True, fc_norm=False,
                                                 global_pool="token", qkv_bias=False, rel_pos_dim=256),
    "vit_relpos_medium_patch16_rpn_224": _relpos(16, 224, 512, 12, 8, block_fn="ResPostRelPosBlock", qkv_bias=False),
    "vit_relpos_small_patch16_224": _relpos(16, 224, 384, 12, 6, fc_norm=True, qkv_bias=False),
    "vit_relpos_small_patch16_rpn_224": _relpos(16, 224, 384, 12, 6, block_fn="ResPostRelPosBlock", qkv_bias=False),
    "vit_srelpos_medium_patch16_224": _relpos(16, 224, 512, 12, 8, fc_norm=False, qkv_bias=False, rel_pos_dim=512,
                                              shared_rel_pos=True),
    "vit_srelpos_small_patch16_224": _relpos(16, 224, 384, 12, 6, fc_norm=False, qkv_bias=False, rel_pos_dim=384,
                                             shared_rel_pos=True),
}


def relpos_form(rel_pos_type):
    """keras_vit's relative position form of timm's `rel_pos_type`, as `VisionTransformerRelPos` reads it."""
    if rel_pos_type.startswith("mlp"):
        return "mlp_swin" if "swin" in rel_pos_type else "mlp"
    return "table"


def relpos_switches_to_architecture(switches):
    """keras_vit `Architecture` fields for timm `VisionTransformerRelPos` keywords, with its defaults.

    No class token, the patch tokens' mean pooled, the final norm (or
    `fc_norm` after pooling), a q/k/v bias, layer scale 1e-6 (none in a
    post-norm block), an MLP relative position bias of width 128 in each
    block, exact GELU, LayerNorm epsilon 1e-6.
    """
    block = switches.get("block_fn", "RelPosBlock")
    if block not in BLOCKS:
        raise KeyError(f"block_fn {block!r}")
    post_norm = BLOCKS[block]
    form = relpos_form(switches.get("rel_pos_type", "mlp"))
    shared = bool(switches.get("shared_rel_pos", False))
    init_values = switches.get("init_values", 1e-6)
    return dict(
        class_token=bool(switches.get("class_token", False)),
        position_embedding=False,
        classifier=POOLS[switches.get("global_pool", "avg")],
        fc_norm=bool(switches.get("fc_norm", False)),
        final_norm=True,
        qkv_bias=bool(switches.get("qkv_bias", True)),
        qk_norm=bool(switches.get("qk_norm", False)),
        post_norm=post_norm,
        layer_scale=None if post_norm or not init_values else float(init_values),  # its LayerScale for a truthy value
        mlp_activation="gelu",
        layer_norm_epsilon=1e-6,
        relative_position_bias=None if shared else form,
        shared_relative_position_bias=form if shared else None,
        relative_position_mlp_dim=int(switches.get("rel_pos_dim") or MLP_DIM),
    )


def _relative_positions(prefix, ours):
    """timm's names of a relative position bias under `prefix` -> keras_vit's (after `ours`)."""
    return {f"{prefix}relative_position_bias_table": f"{ours}relative_position_bias_table",
            f"{prefix}mlp.fc1.weight": f"{ours}relative_position_mlp_hidden_kernel",
            f"{prefix}mlp.fc1.bias": f"{ours}relative_position_mlp_hidden_bias",
            f"{prefix}mlp.fc2.weight": f"{ours}relative_position_mlp_output_kernel",
            f"{prefix}mlp.fc2.bias": f"{ours}relative_position_mlp_output_bias"}


LAYOUT = dataclasses.replace(
    VISION_TRANSFORMER_LAYOUT, name="timm's VisionTransformerRelPos layout",
    top={**VISION_TRANSFORMER_LAYOUT.top, **_relative_positions("shared_rel_pos.", "relative_position_bias/")},
    block={**VISION_TRANSFORMER_LAYOUT.block, **_relative_positions("attn.rel_pos.", "")},
    hint="; keras_vit reads timm VisionTransformerRelPos state dicts (blocks.N.attn.rel_pos.mlp.fc1.weight, ...)")


def configured_relpos_architecture(config, where):
    """`(entry, model_args, switches, pretrained_cfg, Architecture)` of a timm `config.json` (parsed, read from
    `where`) naming one of `RELPOS_ARCHITECTURES`: the model it describes, before any tensor is read."""
    return configured_class_architecture(config, where, 'VisionTransformerRelPos', RELPOS_ARCHITECTURES, RELPOS_ARGUMENTS, RELPOS_KEYWORDS,
                                         relpos_switches_to_architecture, POOLS)


def _check_mlp_width(tensors, architecture, path):
    """Refuse relative position MLPs (`...rel_pos.mlp.fc1.weight`) of another width than the config's."""
    for name, value in tensors.items():
        if name.endswith("rel_pos.mlp.fc1.weight") and value.shape[0] != architecture.relative_position_mlp_dim:
            raise CheckpointError(f"{path}: {name} is {value.shape[0]} wide, but the config's rel_pos_dim gives "
                                  f"{architecture.relative_position_mlp_dim}. Nothing was loaded.")


def read_timm_relpos(path, budget, config, where):
    """Read a timm `VisionTransformerRelPos` state dict whose `config.json` (parsed as `config`, read from `where`)
    names one of `RELPOS_ARCHITECTURES` into a `WeightsSource`."""
    name = config.get("architecture")
    entry, args, switches, pretrained, architecture = configured_relpos_architecture(config, where)
    transform = configured_eval_transform(config, where)
    tensors = read_state_dict(path, budget)
    state = LAYOUT.read(tensors, path)
    if "embedding/kernel" not in state or "encoderblock_0/mlp_hidden/kernel" not in state:
        raise CheckpointError(f"{path} lacks timm's patch embedding or first block (patch_embed.proj.weight, "
                              "blocks.0.mlp.fc1.weight). Nothing was loaded.")
    sizes = eva_layout.checked_eva_sizes(state, entry, args, switches, name, path, where,
                                          resamples_patches=False)  # timm loads the kernel as it is
    LAYOUT.check_complete(list(tensors), architecture, sizes["depth"],
                          settings(dict(sizes, architecture=name), "architecture", "depth"), path)
    _check_mlp_width(tensors, architecture, path)
    check_head(state, args.get("num_classes", config.get("num_classes")), path, where)
    size = configured_image_sizes(args, pretrained, entry, where)[0]
    grid = (size[0] // sizes["patch_size"], size[1] // sizes["patch_size"])
    check_relative_tables(tensors, grid, sizes["num_heads"], architecture.class_token, path)
    source = source_from_state(path, state, grid, sizes["num_heads"], architecture)
    source.origins = LAYOUT.origins(tensors)
    source.eval_transform = transform
    return source


def relpos_arguments(model, architecture):
    """The keywords of `timm.create_model(architecture, **kwargs)` with the sizes and switches of `model`, for a
    name of timm's `VisionTransformerRelPos` class (`writer.timm_arguments` checks that they rebuild it)."""
    found = architecture_of(model)
    form = found.relative_position_bias or found.shared_relative_position_bias
    return dict(**size_arguments(model), class_token=found.class_token,
                global_pool={"gap": "avg"}.get(found.classifier, found.classifier), fc_norm=found.fc_norm,
                qkv_bias=found.qkv_bias, qk_norm=found.qk_norm,
                # timm's create_model drops a None, so the name's own layer scale would stand; 0 makes none
                init_values=0.0 if found.layer_scale is None else found.layer_scale,
                rel_pos_type={"table": "bias"}.get(form, form), rel_pos_dim=found.relative_position_mlp_dim,
                shared_rel_pos=bool(found.shared_relative_position_bias))


def to_timm_relpos(model, architecture):
    """`model`'s weights as the state dict of timm's `VisionTransformerRelPos` `architecture` (numpy arrays,
    PyTorch's shapes)."""
    state = state_without_adapters(model, "VisionTransformerRelPos")
    tensors = LAYOUT.write(state, architecture=architecture_of(model))
    return {name: np.ascontiguousarray(value) for name, value in tensors.items()}
