"""The Transformer encoder block and the attention-pooling head, the two layers of a ViT that attend.

`TransformerBlock` is one pre-LayerNorm encoder block (paper Eq. 2-3) with
the switches of timm's ViT family (layer scale, query/key normalisation,
an optional qkv bias, GELU, QuickGELU or SwiGLU); `AttentionPooling` is the
multi-head attention pooling (MAP) head of SigLIP, timm's
`AttentionPoolLatent`. Both use `keras.ops` only; how attention and
LayerNorm are differentiated on each platform is `keras_vit.layers.kernels`'.
"""

import functools
import math

import keras
from keras import ops

from keras_vit.layers import kernels
from keras_vit.layers import rope as rope_module
from keras_vit.layers.dense import Dense
from keras_vit.layers.mlp import ACTIVATIONS, mlp_activation
from keras_vit.layers.norm import LAYER_NORM_EPSILON, NORMALIZATIONS, norm_layer
from keras_vit.utils.keras_internals import stored_kernel, sublayers


class _QuantizableSublayers:
    """Sublayers that `model.quantize("int8")` changed are rebuilt quantized when a `.keras` file is loaded."""

    def _sublayer_policy(self, name=None):
        """The dtype policy of sublayer `name`: the block's own, or a quantized one its saved config names.

        A block reloaded after `quantize` has a `DTypePolicyMap`; each sublayer
        gets its own entry as a plain policy, which Keras' Dense saves and
        reloads correctly (it does not look a map up when it saves).
        """
        policy = self.dtype_policy
        if not isinstance(policy, keras.dtype_policies.DTypePolicyMap):
            return policy
        return policy.default_policy if name is None else policy[f"{self.path}/{name}"]

    def _with_quantized_sublayers(self, config):
        # A quantized dense layer (after `model.quantize("int8")`) is rebuilt quantized on loading only if
        # the block's config says so: Keras' DTypePolicyMap, keyed by the sublayers' paths.
        quantized = {layer.path: layer.dtype_policy for layer in sublayers(self, include_self=False)
                     if layer.quantization_mode is not None}
        if quantized:
            own = self.dtype_policy
            default = own.default_policy if isinstance(own, keras.dtype_policies.DTypePolicyMap) else own
            policies = keras.dtype_policies.DTypePolicyMap(default_policy=default)
            for path, policy in quantized.items():
                policies[path] = policy
            config["dtype"] = keras.dtype_policies.serialize(policies)
        return config


@keras.saving.register_keras_serializable(package="keras_vit")
class ZeroKeyBias(keras.constraints.Constraint):
    """Keeps the middle third of a fused q/k/v bias, the keys', at zero after every update (EVA's zero `k_bias`).

    Without RoPE a key bias cannot change attention; with RoPE it can, so a
    model whose checkpoint has none must not learn one.
    """

    def __call__(self, bias):
        third = bias.shape[-1] // 3
        mask = ops.concatenate([ops.ones((third,)), ops.zeros((third,)), ops.ones((third,))])
        return bias * ops.cast(mask, bias.dtype)


