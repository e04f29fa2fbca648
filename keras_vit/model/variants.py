"""The sizes that name a Vision Transformer: one table, read by everything else.

`Variant` holds a model's sizes, `decode_variant("B/16")` turns a name into
them, and `VARIANTS` is the table of named variants (the paper's Table 1,
the Ti and S sizes of the released checkpoints, and the ResNet+ViT hybrids);
This module imports nothing from the rest of the package.

Example:
>>> decode_variant("S/16").hidden_size
384
>>> VARIANTS["ViT_R50_B16"].pixels_per_patch
16
"""

import dataclasses
import difflib

# MobileCLIP's convolutional stem before the patches (`keras_vit.layers.conv_stem`): a 4x4/4 and a 2x2/2
# convolution.
CONV_STEM_STRIDE = 8
# ViTamin's MbConv stem (`keras_vit.layers.mbconv`): its patch embedding, a 3x3 convolution, strides by 2.
MBCONV_PATCH_SIZE = 2


def mbconv_stride(depths):
    """How many pixels one position of ViTamin's stem output spans: 2 for its stem, x2 per stage."""
    return 2 * 2 ** len(depths)


def resnet_stride(resnet_layers):
    """How many pixels one feature-map position of a hybrid's ResNet spans: 4 for the root, x2 per later stage."""
    return 4 * 2 ** max(len(resnet_layers) - 1, 0)


@dataclasses.dataclass(frozen=True)
class Variant:
    """The sizes that name a ViT, for example `ViT_B16` or the hybrid `ViT_R50_B16`.

    Hybrids have `resnet_layers` (bottleneck units per ResNet stage; `()` for
    the root block alone) and cut the ResNet's feature map into
    `patch_size` patches; `resnet_width` is the root block's width.
    `conv_stem_widths` are the widths of MobileCLIP's convolutional stem
    (`keras_vit.layers.conv_stem`), which puts `CONV_STEM_STRIDE` pixels in each
    position before the patches (None: no such stem). `mbconv_widths` (the
    stem's, then each stage's) and `mbconv_depths` (blocks per stage) are
    ViTamin's MbConv stem (`keras_vit.layers.mbconv`), whose patch
    embedding strides by `patch_size` (`MBCONV_PATCH_SIZE`) with a 3x3 kernel.
    """

    patch_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    mlp_dim: int
    resnet_layers: tuple = None
    resnet_width: int = 64
    conv_stem_widths: tuple = None
    mbconv_widths: tuple = None
    mbconv_depths: tuple = None

    @property
    def pixels_per_patch(self):
        """The side in pixels of the image region one token stands for (16 for B/16 and R50+B/16)."""
        if self.mbconv_depths is not None:
            return self.patch_size * mbconv_stride(self.mbconv_depths)
        if self.conv_stem_widths is not None:
            return self.patch_size * CONV_STEM_STRIDE
        if self.resnet_layers is None:
            return self.patch_size
        return self.patch_size * resnet_stride(self.resnet_layers)


# (hidden_size, num_layers, num_heads, mlp_dim) of each model width.
_WIDTHS = {
    "Ti": (192, 12, 3, 768),
    "S": (384, 12, 6, 1536),
    "B": (768, 12, 12, 3072),
    "L": (1024, 24, 16, 4096),
    "H": (1280, 32, 16, 5120),
}
# The hybrids' ResNet stages by (depth, total stride): R50 at /16 is cut after
# its third stage, which gets 9 units instead of 6, as in the released model.
_RESNETS = {("R50", 16): (3, 4, 9), ("R50", 32): (3, 4, 6, 3), ("R26", 32): (2, 2, 2, 2)}
_NAMED = (
    "Ti/16", "S/16", "S/32", "B/8", "B/16", "B/32", "L/16", "L/32", "H/14",
    "R50+B/16", "R26+B/32", "R26+S/32", "R50+L/32",
)


def decode_variant(spec):
    """`"B/16"` -> `Variant(patch_size=16, hidden_size=768, ...)`; `"R50+B/16"` -> its hybrid.

    A hybrid's `/16` is its total stride: the ResNet's feature map is cut
    into 1x1 patches.
    """
    resnet, _, vit = spec.rpartition("+")
    width, _, patch = vit.partition("/")
    if width not in _WIDTHS or not patch.isdigit() or (resnet and (resnet, int(patch)) not in _RESNETS):
        raise ValueError(
            f"Unknown variant {spec!r}; expected e.g. 'B/16' with a width in {list(_WIDTHS)}, "
            f"or a hybrid {sorted(f'{r}+?/{s}' for r, s in _RESNETS)}."
        )
    hidden_size, num_layers, num_heads, mlp_dim = _WIDTHS[width]
    if resnet:
        return Variant(1, hidden_size, num_layers, num_heads, mlp_dim, _RESNETS[(resnet, int(patch))])
    return Variant(int(patch), hidden_size, num_layers, num_heads, mlp_dim)


def width_name(hidden_size):
    """The width ("Ti", "S", "B", "L", "H") with this hidden size, or `None`."""
    return next((name for name, sizes in _WIDTHS.items() if sizes[0] == hidden_size), None)


VARIANTS = {"ViT_" + spec.replace("+", "_").replace("/", ""): decode_variant(spec) for spec in _NAMED}


def named_variant(name):
    """The sizes of the variant called `name`; an unknown name gets the closest names in the error.

    Example:
    >>> named_variant("ViT_B16").patch_size
    16
    """
    if name in VARIANTS:
        return VARIANTS[name]
    folded = {key.lower().replace("_", ""): key for key in VARIANTS}
    wanted = str(name).lower().replace("_", "").replace("-", "").replace("/", "").replace("+", "")
    close = [folded[key] for key in difflib.get_close_matches(wanted, list(folded), n=3, cutoff=0.6)]
    hint = f"Did you mean {' or '.join(close)}? " if close else ""
    raise ValueError(f"Unknown model {name!r}. {hint}Named variants: {', '.join(VARIANTS)}.")


def variant_name(sizes):
    """The name of the variant with these `Variant` sizes, or `None`."""
    return next((name for name, variant in VARIANTS.items() if variant == sizes), None)


# The digits example's model: a small ViT for the embedded 8x8 digits (keras_vit.data.arrays), upsampled to 16 or 32 px.
SMALL_VIT = Variant(patch_size=4, hidden_size=64, num_layers=4, num_heads=4, mlp_dim=128)
