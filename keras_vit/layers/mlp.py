"""The MLP's nonlinearities: `ACTIVATIONS` names them, `mlp_activation` computes them."""

from keras import ops

from keras_vit.layers import kernels

# "gelu_tanh": the original Flax checkpoints'; "gelu": exact (timm, DINOv2, OpenCLIP); "quick_gelu":
# x * sigmoid(1.702 x) (OpenAI's CLIP); "swiglu": silu(a) * b of the two halves of the first MLP layer
# (DINOv2's giant, timm's SwiGLUPacked).
ACTIVATIONS = ("gelu_tanh", "gelu", "quick_gelu", "swiglu")


def mlp_activation(x, activation):
    """The MLP's nonlinearity `activation` (one of `ACTIVATIONS`) applied to `x`.

    `"swiglu"` halves the last axis: `silu(first half) * second half`, as
    timm's `SwiGLUPacked`.

    Example:
    >>> import numpy as np
    >>> np.round(np.asarray(mlp_activation(np.array([1.0], "float32"), "quick_gelu")), 4).tolist()
    [0.8458]
    """
    if activation == "gelu_tanh":
        return kernels.gelu(x, approximate=True)
    if activation == "gelu":
        return kernels.gelu(x, approximate=False)
    if activation == "quick_gelu":
        return x * ops.sigmoid(1.702 * x)
    if activation == "swiglu":
        gate, value = ops.split(x, 2, axis=-1)
        return ops.silu(gate) * value
    raise ValueError(f"Unknown activation {activation!r}; expected one of {ACTIVATIONS}.")
