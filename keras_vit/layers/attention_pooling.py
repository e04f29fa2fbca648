"""Multi-head attention pooling (MAP): the pooling head of SigLIP and timm's `AttentionPoolLatent`.

A sibling of `keras_vit.layers.blocks.TransformerBlock`: the same quantizable
sublayers and the same MLP nonlinearities, over one learned probe.
"""

import keras
from keras import ops

from keras_vit.layers import kernels
from keras_vit.layers.blocks import _QuantizableSublayers
from keras_vit.layers.dense import Dense
from keras_vit.layers.mlp import ACTIVATIONS, GATED, mlp_activation
from keras_vit.layers.norm import LAYER_NORM_EPSILON, LayerNorm


@keras.saving.register_keras_serializable(package="keras_vit")
class AttentionPooling(_QuantizableSublayers, keras.layers.Layer):
    """Multi-head attention pooling (MAP): a learned probe attends over the tokens, then a residual MLP.

    The pooling head of SigLIP (big_vision's `MAPHead`, timm's
    `AttentionPoolLatent` with one latent): the probe's query attends over
    the patch tokens (`query`, `key_value` projections, `attention_output`;
    the first `num_prefix_tokens` are left out, as timm does, and so are
    the tokens where `token_mask`, a NaFlex batch's, is False), and
    `x + MLP(LN(x))` follows. Input `(batch, tokens, hidden)`, output
    `(batch, hidden)`.

    Example:
    >>> import numpy as np
    >>> AttentionPooling(num_heads=2, mlp_dim=32)(np.zeros((3, 5, 8))).shape
    (3, 8)
    """

    def __init__(self, num_heads, mlp_dim, activation="gelu", qkv_bias=True, layer_norm_epsilon=LAYER_NORM_EPSILON,
                 num_prefix_tokens=0, **kwargs):
        super().__init__(**kwargs)
        if activation not in ACTIVATIONS or activation in GATED:
            raise ValueError(f"Unknown attention-pooling activation {activation!r}; expected one of "
                             f"{[name for name in ACTIVATIONS if name not in GATED]}.")
        # === Config ===
        self.num_heads = int(num_heads)
        self.mlp_dim = int(mlp_dim)
        self.activation = activation
        self.qkv_bias = bool(qkv_bias)
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.num_prefix_tokens = int(num_prefix_tokens)

    def build(self, input_shape):
        hidden_size = input_shape[-1]
        if hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {hidden_size} is not divisible by num_heads {self.num_heads}.")
        self.head_dim = hidden_size // self.num_heads
        policy = dict(dtype=self._sublayer_policy())
        self.probe = self.add_weight(name="probe", shape=(1, 1, hidden_size),
                                     initializer=keras.initializers.TruncatedNormal(stddev=hidden_size**-0.5))
        def dense(units, name, use_bias=True):
            return Dense(units, use_bias=use_bias, name=name, dtype=self._sublayer_policy(name))

        self.query = dense(hidden_size, "query", self.qkv_bias)
        self.key_value = dense(2 * hidden_size, "key_value", self.qkv_bias)
        self.attention_output = dense(hidden_size, "attention_output")
        self.mlp_norm = LayerNorm(epsilon=self.layer_norm_epsilon, name="mlp_norm", **policy)
        self.mlp_hidden = dense(self.mlp_dim, "mlp_hidden")
        self.mlp_output = dense(hidden_size, "mlp_output")
        one = (input_shape[0], 1, hidden_size)
        self.query.build(one)
        self.key_value.build(tuple(input_shape))
        for layer in (self.attention_output, self.mlp_norm, self.mlp_hidden):
            layer.build(one)
        self.mlp_output.build((input_shape[0], 1, self.mlp_dim))

    def call(self, tokens, token_mask=None):
        tokens = tokens[:, self.num_prefix_tokens:]
        key_mask = None if token_mask is None else token_mask[:, self.num_prefix_tokens:]
        batch, count = ops.shape(tokens)[0], ops.shape(tokens)[1]
        probe = ops.broadcast_to(ops.cast(self.probe, tokens.dtype), (batch, 1, ops.shape(self.probe)[-1]))
        query = ops.reshape(self.query(probe), (batch, 1, self.num_heads, self.head_dim))
        key, value = (ops.reshape(part, (batch, count, self.num_heads, self.head_dim))
                      for part in ops.split(self.key_value(tokens), 2, axis=-1))
        context = ops.reshape(kernels.attention(query, key, value, key_mask), (batch, 1, self.num_heads * self.head_dim))
        x = self.attention_output(context)
        x = x + self.mlp_output(mlp_activation(self.mlp_hidden(self.mlp_norm(x)), self.activation))
        return x[:, 0]

    def compute_output_shape(self, tokens_shape, token_mask_shape=None):
        return (tokens_shape[0], tokens_shape[-1])

    def get_config(self):
        config = super().get_config()
        config.update(num_heads=self.num_heads, mlp_dim=self.mlp_dim, activation=self.activation,
                      qkv_bias=self.qkv_bias, layer_norm_epsilon=self.layer_norm_epsilon,
                      num_prefix_tokens=self.num_prefix_tokens)
        return self._with_quantized_sublayers(config)
