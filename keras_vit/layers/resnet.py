"""The ResNet in front of the paper's hybrid models (R50+ViT-B/16, ...).

A BiT-style ResNet without pre-activation: weight-standardised convolutions
and GroupNorm (32 groups), a 7x7/2 root convolution and a 3x3/2 max pool,
then stages of bottleneck units, the first of each later stage striding by
2. Padding is TensorFlow's "SAME", as in the original Flax model, and every
weight keeps the original checkpoint's layout (`conv_root`, `gn_root`,
`block{i}/unit{j}/conv1`, ...). timm's `ResNetV2` hybrids are the same
network with other epsilons (`epsilons="timm"`); their names map onto these
in `keras_vit.checkpoints.timm.hybrid`. The hybrid ViT cuts the final
feature map into patches (1x1 for the released models) instead of the image.
"""

import keras
from keras import ops

# A hybrid ResNet's epsilons, by the layout its weights come from: the weight standardisation's, added to
# the kernel's standard deviation (the original Flax StdConv) or inside the square root with the variance
# (timm's StdConv2dSame, through torch's batch_norm), and the GroupNorms'.
RESNET_EPSILONS = {
    "flax": dict(standardization_epsilon=1e-5, epsilon_added_to="std", group_norm_epsilon=1e-6),
    "timm": dict(standardization_epsilon=1e-8, epsilon_added_to="variance", group_norm_epsilon=1e-5),
}


# The original Flax GroupNorm's epsilon, and the weight standardisation's
# (added to the standard deviation, not the variance); timm's differ
# (`keras_vit.model.architecture.RESNET_EPSILONS`).
GROUP_NORM_EPSILON = RESNET_EPSILONS["flax"]["group_norm_epsilon"]
STANDARDIZATION_EPSILON = RESNET_EPSILONS["flax"]["standardization_epsilon"]
GROUPS = 32


@keras.saving.register_keras_serializable(package="keras_vit")
class StandardizedConv2D(keras.layers.Conv2D):
    """`Conv2D` whose kernel is standardised per output channel before use.

    Over the kernel's spatial and input axes (Qiao et al., 2019):
    `(kernel - mean) / (std + epsilon)` with `epsilon_added_to="std"`, as
    the original hybrid models compute it, or
    `(kernel - mean) / sqrt(variance + epsilon)` with `"variance"`, as
    timm's `StdConv2d` does. The stored kernel stays unstandardised, like
    the checkpoints'.

    Example:
    >>> import numpy as np
    >>> StandardizedConv2D(8, 3, padding="same", use_bias=False)(np.ones((1, 6, 6, 4))).shape
    (1, 6, 6, 8)
    >>> StandardizedConv2D(8, 1, epsilon=1e-8, epsilon_added_to="variance").get_config()["epsilon_added_to"]
    'variance'
    """

    def __init__(self, *args, epsilon=STANDARDIZATION_EPSILON, epsilon_added_to="std", **kwargs):
        super().__init__(*args, **kwargs)
        if epsilon_added_to not in ("std", "variance"):
            raise ValueError(f"epsilon_added_to must be 'std' or 'variance', got {epsilon_added_to!r}.")
        # === Config ===
        self.epsilon = epsilon
        self.epsilon_added_to = epsilon_added_to

    def convolution_op(self, inputs, kernel):
        weights = ops.cast(kernel, "float32")
        centred = weights - ops.mean(weights, axis=(0, 1, 2), keepdims=True)
        variance = ops.mean(ops.square(centred), axis=(0, 1, 2), keepdims=True)
        if self.epsilon_added_to == "variance":
            scale = ops.sqrt(variance + self.epsilon)
        else:
            scale = ops.sqrt(variance) + self.epsilon
        standardized = ops.cast(centred / scale, inputs.dtype)
        return super().convolution_op(inputs, standardized)

    def get_config(self):
        return {**super().get_config(), "epsilon": self.epsilon, "epsilon_added_to": self.epsilon_added_to}


def _conv(filters, kernel_size, strides, name, dtype, epsilons="flax"):
    settings = RESNET_EPSILONS[epsilons]
    return StandardizedConv2D(
        filters, kernel_size, strides=strides, padding="same", use_bias=False,
        kernel_initializer="he_normal", name=name, dtype=dtype,
        epsilon=settings["standardization_epsilon"], epsilon_added_to=settings["epsilon_added_to"],
    )


def _group_norm(name, dtype, zero=False, epsilons="flax"):
    return keras.layers.GroupNormalization(
        groups=GROUPS, epsilon=RESNET_EPSILONS[epsilons]["group_norm_epsilon"],
        gamma_initializer="zeros" if zero else "ones", name=name, dtype=dtype,
    )


