"""CaiT's class attention (Touvron et al., 2021): `ClassAttentionBlock`, a block in which the class token alone
attends to the patches.

In CaiT the patches go through the encoder blocks without a class token;
the class token then enters, and each class-attention block updates it
alone: `c = c + g1 * CA(LN([c, x]))` with the query from `c` and the keys
and values from `[c, x]`, then `c = c + g2 * MLP(LN(c))`, the patches
unchanged (timm's `LayerScaleBlockClassAttn` with `ClassAttn`). A sibling
of `keras_vit.layers.attention_pooling.AttentionPooling`: the same
quantizable sublayers and MLP nonlinearities.
"""

import keras
from keras import ops

from keras_vit.layers import kernels
from keras_vit.layers.blocks import _QuantizableSublayers
from keras_vit.layers.dense import Dense
from keras_vit.layers.mlp import ACTIVATIONS, GATED, mlp_activation
from keras_vit.layers.norm import LAYER_NORM_EPSILON, LayerNorm


def class_attention_weights(qkv_bias):
    """The names of a `ClassAttentionBlock`'s weights (with `qkv_bias`, the query's, key's and value's biases)."""
    projections = [f"{part}/{kind}" for part in ("query", "key", "value")
                   for kind in (("kernel", "bias") if qkv_bias else ("kernel",))]
    return projections + [f"{part}/{kind}" for part in ("attention_output", "mlp_hidden", "mlp_output")
                          for kind in ("kernel", "bias")] + [
        f"{norm}/{kind}" for norm in ("attention_norm", "mlp_norm") for kind in ("gamma", "beta")] + [
        "attention_layer_scale", "mlp_layer_scale"]


@keras.saving.register_keras_serializable(package="keras_vit")
class ClassAttentionBlock(_QuantizableSublayers, keras.layers.Layer):
    """One CaiT class-attention block on `(batch, 1 + patches, hidden)` tokens, the class token first: it gives the
    tokens back with the class token updated and the patches as they were.

    Its weights: `attention_norm`, `query`, `key`, `value` (biases with
    `qkv_bias`), `attention_output`, `attention_layer_scale`, `mlp_norm`,
    `mlp_hidden`, `mlp_output` and `mlp_layer_scale` (both scales start at
    `layer_scale`).

    Example:
    >>> import numpy as np
    >>> ClassAttentionBlock(num_heads=2, mlp_dim=32)(np.zeros((3, 5, 8))).shape
    (3, 5, 8)
    """

    def __init__(self, num_heads, mlp_dim, activation="gelu", qkv_bias=True, layer_scale=1e-4,
                 layer_norm_epsilon=LAYER_NORM_EPSILON, **kwargs):
        super().__init__(**kwargs)
        if activation not in ACTIVATIONS or activation in GATED:
            raise ValueError(f"Unknown class-attention activation {activation!r}; expected one of "
                             f"{[name for name in ACTIVATIONS if name not in GATED]}.")
        # === Config ===
        self.num_heads = int(num_heads)
        self.mlp_dim = int(mlp_dim)
        self.activation = activation
        self.qkv_bias = bool(qkv_bias)
        self.layer_scale = float(layer_scale)
        self.layer_norm_epsilon = float(layer_norm_epsilon)

    def build(self, input_shape):
        hidden_size = input_shape[-1]
        if hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {hidden_size} is not divisible by num_heads {self.num_heads}.")
        self.head_dim = hidden_size // self.num_heads

        def dense(units, name, use_bias=True):
            return Dense(units, use_bias=use_bias, name=name, dtype=self._sublayer_policy(name))

        def norm(name):
            return LayerNorm(epsilon=self.layer_norm_epsilon, name=name, dtype=self._sublayer_policy())

        self.attention_norm = norm("attention_norm")
        self.query, self.key, self.value = (dense(hidden_size, name, self.qkv_bias) for name in ("query", "key",
                                                                                                 "value"))
        self.attention_output = dense(hidden_size, "attention_output")
        self.mlp_norm = norm("mlp_norm")
        self.mlp_hidden = dense(self.mlp_dim, "mlp_hidden")
        self.mlp_output = dense(hidden_size, "mlp_output")
        tokens, one = tuple(input_shape), (input_shape[0], 1, hidden_size)
        for layer in (self.attention_norm, self.key, self.value):
            layer.build(tokens)
        for layer in (self.query, self.attention_output, self.mlp_norm, self.mlp_hidden):
            layer.build(one)
        self.mlp_output.build((input_shape[0], 1, self.mlp_dim))
        scale = keras.initializers.Constant(self.layer_scale)
        self.attention_layer_scale = self.add_weight(name="attention_layer_scale", shape=(hidden_size,),
                                                     initializer=scale)
        self.mlp_layer_scale = self.add_weight(name="mlp_layer_scale", shape=(hidden_size,), initializer=scale)

    def call(self, tokens):
        batch, count = ops.shape(tokens)[0], ops.shape(tokens)[1]
        normed = self.attention_norm(tokens)
        query = ops.reshape(self.query(normed[:, :1]), (batch, 1, self.num_heads, self.head_dim))
        key, value = (ops.reshape(layer(normed), (batch, count, self.num_heads, self.head_dim))
                      for layer in (self.key, self.value))
        context = ops.reshape(kernels.attention(query, key, value), (batch, 1, self.num_heads * self.head_dim))
        cls = tokens[:, :1]
        cls = cls + self.attention_output(context) * ops.cast(self.attention_layer_scale, cls.dtype)
        mlp = self.mlp_output(mlp_activation(self.mlp_hidden(self.mlp_norm(cls)), self.activation))
        cls = cls + mlp * ops.cast(self.mlp_layer_scale, cls.dtype)
        return ops.concatenate([cls, tokens[:, 1:]], axis=1)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        config = super().get_config()
        config.update(num_heads=self.num_heads, mlp_dim=self.mlp_dim, activation=self.activation,
                      qkv_bias=self.qkv_bias, layer_scale=self.layer_scale,
                      layer_norm_epsilon=self.layer_norm_epsilon)
        return self._with_quantized_sublayers(config)
