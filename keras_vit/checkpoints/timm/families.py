"""What timm's model functions set for each plain-ViT architecture keras_vit computes: one declared table.

A timm Hub `config.json` names the architecture (`vit_small_patch14_reg4_dinov2`)
and usually has no `model_args`: the model function of that name sets the
sizes and switches (heads, registers, `no_embed_class`, pooling, norms,
activation, epsilon). `ARCHITECTURES` holds, for every name keras_vit
computes, those settings in timm's own keyword names (as `model_args` would
spell them), with the default pretrained config's image size and the
position-table resize that timm's `checkpoint_filter_fn` applies. A name the
table does not hold is refused (`timm_architecture`), with the reason where
the family is known: a prefix check would let timm's RoPE models (`Eva`),
whose tensors look plain, load as a plain ViT with wrong outputs.
`tests/test_timm_registry.py` audits the table against timm's registry.

Example:
>>> entry = timm_architecture("vit_base_patch32_plus_256")
>>> entry.num_heads, entry.image_size, entry.switches["init_values"]
(14, (256, 256), 1e-05)
>>> timm_switches_to_architecture({"global_pool": "avg", "class_token": False})["fc_norm"]
True
"""

import dataclasses
import re

from keras_vit.checkpoints.source import CheckpointError

# timm's VisionTransformer keywords that keras_vit computes, as model_args (and this table) spell them:
# the sizes, the switches of keras_vit.Architecture, and those with no effect on a forward pass at the
# checkpoint's own size (dropout and initialisation, and dynamic_img_size, which keras_vit's
# image_size=(None, None) gives on request).
SIZE_KEYWORDS = ("img_size", "patch_size", "embed_dim", "depth", "num_heads", "mlp_ratio", "num_classes", "in_chans")
SWITCH_KEYWORDS = ("class_token", "reg_tokens", "no_embed_class", "global_pool", "fc_norm", "pre_norm",
                   "final_norm", "qkv_bias", "qk_norm", "init_values", "act_layer", "norm_eps", "mlp_layer",
                   "block_fn", "scale_attn_norm", "scale_mlp_norm", "pool_include_prefix", "proj_bias", "norm_layer",
                   "embed_norm_layer", "attn_layer", "pos_embed")
# Switches only a model function sets (classes in timm, names here): never taken from model_args. timm also
# takes attn_layer by name ('diff'), so model_args may set that one.
TABLE_ONLY_KEYWORDS = ("norm_eps", "mlp_layer", "norm_layer", "embed_norm_layer", "pos_embed")
INFERENCE_NEUTRAL_KEYWORDS = ("drop_rate", "pos_drop_rate", "patch_drop_rate", "proj_drop_rate", "attn_drop_rate",
                              "drop_path_rate", "weight_init", "fix_init", "dynamic_img_size")
# Keywords keras_vit computes only at timm's default value (a file that changes them is refused).
DEFAULT_ONLY_KEYWORDS = {"padding_same": True, "dynamic_img_pad": False, "pos_embed": "learn",
                         "block_fn": "Block", "embed_layer": "PatchEmbed", "mlp_layer": "Mlp"}
# act_layer (as timm's get_act_layer takes it) -> keras_vit's mlp_activation; timm's default is exact GELU.
ACTIVATIONS = {None: "gelu", "gelu": "gelu", "gelu_tanh": "gelu_tanh", "quick_gelu": "quick_gelu"}
POOLS = {"token": "token", "avg": "gap", "map": "map"}
# block_fn -> the Architecture fields it sets. ResPostBlock's init_values only initialise its norms: no layer
# scale. The parallel blocks scale the sum of both branches by one.
BLOCKS = {"Block": {}, "ResPostBlock": {"post_norm": True}, "ParallelScalingBlock": {"parallel": True},
          "DiffParallelScalingBlock": {"parallel": True, "differential_attention": True}}
# timm's checkpoint_filter_fn resamples a position table bicubic with antialias, except where noted.
DEFAULT_RESIZE = ("bicubic", True, False)