@keras.saving.register_keras_serializable(package="keras_vit")
class BottleneckUnit(keras.layers.Layer):
    """A ResNet bottleneck unit without pre-activation (the original `ResidualUnit`).

    1x1 conv to `filters`, 3x3 conv (carrying the stride), 1x1 conv to
    `4 * filters`, each followed by GroupNorm (the last one zero-initialised)
    and ReLU after the residual sum. The shortcut is projected by a
    1x1 conv + GroupNorm when the width or resolution changes. `epsilons`
    names the ResNet's epsilons (`keras_vit.model.architecture.RESNET_EPSILONS`).

    Example:
    >>> import numpy as np
    >>> BottleneckUnit(32, strides=2)(np.ones((1, 8, 8, 64))).shape
    (1, 4, 4, 128)
    """

    def __init__(self, filters, strides=1, epsilons="flax", **kwargs):
        super().__init__(**kwargs)
        if epsilons not in RESNET_EPSILONS:
            raise ValueError(f"Unknown epsilons {epsilons!r}; expected one of {tuple(RESNET_EPSILONS)}.")
        # === Config ===
        self.filters = int(filters)
        self.strides = int(strides)
        self.epsilons = epsilons

    def build(self, input_shape):
        dtype, epsilons = self.dtype_policy, self.epsilons
        self.projects = input_shape[-1] != 4 * self.filters or self.strides != 1
        if self.projects:
            self.conv_proj = _conv(4 * self.filters, 1, self.strides, "conv_proj", dtype, epsilons)
            self.gn_proj = _group_norm("gn_proj", dtype, epsilons=epsilons)
            self.conv_proj.build(input_shape)
            self.gn_proj.build(self.conv_proj.compute_output_shape(input_shape))
        self.conv1 = _conv(self.filters, 1, 1, "conv1", dtype, epsilons)
        self.gn1 = _group_norm("gn1", dtype, epsilons=epsilons)
        self.conv2 = _conv(self.filters, 3, self.strides, "conv2", dtype, epsilons)
        self.gn2 = _group_norm("gn2", dtype, epsilons=epsilons)
        self.conv3 = _conv(4 * self.filters, 1, 1, "conv3", dtype, epsilons)
        self.gn3 = _group_norm("gn3", dtype, zero=True, epsilons=epsilons)
        shape = input_shape
        for conv, norm in ((self.conv1, self.gn1), (self.conv2, self.gn2), (self.conv3, self.gn3)):
            conv.build(shape)
            shape = conv.compute_output_shape(shape)
            norm.build(shape)

    def call(self, inputs):
        shortcut = self.gn_proj(self.conv_proj(inputs)) if self.projects else inputs
        x = ops.relu(self.gn1(self.conv1(inputs)))
        x = ops.relu(self.gn2(self.conv2(x)))
        x = self.gn3(self.conv3(x))
        return ops.relu(shortcut + x)

    def compute_output_shape(self, input_shape):
        height, width = (None if size is None else -(-size // self.strides) for size in input_shape[1:3])
        return (input_shape[0], height, width, 4 * self.filters)

    def get_config(self):
        return {**super().get_config(), "filters": self.filters, "strides": self.strides, "epsilons": self.epsilons}


def apply_resnet(images, resnet_layers, width=64, epsilons="flax", dtype=None):
    """Run the hybrid's ResNet on a Keras tensor of images; returns its feature map.

    `resnet_layers` lists the bottleneck units per stage (`()` for the root
    block alone); stage `i` has bottleneck width `width * 2**i`; `epsilons`
    is a key of `keras_vit.model.architecture.RESNET_EPSILONS`; `dtype` is every
    layer's dtype policy (None: Keras' global one). The max pool
    follows the ReLU, so its padding (ignored by TensorFlow's "SAME", -inf
    in timm's `MaxPool2dSame`) never wins.
    """
    x = _conv(width, 7, 2, "conv_root", dtype, epsilons)(images)
    x = _group_norm("gn_root", dtype, epsilons=epsilons)(x)
    x = keras.layers.ReLU(name="root_relu", dtype=dtype)(x)
    x = keras.layers.MaxPooling2D(3, strides=2, padding="same", name="root_pool", dtype=dtype)(x)
    for stage, units in enumerate(resnet_layers, start=1):
        for unit in range(1, units + 1):
            strides = 2 if stage > 1 and unit == 1 else 1
            x = BottleneckUnit(width * 2 ** (stage - 1), strides, epsilons, name=f"block{stage}_unit{unit}",
                               dtype=dtype)(x)
    return x
