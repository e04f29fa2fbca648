"""The layers a Vision Transformer is made of.

`PatchEmbedding` cuts an image into patches and projects them, `ClassToken`
prepends the learned [class] token, `AddPositionEmbedding` adds learned
position embeddings (resizing them when the grid changes),
`TransformerBlock` is one pre-LayerNorm encoder block (paper Eq. 2-3) with
its `LayerNorm`, and `TokenPooling` reduces the tokens to one vector for the
head. Every layer uses `keras.ops` only, so it runs on JAX, TensorFlow and
PyTorch alike, and every weight keeps the layout of the original Flax
checkpoints. How attention and LayerNorm are differentiated on each platform
is `keras_vit.kernels`' business, not the layers'.
"""

import math

import keras
from keras import ops

from keras_vit import kernels
from keras_vit.position_embedding import AddPositionEmbedding, as_pair  # noqa: F401 (re-exported: a ViT layer)

LAYER_NORM_EPSILON = 1e-6
# The precisions a ViT runs in (`dtype=`): float32, half precision, or mixed (float32 weights).
PRECISIONS = ("float32", "bfloat16", "mixed_bfloat16", "float16", "mixed_float16")


@keras.saving.register_keras_serializable(package="keras_vit")
class PatchEmbedding(keras.layers.Layer):
    """Split images into non-overlapping patches and project each to a vector.

    A `patch_size`-strided convolution with bias, as in the original model.
    Input `(batch, height, width, channels)` with height and width divisible
    by `patch_size`; output `(batch, (height // P) * (width // P), hidden_size)`
    in row-major patch order, or the grid `(batch, height // P, width // P,
    hidden_size)` with `flatten=False` (a dynamic-resolution model reads its
    grid from it).

    Example:
    >>> import numpy as np
    >>> PatchEmbedding(patch_size=16, hidden_size=32)(np.zeros((2, 64, 48, 3))).shape
    (2, 12, 32)
    """

    def __init__(
        self,
        patch_size,
        hidden_size,
        kernel_initializer="lecun_normal",
        bias_initializer="zeros",
        flatten=True,
        **kwargs,
    ):
        super().__init__(**kwargs)
        # === Config ===
        self.patch_size = as_pair(patch_size, "patch_size")
        self.hidden_size = int(hidden_size)
        self.flatten = bool(flatten)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)

    def grid_size(self, input_shape):
        """The `(rows, cols)` patch grid of an input shape; errors if not divisible."""
        height, width = input_shape[1], input_shape[2]
        for size, patch, axis in zip((height, width), self.patch_size, ("height", "width")):
            if size is not None and size % patch:
                raise ValueError(
                    f"Image {axis} {size} is not divisible by the patch size {patch} "
                    f"(input shape {tuple(input_shape)})."
                )
        return tuple(
            None if size is None else size // patch
            for size, patch in zip((height, width), self.patch_size)
        )

    def build(self, input_shape):
        self.grid_size(input_shape)
        channels = input_shape[-1]
        self.kernel = self.add_weight(
            name="kernel",
            shape=(*self.patch_size, channels, self.hidden_size),
            initializer=self.kernel_initializer,
        )
        self.bias = self.add_weight(
            name="bias", shape=(self.hidden_size,), initializer=self.bias_initializer
        )

    def call(self, images):
        self.grid_size(images.shape)  # A "valid" convolution would crop a size that does not divide.
        patches = ops.conv(
            images,
            self.kernel,
            strides=self.patch_size,
            padding="valid",
            data_format="channels_last",
        )
        patches = patches + self.bias
        if not self.flatten:
            return patches
        shape = ops.shape(patches)
        return ops.reshape(patches, (shape[0], shape[1] * shape[2], self.hidden_size))

    def compute_output_shape(self, input_shape):
        rows, cols = self.grid_size(input_shape)
        if not self.flatten:
            return (input_shape[0], rows, cols, self.hidden_size)
        tokens = None if rows is None or cols is None else rows * cols
        return (input_shape[0], tokens, self.hidden_size)

    def get_config(self):
        config = super().get_config()
        config.update(
            patch_size=self.patch_size,
            hidden_size=self.hidden_size,
            kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
            bias_initializer=keras.initializers.serialize(self.bias_initializer),
        )
        if not self.flatten:  # Kept out of fixed-size models' configs, which older keras_vit reads.
            config.update(flatten=False)
        return config


