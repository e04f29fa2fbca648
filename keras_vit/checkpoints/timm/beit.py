"""timm's `Beit` class (BEiT and BEiT v2): its architectures, its state dict layout, read and written.

A `Beit` is timm's `Eva` block without RoPE plus relative position bias
tables: each block's (`blocks.N.attn.relative_position_bias_table`, timm's
`use_rel_pos_bias`) and one shared by every block
(`rel_pos_bias.relative_position_bias_table`, `use_shared_rel_pos_bias`),
`(2h - 1)(2w - 1) + 3` rows by one column per head for an `h x w` patch
grid (`keras_vit.layers.relative_position`). Its attention has q and v
biases only (`attn.q_bias`, `attn.v_bias`), its layer scales are
`gamma_1`/`gamma_2` (made only for an `init_values` that is not 0), its
SwiGLU is always two layers (`mlp.fc1_g`, `mlp.fc1_x`), and it pools the
patch tokens' mean into `fc_norm` unless told otherwise. `BEIT_ARCHITECTURES`
holds what each of timm's model functions sets, in timm's keywords;
`tests/test_timm_registry.py` audits it against timm's registry.

Example:
>>> fields = beit_switches_to_architecture(BEIT_ARCHITECTURES["beitv2_base_patch16_224"].switches)
>>> fields["relative_position_bias"], fields["classifier"], fields["layer_scale"]
(True, 'gap', 1e-05)
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
    grid_of_config,
)
from keras_vit.checkpoints.timm.families import (
    INFERENCE_NEUTRAL_KEYWORDS,
    SIZE_KEYWORDS,
    TimmArchitecture,
)
from keras_vit.model.description import architecture_of

# timm's Beit keywords that keras_vit computes, as model_args (and the table) spell them.
BEIT_KEYWORDS = ("qkv_bias", "use_abs_pos_emb", "use_rel_pos_bias", "use_shared_rel_pos_bias", "global_pool",
                 "use_fc_norm", "init_values", "swiglu_mlp", "scale_mlp")
# Keywords that change only training (the head's initial scale).
TRAINING_ONLY_KEYWORDS = ("head_init_scale",)
BEIT_ARGUMENTS = frozenset({*BEIT_KEYWORDS, *TRAINING_ONLY_KEYWORDS, *SIZE_KEYWORDS, *INFERENCE_NEUTRAL_KEYWORDS})
POOLS = {"avg": "gap", "token": "token"}
# timm's checkpoint_filter_fn resizes a pos_embed bicubic and anti-aliased.
RESIZE = ("bicubic", True, False)


def _beit(image_size, embed_dim, depth, num_heads, init_values):
    return TimmArchitecture(16, (image_size, image_size), embed_dim, depth, num_heads, 4.0,
                            dict(use_abs_pos_emb=False, use_rel_pos_bias=True, init_values=init_values), RESIZE)


BEIT_ARCHITECTURES = {
    "beit_base_patch16_224": _beit(224, 768, 12, 12, 0.1),
    "beit_base_patch16_384": _beit(384, 768, 12, 12, 0.1),
    "beit_large_patch16_224": _beit(224, 1024, 24, 16, 1e-5),
    "beit_large_patch16_384": _beit(384, 1024, 24, 16, 1e-5),
    "beit_large_patch16_512": _beit(512, 1024, 24, 16, 1e-5),
    "beitv2_base_patch16_224": _beit(224, 768, 12, 12, 1e-5),
    "beitv2_large_patch16_224": _beit(224, 1024, 24, 16, 1e-5),
}


def beit_switches_to_architecture(switches):
    """keras_vit `Architecture` fields for timm `Beit` keywords, with `Beit`'s defaults.

    A class token; an absolute position table unless `use_abs_pos_emb` is
    false; the patch tokens' mean into `fc_norm` (the final norm otherwise);
    q and v biases without a key bias; layer scales for a truthy
    `init_values`; exact GELU or SwiGLU; LayerNorm epsilon 1e-6.
    """
    pool = switches.get("global_pool", "avg")
    fc_norm = switches.get("use_fc_norm")
    fc_norm = pool == "avg" if fc_norm is None else fc_norm
    qkv_bias = bool(switches.get("qkv_bias", True))
    init_values = switches.get("init_values")
    return dict(
        class_token=True,
        position_embedding=bool(switches.get("use_abs_pos_emb", True)),
        classifier=POOLS[pool],
        fc_norm=bool(fc_norm),
        final_norm=True,  # the final norm, or fc_norm in its place
        qkv_bias=qkv_bias,
        key_bias=not qkv_bias,
        layer_scale=float(init_values) if init_values else None,  # Beit's `if init_values:` makes the gammas
        mlp_activation="swiglu" if switches.get("swiglu_mlp") else "gelu",
        mlp_hidden_norm=bool(switches.get("scale_mlp", False)),
        layer_norm_epsilon=1e-6,
        relative_position_bias=bool(switches.get("use_rel_pos_bias", False)),
        shared_relative_position_bias=bool(switches.get("use_shared_rel_pos_bias", False)),
    )


_TABLE = "relative_position_bias_table"
LAYOUT = dataclasses.replace(
    eva_layout.FUSED, name="timm's Beit layout",
    top={**eva_layout.FUSED.top, f"rel_pos_bias.{_TABLE}": f"relative_position_bias/{_TABLE}"},
    block={**eva_layout.FUSED.block, f"attn.{_TABLE}": _TABLE},
    hint="; keras_vit reads timm Beit state dicts (blocks.N.attn.relative_position_bias_table, blocks.N.gamma_1, ...)")


def configured_beit_architecture(config, where):
    """`(entry, model_args, switches, pretrained_cfg, Architecture)` of a timm `config.json` (parsed, read from
    `where`) naming one of `BEIT_ARCHITECTURES`: the model it describes, before any tensor is read."""
    return configured_class_architecture(config, where, 'Beit', BEIT_ARCHITECTURES, BEIT_ARGUMENTS, BEIT_KEYWORDS,
                                         beit_switches_to_architecture, POOLS)


def read_timm_beit(path, budget, config, where):
    """Read a timm `Beit` state dict whose `config.json` (parsed as `config`, read from `where`) names one of
    `BEIT_ARCHITECTURES` into a `WeightsSource`."""
    name = config.get("architecture")
    entry, args, switches, pretrained, architecture = configured_beit_architecture(config, where)
    transform = configured_eval_transform(config, where)
    tensors = read_state_dict(path, budget)
    state = LAYOUT.read(tensors, path)
    if "embedding/kernel" not in state or "encoderblock_0/mlp_hidden/kernel" not in state:
        raise CheckpointError(f"{path} lacks timm's patch embedding or first block (patch_embed.proj.weight, "
                              "blocks.0.mlp.fc1*). Nothing was loaded.")
    sizes = eva_layout.checked_eva_sizes(state, entry, args, switches, name, path, where)
    swiglu = architecture.mlp_activation == "swiglu"
    if swiglu and "blocks.0.mlp.fc1_g.weight" not in tensors:
        raise CheckpointError(f"{path} holds one packed MLP layer (mlp.fc1), but timm's {name!r} with swiglu_mlp "
                              "builds a SwiGLU in two (mlp.fc1_g, mlp.fc1_x). Nothing was loaded.")
    LAYOUT.check_complete(list(tensors), architecture, sizes["depth"],
                          settings(dict(sizes, architecture=name), "architecture", "depth"), path)
    check_head(state, args.get("num_classes", config.get("num_classes")), path, where)
    step = sizes["patch_size"]
    if architecture.position_embedding:
        grid, _ = grid_of_config(state, architecture, entry, args, pretrained, step, where)
    else:
        size = configured_image_sizes(args, pretrained, entry, where)[0]
        grid = (size[0] // step, size[1] // step)
    if grid is not None:  # a position table of no stated size is read at its own square grid
        check_relative_tables(tensors, grid, sizes["num_heads"], True, path)
    source = source_from_state(path, state, grid, sizes["num_heads"], architecture)
    source.origins = LAYOUT.origins(tensors)
    source.position_resize = entry.resize[:2]
    source.eval_transform = transform
    return source


def beit_arguments(model, architecture):
    """The keywords of `timm.create_model(architecture, **kwargs)` with the sizes and switches of `model`, for a
    name of timm's `Beit` class (`writer.timm_arguments` checks that they rebuild it)."""
    found = architecture_of(model)
    switches = {"swiglu_mlp": found.mlp_activation == "swiglu"}
    return dict(**size_arguments(model, switches), qkv_bias=found.qkv_bias,
                use_abs_pos_emb=found.position_embedding, use_rel_pos_bias=bool(found.relative_position_bias),
                use_shared_rel_pos_bias=bool(found.shared_relative_position_bias),
                global_pool={"gap": "avg"}.get(found.classifier, found.classifier), use_fc_norm=found.fc_norm,
                # timm's create_model drops a None, so the name's own layer scale would stand; 0 makes none
                init_values=0.0 if found.layer_scale is None else found.layer_scale, swiglu_mlp=switches["swiglu_mlp"],
                scale_mlp=found.mlp_hidden_norm)


def to_timm_beit(model, architecture):
    """`model`'s weights as the state dict of timm's `Beit` `architecture` (numpy arrays, PyTorch's shapes)."""
    state = state_without_adapters(model, "Beit")
    found = architecture_of(model)
    tensors = LAYOUT.write(state, unpacked=found.mlp_activation == "swiglu", architecture=found)
    return {name: np.ascontiguousarray(value) for name, value in tensors.items()}