@keras.saving.register_keras_serializable(package="keras_vit")
class TransformerBlock(_QuantizableSublayers, keras.layers.Layer):
    """One pre-LayerNorm Transformer encoder block (paper Eq. 2-3).

    `x + MSA(LN(x))` then `x + MLP(LN(x))`, with LayerNorm epsilon 1e-6, a
    GELU MLP (tanh approximation by default, as the original Flax models),
    dropout after every dense layer except q/k/v, optional dropout on the
    attention probabilities and optional stochastic depth on both residual
    branches. q, k and v are one fused projection (`qkv_bias=False`: without
    bias). `activation` is one of `keras_vit.model.architecture.ACTIVATIONS`
    (`"swiglu"` halves the first MLP layer's `mlp_dim` outputs);
    `qk_norm=True` normalises each head's queries and keys (each half, with
    differential attention); `layer_scale` (an initial value) scales both
    residual branches by learned per-channel factors. `post_norm=True` normalises each branch's output
    instead of its input, `x + LN(MSA(x))` then `x + LN(MLP(x))` (timm's
    `ResPostBlock`). `attention_output_norm` and `mlp_hidden_norm` add a
    LayerNorm before the attention's output projection and before the second
    MLP layer (timm's `scale_attn_norm` and `scale_mlp_norm`, BEiT-3's).
    `normalization="rms_norm"` makes every norm an RMSNorm and
    `projection_bias=False` drops the biases of the attention output and
    both MLP layers (AIMv2). `differential_attention=True` computes each
    head as the difference of two softmax maps (timm's `DiffAttention`,
    whose offset depends on the block's `layer_index`); its attention
    weights are the combined map. `parallel=True` adds attention and the
    MLP, both on one LayerNorm of the input, under one layer scale (timm's
    `ParallelScalingBlock`). `rope` (a form of `keras_vit.layers.rope.ROPE_FORMS`)
    rotates queries and keys by the token positions the block is called
    with (`rope_positions`, from `keras_vit.layers.rope.RotaryPositions`);
    `key_bias=False` keeps the key part of the q/k/v bias at zero (EVA's
    `q_bias` and `v_bias`). Attention is
    `keras_vit.layers.kernels.attention`, except when its weights are asked for
    (`return_attention_weights=True`) or attention dropout is active: then
    it is computed as explicit einsums, which expose the weights.

    Example:
    >>> import numpy as np
    >>> block = TransformerBlock(num_heads=4, mlp_dim=128)
    >>> out, weights = block(np.zeros((2, 17, 64)), return_attention_weights=True)
    >>> out.shape, weights.shape
    ((2, 17, 64), (2, 4, 17, 17))
    """

    def __init__(
        self,
        num_heads,
        mlp_dim,
        dropout_rate=0.0,
        attention_dropout_rate=0.0,
        stochastic_depth_rate=0.0,
        approximate_gelu=None,
        seed=None,
        lora_rank=None,
        lora_targets=(),
        layer_norm_epsilon=LAYER_NORM_EPSILON,
        activation=None,
        qkv_bias=True,
        qk_norm=False,
        layer_scale=None,
        post_norm=False,
        attention_output_norm=False,
        mlp_hidden_norm=False,
        normalization="layer_norm",
        projection_bias=True,
        differential_attention=False,
        layer_index=0,
        parallel=False,
        rope=None,
        rope_temperature=10000.0,
        rope_rotate_half=False,
        key_bias=True,
        **kwargs,
    ):
        super().__init__(**kwargs)
        # === Config ===
        self.num_heads = int(num_heads)
        self.layer_norm_epsilon = float(layer_norm_epsilon)  # 1e-12 in transformers' google/vit-* files
        self.lora_rank = lora_rank  # LoRA adapters on the dense layers named in lora_targets (keras_vit.enable_lora)
        self.lora_targets = tuple(lora_targets)
        self.mlp_dim = int(mlp_dim)
        self.dropout_rate = float(dropout_rate)
        self.attention_dropout_rate = float(attention_dropout_rate)
        self.stochastic_depth_rate = float(stochastic_depth_rate)
        if activation is None:  # approximate_gelu: the option of keras_vit 0.x, kept for its .keras files.
            activation = "gelu" if approximate_gelu is False else "gelu_tanh"
        if activation not in ACTIVATIONS:
            raise ValueError(f"Unknown activation {activation!r}; expected one of {ACTIVATIONS}.")
        if activation == "swiglu" and self.mlp_dim % 2:
            raise ValueError(f"A SwiGLU MLP halves its mlp_dim, which must be even; got {self.mlp_dim}.")
        self.activation = activation
        self.qkv_bias = bool(qkv_bias)
        self.qk_norm = bool(qk_norm)
        self.layer_scale = None if layer_scale is None else float(layer_scale)
        self.post_norm = bool(post_norm)
        self.attention_output_norm = bool(attention_output_norm)
        self.mlp_hidden_norm = bool(mlp_hidden_norm)
        if normalization not in NORMALIZATIONS:
            raise ValueError(f"Unknown normalization {normalization!r}; expected one of {NORMALIZATIONS}.")
        self.normalization = normalization
        self.projection_bias = bool(projection_bias)
        self.differential_attention = bool(differential_attention)
        self.layer_index = int(layer_index)
        self.parallel = bool(parallel)
        if self.parallel and (self.post_norm or self.attention_output_norm or self.mlp_hidden_norm):
            raise ValueError("parallel=True is not supported with post_norm, attention_output_norm or "
                             "mlp_hidden_norm (timm's parallel blocks have none of them).")
        if rope is not None and rope not in rope_module.ROPE_FORMS:
            raise ValueError(f"Unknown rope {rope!r}; expected one of {rope_module.ROPE_FORMS} or None.")
        self.rope = rope
        self.rope_temperature = float(rope_temperature)
        self.rope_rotate_half = bool(rope_rotate_half)
        if rope == "mixed" and self.rope_rotate_half:
            raise ValueError("Mixed RoPE rotates interleaved pairs; rope_rotate_half=True is not supported with it.")
        self.key_bias = bool(key_bias)
        self.seed = seed
        for name in ("dropout_rate", "attention_dropout_rate", "stochastic_depth_rate"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}.")

    @property
    def approximate_gelu(self):
        """Whether the MLP computes the tanh-approximated GELU."""
        return self.activation == "gelu_tanh"

    def build(self, input_shape):
        hidden_size = input_shape[-1]
        if hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size {hidden_size} is not divisible by num_heads {self.num_heads}."
            )
        self.head_dim = hidden_size // self.num_heads
        if self.differential_attention and self.head_dim % 2:
            raise ValueError(f"Differential attention halves each head's queries and keys, so the head width "
                             f"{self.head_dim} (hidden_size / num_heads) must be even.")
        plain = dict(dtype=self._sublayer_policy())  # Norms and dropouts: never quantized.
        # Glorot over each of q, k and v (fan D -> D), as the original's three
        # separate projections, although they are stored as one (D, 3D) kernel.
        qkv_init = keras.initializers.VarianceScaling(2.0, "fan_avg", "uniform", seed=self._seed(0))
        self.attention_norm = self._norm("attention_norm", plain)
        self.qkv = Dense(
            3 * hidden_size, kernel_initializer=qkv_init, use_bias=self.qkv_bias, name="qkv",
            dtype=self._sublayer_policy("qkv"), lora_rank=self._lora("qkv"),
            bias_constraint=None if self.key_bias else ZeroKeyBias(),
        )
        if self.rope and self.head_dim % 4:
            raise ValueError(f"RoPE rotates pairs of each axis' quarter of a head, so the head width {self.head_dim} "
                             "(hidden_size / num_heads) must be a multiple of 4.")
        if self.rope == "mixed":  # learned, per head: (2 axes, heads, head_dim / 2)
            initial = rope_module.initial_mixed_frequencies(self.num_heads, self.head_dim, self.rope_temperature,
                                                            self._seed(12))
            self.rope_frequencies = self.add_weight(name="rope_frequencies", shape=initial.shape, autocast=False,
                                                    initializer=lambda shape, dtype=None: ops.cast(initial, dtype))
        elif self.rope:
            self.rope_frequencies = rope_module.rope_frequencies(self.rope, self.head_dim, self.rope_temperature)
        if self.qk_norm:
            self.query_norm = self._norm("query_norm", plain)
            self.key_norm = self._norm("key_norm", plain)
        hidden_width = self.mlp_dim // 2 if self.activation == "swiglu" else self.mlp_dim
        if self.attention_output_norm:
            self.attention_output_norm_layer = self._norm("attention_output_norm", plain)
            self.attention_output_norm_layer.build(tuple(input_shape))
        if self.mlp_hidden_norm:
            self.mlp_hidden_norm_layer = self._norm("mlp_hidden_norm", plain)
            self.mlp_hidden_norm_layer.build((*tuple(input_shape)[:-1], hidden_width))
        self.attention_output = Dense(
            hidden_size,
            kernel_initializer=keras.initializers.GlorotUniform(seed=self._seed(1)),
            use_bias=self.projection_bias,
            name="attention_output",
            dtype=self._sublayer_policy("attention_output"),
            lora_rank=self._lora("attention_output"),
        )
        if not self.parallel:
            self.mlp_norm = self._norm("mlp_norm", plain)
        # A parallel block's MLP input layer always has its bias (timm's mlp_bias), and its one output bias is the
        # attention output's.
        self.mlp_hidden = self._mlp_dense(self.mlp_dim, "mlp_hidden", 2, self.projection_bias or self.parallel)
        self.mlp_output = self._mlp_dense(hidden_size, "mlp_output", 4, self.projection_bias and not self.parallel)
        # Attention probabilities stay float32 (softmax precision), whatever the policy.
        self.attention_dropout = keras.layers.Dropout(
            self.attention_dropout_rate, seed=self._seed(6), dtype="float32"
        )
        self.output_dropout = keras.layers.Dropout(self.dropout_rate, seed=self._seed(7), **plain)
        self.mlp_hidden_dropout = keras.layers.Dropout(self.dropout_rate, seed=self._seed(8), **plain)
        self.mlp_output_dropout = keras.layers.Dropout(self.dropout_rate, seed=self._seed(9), **plain)
        if self.stochastic_depth_rate:
            self.stochastic_depth_seed = keras.random.SeedGenerator(self._seed(10))

        token_shape = tuple(input_shape)
        self.attention_norm.build(token_shape)
        self.qkv.build(token_shape)
        self.attention_output.build(token_shape)
        if not self.parallel:
            self.mlp_norm.build(token_shape)
        self.mlp_hidden.build(token_shape)
        self.mlp_output.build((*token_shape[:-1], self.mlp_dim // 2 if self.activation == "swiglu" else self.mlp_dim))
        if self.qk_norm:  # differential attention normalises each half-width query and key (timm's DiffAttention)
            heads = (self.num_heads, 2, self.head_dim // 2) if self.differential_attention else (self.num_heads,
                                                                                                  self.head_dim)
            self.query_norm.build((*token_shape[:-1], *heads))
            self.key_norm.build((*token_shape[:-1], *heads))
        if self.differential_attention:
            # timm's DiffAttention: lambda = exp(q1 . k1) - exp(q2 . k2) + lambda_init, and an RMSNorm (1e-5) per head.
            for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
                setattr(self, name, self.add_weight(
                    name=name, shape=(self.head_dim // 2,), autocast=False,
                    initializer=keras.initializers.RandomNormal(stddev=0.1, seed=self._seed(11)),
                ))
            self.attention_sub_norm = norm_layer("rms_norm", 1e-5, name="attention_sub_norm", **plain)
            self.attention_sub_norm.build((*token_shape[:-1], self.num_heads, self.head_dim))
        if self.layer_scale is not None and self.parallel:  # one scale on the sum of both branches
            self.branch_layer_scale = self.add_weight(name="layer_scale", shape=(hidden_size,),
                                                      initializer=keras.initializers.Constant(self.layer_scale))
        elif self.layer_scale is not None:
            scale = keras.initializers.Constant(self.layer_scale)
            self.attention_layer_scale = self.add_weight(name="attention_layer_scale", shape=(hidden_size,),
                                                         initializer=scale)
            self.mlp_layer_scale = self.add_weight(name="mlp_layer_scale", shape=(hidden_size,), initializer=scale)
        if self.lora_rank:
            self.freeze_all_but_lora()

    def _lora(self, name):
        return self.lora_rank if name in self.lora_targets else None

    def freeze_all_but_lora(self):
        """Train only the LoRA adapters: every sublayer, and the adapted layers' kernels and biases, frozen."""
        for layer in sublayers(self, include_self=False):
            layer.trainable = getattr(layer, "lora_enabled", False)  # The setter also resets its variables.
            if layer.trainable:
                stored_kernel(layer).trainable = False
                if layer.bias is not None:
                    layer.bias.trainable = False

    def _seed(self, offset):
        """Distinct seeds per random op, so that equal seeds give unequal masks."""
        return None if self.seed is None else self.seed + offset

    def _norm(self, name, plain):
        return norm_layer(self.normalization, self.layer_norm_epsilon, name=name, **plain)

    def _mlp_dense(self, units, name, seed_offset, use_bias):
        return Dense(
            units, use_bias=use_bias, kernel_initializer=keras.initializers.GlorotUniform(seed=self._seed(seed_offset)),
            bias_initializer=keras.initializers.RandomNormal(stddev=1e-6, seed=self._seed(seed_offset + 1)),
            name=name, dtype=self._sublayer_policy(name), lora_rank=self._lora(name),
        )

    def _self_attention(self, x, training, return_weights, positions=None):
        """MSA(x): multi-head self-attention, its output projection and dropout."""
        batch, tokens = ops.shape(x)[0], ops.shape(x)[1]
        # Split the fused projection on its last axis, then reshape each part, rather than
        # reshaping to (..., 3, heads, dim) and slicing: TensorFlow trains better this way
        # (see benchmarks/README.md).
        heads = (batch, tokens, self.num_heads, self.head_dim)
        query, key, value = (ops.reshape(part, heads) for part in ops.split(self.qkv(x), 3, axis=-1))
        if self.qk_norm and not self.differential_attention:
            query, key = self.query_norm(query), self.key_norm(key)
        if self.rope:
            if positions is None:
                raise ValueError(f"{self.name} rotates queries and keys (rope={self.rope!r}): call it with "
                                 "rope_positions, the RotaryPositions of its tokens.")
            frequencies = self.rope_frequencies
            if not isinstance(frequencies, keras.Variable):
                frequencies = ops.convert_to_tensor(frequencies)
            query, key = rope_module.rotate_queries_and_keys(query, key, positions, frequencies,
                                                             self.rope_rotate_half)
        if self.differential_attention:
            context, weights = self._differential_attention(query, key, value, training)
            weights = weights if return_weights else None
        elif return_weights or (training and self.attention_dropout_rate > 0):
            context, weights = self._attention_with_weights(query, key, value, training)
        else:
            context, weights = kernels.attention(query, key, value), None
        context = ops.reshape(context, (batch, tokens, self.num_heads * self.head_dim))
        if self.attention_output_norm:
            context = self.attention_output_norm_layer(context)
        return self._dropout(self.output_dropout, self.attention_output(context), training), weights

    @property
    def lambda_init(self):
        """Differential attention's depth-dependent offset of lambda, as timm's `DiffAttention.set_lambda_init`."""
        return 0.8 - 0.6 * math.exp(-0.3 * self.layer_index)

    def _differential_attention(self, query, key, value, training):
        """Differential attention (Ye et al., 2024): per head, the softmax of its second half-width query/key pair,
        scaled by lambda, is subtracted from the first's; the combined map weighs the full-width values, then an
        RMSNorm per head and `1 - lambda_init` scale the result. Returns the context and the combined map."""
        batch, tokens = ops.shape(query)[0], ops.shape(query)[1]
        half = self.head_dim // 2
        pairs = (batch, tokens, self.num_heads, 2, half)
        query, key = ops.reshape(query, pairs), ops.reshape(key, pairs)
        if self.qk_norm:
            query, key = self.query_norm(query), self.key_norm(key)
        logits = ops.einsum("bqhpd,bkhpd->bhpqk", query * ops.cast(1.0 / math.sqrt(half), query.dtype), key)
        maps = self._dropout(self.attention_dropout, ops.softmax(ops.cast(logits, "float32"), axis=-1), training)
        first, second = ops.sum(self.lambda_q1 * self.lambda_k1), ops.sum(self.lambda_q2 * self.lambda_k2)
        lambda_full = ops.exp(first) - ops.exp(second) + self.lambda_init
        combined = maps[:, :, 0] - ops.cast(lambda_full, "float32") * maps[:, :, 1]
        context = ops.einsum("bhqk,bkhd->bqhd", ops.cast(combined, value.dtype), value)
        context = self.attention_sub_norm(context) * ops.cast(1.0 - self.lambda_init, context.dtype)
        return ops.cast(context, value.dtype), combined

    def _attention_with_weights(self, query, key, value, training):
        """Attention as explicit einsums, returning its float32 weights (before dropout)."""
        scale = 1.0 / math.sqrt(self.head_dim)
        logits = ops.einsum("bqhd,bkhd->bhqk", query * ops.cast(scale, query.dtype), key)
        weights = ops.softmax(ops.cast(logits, "float32"), axis=-1)
        dropped = self._dropout(self.attention_dropout, weights, training)
        return ops.einsum("bhqk,bkhd->bqhd", ops.cast(dropped, value.dtype), value), weights

    def _mlp(self, x, training):
        """MLP(x): two dense layers with the activation between them, each followed by dropout."""
        hidden = mlp_activation(self.mlp_hidden(x), self.activation)
        hidden = self._dropout(self.mlp_hidden_dropout, hidden, training)
        if self.mlp_hidden_norm:
            hidden = self.mlp_hidden_norm_layer(hidden)
        return self._dropout(self.mlp_output_dropout, self.mlp_output(hidden), training)

    @staticmethod
    def _dropout(layer, x, training):
        """`layer(x)`, skipped where it is the identity (inference, or rate 0).

        The same result as calling it, cast to the layer's compute dtype as
        its call would (on PyTorch a symbolic `Dense` under mixed precision
        gives float32); there, where Keras runs eagerly, each skipped call
        saves a `Layer.__call__` (a third of a block's).
        """
        if training and layer.rate:
            return layer(x, training=training)
        return ops.cast(x, layer.compute_dtype)

    def _drop_path(self, residual, training):
        """Stochastic depth: drop the whole branch for random samples."""
        if not (training and self.stochastic_depth_rate):
            return residual
        keep = 1.0 - self.stochastic_depth_rate
        shape = (ops.shape(residual)[0], 1, 1)
        mask = keras.random.uniform(shape, seed=self.stochastic_depth_seed) < keep
        return residual * ops.cast(mask, residual.dtype) / ops.cast(keep, residual.dtype)

    def _scaled(self, branch, name):
        """A residual branch times its layer scale, where the block has one."""
        if self.layer_scale is None:
            return branch
        return branch * ops.cast(getattr(self, name), branch.dtype)

    def call(self, inputs, rope_positions=None, training=None, return_attention_weights=False):
        attend = functools.partial(self._self_attention, training=training, return_weights=return_attention_weights,
                                   positions=rope_positions)
        if self.parallel:  # x + MSA(LN(x)) + MLP(LN(x)), one layer scale on the sum (ViT-22B's parallel block)
            normed = self.attention_norm(inputs)
            attended, weights = attend(normed)
            x, mlp = inputs, self._scaled(attended + self._mlp(normed, training), "branch_layer_scale")
        elif self.post_norm:  # x + LN(MSA(x)), then x + LN(MLP(x))
            attended, weights = attend(inputs)
            x = inputs + self._drop_path(self._scaled(self.attention_norm(attended), "attention_layer_scale"), training)
            mlp = self._scaled(self.mlp_norm(self._mlp(x, training)), "mlp_layer_scale")
        else:
            # Eq. 2: z' = MSA(LN(z)) + z
            attended, weights = attend(self.attention_norm(inputs))
            x = inputs + self._drop_path(self._scaled(attended, "attention_layer_scale"), training)
            # Eq. 3: z = MLP(LN(z')) + z'
            mlp = self._scaled(self._mlp(self.mlp_norm(x), training), "mlp_layer_scale")
        outputs = x + self._drop_path(mlp, training)
        if return_attention_weights:
            return outputs, weights
        return outputs

    def get_config(self):
        config = super().get_config()
        config.update(
            num_heads=self.num_heads,
            mlp_dim=self.mlp_dim,
            dropout_rate=self.dropout_rate,
            attention_dropout_rate=self.attention_dropout_rate,
            stochastic_depth_rate=self.stochastic_depth_rate,
            activation=self.activation,
            seed=self.seed,
            layer_norm_epsilon=self.layer_norm_epsilon,
        )
        # The switches of timm's ViT family, kept out of the paper model's config (older keras_vit reads it).
        if not self.qkv_bias:
            config.update(qkv_bias=False)
        if self.qk_norm:
            config.update(qk_norm=True)
        if self.layer_scale is not None:
            config.update(layer_scale=self.layer_scale)
        if self.post_norm:
            config.update(post_norm=True)
        if self.attention_output_norm:
            config.update(attention_output_norm=True)
        if self.mlp_hidden_norm:
            config.update(mlp_hidden_norm=True)
        if self.normalization != "layer_norm":
            config.update(normalization=self.normalization)
        if not self.projection_bias:
            config.update(projection_bias=False)
        if self.differential_attention:
            config.update(differential_attention=True, layer_index=self.layer_index)
        if self.parallel:
            config.update(parallel=True)
        if self.rope:
            config.update(rope=self.rope, rope_temperature=self.rope_temperature, rope_rotate_half=self.rope_rotate_half)
        if not self.key_bias:
            config.update(key_bias=False)
        if self.lora_rank:
            config.update(lora_rank=self.lora_rank, lora_targets=list(self.lora_targets))
        return self._with_quantized_sublayers(config)