@keras.saving.register_keras_serializable(package="keras_vit")
class ClassToken(keras.layers.Layer):
    """Prepend a learned [class] token to a token sequence.

    Example:
    >>> import numpy as np
    >>> ClassToken()(np.zeros((2, 196, 32))).shape
    (2, 197, 32)
    """

    def __init__(self, initializer="zeros", **kwargs):
        super().__init__(**kwargs)
        # === Config ===
        self.initializer = keras.initializers.get(initializer)

    def build(self, input_shape):
        self.cls = self.add_weight(
            name="cls", shape=(1, 1, input_shape[-1]), initializer=self.initializer
        )

    def call(self, tokens):
        batch = ops.shape(tokens)[0]
        cls = ops.cast(self.cls, tokens.dtype)
        cls = ops.broadcast_to(cls, (batch, 1, ops.shape(self.cls)[-1]))
        return ops.concatenate([cls, tokens], axis=1)

    def compute_output_shape(self, input_shape):
        tokens = None if input_shape[1] is None else input_shape[1] + 1
        return (input_shape[0], tokens, input_shape[2])

    def get_config(self):
        config = super().get_config()
        config.update(initializer=keras.initializers.serialize(self.initializer))
        return config


@keras.saving.register_keras_serializable(package="keras_vit")
class TokenPooling(keras.layers.Layer):
    """Pool a token sequence to one vector: the class token or the patch mean.

    `method="token"` takes the first token; `method="gap"` averages the
    tokens after the first `num_prefix_tokens`.

    Example:
    >>> import numpy as np
    >>> TokenPooling("gap", num_prefix_tokens=0)(np.ones((2, 196, 32))).shape
    (2, 32)
    """

    METHODS = ("token", "gap")

    def __init__(self, method, num_prefix_tokens=1, **kwargs):
        super().__init__(**kwargs)
        if method not in self.METHODS:
            raise ValueError(f"Unknown pooling {method!r}; expected one of {self.METHODS}.")
        if method == "token" and num_prefix_tokens < 1:
            raise ValueError("Token pooling needs a class token (num_prefix_tokens >= 1).")
        # === Config ===
        self.method = method
        self.num_prefix_tokens = int(num_prefix_tokens)

    def call(self, tokens):
        if self.method == "token":
            return tokens[:, 0]
        return ops.mean(tokens[:, self.num_prefix_tokens :], axis=1)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[-1])

    def get_config(self):
        config = super().get_config()
        config.update(method=self.method, num_prefix_tokens=self.num_prefix_tokens)
        return config


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