@dataclasses.dataclass(frozen=True)
class TimmArchitecture:
    """One timm architecture: its sizes, its switches in timm's keywords, and timm's position-table resize."""

    patch_size: int
    image_size: tuple
    embed_dim: int
    depth: int
    num_heads: int
    mlp_ratio: float
    switches: dict
    resize: tuple = DEFAULT_RESIZE  # (interpolation, antialias, align_corners)
    # A hybrid's ResNet as timm's model function builds it: bottleneck units per stage (() for its stem
    # alone) and stem width; None for a plain ViT.
    resnet_layers: tuple = None
    resnet_width: int = None
    # MobileCLIP's ConvStem before the patches (widths embed_dim // 4, as timm's vit_base_mci_224 builds them).
    conv_stem: bool = False
    # timm's VisionTransformerDistilled (DeiT distilled): a distillation token and head, which no keyword sets.
    distilled: bool = False
    # ViTamin's MbConv stem as timm's model function builds it (its VitCfg): widths (the stem's, then each
    # stage's) and blocks per stage; None for none.
    mbconv: tuple = None

    @property
    def conv_stem_widths(self):
        """The two widths of the ConvStem timm's model function builds, or None."""
        return (self.embed_dim // 4,) * 2 if self.conv_stem else None

    @property
    def mlp_dim(self):
        """keras_vit's width of the MLP's first layer, as timm builds it at the name's own sizes."""
        return timm_mlp_dim(self.embed_dim, self.mlp_ratio, self.switches)


def timm_mlp_pieces(switches):
    """How many of timm's MLP widths `int(dim * mlp_ratio)` keras_vit's first MLP layer holds, by the switches.

    Two where timm sizes a gated MLP by each half (AIMv2's `SwiGLU`, `fc1_g`
    and `fc1_x`; ViTamin's `GeGluMlp`, `w0` and `w1`; every `swiglu_mlp` of
    timm's Eva), one where the width is
    the whole layer (a plain MLP, DINOv2 giant's `SwiGLUPacked`, which
    halves it).
    """
    return 2 if switches.get("mlp_layer") in ("swiglu", "geglu") or switches.get("swiglu_mlp") else 1


def timm_mlp_dim(embed_dim, mlp_ratio, switches):
    """keras_vit's width of the first MLP layer timm builds with `switches` (of either family): timm's
    `int(dim * mlp_ratio)`, rounded up to an Eva SwiGLU's `swiglu_align_to`, `timm_mlp_pieces` times."""
    width = int(embed_dim * mlp_ratio)
    align = switches.get("swiglu_align_to") if switches.get("swiglu_mlp") else None
    return timm_mlp_pieces(switches) * (width + (-width % align if align else 0))


def timm_mlp_ratio(embed_dim, mlp_dim, switches):
    """The `mlp_ratio` with which timm's architecture of `switches` builds keras_vit's `mlp_dim`-wide MLP (where
    `timm_mlp_dim` gives it back; else no ratio does).

    Example:
    >>> timm_mlp_ratio(24, 132, {"mlp_layer": "swiglu"}), timm_mlp_ratio(24, 132, {"mlp_layer": "swiglu_packed"})
    (2.75, 5.5)
    """
    width = mlp_dim // timm_mlp_pieces(switches)
    ratio = width / embed_dim
    return ratio if int(embed_dim * ratio) == width else (width + 0.5) / embed_dim  # timm's int() gives `width`


def _timm(patch_size, image_size, embed_dim, depth, num_heads, mlp_ratio=4.0, resize=DEFAULT_RESIZE,
          resnet_layers=None, resnet_width=None, conv_stem=False, distilled=False, mbconv=None, **switches):
    if set(switches) - set(SWITCH_KEYWORDS):
        raise TypeError(f"Not a switch of the family table: {sorted(set(switches) - set(SWITCH_KEYWORDS))}")
    sides = tuple(image_size) if isinstance(image_size, tuple) else (image_size, image_size)
    return TimmArchitecture(patch_size, sides, embed_dim, depth, num_heads, mlp_ratio, switches, tuple(resize),
                            resnet_layers, resnet_width, conv_stem, distilled, mbconv)


def _hybrid(patch_size, image_size, embed_dim, depth, num_heads, resnet_layers):
    """timm's `_resnetv2(resnet_layers)` (a 64-wide stem; `()` the stem alone) in front of a ViT."""
    return _timm(patch_size, image_size, embed_dim, depth, num_heads, resnet_layers=resnet_layers, resnet_width=64)


def _aimv2(image_size, embed_dim, num_heads, mlp_ratio):
    """AIMv2: RMSNorm (1e-5) everywhere and on the patches, an unpacked SwiGLU, no biases but the patches'."""
    return _timm(14, image_size, embed_dim, 24, num_heads, mlp_ratio, class_token=False, fc_norm=False,
                 global_pool="avg", qkv_bias=False, proj_bias=False, norm_layer="rms_norm",
                 embed_norm_layer="rms_norm", norm_eps=1e-05, mlp_layer="swiglu")


def _vitamin(image_size, embed_dim, depth, num_heads, stem_width, pos_embed="learn"):
    """ViTamin: its MbConv stem (two stages of 2 and 4 blocks, `stem_width` and twice that wide) before a ViT of
    GeGLU MLPs, average-pooled (XL: without position embeddings)."""
    switches = {} if pos_embed == "learn" else dict(pos_embed=pos_embed)
    return _timm(1, image_size, embed_dim, depth, num_heads, 2.0, mbconv=((stem_width, stem_width, 2 * stem_width),
                                                                          (2, 4)),
                 class_token=False, global_pool="avg", mlp_layer="geglu", **switches)


# ViTamin's sizes: (name, image sizes, (embed_dim, depth, num_heads, stem width[, switches])).
_VITAMINS = (("small", (224,), (384, 14, 6, 64)), ("base", (224,), (768, 14, 12, 128)),
             *((large, (224, 256, 336, 384), (1024, 31, 16, 160)) for large in ("large", "large2")),
             ("xlarge", (256, 336, 384), (1152, 32, 16, 192, "none")))

# Why timm architectures outside the table are refused, by name (first match).
REFUSED = (
    (r"_xp_|_18x2_", "parallel blocks of several attention and MLP branches (timm's ParallelThingsBlock)"),
    (r"_resnet(26|50)d_", "a ResNet-D backbone (timm's resnet26d or resnet50d, not the ResNetV2 of the hybrids keras_vit "
                          "computes)"),
)

ARCHITECTURES = {
    "aimv2_1b_patch14_224": _aimv2(224, 2048, 16, 2.75),
    "aimv2_1b_patch14_336": _aimv2(336, 2048, 16, 2.75),
    "aimv2_1b_patch14_448": _aimv2(448, 2048, 16, 2.75),
    "aimv2_3b_patch14_224": _aimv2(224, 3072, 24, 2.6667),
    "aimv2_3b_patch14_336": _aimv2(336, 3072, 24, 2.6667),
    "aimv2_3b_patch14_448": _aimv2(448, 3072, 24, 2.6667),
    "aimv2_huge_patch14_224": _aimv2(224, 1536, 12, 2.6667),
    "aimv2_huge_patch14_336": _aimv2(336, 1536, 12, 2.6667),
    "aimv2_huge_patch14_448": _aimv2(448, 1536, 12, 2.6667),
    "aimv2_large_patch14_224": _aimv2(224, 1024, 8, 2.75),
    "aimv2_large_patch14_336": _aimv2(336, 1024, 8, 2.75),
    "aimv2_large_patch14_448": _aimv2(448, 1024, 8, 2.75),
    "beit3_base_patch16_224": _timm(16, 224, 768, 12, 12, class_token=True, global_pool='avg', norm_eps=1e-05,
                                    scale_attn_norm=True, scale_mlp_norm=True),
    "beit3_giant_patch14_224": _timm(14, 224, 1408, 40, 16, mlp_ratio=4.3637, class_token=True, global_pool='avg',
                                     norm_eps=1e-05, scale_attn_norm=True, scale_mlp_norm=True),
    "beit3_giant_patch14_336": _timm(14, 336, 1408, 40, 16, mlp_ratio=4.3637, class_token=True, global_pool='avg',
                                     norm_eps=1e-05, scale_attn_norm=True, scale_mlp_norm=True),
    "beit3_large_patch16_224": _timm(16, 224, 1024, 24, 16, class_token=True, global_pool='avg', norm_eps=1e-05,
                                     scale_attn_norm=True, scale_mlp_norm=True),
    "deit3_base_patch16_224": _timm(16, 224, 768, 12, 12, init_values=1e-06, no_embed_class=True),
    "deit3_base_patch16_384": _timm(16, 384, 768, 12, 12, init_values=1e-06, no_embed_class=True),
    "deit3_huge_patch14_224": _timm(14, 224, 1280, 32, 16, init_values=1e-06, no_embed_class=True),
    "deit3_large_patch16_224": _timm(16, 224, 1024, 24, 16, init_values=1e-06, no_embed_class=True),
    "deit3_large_patch16_384": _timm(16, 384, 1024, 24, 16, init_values=1e-06, no_embed_class=True),
    "deit3_medium_patch16_224": _timm(16, 224, 512, 12, 8, init_values=1e-06, no_embed_class=True),
    "deit3_small_patch16_224": _timm(16, 224, 384, 12, 6, init_values=1e-06, no_embed_class=True),
    "deit3_small_patch16_384": _timm(16, 384, 384, 12, 6, init_values=1e-06, no_embed_class=True),
    "deit_base_distilled_patch16_224": _timm(16, 224, 768, 12, 12, distilled=True),
    "deit_base_distilled_patch16_384": _timm(16, 384, 768, 12, 12, distilled=True),
    "deit_base_patch16_224": _timm(16, 224, 768, 12, 12),
    "deit_base_patch16_384": _timm(16, 384, 768, 12, 12),
    "deit_small_distilled_patch16_224": _timm(16, 224, 384, 12, 6, distilled=True),
    "deit_small_patch16_224": _timm(16, 224, 384, 12, 6),
    "deit_tiny_distilled_patch16_224": _timm(16, 224, 192, 12, 3, distilled=True),
    "deit_tiny_patch16_224": _timm(16, 224, 192, 12, 3),
    "eva_large_patch14_196": _timm(14, 196, 1024, 24, 16, global_pool='avg'),
    "eva_large_patch14_336": _timm(14, 336, 1024, 24, 16, global_pool='avg'),
    "flexivit_base": _timm(16, 240, 768, 12, 12, no_embed_class=True, resize=('bilinear', False, False)),
    "flexivit_large": _timm(16, 240, 1024, 24, 16, no_embed_class=True, resize=('bilinear', False, False)),
    "flexivit_small": _timm(16, 240, 384, 12, 6, no_embed_class=True, resize=('bilinear', False, False)),
    "test_vit": _timm(16, 160, 64, 6, 2, mlp_ratio=3),
    "test_vit3": _timm(16, 160, 96, 9, 3, mlp_ratio=2, class_token=False, global_pool='map', init_values=1e-05,
                       pool_include_prefix=True, reg_tokens=1),
    "test_vit4": _timm(16, 160, 96, 9, 3, mlp_ratio=3, class_token=False, global_pool='avg', init_values=1e-05,
                       norm_layer='rms_norm', reg_tokens=1),
    "test_vit2": _timm(16, 160, 64, 8, 2, mlp_ratio=3, class_token=False, global_pool='avg', init_values=1e-05,
                       reg_tokens=1),
    **{f"vitamin_{size}_{image}": _vitamin(image, *sizes) for size, images, sizes in _VITAMINS for image in images},
    "vit_base_patch14_dinov2": _timm(14, 518, 768, 12, 12, init_values=1e-05),
    "vit_base_patch14_reg1_tipsv2": _timm(14, 448, 768, 12, 12, init_values=1.0, no_embed_class=True, reg_tokens=1),
    "vit_base_patch14_reg4_dinov2": _timm(14, 518, 768, 12, 12, init_values=1e-05, no_embed_class=True, reg_tokens=4),
    "vit_base_patch16_224": _timm(16, 224, 768, 12, 12),
    "vit_base_patch16_224_miil": _timm(16, 224, 768, 12, 12, qkv_bias=False),
    "vit_base_patch16_384": _timm(16, 384, 768, 12, 12),
    "vit_base_patch16_clip_224": _timm(16, 224, 768, 12, 12, pre_norm=True, norm_eps=1e-05),
    "vit_base_patch16_clip_384": _timm(16, 384, 768, 12, 12, pre_norm=True, norm_eps=1e-05),
    "vit_base_patch16_clip_quickgelu_224": _timm(16, 224, 768, 12, 12, act_layer='quick_gelu', pre_norm=True,
                                                 norm_eps=1e-05),
    "vit_base_patch16_gap_224": _timm(16, 224, 768, 12, 16, class_token=False, fc_norm=False, global_pool='avg'),
    "vit_base_patch16_plus_240": _timm(16, 240, 896, 12, 14, init_values=1e-05),
    "vit_base_patch16_plus_clip_240": _timm(16, 240, 896, 12, 14, pre_norm=True, norm_eps=1e-05),
    "vit_base_patch16_radio_v3": _timm(16, 512, 768, 12, 12, final_norm=False, init_values=1e-05, no_embed_class=True,
                                       reg_tokens=7, resize=('bilinear', False, True)),
    "vit_base_patch16_rpn_224": _timm(16, 224, 768, 12, 12, block_fn='ResPostBlock', class_token=False,
                                      global_pool='avg', init_values=1e-05, qkv_bias=False),
    "vit_base_patch16_reg4_gap_256": _timm(16, 256, 768, 12, 12, class_token=False, global_pool='avg',
                                           no_embed_class=True, reg_tokens=4),
    "vit_base_patch16_siglip_224": _timm(16, 224, 768, 12, 12, class_token=False, global_pool='map'),
    "vit_base_patch16_siglip_256": _timm(16, 256, 768, 12, 12, class_token=False, global_pool='map'),
    "vit_base_patch16_siglip_384": _timm(16, 384, 768, 12, 12, class_token=False, global_pool='map'),
    "vit_base_patch16_siglip_512": _timm(16, 512, 768, 12, 12, class_token=False, global_pool='map'),
    "vit_base_patch16_siglip_gap_224": _timm(16, 224, 768, 12, 12, class_token=False, fc_norm=False,
                                             global_pool='avg'),
    "vit_base_patch16_siglip_gap_256": _timm(16, 256, 768, 12, 12, class_token=False, fc_norm=False,
                                             global_pool='avg'),
    "vit_base_patch16_siglip_gap_384": _timm(16, 384, 768, 12, 12, class_token=False, fc_norm=False,
                                             global_pool='avg'),
    "vit_base_patch16_siglip_gap_512": _timm(16, 512, 768, 12, 12, class_token=False, fc_norm=False,
                                             global_pool='avg'),
    "vit_base_patch32_224": _timm(32, 224, 768, 12, 12),
    "vit_base_patch32_384": _timm(32, 384, 768, 12, 12),
    "vit_base_patch32_clip_224": _timm(32, 224, 768, 12, 12, pre_norm=True, norm_eps=1e-05),
    "vit_base_patch32_clip_256": _timm(32, 256, 768, 12, 12, pre_norm=True, norm_eps=1e-05),
    "vit_base_patch32_clip_384": _timm(32, 384, 768, 12, 12, pre_norm=True, norm_eps=1e-05),
    "vit_base_patch32_clip_448": _timm(32, 448, 768, 12, 12, pre_norm=True, norm_eps=1e-05),
    "vit_base_patch32_clip_quickgelu_224": _timm(32, 224, 768, 12, 12, act_layer='quick_gelu', pre_norm=True,
                                                 norm_eps=1e-05),
    "vit_base_patch32_plus_256": _timm(32, 256, 896, 12, 14, init_values=1e-05),
    "vit_base_patch32_siglip_256": _timm(32, 256, 768, 12, 12, act_layer='gelu_tanh', class_token=False,
                                         global_pool='map'),
    "vit_base_patch32_siglip_gap_256": _timm(32, 256, 768, 12, 12, act_layer='gelu_tanh', class_token=False,
                                             fc_norm=False, global_pool='avg'),
    # MobileCLIP's image tower: timm's patch 1 over a ConvStem of stride 16 (its last convolution the patches).
    "vit_base_mci_224": _timm(1, 224, 768, 12, 12, conv_stem=True, no_embed_class=True),
    "vit_base_patch8_224": _timm(8, 224, 768, 12, 12),
    "vit_base_r26_s32_224": _hybrid(1, 224, 768, 12, 12, (2, 2, 2, 2)),
    "vit_base_r50_s16_224": _hybrid(1, 224, 768, 12, 12, (3, 4, 9)),
    "vit_base_r50_s16_384": _hybrid(1, 384, 768, 12, 12, (3, 4, 9)),
    "vit_betwixt_patch16_gap_256": _timm(16, 256, 640, 12, 10, class_token=False, fc_norm=False, global_pool='avg',
                                         init_values=1e-06, qkv_bias=False),
    "vit_betwixt_patch16_reg1_gap_256": _timm(16, 256, 640, 12, 10, class_token=False, global_pool='avg',
                                              init_values=1e-05, no_embed_class=True, reg_tokens=1),
    "vit_betwixt_patch16_reg4_gap_256": _timm(16, 256, 640, 12, 10, class_token=False, global_pool='avg',
                                              init_values=1e-05, no_embed_class=True, reg_tokens=4),
    "vit_betwixt_patch16_reg4_gap_384": _timm(16, 384, 640, 12, 10, class_token=False, global_pool='avg',
                                              init_values=1e-05, no_embed_class=True, reg_tokens=4),
    "vit_betwixt_patch32_clip_224": _timm(32, 224, 640, 12, 10, pre_norm=True, norm_eps=1e-05),
    "vit_giant_patch14_224": _timm(14, 224, 1408, 40, 16, mlp_ratio=4.363636363636363),
    "vit_giant_patch14_clip_224": _timm(14, 224, 1408, 40, 16, mlp_ratio=4.363636363636363, pre_norm=True,
                                        norm_eps=1e-05),
    "vit_giant_patch14_dinov2": _timm(14, 518, 1536, 40, 24, mlp_ratio=5.33334, init_values=1e-05,
                                      mlp_layer='swiglu_packed'),
    "vit_giant_patch14_reg1_tipsv2": _timm(14, 448, 1536, 40, 24, mlp_ratio=5.33334, init_values=1.0,
                                           no_embed_class=True, reg_tokens=1, mlp_layer='swiglu_packed'),
    "vit_giant_patch14_reg4_dinov2": _timm(14, 518, 1536, 40, 24, mlp_ratio=5.33334, init_values=1e-05,
                                           no_embed_class=True, reg_tokens=4, mlp_layer='swiglu_packed'),
    "vit_giant_patch16_gap_224": _timm(16, 224, 1408, 40, 16, mlp_ratio=4.363636363636363, class_token=False,
                                       fc_norm=False, global_pool='avg'),
    "vit_giant_patch16_radio_v3": _timm(16, 512, 1536, 40, 24, final_norm=False, no_embed_class=True, reg_tokens=7,
                                        resize=('bilinear', False, False)),
    "vit_giantopt_patch16_siglip_256": _timm(16, 256, 1536, 40, 16, act_layer='gelu_tanh', class_token=False,
                                             global_pool='map'),
    "vit_giantopt_patch16_siglip_384": _timm(16, 384, 1536, 40, 16, act_layer='gelu_tanh', class_token=False,
                                             global_pool='map'),
    "vit_giantopt_patch16_siglip_gap_256": _timm(16, 256, 1536, 40, 16, act_layer='gelu_tanh', class_token=False,
                                                 fc_norm=False, global_pool='avg'),
    "vit_giantopt_patch16_siglip_gap_384": _timm(16, 384, 1536, 40, 16, act_layer='gelu_tanh', class_token=False,
                                                 fc_norm=False, global_pool='avg'),
    "vit_gigantic_patch14_224": _timm(14, 224, 1664, 48, 16, mlp_ratio=4.923076923076923),
    "vit_gigantic_patch14_clip_224": _timm(14, 224, 1664, 48, 16, mlp_ratio=4.923076923076923, pre_norm=True,
                                           norm_eps=1e-05),
    "vit_gigantic_patch14_clip_378": _timm(14, 378, 1664, 48, 16, mlp_ratio=4.923076923076923, pre_norm=True,
                                           norm_eps=1e-05),
    "vit_gigantic_patch14_clip_quickgelu_224": _timm(14, 224, 1664, 48, 16, mlp_ratio=4.923076923076923,
                                                     act_layer='quick_gelu', pre_norm=True, norm_eps=1e-05),
    "vit_huge_patch14_224": _timm(14, 224, 1280, 32, 16),
    "vit_huge_patch14_clip_224": _timm(14, 224, 1280, 32, 16, pre_norm=True, norm_eps=1e-05),
    "vit_huge_patch14_clip_336": _timm(14, 336, 1280, 32, 16, pre_norm=True, norm_eps=1e-05),
    "vit_huge_patch14_clip_378": _timm(14, 378, 1280, 32, 16, pre_norm=True, norm_eps=1e-05),
    "vit_huge_patch14_clip_quickgelu_224": _timm(14, 224, 1280, 32, 16, act_layer='quick_gelu', pre_norm=True,
                                                 norm_eps=1e-05),
    "vit_huge_patch14_clip_quickgelu_378": _timm(14, 378, 1280, 32, 16, act_layer='quick_gelu', pre_norm=True,
                                                 norm_eps=1e-05),
    "vit_huge_patch14_gap_224": _timm(14, 224, 1280, 32, 16, class_token=False, fc_norm=False, global_pool='avg'),
    "vit_huge_patch16_gap_448": _timm(16, 448, 1280, 32, 16, class_token=False, fc_norm=False, global_pool='avg'),
    "vit_huge_patch16_radio_v3": _timm(16, 512, 1280, 32, 16, final_norm=False, no_embed_class=True, reg_tokens=7,
                                       resize=('bilinear', False, True)),
    "vit_huge_patch16_radio_v4": _timm(16, 512, 1280, 32, 16, final_norm=False, no_embed_class=True, reg_tokens=9,
                                       resize=('bilinear', False, False)),
    "vit_intern300m_patch14_448": _timm(14, 448, 1024, 24, 16, final_norm=False, init_values=0.1),
    "vit_large_patch14_224": _timm(14, 224, 1024, 24, 16),
    "vit_large_patch14_clip_224": _timm(14, 224, 1024, 24, 16, pre_norm=True, norm_eps=1e-05),
    "vit_large_patch14_clip_336": _timm(14, 336, 1024, 24, 16, pre_norm=True, norm_eps=1e-05),
    "vit_large_patch14_clip_quickgelu_224": _timm(14, 224, 1024, 24, 16, act_layer='quick_gelu', pre_norm=True,
                                                  norm_eps=1e-05),
    "vit_large_patch14_clip_quickgelu_336": _timm(14, 336, 1024, 24, 16, act_layer='quick_gelu', pre_norm=True,
                                                  norm_eps=1e-05),
    "vit_large_patch14_dinov2": _timm(14, 518, 1024, 24, 16, init_values=1e-05),
    "vit_large_patch14_reg1_tipsv2": _timm(14, 448, 1024, 24, 16, init_values=1.0, no_embed_class=True, reg_tokens=1),
    "vit_large_patch14_reg4_dinov2": _timm(14, 518, 1024, 24, 16, init_values=1e-05, no_embed_class=True,
                                           reg_tokens=4),
    "vit_large_patch16_224": _timm(16, 224, 1024, 24, 16),
    "vit_large_patch16_384": _timm(16, 384, 1024, 24, 16),
    "vit_large_patch16_radio_v3": _timm(16, 512, 1024, 24, 16, final_norm=False, init_values=1e-05,
                                        no_embed_class=True, reg_tokens=7, resize=('bilinear', False, False)),
    "vit_large_patch16_siglip_256": _timm(16, 256, 1024, 24, 16, class_token=False, global_pool='map'),
    "vit_large_patch16_siglip_384": _timm(16, 384, 1024, 24, 16, class_token=False, global_pool='map'),
    "vit_large_patch16_siglip_512": _timm(16, 512, 1024, 24, 16, act_layer='gelu_tanh', class_token=False,
                                          global_pool='map'),
    "vit_large_patch16_siglip_gap_256": _timm(16, 256, 1024, 24, 16, class_token=False, fc_norm=False,
                                              global_pool='avg'),
    "vit_large_patch16_siglip_gap_384": _timm(16, 384, 1024, 24, 16, class_token=False, fc_norm=False,
                                              global_pool='avg'),
    "vit_large_patch16_siglip_gap_512": _timm(16, 512, 1024, 24, 16, act_layer='gelu_tanh', class_token=False,
                                              fc_norm=False, global_pool='avg'),
    "vit_large_patch32_224": _timm(32, 224, 1024, 24, 16),
    "vit_large_patch32_384": _timm(32, 384, 1024, 24, 16),
    "vit_large_r50_s32_224": _hybrid(1, 224, 1024, 24, 16, (3, 4, 6, 3)),
    "vit_large_r50_s32_384": _hybrid(1, 384, 1024, 24, 16, (3, 4, 6, 3)),
    "vit_dlittle_patch16_reg1_gap_256": _timm(16, 256, 320, 14, 5, mlp_ratio=5.6, attn_layer='diff', class_token=False,
                                              global_pool='avg', init_values=1e-05, no_embed_class=True, reg_tokens=1),
    "vit_dwee_patch16_reg1_gap_256": _timm(16, 256, 256, 14, 4, mlp_ratio=5, attn_layer='diff', class_token=False,
                                           global_pool='avg', init_values=1e-05, no_embed_class=True, reg_tokens=1),
    "vit_dpwee_patch16_reg1_gap_256": _timm(16, 256, 256, 16, 4, mlp_ratio=5, block_fn='DiffParallelScalingBlock',
                                            class_token=False, global_pool='avg', init_values=1e-05,
                                            no_embed_class=True, reg_tokens=1),
    "vit_pwee_patch16_reg1_gap_256": _timm(16, 256, 256, 16, 4, mlp_ratio=5, block_fn='ParallelScalingBlock',
                                           class_token=False, global_pool='avg', init_values=1e-05,
                                           no_embed_class=True, reg_tokens=1),
    "vit_little_patch16_reg1_gap_256": _timm(16, 256, 320, 14, 5, mlp_ratio=5.6, class_token=False, global_pool='avg',
                                             init_values=1e-05, no_embed_class=True, reg_tokens=1),
    "vit_little_patch16_reg4_gap_256": _timm(16, 256, 320, 14, 5, mlp_ratio=5.6, class_token=False, global_pool='avg',
                                             init_values=1e-05, no_embed_class=True, reg_tokens=4),
    "vit_medium_patch16_clip_224": _timm(16, 224, 512, 12, 8, pre_norm=True, norm_eps=1e-05),
    "vit_medium_patch16_gap_240": _timm(16, 240, 512, 12, 8, class_token=False, fc_norm=False, global_pool='avg',
                                        init_values=1e-06, qkv_bias=False),
    "vit_medium_patch16_gap_256": _timm(16, 256, 512, 12, 8, class_token=False, fc_norm=False, global_pool='avg',
                                        init_values=1e-06, qkv_bias=False),
    "vit_medium_patch16_gap_384": _timm(16, 384, 512, 12, 8, class_token=False, fc_norm=False, global_pool='avg',
                                        init_values=1e-06, qkv_bias=False),
    "vit_medium_patch16_reg1_gap_256": _timm(16, 256, 512, 12, 8, class_token=False, global_pool='avg',
                                             init_values=1e-05, no_embed_class=True, reg_tokens=1),
    "vit_medium_patch16_reg4_gap_256": _timm(16, 256, 512, 12, 8, class_token=False, global_pool='avg',
                                             init_values=1e-05, no_embed_class=True, reg_tokens=4),
    "vit_medium_patch32_clip_224": _timm(32, 224, 512, 12, 8, pre_norm=True, norm_eps=1e-05),
    "vit_mediumd_patch16_reg4_gap_256": _timm(16, 256, 512, 20, 8, class_token=False, global_pool='avg',
                                              init_values=1e-05, no_embed_class=True, reg_tokens=4),
    "vit_mediumd_patch16_reg4_gap_384": _timm(16, 384, 512, 20, 8, class_token=False, global_pool='avg',
                                              init_values=1e-05, no_embed_class=True, reg_tokens=4),
    "vit_small_patch14_dinov2": _timm(14, 518, 384, 12, 6, init_values=1e-05),
    "vit_small_patch14_reg4_dinov2": _timm(14, 518, 384, 12, 6, init_values=1e-05, no_embed_class=True, reg_tokens=4),
    "vit_small_patch16_224": _timm(16, 224, 384, 12, 6),
    "vit_small_patch16_36x1_224": _timm(16, 224, 384, 36, 6, init_values=1e-05),
    "vit_small_patch16_384": _timm(16, 384, 384, 12, 6),
    "vit_small_patch32_224": _timm(32, 224, 384, 12, 6),
    "vit_small_patch32_384": _timm(32, 384, 384, 12, 6),
    "vit_small_patch8_224": _timm(8, 224, 384, 12, 6),
    "vit_small_r26_s32_224": _hybrid(1, 224, 384, 12, 6, (2, 2, 2, 2)),
    "vit_small_r26_s32_384": _hybrid(1, 384, 384, 12, 6, (2, 2, 2, 2)),
    "vit_so150m2_patch16_reg1_gap_256": _timm(16, 256, 832, 21, 13, mlp_ratio=2.6153846153846154, class_token=False,
                                              global_pool='avg', init_values=1e-05, qkv_bias=False, reg_tokens=1),
    "vit_so150m2_patch16_reg1_gap_384": _timm(16, 384, 832, 21, 13, mlp_ratio=2.6153846153846154, class_token=False,
                                              global_pool='avg', init_values=1e-05, qkv_bias=False, reg_tokens=1),
    "vit_so150m2_patch16_reg1_gap_448": _timm(16, 448, 832, 21, 13, mlp_ratio=2.6153846153846154, class_token=False,
                                              global_pool='avg', init_values=1e-05, qkv_bias=False, reg_tokens=1),
    "vit_so150m_patch16_reg4_gap_256": _timm(16, 256, 896, 18, 14, mlp_ratio=2.572, class_token=False, fc_norm=False,
                                             global_pool='avg', reg_tokens=4),
    "vit_so150m_patch16_reg4_gap_384": _timm(16, 384, 896, 18, 14, mlp_ratio=2.572, class_token=False, fc_norm=False,
                                             global_pool='avg', reg_tokens=4),
    "vit_so150m_patch16_reg4_map_256": _timm(16, 256, 896, 18, 14, mlp_ratio=2.572, class_token=False,
                                             global_pool='map', reg_tokens=4),
    "vit_so400m_patch14_reg1_tipsv2": _timm(14, 448, 1152, 27, 16, mlp_ratio=3.736111111111111, init_values=1.0,
                                            no_embed_class=True, reg_tokens=1),
    "vit_so400m_patch14_siglip_224": _timm(14, 224, 1152, 27, 16, mlp_ratio=3.7362, class_token=False,
                                           global_pool='map'),
    "vit_so400m_patch14_siglip_378": _timm(14, 378, 1152, 27, 16, mlp_ratio=3.7362, class_token=False,
                                           global_pool='map'),
    # 384 px on 14-pixel patches: a 27x27 grid, the last 6 pixel rows and columns unseen (drop_remainder).
    "vit_so400m_patch14_siglip_384": _timm(14, 384, 1152, 27, 16, mlp_ratio=3.7362, class_token=False,
                                           global_pool='map'),
    "vit_so400m_patch14_siglip_gap_224": _timm(14, 224, 1152, 27, 16, mlp_ratio=3.7362, class_token=False,
                                               fc_norm=False, global_pool='avg'),
    "vit_so400m_patch14_siglip_gap_378": _timm(14, 378, 1152, 27, 16, mlp_ratio=3.7362, class_token=False,
                                               fc_norm=False, global_pool='avg'),
    "vit_so400m_patch14_siglip_gap_384": _timm(14, 384, 1152, 27, 16, mlp_ratio=3.7362, class_token=False,
                                               fc_norm=False, global_pool='avg'),
    "vit_so400m_patch14_siglip_gap_448": _timm(14, 448, 1152, 27, 16, mlp_ratio=3.7362, class_token=False,
                                               fc_norm=False, global_pool='avg'),
    "vit_so400m_patch14_siglip_gap_896": _timm(14, 896, 1152, 27, 16, mlp_ratio=3.7362, class_token=False,
                                               fc_norm=False, global_pool='avg'),
    "vit_so400m_patch16_radio_v4": _timm(16, 512, 1152, 27, 16, mlp_ratio=3.736111111111111, final_norm=False,
                                         no_embed_class=True, reg_tokens=9, resize=('bilinear', False, False)),
    "vit_so400m_patch16_siglip_256": _timm(16, 256, 1152, 27, 16, mlp_ratio=3.7362, act_layer='gelu_tanh',
                                           class_token=False, global_pool='map'),
    "vit_so400m_patch16_siglip_384": _timm(16, 384, 1152, 27, 16, mlp_ratio=3.7362, act_layer='gelu_tanh',
                                           class_token=False, global_pool='map'),
    "vit_so400m_patch16_siglip_512": _timm(16, 512, 1152, 27, 16, mlp_ratio=3.7362, act_layer='gelu_tanh',
                                           class_token=False, global_pool='map'),
    "vit_so400m_patch16_siglip_gap_256": _timm(16, 256, 1152, 27, 16, mlp_ratio=3.7362, act_layer='gelu_tanh',
                                               class_token=False, fc_norm=False, global_pool='avg'),
    "vit_so400m_patch16_siglip_gap_384": _timm(16, 384, 1152, 27, 16, mlp_ratio=3.7362, act_layer='gelu_tanh',
                                               class_token=False, fc_norm=False, global_pool='avg'),
    "vit_so400m_patch16_siglip_gap_512": _timm(16, 512, 1152, 27, 16, mlp_ratio=3.7362, act_layer='gelu_tanh',
                                               class_token=False, fc_norm=False, global_pool='avg'),
    "vit_tiny_patch16_224": _timm(16, 224, 192, 12, 3),
    "vit_tiny_patch16_384": _timm(16, 384, 192, 12, 3),
    "vit_tiny_r_s16_p8_224": _hybrid(8, 224, 192, 12, 3, ()),
    "vit_tiny_r_s16_p8_384": _hybrid(8, 384, 192, 12, 3, ()),
    "vit_wee_patch16_reg1_gap_256": _timm(16, 256, 256, 14, 4, mlp_ratio=5, class_token=False, global_pool='avg',
                                          init_values=1e-05, no_embed_class=True, reg_tokens=1),
    "vit_xsmall_patch16_clip_224": _timm(16, 224, 256, 10, 4, pre_norm=True, norm_eps=1e-05),
}


def timm_architecture(name, where="config.json"):
    """The `TimmArchitecture` of a timm architecture name, or a `CheckpointError` naming why it is not computed."""
    entry = ARCHITECTURES.get(name)
    if entry is not None:
        return entry
    reason = next((why for pattern, why in REFUSED if re.search(pattern, name)), None)
    if reason is None:
        raise CheckpointError(f"{where}: timm's {name!r} is not one of the {len(ARCHITECTURES)} timm ViT architectures "
                              "keras_vit computes (keras_vit.checkpoints.timm.families.ARCHITECTURES, timm's plain "
                              "VisionTransformer family and DeiT distilled).")
    raise CheckpointError(f"{where}: timm's {name!r} is a ViT with {reason}." if not reason.startswith(("RoPE", "timm's"))
                          else f"{where}: timm's {name!r}: {reason}.")


def timm_switches_to_architecture(switches):
    """keras_vit `Architecture` fields for timm `VisionTransformer` switches (keywords as in `SWITCH_KEYWORDS`).

    Follows timm's own defaults: a class token, the class token pooled,
    `fc_norm` where the pool is the average (unless set), a patch bias
    unless `pre_norm`, exact GELU, LayerNorm epsilon 1e-6.
    """
    pool = switches.get("global_pool", "token")
    class_token = switches.get("class_token", True)
    fc_norm = switches.get("fc_norm")
    if fc_norm is None:
        fc_norm = pool == "avg"
    final_norm = switches.get("final_norm", True)
    block = BLOCKS[switches.get("block_fn", "Block")]
    post_norm = block.get("post_norm", False)
    init_values = None if post_norm else switches.get("init_values")
    return dict(
        class_token=bool(class_token),
        register_tokens=int(switches.get("reg_tokens", 0)),
        class_token_position_embedding=not switches.get("no_embed_class", False),
        classifier=POOLS[pool],
        fc_norm=bool(fc_norm) and bool(final_norm),
        final_norm=bool(final_norm),
        norm_pre=bool(switches.get("pre_norm", False)),
        patch_bias=not switches.get("pre_norm", False),
        qkv_bias=bool(switches.get("qkv_bias", True)),
        qk_norm=bool(switches.get("qk_norm", False)),
        layer_scale=float(init_values) if init_values else None,
        mlp_activation="swiglu" if switches.get("mlp_layer") in ("swiglu_packed", "swiglu") else
        "geglu" if switches.get("mlp_layer") == "geglu" else ACTIVATIONS[switches.get("act_layer")],
        mlp_input_norm=switches.get("mlp_layer") == "geglu",  # GeGluMlp normalises its input
        position_embedding=switches.get("pos_embed", "learn") != "none",
        normalization=switches.get("norm_layer", "layer_norm"),
        projection_bias=bool(switches.get("proj_bias", True)),
        patch_norm=switches.get("embed_norm_layer") is not None,
        differential_attention=switches.get("attn_layer") == "diff" or block.get("differential_attention", False),
        parallel=block.get("parallel", False),
        layer_norm_epsilon=float(switches.get("norm_eps", 1e-6)),
        post_norm=post_norm,
        attention_output_norm=bool(switches.get("scale_attn_norm", False)),
        mlp_hidden_norm=bool(switches.get("scale_mlp_norm", False)),
        pool_include_prefix=bool(switches.get("pool_include_prefix", False)) and pool != "token",
    )
