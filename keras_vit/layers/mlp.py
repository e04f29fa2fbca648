"""The MLP of an encoder block, `Mlp`, and its nonlinearities (`ACTIVATIONS`, computed by `mlp_activation`)."""

import keras
from keras import ops

from keras_vit.layers import kernels
from keras_vit.layers.parts import BlockPart

# "gelu_tanh": the original Flax checkpoints'; "gelu": exact (timm, DINOv2, OpenCLIP); "quick_gelu":
# x * sigmoid(1.702 x) (OpenAI's CLIP); "swiglu": silu(a) * b of the two halves of the first MLP layer
# (DINOv2's giant, timm's SwiGLUPacked); "geglu": gelu(a) * b, exact GELU, of the two halves (timm's GeGluMlp,
# ViTamin: its w0 then its w1); "geglu_tanh": the same with tanh-approximated GELU (Gemma 4's gate_proj, then
# its up_proj).
ACTIVATIONS = ("gelu_tanh", "gelu", "quick_gelu", "swiglu", "geglu", "geglu_tanh")
GATED = ("swiglu", "geglu", "geglu_tanh")  # the activations that halve the first layer's outputs


def mlp_activation(x, activation):
    """The MLP's nonlinearity `activation` (one of `ACTIVATIONS`) applied to `x`.

    `"swiglu"` halves the last axis: `silu(first half) * second half`, as
    timm's `SwiGLUPacked`; `"geglu"` likewise `gelu(first half) * second
    half`, exact GELU, as timm's `GeGluMlp`, and `"geglu_tanh"` with the
    tanh approximation (Gemma 4's `gelu(gate_proj x, "tanh") * up_proj x`).

    Example:
    >>> import numpy as np
    >>> np.round(np.asarray(mlp_activation(np.array([1.0], "float32"), "quick_gelu"), "float64"), 4).tolist()
    [0.8458]
    """
    if activation == "gelu_tanh":
        return kernels.gelu(x, approximate=True)
    if activation == "gelu":
        return kernels.gelu(x, approximate=False)
    if activation == "quick_gelu":
        return x * ops.sigmoid(1.702 * x)
    if activation in GATED:
        gate, value = ops.split(x, 2, axis=-1)
        if activation == "swiglu":
            return ops.silu(gate) * value
        return kernels.gelu(gate, approximate=activation == "geglu_tanh") * value
    raise ValueError(f"Unknown activation {activation!r}; expected one of {ACTIVATIONS}.")


class Mlp(BlockPart):
    """MLP(x) of a block: two dense layers with `switches.mlp_activation` between them, each followed by dropout.

    A gated activation (`GATED`) halves the first layer's `mlp_dim` outputs;
    the switch `mlp_hidden_norm` adds a norm before the second layer,
    `mlp_input_norm` one before the first (timm's `GeGluMlp`). `biases` says
    which of the two layers have one (a parallel block's output bias is
    its attention's).
    """

    def __init__(self, block, biases):
        super().__init__(block)
        self.biases = tuple(biases)
        self.mlp_dim = block.mlp_dim
        if self.switches.mlp_activation in GATED and self.mlp_dim % 2:
            kind = {"swiglu": "SwiGLU", "geglu": "GeGLU", "geglu_tanh": "GeGLU"}[self.switches.mlp_activation]
            raise ValueError(f"A {kind} MLP halves its mlp_dim, which must be even; got {self.mlp_dim}.")

    def build(self, token_shape):
        block, (hidden_bias, output_bias) = self.block, self.biases
        hidden_shape = (*token_shape[:-1], self.mlp_dim // 2 if self.switches.mlp_activation in GATED
                        else self.mlp_dim)
        if self.switches.mlp_input_norm:
            self.input_norm = self.norm("mlp_input_norm_layer", token_shape, name="mlp_input_norm")
        if self.switches.mlp_hidden_norm:
            self.hidden_norm = self.norm("mlp_hidden_norm_layer", hidden_shape, name="mlp_hidden_norm")

        def bias_initializer(seed_offset):
            return keras.initializers.RandomNormal(stddev=1e-6, seed=block.seed_for(seed_offset))

        self.hidden = self.dense(self.mlp_dim, "mlp_hidden", token_shape, 2, use_bias=hidden_bias,
                                 bias_initializer=bias_initializer(3))
        self.output = self.dense(token_shape[-1], "mlp_output", hidden_shape, 4, use_bias=output_bias,
                                 bias_initializer=bias_initializer(5))
        if self.switches.clipped_linears:  # Gemma 4's: the gate and the up projection each clamp their own
            self.clip_bounds("mlp_hidden", 2 if self.switches.mlp_activation in GATED else 1)
            self.clip_bounds("mlp_output", 1)
        self.hidden_dropout = self.dropout("mlp_hidden_dropout", block.dropout_rate, 8)
        self.output_dropout = self.dropout("mlp_output_dropout", block.dropout_rate, 9)

    def __call__(self, x, training):
        if self.switches.mlp_input_norm:
            x = self.input_norm(x)
        hidden = mlp_activation(self.project(self.hidden, x, "mlp_hidden"), self.switches.mlp_activation)
        hidden = self.apply_dropout(self.hidden_dropout, hidden, training)
        if self.switches.mlp_hidden_norm:
            hidden = self.hidden_norm(hidden)
        return self.apply_dropout(self.output_dropout, self.project(self.output, hidden, "mlp_output"), training)
