"""The norms of a ViT: `LayerNorm` (Keras' `LayerNormalization`, always computed in float32) and `RMSNorm`.

`NORMALIZATIONS` names them, `norm_layer` makes one by name.
"""

import keras
from keras import ops

from keras_vit.layers import kernels

LAYER_NORM_EPSILON = 1e-6


@keras.saving.register_keras_serializable(package="keras_vit")
class LayerNorm(keras.layers.LayerNormalization):
    """`LayerNormalization` over the last axis, always computed in float32.

    The same function (equal to float32 rounding) with the same weights
    (`gamma`, `beta`), computed in float32 under mixed precision. On CPUs
    under JAX and TensorFlow (`keras_vit.layers.kernels.use_matrix_means`) it is
    `keras_vit.layers.kernels.layer_norm`, which computes the means as matrix
    products and writes its gradient out where that trains better under
    XLA; on PyTorch it is torch's `layer_norm` on the input in its own dtype
    (`keras_vit.layers.kernels.torch_layer_norm`); on GPUs and TPUs, and for
    other axes or RMS scaling, it is Keras' own `LayerNormalization`.

    Example:
    >>> import numpy as np
    >>> tuple(LayerNorm(epsilon=1e-6)(np.arange(8.0).reshape(2, 4)).shape)
    (2, 4)
    """

    def call(self, inputs):
        axes = [self.axis] if isinstance(self.axis, int) else list(self.axis)
        last_axis_only = len(axes) == 1 and axes[0] % len(inputs.shape) == len(inputs.shape) - 1
        if kernels.use_torch_kernels() and last_axis_only and not self.rms_scaling:
            outputs = kernels.torch_layer_norm(inputs, self.gamma if self.scale else None,
                                               self.beta if self.center else None, self.epsilon)
            if outputs is not None:
                return ops.cast(outputs, self.compute_dtype)
        if not kernels.use_matrix_means() or not last_axis_only or self.rms_scaling:
            return super().call(inputs)
        width = inputs.shape[-1]
        gamma = ops.convert_to_tensor(self.gamma) if self.scale else ops.ones((width,))
        beta = ops.convert_to_tensor(self.beta) if self.center else ops.zeros((width,))
        outputs = kernels.layer_norm(
            ops.cast(inputs, "float32"), ops.cast(gamma, "float32"), ops.cast(beta, "float32"), self.epsilon
        )
        return ops.cast(outputs, self.compute_dtype)



@keras.saving.register_keras_serializable(package="keras_vit")
class RMSNorm(LayerNorm):
    """RMSNorm over the last axis, `x / sqrt(mean(x**2) + epsilon) * gamma`, always computed in float32.

    timm's `RmsNorm` (AIMv2): no centring and no bias; `scale=False` has no
    `gamma` either (timm's `affine=False`, Gemma 4's value and classifier
    norms). It keeps `LayerNorm`'s
    `gamma` weight name, so a layout's table maps a norm's weight alike for
    both kinds. (Keras' `rms_scaling=True` divides by the standard deviation,
    not the root mean square, so it is not this function.)

    Example:
    >>> import numpy as np
    >>> norm = RMSNorm(epsilon=1e-5, name="norm")
    >>> np.round(np.asarray(norm(np.array([[3.0, -3.0, 3.0, -3.0]]))), 3).tolist()
    [[1.0, -1.0, 1.0, -1.0]]
    >>> [weight.path for weight in norm.weights]
    ['norm/gamma']
    """

    def __init__(self, epsilon=1e-6, scale=True, **kwargs):
        kwargs.update(center=False, scale=bool(scale), rms_scaling=False)
        super().__init__(epsilon=epsilon, **kwargs)

    def call(self, inputs):
        inputs = ops.cast(inputs, "float32")
        if not self.scale:
            mean_square = ops.mean(ops.square(inputs), axis=self.axis, keepdims=True)
            return ops.cast(inputs * ops.rsqrt(mean_square + self.epsilon), self.compute_dtype)
        outputs = ops.rms_normalization(inputs, scale=ops.cast(self.gamma, "float32"), axis=self.axis,
                                        epsilon=self.epsilon)
        return ops.cast(outputs, self.compute_dtype)


# "layer_norm": every norm is a LayerNorm; "rms_norm": every norm is an RMSNorm, no centring and no bias (AIMv2).
_NORM_LAYERS = {"layer_norm": LayerNorm, "rms_norm": RMSNorm}
NORMALIZATIONS = tuple(_NORM_LAYERS)


def norm_layer(normalization, epsilon, **kwargs):
    """A `LayerNorm` or `RMSNorm` (`normalization`, one of `NORMALIZATIONS`) with `epsilon`; `scale=False`: without
    its learned gain."""
    if normalization not in _NORM_LAYERS:
        raise ValueError(f"Unknown normalization {normalization!r}; expected one of {NORMALIZATIONS}.")
    return _NORM_LAYERS[normalization](epsilon=epsilon, **kwargs)
