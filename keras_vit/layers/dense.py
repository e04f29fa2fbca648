"""The projections of a ViT's blocks: Keras' `Dense`, computed by `keras_vit.layers.kernels.linear`."""

import keras

from keras_vit.layers import kernels


@keras.saving.register_keras_serializable(package="keras_vit")
class Dense(keras.layers.Dense):
    """Keras' `Dense` (same weights, LoRA, `quantize`, config), with its product and bias in one call.

    Its unquantized call is `kernels.linear(inputs, kernel, bias)`: on
    PyTorch torch's fused `linear`, elsewhere Keras' own product and
    addition. A quantized layer keeps Keras' quantized call.

    Example:
    >>> import numpy as np
    >>> layer = Dense(4, kernel_initializer="ones", bias_initializer="ones")
    >>> np.asarray(layer(np.ones((2, 3), "float32"))).tolist()
    [[4.0, 4.0, 4.0, 4.0], [4.0, 4.0, 4.0, 4.0]]
    """

    def call(self, inputs, training=None):
        outputs = kernels.linear(inputs, self.kernel, self.bias)
        return outputs if self.activation is None else self.activation(outputs)

    def quantize(self, mode=None, type_check=True, config=None):
        # Keras refuses to quantize subclasses of Dense, whose call may compute something else; this one's
        # quantized call is Keras' own (Operation.__call__ dispatches to quantized_call), so it is safe.
        return super().quantize(mode, type_check=False, config=config)
