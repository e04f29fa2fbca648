"""What a timm ViT's state dict cannot show, read from its architecture name: one table of families.

A timm Hub `config.json` names the architecture (`vit_small_patch14_reg4_dinov2`)
and usually has no `model_args`. The tensors show registers, biases, layer
scale, norms and heads; the head count, the MLP activation and the LayerNorm
epsilon are fixed by timm's model function for that name. This table holds
them by family, following timm's `vision_transformer.py` and `deit.py`.

Example:
>>> timm_family("vit_base_patch16_clip_quickgelu_224")
{'num_heads': 12, 'mlp_activation': 'quick_gelu', 'layer_norm_epsilon': 1e-05}
"""

import re


# The prefixes of timm's plain-ViT architecture names (VisionTransformer and DeiT's plain models).
PREFIXES = ("vit_", "deit_", "deit3_", "flexivit_")
# Heads per size word: the word after the prefix (vit_SMALL_patch16_224, flexivit_SMALL, deit3_SMALL_...).
_HEADS = {"tiny": 3, "xsmall": 4, "wee": 4, "dwee": 4, "pwee": 4, "dpwee": 4, "little": 5, "dlittle": 5,
          "small": 6, "medium": 8, "mediumd": 8, "betwixt": 10, "base": 12, "so150m": 14, "so150m2": 13,
          "large": 16, "huge": 16, "giant": 16, "gigantic": 16, "giantopt": 16, "so400m": 16, "intern300m": 16}
# Names whose head count differs from their size word's.
# Plain-ViT names whose blocks differ from keras_vit's although their tensors have the same names: refused by name.
NOT_PLAIN_BLOCKS = {"_rpn_": "post-norm residual blocks (timm's ResPostBlock)"}
_HEAD_EXCEPTIONS = ((r"^vit_giant_patch14_(reg\d+_)?(dinov2|tipsv2)", 24), (r"^vit_giant_patch16_radio", 24), (r"^vit_base_patch16_gap_224", 16),
                    (r"^vit_base_patch16_plus", 14))
# timm's SigLIP 2 towers compute the tanh GELU (act_layer='gelu_tanh'); every other plain ViT in timm
# computes exact GELU, except the OpenAI CLIP towers' QuickGELU (and SwiGLU, which the tensors show).
_GELU_TANH = (r"^vit_base_patch32_siglip_(gap_)?256", r"^vit_large_patch16_siglip_(gap_)?512",
              r"^vit_so400m_patch16_siglip_(gap_)?(256|384|512)", r"^vit_giantopt_patch16_siglip")


def timm_family(architecture):
    """`{num_heads, mlp_activation, layer_norm_epsilon}` of a timm plain-ViT architecture name.

    `num_heads` is None for a size outside the families keras_vit knows
    (`from_pretrained` then asks for `num_heads=`).
    """
    match = re.match(r"^(vit|deit3|deit|flexivit)_([a-z0-9]+)", architecture)
    word = match.group(2) if match else None
    heads = next((count for pattern, count in _HEAD_EXCEPTIONS if re.match(pattern, architecture)),
                 _HEADS.get(word))
    if "_clip_quickgelu_" in architecture:
        activation = "quick_gelu"
    elif any(re.match(pattern, architecture) for pattern in _GELU_TANH):
        activation = "gelu_tanh"
    else:
        activation = "gelu"
    return dict(num_heads=heads, mlp_activation=activation,
                layer_norm_epsilon=1e-5 if "_clip_" in architecture else 1e-6)

