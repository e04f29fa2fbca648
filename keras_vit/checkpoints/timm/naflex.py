"""timm's `NaFlexVit` class: its 14 architectures, its state dict read through the `VisionTransformer` layout.

NaFlexVit (timm/models/naflexvit.py) is timm's NaFlex ViT: the blocks,
norms, pooling and head of `VisionTransformer` under the same names, and an
`embeds` module instead of `patch_embed`/`pos_embed`:

- `embeds.proj.weight` `(D, P * P * C)`: the patch projection as a linear
  layer over patches flattened in (row, column, channel) order (a `(D, C,
  P, P)` convolution where `embed_proj_type='conv'`);
- `embeds.pos_embed` `(1, H, W, D)`: the position table on its own grid
  (`pos_embed_grid_size`), for the patches only (no prefix rows); with
  `pos_embed='factorized'`, `embeds.pos_embed_y` `(1, H, D)` and
  `embeds.pos_embed_x` `(1, W, D)` instead (`FACTORIZED`: read and written
  beside the layout, into `NaFlexFactorizedPositionEmbedding`);
- `embeds.cls_token`, `embeds.reg_token`.

`to_vision_transformer` renames these to timm's `VisionTransformer` names, so
`layout.LAYOUT` reads the rest; `from_vision_transformer` is the way back
(`writer.save_timm`). The architecture's `NaFlexVitCfg` (the table below,
with `model_args` over it) gives the switches and the per-image resize of
the position table (`pos_embed_interp_mode`, `pos_embed_antialias`,
`pos_embed_ar_preserving`, `pos_embed_align_corners`), which the
`WeightsSource` carries (`naflex=True`): `ViT` then builds a NaFlex model.
A `NaFlexVitCfg` field keras_vit does not compute, at a value other than
timm's default, is refused by name (no position table, grid-sample
resizing, RoPE, ...). `tests/test_timm_registry.py` audits the table.

Example:
>>> NAFLEX_ARCHITECTURES["naflexvit_base_patch16_par_gap"].cfg["pos_embed_ar_preserving"]
True
"""

import dataclasses

import numpy as np

from keras_vit.checkpoints.config_fields import checked_fields
from keras_vit.checkpoints.source import CheckpointError, pixel_statistics, refuse_non_float, source_from_state
from keras_vit.checkpoints.state_dict_files import read_state_dict
from keras_vit.checkpoints.tensor_layout import settings
from keras_vit.checkpoints.timm.config import check_head, check_tensors_agree, checked_sizes
from keras_vit.checkpoints.timm.families import ACTIVATIONS, timm_mlp_ratio, timm_switches_to_architecture
from keras_vit.checkpoints.timm.layout import LAYOUT, from_timm
from keras_vit.data.preprocessing import PILLOW_FILTERS
from keras_vit.layers.naflex import NaFlexFactorizedPositionEmbedding
from keras_vit.model.architecture import Architecture

