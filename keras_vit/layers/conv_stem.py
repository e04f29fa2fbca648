"""MobileCLIP's convolutional stem (timm's `ConvStem` in `vit_base_mci_224`), before the patch embedding.

Two patchifying convolutions without bias, each followed by BatchNorm and
exact GELU: 4x4 with stride 4, then 2x2 with stride 2. The patch
embedding (a 2x2 convolution with bias, timm's third `ConvStem` layer,
whose `HybridEmbed` has no projection of its own) follows, so one token
spans 16 pixels. BatchNorm keeps timm's epsilon (1e-5) and momentum (0.1,
Keras' 0.9).

Example:
>>> import keras
>>> images = keras.Input((32, 32, 3))
>>> tuple(apply_conv_stem(images, (8, 8)).shape)
(None, 4, 4, 8)
"""

import keras

from keras_vit.layers import kernels

KERNELS = (4, 2)  # each also its stride; their product is `keras_vit.model.variants.CONV_STEM_STRIDE`
BATCH_NORM_EPSILON = 1e-5


@keras.saving.register_keras_serializable(package="keras_vit")
class ExactGELU(keras.layers.Layer):
    """Exact GELU as `keras_vit.layers.kernels.gelu` computes it (on TensorFlow through erf, which ONNX exports).

    Example:
    >>> import numpy as np
    >>> [round(float(value), 4) for value in np.asarray(ExactGELU()(np.array([1.0], "float32")))]
    [0.8413]
    """

    def call(self, inputs):
        return kernels.gelu(inputs, approximate=False)

    def get_config(self):  # written out: Keras' generated config refuses the dtype policy a bfloat16 model passes
        return super().get_config()


def apply_conv_stem(images, widths, dtype=None):
    """Run the stem (`widths`: each convolution's output channels) on a Keras tensor of images, in `dtype`."""
    assert len(widths) == len(KERNELS)
    x = images
    for index, (width, kernel) in enumerate(zip(widths, KERNELS)):
        x = keras.layers.Conv2D(int(width), kernel, strides=kernel, use_bias=False, name=f"conv_stem_{index}",
                                dtype=dtype)(x)
        x = keras.layers.BatchNormalization(epsilon=BATCH_NORM_EPSILON, momentum=0.9,
                                            name=f"conv_stem_{index}_norm", dtype=dtype)(x)
        x = ExactGELU(name=f"conv_stem_{index}_gelu", dtype=dtype)(x)
    return x
