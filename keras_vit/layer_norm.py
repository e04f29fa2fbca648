"""The LayerNorm every keras_vit model uses: Keras' `LayerNormalization`, always computed in float32."""

import keras
from keras import ops

from keras_vit import kernels


@keras.saving.register_keras_serializable(package="keras_vit")
class LayerNorm(keras.layers.LayerNormalization):
    """`LayerNormalization` over the last axis, always computed in float32.

    The same function (equal to float32 rounding) with the same weights
    (`gamma`, `beta`), computed in float32 under mixed precision. Under JAX
    and TensorFlow it is `keras_vit.kernels.layer_norm`, which computes the
    means as matrix products and writes its gradient out where that trains
    better under XLA; on PyTorch, and for other axes or RMS scaling, it is
    Keras' own `LayerNormalization`.

    Example:
    >>> import numpy as np
    >>> tuple(LayerNorm(epsilon=1e-6)(np.arange(8.0).reshape(2, 4)).shape)
    (2, 4)
    """

    def call(self, inputs):
        axes = [self.axis] if isinstance(self.axis, int) else list(self.axis)
        last_axis_only = len(axes) == 1 and axes[0] % len(inputs.shape) == len(inputs.shape) - 1
        if keras.backend.backend() == "torch" or not last_axis_only or self.rms_scaling:
            return super().call(inputs)
        width = inputs.shape[-1]
        gamma = ops.convert_to_tensor(self.gamma) if self.scale else ops.ones((width,))
        beta = ops.convert_to_tensor(self.beta) if self.center else ops.zeros((width,))
        outputs = kernels.layer_norm(
            ops.cast(inputs, "float32"), ops.cast(gamma, "float32"), ops.cast(beta, "float32"), self.epsilon
        )
        return ops.cast(outputs, self.compute_dtype)