# timm's NaFlexVitCfg and its defaults (timm 1.0.31).
CFG_DEFAULTS = {
    "patch_size": 16, "embed_dim": 768, "depth": 12, "num_heads": 12, "mlp_ratio": 4.0, "scale_mlp_norm": False,
    "num_kv_heads": None, "qkv_bias": True, "qk_norm": False, "proj_bias": True, "attn_drop_rate": 0.0,
    "scale_attn_inner_norm": False, "use_key_only_attn_mask": False, "init_values": None, "drop_rate": 0.0,
    "pos_drop_rate": 0.0, "patch_drop_rate": 0.0, "proj_drop_rate": 0.0, "drop_path_rate": 0.0,
    "class_token": False, "reg_tokens": 0, "pos_embed": "learned", "pos_embed_grid_size": [16, 16],
    "pos_embed_interp_mode": "bicubic", "pos_embed_ar_preserving": False, "pos_embed_antialias": True,
    "pos_embed_align_corners": False, "pos_embed_use_grid_sample": False, "rope_type": "",
    "rope_temperature": 10000.0, "rope_ref_feat_shape": None, "rope_grid_offset": 0.0, "rope_grid_indexing": "ij",
    "rope_rotate_half": False, "rope_shift_coords": None, "rope_jitter_coords": None, "rope_rescale_coords": None,
    "rope_mrope_section": None, "dynamic_img_pad": False, "patchify_channels_last": True, "pre_norm": False,
    "final_norm": True, "fc_norm": None, "global_pool": "map", "pool_include_prefix": False,
    "attn_pool_num_heads": None, "attn_pool_mlp_ratio": None, "weight_init": "", "fix_init": True,
    "embed_proj_type": "linear", "input_norm_layer": None, "embed_norm_layer": None, "norm_layer": None,
    "act_layer": None, "block_fn": None, "mlp_layer": None, "attn_layer": None, "attn_type": "standard",
    "attn_gated": False, "swiglu_mlp": False, "swiglu_align_to": 0, "qkv_fused": True,
    "attn_only_layer_scale": False, "enable_patch_interpolator": False,
}
# NaFlexVitCfg fields that are VisionTransformer switches (its keyword where the name differs).
_SWITCHES = {"class_token": "class_token", "reg_tokens": "reg_tokens", "global_pool": "global_pool",
             "fc_norm": "fc_norm", "pre_norm": "pre_norm", "final_norm": "final_norm", "qkv_bias": "qkv_bias",
             "qk_norm": "qk_norm", "init_values": "init_values", "act_layer": "act_layer", "proj_bias": "proj_bias",
             "pool_include_prefix": "pool_include_prefix", "scale_mlp_norm": "scale_mlp_norm",
             "scale_attn_inner_norm": "scale_attn_norm"}
_SIZES = ("patch_size", "embed_dim", "depth", "num_heads", "mlp_ratio")
_POSITION = ("pos_embed_grid_size", "pos_embed_interp_mode", "pos_embed_antialias", "pos_embed_ar_preserving",
             "pos_embed_align_corners")
# No effect on an inference forward pass (dropout, initialisation, the attention mask's shape); both projections.
_NEUTRAL = ("attn_drop_rate", "drop_rate", "pos_drop_rate", "patch_drop_rate", "proj_drop_rate", "drop_path_rate",
            "weight_init", "fix_init", "use_key_only_attn_mask", "embed_proj_type")
COMPUTED = frozenset({*_SWITCHES, *_SIZES, *_POSITION, *_NEUTRAL})
# What the fields keras_vit computes only at their default are, for the refusals.
_NOT_COMPUTED = {"pos_embed": "no position table (only pos_embed='learned' or 'factorized')",
                 "pos_embed_use_grid_sample": "the grid-sample resize of the position table",
                 "rope_type": "RoPE", "attn_type": "EVA or RoPE attention", "dynamic_img_pad": "padded images",
                 "patchify_channels_last": "(channel, row, column) patches"}
_OTHER_ARGUMENTS = ("img_size", "num_classes", "in_chans")
# timm's NaFlex eval loader (create_naflex_loader): 576 patches, the pretrained config's filter.
EVAL_MAX_PATCHES = 576


@dataclasses.dataclass(frozen=True)
class NaFlexArchitecture:
    """One NaFlexVit architecture: its model function's `NaFlexVitCfg` (every field) and its pretrained tags."""

    cfg: dict
    tags: tuple = ()

    def __getattr__(self, name):  # the sizes, as `config.checked_sizes` reads an entry
        if name in _SIZES:
            return self.cfg[name]
        raise AttributeError(name)

    @property
    def switches(self):
        return self.cfg


def _naflex(*tags, **cfg):
    if set(cfg) - set(CFG_DEFAULTS):
        raise TypeError(f"Not a NaFlexVitCfg field: {sorted(set(cfg) - set(CFG_DEFAULTS))}")
    return NaFlexArchitecture({**CFG_DEFAULTS, **cfg}, tuple(tags))


def _radio(*tags, **cfg):
    """timm's `_radio_vit_cfg`: RADIO's 128 x 128 table, bilinear, aspect-preserving, no anti-aliasing."""
    return _naflex(*tags, class_token=True, global_pool="token", final_norm=False, pos_embed_grid_size=[128, 128],
                   pos_embed_interp_mode="bilinear", pos_embed_ar_preserving=True, pos_embed_antialias=False, **cfg)