@keras.saving.register_keras_serializable(package="keras_vit")
class TransformerBlock(keras.layers.Layer):
    """One pre-LayerNorm Transformer encoder block (paper Eq. 2-3).

    `x + MSA(LN(x))` then `x + MLP(LN(x))`, with LayerNorm epsilon 1e-6, a
    GELU MLP (tanh approximation by default, as the original Flax models),
    dropout after every dense layer except q/k/v, optional dropout on the
    attention probabilities and optional stochastic depth on both residual
    branches. q, k and v are one fused projection. Attention is
    `keras_vit.kernels.attention`, except when its weights are asked for
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
        approximate_gelu=True,
        seed=None,
        lora_rank=None,
        lora_targets=(),
        layer_norm_epsilon=LAYER_NORM_EPSILON,
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
        self.approximate_gelu = bool(approximate_gelu)
        self.seed = seed
        for name in ("dropout_rate", "attention_dropout_rate", "stochastic_depth_rate"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}.")

    def build(self, input_shape):
        hidden_size = input_shape[-1]
        if hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size {hidden_size} is not divisible by num_heads {self.num_heads}."
            )
        self.head_dim = hidden_size // self.num_heads
        plain = dict(dtype=self._sublayer_policy())  # Norms and dropouts: never quantized.
        # Glorot over each of q, k and v (fan D -> D), as the original's three
        # separate projections, although they are stored as one (D, 3D) kernel.
        qkv_init = keras.initializers.VarianceScaling(2.0, "fan_avg", "uniform", seed=self._seed(0))
        self.attention_norm = LayerNorm(
            epsilon=self.layer_norm_epsilon, name="attention_norm", **plain
        )
        self.qkv = keras.layers.Dense(
            3 * hidden_size, kernel_initializer=qkv_init, name="qkv", dtype=self._sublayer_policy("qkv"),
            lora_rank=self._lora("qkv"),
        )
        self.attention_output = keras.layers.Dense(
            hidden_size,
            kernel_initializer=keras.initializers.GlorotUniform(seed=self._seed(1)),
            name="attention_output",
            dtype=self._sublayer_policy("attention_output"),
            lora_rank=self._lora("attention_output"),
        )
        self.mlp_norm = LayerNorm(
            epsilon=self.layer_norm_epsilon, name="mlp_norm", **plain
        )
        self.mlp_hidden = self._mlp_dense(self.mlp_dim, "mlp_hidden", seed_offset=2)
        self.mlp_output = self._mlp_dense(hidden_size, "mlp_output", seed_offset=4)
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
        self.mlp_norm.build(token_shape)
        self.mlp_hidden.build(token_shape)
        self.mlp_output.build((*token_shape[:-1], self.mlp_dim))
        if self.lora_rank:
            self.freeze_all_but_lora()

    def _lora(self, name):
        return self.lora_rank if name in self.lora_targets else None

    def freeze_all_but_lora(self):
        """Train only the LoRA adapters: every sublayer, and the adapted layers' kernels and biases, frozen."""
        for layer in self._flatten_layers(include_self=False):
            layer.trainable = getattr(layer, "lora_enabled", False)  # The setter also resets its variables.
            if layer.trainable:
                layer._kernel.trainable = False
                if layer.bias is not None:
                    layer.bias.trainable = False

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

    def _seed(self, offset):
        """Distinct seeds per random op, so that equal seeds give unequal masks."""
        return None if self.seed is None else self.seed + offset

    def _mlp_dense(self, units, name, seed_offset):
        return keras.layers.Dense(
            units,
            kernel_initializer=keras.initializers.GlorotUniform(seed=self._seed(seed_offset)),
            bias_initializer=keras.initializers.RandomNormal(
                stddev=1e-6, seed=self._seed(seed_offset + 1)
            ),
            name=name,
            dtype=self._sublayer_policy(name),
            lora_rank=self._lora(name),
        )

    def _self_attention(self, x, training, return_weights):
        """MSA(x): multi-head self-attention, its output projection and dropout."""
        batch, tokens = ops.shape(x)[0], ops.shape(x)[1]
        # Split the fused projection on its last axis, then reshape each part, rather than
        # reshaping to (..., 3, heads, dim) and slicing: TensorFlow trains better this way
        # (see benchmarks/README.md).
        heads = (batch, tokens, self.num_heads, self.head_dim)
        query, key, value = (ops.reshape(part, heads) for part in ops.split(self.qkv(x), 3, axis=-1))
        if return_weights or (training and self.attention_dropout_rate > 0):
            context, weights = self._attention_with_weights(query, key, value, training)
        else:
            context, weights = kernels.attention(query, key, value), None
        context = ops.reshape(context, (batch, tokens, self.num_heads * self.head_dim))
        return self._dropout(self.output_dropout, self.attention_output(context), training), weights

    def _attention_with_weights(self, query, key, value, training):
        """Attention as explicit einsums, returning its float32 weights (before dropout)."""
        scale = 1.0 / math.sqrt(self.head_dim)
        logits = ops.einsum("bqhd,bkhd->bhqk", query * ops.cast(scale, query.dtype), key)
        weights = ops.softmax(ops.cast(logits, "float32"), axis=-1)
        dropped = self._dropout(self.attention_dropout, weights, training)
        return ops.einsum("bhqk,bkhd->bqhd", ops.cast(dropped, value.dtype), value), weights

    def _mlp(self, x, training):
        """MLP(x): two dense layers with a GELU between them, each followed by dropout."""
        hidden = kernels.gelu(self.mlp_hidden(x), approximate=self.approximate_gelu)
        hidden = self._dropout(self.mlp_hidden_dropout, hidden, training)
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

    def call(self, inputs, training=None, return_attention_weights=False):
        # Eq. 2: z' = MSA(LN(z)) + z
        attended, weights = self._self_attention(
            self.attention_norm(inputs), training, return_attention_weights
        )
        x = inputs + self._drop_path(attended, training)
        # Eq. 3: z = MLP(LN(z')) + z'
        outputs = x + self._drop_path(self._mlp(self.mlp_norm(x), training), training)
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
            approximate_gelu=self.approximate_gelu,
            seed=self.seed,
            layer_norm_epsilon=self.layer_norm_epsilon,
        )
        if self.lora_rank:
            config.update(lora_rank=self.lora_rank, lora_targets=list(self.lora_targets))
        # A quantized dense layer (after `model.quantize("int8")`) is rebuilt quantized on loading only if
        # the block's config says so: Keras' DTypePolicyMap, keyed by the sublayers' paths.
        quantized = {layer.path: layer.dtype_policy for layer in self._flatten_layers(include_self=False)
                     if layer.quantization_mode is not None}
        if quantized:
            own = self.dtype_policy
            default = own.default_policy if isinstance(own, keras.dtype_policies.DTypePolicyMap) else own
            policies = keras.dtype_policies.DTypePolicyMap(default_policy=default)
            for path, policy in quantized.items():
                policies[path] = policy
            config["dtype"] = keras.dtype_policies.serialize(policies)
        return config
