"""ViTamin's convolutional stem (timm's `MbConvStages` in `vitamin_*`), before the patch embedding.

A stem (3x3/2 convolution, LayerNorm over the channels, exact GELU, 3x3
convolution), then stages of MbConv blocks: each a pre-norm inverted
bottleneck (LayerNorm, 1x1 expansion to 4x the output width, exact GELU,
3x3 depthwise convolution carrying the stride, exact GELU, 1x1
projection) on a residual. The first block of each stage strides by 2; its
shortcut is a 3x3/2 average pool that leaves the padding out of the mean
(PyTorch's `count_include_pad=False`), then a 1x1 convolution where the
width changes. A LayerNorm and a 3x3/2 convolution (`MbConvEmbedding`,
keras_vit's patch embedding; timm's `StridedConv`, whose `HybridEmbed` has
no projection of its own) follow, so one token spans 16 pixels with two
stages. Every convolution has a bias and pads one pixel on each side, as
PyTorch's; every LayerNorm has epsilon 1e-6.

Example:
>>> import keras
>>> images = keras.Input((32, 32, 3))
>>> tuple(apply_mbconv_stem(images, (8, 8, 16), (1, 2)).shape)
(None, 4, 4, 16)
"""

import keras
from keras import ops

from keras_vit.layers import kernels
from keras_vit.layers.conv_stem import ExactGELU
from keras_vit.layers.embedding import PatchEmbedding
from keras_vit.layers.norm import LayerNorm

EPSILON = 1e-6  # every LayerNorm2d of timm's MbConvStages
EXPANSION = 4


def expanded_width(filters):
    """The width of a block's inverted bottleneck: timm's `make_divisible(4 * filters)` (to a multiple of 8)."""
    value = EXPANSION * filters
    width = max(8, int(value + 4) // 8 * 8)
    return width + 8 if width < 0.9 * value else width


def _pad(x):
    """One zero pixel on each side, as PyTorch's `padding=1`."""
    return ops.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))


def _average_pool(x):
    """timm's `AvgPool2d(3, stride=2, padding=1, count_include_pad=False)`: the mean of each window's pixels."""
    ones = ops.ones_like(x[..., :1])
    pool = lambda value: ops.average_pool(_pad(value), 3, strides=2, padding="valid")  # noqa: E731
    return pool(x) / pool(ones)


@keras.saving.register_keras_serializable(package="keras_vit")
class MbConvBlock(keras.layers.Layer):
    """One MbConv block of ViTamin's stem (timm's `MbConvLNBlock`), `filters` wide out, striding by `strides`.

    Example:
    >>> import numpy as np
    >>> MbConvBlock(16, strides=2)(np.ones((1, 8, 8, 8), "float32")).shape
    (1, 4, 4, 16)
    """

    def __init__(self, filters, strides=1, **kwargs):
        super().__init__(**kwargs)
        if int(strides) not in (1, 2):
            raise ValueError(f"An MbConv block strides by 1 or 2, got {strides!r}.")
        # === Config ===
        self.filters = int(filters)
        self.strides = int(strides)

    def build(self, input_shape):
        dtype, width = self.dtype_policy, expanded_width(self.filters)
        self.projects = input_shape[-1] != self.filters
        self.pre_norm = LayerNorm(epsilon=EPSILON, name="pre_norm", dtype=dtype)
        self.conv1 = keras.layers.Conv2D(width, 1, name="conv1", dtype=dtype)
        self.conv2 = keras.layers.DepthwiseConv2D(3, strides=self.strides, name="conv2", dtype=dtype)
        self.conv3 = keras.layers.Conv2D(self.filters, 1, name="conv3", dtype=dtype)
        shape = tuple(input_shape)
        self.pre_norm.build(shape)
        self.conv1.build(shape)
        expanded = (*shape[:-1], width)
        self.conv2.build(expanded)
        self.conv3.build(self.conv2.compute_output_shape(expanded))
        if self.projects:
            self.shortcut = keras.layers.Conv2D(self.filters, 1, name="shortcut", dtype=dtype)
            self.shortcut.build(shape)

    def call(self, inputs):
        shortcut = _average_pool(inputs) if self.strides == 2 else inputs
        if self.projects:
            shortcut = self.shortcut(shortcut)
        x = kernels.gelu(self.conv1(self.pre_norm(inputs)), approximate=False)
        x = kernels.gelu(self.conv2(_pad(x)), approximate=False)
        return self.conv3(x) + shortcut

    def compute_output_shape(self, input_shape):
        height, width = (None if size is None else -(-size // self.strides) for size in input_shape[1:3])
        return (input_shape[0], height, width, self.filters)

    def get_config(self):
        return {**super().get_config(), "filters": self.filters, "strides": self.strides}


@keras.saving.register_keras_serializable(package="keras_vit")
class MbConvEmbedding(PatchEmbedding):
    """The patch embedding after ViTamin's stem: a `kernel_size` convolution, padded by `(kernel_size - 1) // 2`
    on each side as PyTorch's, striding by `patch_size` (timm's `StridedConv`: 3x3, stride 2, padding 1).

    Example:
    >>> import numpy as np
    >>> MbConvEmbedding(patch_size=2, hidden_size=8)(np.zeros((1, 8, 8, 4), "float32")).shape
    (1, 16, 8)
    """

    def __init__(self, patch_size, hidden_size, kernel_size=3, **kwargs):
        super().__init__(patch_size, hidden_size, **kwargs)
        # === Config ===
        self.kernel_size = int(kernel_size)

    @property
    def window(self):
        return (self.kernel_size, self.kernel_size)

    def pad(self, images):
        margin = (self.kernel_size - 1) // 2
        return ops.pad(images, ((0, 0), (margin, margin), (margin, margin), (0, 0)))

    def get_config(self):
        return {**super().get_config(), "kernel_size": self.kernel_size}


def apply_mbconv_stem(images, widths, depths, dtype=None):
    """Run the stem on a Keras tensor of images: `widths` are the stem's then each stage's, `depths` each stage's
    blocks. Ends with the LayerNorm before `MbConvEmbedding`."""
    if len(widths) != len(depths) + 1:
        raise ValueError(f"An MbConv stem has one width more than stages (the stem's); got widths {widths} for "
                         f"depths {depths}.")
    x = keras.layers.ZeroPadding2D(1, name="mbconv_stem_pad1", dtype=dtype)(images)
    x = keras.layers.Conv2D(widths[0], 3, strides=2, name="mbconv_stem_conv1", dtype=dtype)(x)
    x = LayerNorm(epsilon=EPSILON, name="mbconv_stem_norm1", dtype=dtype)(x)
    x = ExactGELU(name="mbconv_stem_gelu", dtype=dtype)(x)
    x = keras.layers.ZeroPadding2D(1, name="mbconv_stem_pad2", dtype=dtype)(x)
    x = keras.layers.Conv2D(widths[0], 3, name="mbconv_stem_conv2", dtype=dtype)(x)
    for stage, (width, depth) in enumerate(zip(widths[1:], depths)):
        for block in range(depth):
            x = MbConvBlock(width, 2 if block == 0 else 1, name=f"mbconv_stage{stage}_block{block}", dtype=dtype)(x)
    return LayerNorm(epsilon=EPSILON, name="mbconv_pool_norm", dtype=dtype)(x)