_SO150M2 = dict(depth=21, embed_dim=832, num_heads=13, mlp_ratio=2.6153846153846154, init_values=1e-05,
                qkv_bias=False, reg_tokens=1)
NAFLEX_ARCHITECTURES = {
    "naflexvit_base_patch16_gap": _naflex("e300_s576_in1k", fc_norm=True, global_pool="avg", init_values=1e-05,
                                          reg_tokens=4),
    "naflexvit_base_patch16_map": _naflex(init_values=1e-05, reg_tokens=1),
    "naflexvit_base_patch16_par_gap": _naflex("e300_s576_in1k", fc_norm=True, global_pool="avg", init_values=1e-05,
                                              pos_embed_ar_preserving=True, reg_tokens=4),
    "naflexvit_base_patch16_parfac_gap": _naflex("e300_s576_in1k", fc_norm=True, global_pool="avg",
                                                 init_values=1e-05, pos_embed="factorized",
                                                 pos_embed_ar_preserving=True, reg_tokens=4),
    "naflexvit_base_patch16_radio_v3": _radio("c_radio", init_values=1e-05, pos_embed_align_corners=True,
                                              reg_tokens=7),
    "naflexvit_base_patch16_siglip": _naflex("v2_webli", act_layer="gelu_tanh", pos_embed_interp_mode="bilinear"),
    "naflexvit_giant_patch16_radio_v3": _radio("c_radio", depth=40, embed_dim=1536, num_heads=24, reg_tokens=7),
    "naflexvit_huge_patch16_radio_v3": _radio("c_radio", depth=32, embed_dim=1280, num_heads=16,
                                              pos_embed_align_corners=True, reg_tokens=7),
    "naflexvit_huge_patch16_radio_v4": _radio("c_radio", depth=32, embed_dim=1280, num_heads=16, reg_tokens=9),
    "naflexvit_large_patch16_radio_v3": _radio("c_radio", depth=24, embed_dim=1024, num_heads=16, init_values=1e-05,
                                               reg_tokens=7),
    "naflexvit_so150m2_patch16_reg1_gap": _naflex(fc_norm=True, global_pool="avg", **_SO150M2),
    "naflexvit_so150m2_patch16_reg1_map": _naflex(**_SO150M2),
    "naflexvit_so400m_patch16_radio_v4": _radio("c_radio", depth=27, embed_dim=1152, mlp_ratio=3.736111111111111,
                                                num_heads=16, reg_tokens=9),
    "naflexvit_so400m_patch16_siglip": _naflex("v2_webli", act_layer="gelu_tanh", depth=27, embed_dim=1152,
                                               mlp_ratio=3.7362, num_heads=16, pos_embed_interp_mode="bilinear"),
}

# NaFlexVit's embedding names -> VisionTransformer's (the tensors reshaped by `_to_vision_transformer`).
_EMBEDS = {"embeds.proj.weight": "patch_embed.proj.weight", "embeds.proj.bias": "patch_embed.proj.bias",
           "embeds.pos_embed": "pos_embed", "embeds.cls_token": "cls_token", "embeds.reg_token": "reg_token"}
# The factorized tables (pos_embed='factorized'), which VisionTransformer has not: read and written beside its layout.
FACTORIZED = {"embeds.pos_embed_y": "position_embedding/pos_embedding_rows",
              "embeds.pos_embed_x": "position_embedding/pos_embedding_cols"}


def to_vision_transformer(tensors, patch_size, description):
    """A NaFlexVit state dict under timm's VisionTransformer names and shapes (`layout.LAYOUT` reads it), the
    factorized tables left out."""
    other = sorted(name for name in tensors if name.startswith("embeds.") and name not in _EMBEDS
                   and name not in FACTORIZED)
    if other:
        raise CheckpointError(f"{description} is a timm NaFlexVit with embedding norms or a patch-size interpolator "
                              f"({', '.join(other[:3])}), which keras_vit's NaFlex model does not have.")
    # Checked under the file's names before they become VisionTransformer's (LAYOUT.read checks the others).
    refuse_non_float(description, {name: np.asarray(tensors[name]).dtype for name in (*_EMBEDS, *FACTORIZED)
                                   if name in tensors})
    out = {_EMBEDS.get(name, name): value for name, value in tensors.items() if name not in FACTORIZED}
    kernel = out.get("patch_embed.proj.weight")
    if kernel is not None and kernel.ndim == 2:  # (D, P*P*C) in (row, column, channel) order -> (D, C, P, P)
        kernel = kernel.reshape(kernel.shape[0], patch_size, patch_size, -1)
        out["patch_embed.proj.weight"] = np.ascontiguousarray(kernel.transpose(0, 3, 1, 2))
    table = out.get("pos_embed")
    if table is not None and table.ndim == 4:
        out["pos_embed"] = table.reshape(1, table.shape[1] * table.shape[2], table.shape[3])
    return out


def from_vision_transformer(tensors, grid_size, linear=True):
    """The way back: a VisionTransformer state dict (`LAYOUT.write`) as NaFlexVit's, its table on `grid_size`."""
    back = {value: key for key, value in _EMBEDS.items()}
    out = {back.get(name, name): value for name, value in tensors.items()}
    kernel = out["embeds.proj.weight"]
    if linear:
        out["embeds.proj.weight"] = np.ascontiguousarray(kernel.transpose(0, 2, 3, 1).reshape(kernel.shape[0], -1))
    if "embeds.pos_embed" in out:
        table = out["embeds.pos_embed"]
        out["embeds.pos_embed"] = np.ascontiguousarray(table.reshape(1, *grid_size, table.shape[-1]))
    return out


def naflex_architecture(name, where="config.json"):
    entry = NAFLEX_ARCHITECTURES.get(name)
    if entry is None:
        raise CheckpointError(f"{where}: timm's {name!r} is not one of the {len(NAFLEX_ARCHITECTURES)} NaFlexVit "
                              "architectures (keras_vit.checkpoints.timm.naflex.NAFLEX_ARCHITECTURES).")
    return entry


def configured_naflex_architecture(config, where):
    """`(entry, model_args, cfg, pretrained_cfg, Architecture)` of a timm `config.json` naming a NaFlexVit
    architecture, with `model_args` over its `NaFlexVitCfg`; what keras_vit does not compute is refused by name."""
    name = config.get("architecture")
    entry = naflex_architecture(name, where)
    args = config.get("model_args") or {}
    if not isinstance(args, dict):
        raise CheckpointError(f"{where}: model_args is a JSON {type(args).__name__}; timm writes an object of "
                              "NaFlexVit arguments ({\"num_heads\": 12, ...}).")
    for key in args:
        if key not in CFG_DEFAULTS and key not in _OTHER_ARGUMENTS:
            raise CheckpointError(f"{where}: model_args.{key} is not a NaFlexVit argument keras_vit computes; "
                                  "nothing was loaded.")
    cfg = {**entry.cfg, **{key: value for key, value in args.items() if key in CFG_DEFAULTS}}
    cfg["global_pool"] = config.get("global_pool", cfg["global_pool"]) if "global_pool" not in args \
        else args["global_pool"]
    for key, value in cfg.items():
        if key == "pos_embed" and value == "factorized":
            continue
        if key not in COMPUTED and value != CFG_DEFAULTS[key] and not (isinstance(value, tuple)
                                                                         and list(value) == CFG_DEFAULTS[key]):
            what = _NOT_COMPUTED.get(key, f"{key}={value!r}")
            raise CheckpointError(f"{where}: timm's {name!r} sets {key}={value!r}: {what}, which keras_vit's NaFlex "
                                  f"model does not compute (only timm's default {CFG_DEFAULTS[key]!r}).")
    args = checked_fields({key: value for key, value in args.items() if key in COMPUTED or key in _OTHER_ARGUMENTS},
                          where, "model_args.")
    cfg.update({key: value for key, value in args.items() if key in CFG_DEFAULTS})
    if cfg["act_layer"] not in ACTIVATIONS:
        raise CheckpointError(f"{where}: act_layer is {cfg['act_layer']!r}; keras_vit computes "
                              f"{sorted(n for n in ACTIVATIONS if n)}.")
    if cfg["global_pool"] not in ("token", "avg", "map"):
        raise CheckpointError(f"{where}: global_pool is {cfg['global_pool']!r}; keras_vit's NaFlex models pool by "
                              "'token', 'avg' or 'map'.")
    if cfg["pos_embed_align_corners"] and cfg["pos_embed_antialias"]:
        raise CheckpointError(f"{where}: pos_embed_align_corners and pos_embed_antialias are both set, a resize "
                              "keras_vit does not compute; nothing was loaded.")
    switches = {vit: cfg[key] for key, vit in _SWITCHES.items()}
    switches["no_embed_class"] = True  # NaFlexVit's table holds the patches' positions alone
    if switches["fc_norm"] is None:  # NaFlexVit's default, as VisionTransformer's
        del switches["fc_norm"]
    pretrained = config.get("pretrained_cfg") if isinstance(config.get("pretrained_cfg"), dict) else {}
    fields = timm_switches_to_architecture(switches)
    fields.update(pixel_statistics(pretrained.get("mean"), pretrained.get("std"), where,
                                   ("pretrained_cfg.mean", "pretrained_cfg.std")))
    return entry, args, cfg, pretrained, Architecture(**fields)


def read_timm_naflex(path, budget, config, where):
    """A timm NaFlexVit state dict and its Hub `config.json` (parsed) as a NaFlex `WeightsSource`."""
    name = config.get("architecture")
    entry, args, cfg, pretrained, architecture = configured_naflex_architecture(config, where)
    interpolation = pretrained.get("interpolation") or "bicubic"  # the filter of timm's NaFlex eval resize
    if interpolation not in PILLOW_FILTERS:
        raise CheckpointError(f"{where}: pretrained_cfg.interpolation {interpolation!r} is not a filter keras_vit "
                              f"resizes NaFlex images with ({', '.join(PILLOW_FILTERS)}); nothing was loaded.")
    tensors = read_state_dict(path, budget)
    patch = cfg["patch_size"] if isinstance(cfg["patch_size"], int) else cfg["patch_size"][0]
    factorized = cfg["pos_embed"] == "factorized"
    table = tensors.get("embeds.pos_embed")
    tables = {name: tensors.get(name) for name in FACTORIZED}
    converted = to_vision_transformer(tensors, patch, path)
    state = from_timm(converted, description=path, position_tables={
        FACTORIZED[name]: np.asarray(value) for name, value in tables.items() if factorized and value is not None})
    grid = tuple(cfg["pos_embed_grid_size"] or (size // patch for size in checked_fields(
        {"img_size": args.get("img_size")}, where, "model_args.")["img_size"] or (0, 0)))
    if factorized:  # its two tables, which VisionTransformer's layout and switches know nothing of
        width = state["embedding/kernel"].shape[-1]
        for file_name, length in zip(FACTORIZED, grid):
            found = tables[file_name]
            if found is None or tuple(found.shape) != (1, length, width):
                raise CheckpointError(f"{path}: {file_name} has shape {None if found is None else tuple(found.shape)}, "
                                      f"but timm's {name!r} with pos_embed='factorized' builds a (1, {length}, {width}) "
                                      f"table (pos_embed_grid_size {list(grid)}, {where}). Nothing was loaded.")
    elif any(value is not None for value in tables.values()):
        raise CheckpointError(f"{path} holds factorized position tables ({', '.join(FACTORIZED)}), but timm's {name!r} "
                              f"sets pos_embed={cfg['pos_embed']!r} ({where}): timm would not load it. Nothing was "
                              "loaded.")
    elif table is None or table.ndim != 4 or tuple(table.shape[1:3]) != grid:
        raise CheckpointError(f"{path}: embeds.pos_embed has shape {None if table is None else tuple(table.shape)}, "
                              f"but timm's {name!r} builds a (1, {grid[0]}, {grid[1]}, width) table "
                              f"(pos_embed_grid_size, {where}). Nothing was loaded.")
    entry_sizes = dataclasses.replace(entry, cfg=cfg)
    sizes = checked_sizes(state, entry_sizes, {}, name, path, where)
    without_table = dataclasses.replace(architecture, position_embedding=not factorized)  # its one table, if any
    check_tensors_agree(state, without_table, name, path)
    LAYOUT.check_complete(list(converted), without_table, sizes["depth"],
                          settings(dict(sizes, architecture=name), "architecture", "depth"), path)
    check_head(state, args.get("num_classes", config.get("num_classes")), path, where)
    source = source_from_state(path, state, grid, sizes["num_heads"], architecture)
    source.naflex = True
    source.factorized_positions = factorized
    # timm resizes factorized tables linearly (its interpolate's mode='linear'), whatever pos_embed_interp_mode says.
    source.position_resize = ("bilinear", False) if factorized else (cfg["pos_embed_interp_mode"],
                                                                      bool(cfg["pos_embed_antialias"]))
    source.resize_align_corners = bool(cfg["pos_embed_align_corners"]) and not factorized
    source.resize_aspect_preserving = bool(cfg["pos_embed_ar_preserving"])
    source.naflex_preprocessing = {"rule": "timm", "max_patches": EVAL_MAX_PATCHES, "interpolation": interpolation}
    return source


def naflex_arguments(model, found):
    """The NaFlexVitCfg keywords of `timm.create_model` that rebuild the NaFlex keras_vit `model` (its
    `Architecture` `found`): the sizes, the switches and the position table's grid and resize."""
    if found.rope or not found.position_embedding or not found.key_bias or found.class_token_position_embedding:
        raise CheckpointError(f"{model.name} has RoPE, no position table, no key bias or a class-token position, "
                              "which timm's NaFlexVit does not build.")
    for field, what in (("post_norm", "post-norm blocks"), ("parallel", "parallel blocks"),
                        ("patch_norm", "a patch-embedding norm"), ("differential_attention", "differential attention"),
                        ("attention_pool_heads", "its own attention-pool head count"),
                        ("attention_pool_mlp_ratio", "its own attention-pool MLP ratio")):
        if getattr(found, field):
            raise CheckpointError(f"{model.name} has {what}, which save_timm does not write for timm's NaFlexVit.")
    if found.normalization != "layer_norm" or found.layer_norm_epsilon != 1e-6 or found.mlp_activation == "swiglu" \
            or found.patch_bias == found.norm_pre:
        raise CheckpointError(f"{model.name}'s norms, MLP or patch bias are not NaFlexVit's (LayerNorm 1e-6, a GELU "
                              "MLP, a patch bias exactly without pre_norm).")
    position = model.get_layer("position_embedding")
    block = model.get_layer("encoderblock_0")
    head = [layer for layer in model.layers if layer.name == "head"]
    embed = int(model.get_layer("embedding").kernel.shape[-1])
    pools = {"token": "token", "gap": "avg", "map": "map"}
    return dict(
        patch_size=int(model.get_layer("embedding").kernel.shape[0]), embed_dim=embed,
        depth=sum(layer.name.startswith("encoderblock_") for layer in model.layers), num_heads=int(block.num_heads),
        mlp_ratio=timm_mlp_ratio(embed, int(block.mlp_dim), {}), num_classes=int(head[0].kernel.shape[-1]) if head else 0,
        class_token=found.class_token, reg_tokens=found.register_tokens, global_pool=pools[found.classifier],
        fc_norm=found.fc_norm, final_norm=found.final_norm, pre_norm=found.norm_pre, qkv_bias=found.qkv_bias,
        qk_norm=found.qk_norm, init_values=found.layer_scale, act_layer=found.mlp_activation,
        proj_bias=found.projection_bias, pool_include_prefix=found.pool_include_prefix,
        scale_mlp_norm=found.mlp_hidden_norm, scale_attn_inner_norm=found.attention_output_norm,
        pos_embed_grid_size=list(position.grid_size), pos_embed_ar_preserving=position.aspect_preserving,
        **({"pos_embed": "factorized"} if isinstance(position, NaFlexFactorizedPositionEmbedding) else dict(
            pos_embed_interp_mode=position.interpolation, pos_embed_antialias=position.antialias,
            pos_embed_align_corners=position.align_corners)),
    )
