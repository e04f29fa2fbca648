"""Multi-head self-attention, the part of an encoder block that mixes its tokens: `SelfAttention`, `ZeroKeyBias`.

One fused q/k/v projection split into heads (with grouped-query attention,
fewer key/value heads, each repeated for its group of query heads before
attention, so every attention path computes it); plain attention
(`keras_vit.layers.kernels.attention`, fused where the platform has it),
attention that returns its weights, or differential attention; RoPE
rotation of queries and keys, per-head query/key norms, a key bias held
at zero, a relative position bias (its own, plus any bias the block is
given; SAM's decomposed one) and CaiT's talking heads as its options;
then the output projection. Uses `keras.ops` only.
"""

import math

import keras
from keras import ops

from keras_vit.layers import kernels
from keras_vit.layers import rope as rope_module
from keras_vit.layers.norm import norm_layer
from keras_vit.layers.parts import BlockPart
from keras_vit.layers.relative_position import RelativePositions
from keras_vit.layers.windows import decomposed_relative_bias


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


class SelfAttention(BlockPart):
    """MSA(x) of a block: q/k/v, attention over the heads, the output projection and its dropout.

    Reads the block's `num_heads`, `num_kv_heads`, `attention_dropout_rate`, `dropout_rate`,
    `layer_index` (differential attention's lambda offset) and its switches
    `qkv_bias`, `key_bias`, `qk_norm`, `rope`, `rope_temperature`,
    `rope_rotate_half`, `differential_attention`, `attention_output_norm`,
    `projection_bias`, `relative_position_bias` and
    `relative_position_mlp_dim` (for the block's `relative_position_grid`),
    `talking_heads` and `decomposed_relative_position` (SAM's, for the
    block's grid or its `window_size`), and Gemma 4's `value_norm`,
    `attention_scale`, `rope_axis_halves` and `clipped_linears`. Attention is `keras_vit.layers.kernels.attention`,
    except when its weights are asked for or attention dropout is active:
    then it is explicit einsums, which expose the weights.
    """

    def build(self, token_shape):
        block, switches = self.block, self.switches
        hidden_size, self.num_heads = token_shape[-1], block.num_heads
        if hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {hidden_size} is not divisible by num_heads {self.num_heads}.")
        self.head_dim = hidden_size // self.num_heads
        self.num_kv_heads = block.num_kv_heads
        grouped = self.num_kv_heads != self.num_heads
        if grouped and (switches.differential_attention or switches.rope == "mixed"
                        or (switches.qkv_bias and not switches.key_bias)):
            raise ValueError("Grouped-query attention (num_kv_heads) is not supported with differential attention, "
                             "mixed RoPE (learned per query head) or a key bias held at zero (key_bias=False).")
        if switches.differential_attention and self.head_dim % 2:
            raise ValueError(f"Differential attention halves each head's queries and keys, so the head width "
                             f"{self.head_dim} (hidden_size / num_heads) must be even.")
        # Glorot over each of q, k and v (fan D -> D), as the original's three
        # separate projections, although they are stored as one (D, 3D) kernel
        # (keys and values narrower with grouped-query attention).
        qkv_init = keras.initializers.VarianceScaling(2.0, "fan_avg", "uniform", seed=block.seed_for(0))
        width = hidden_size + 2 * self.num_kv_heads * self.head_dim
        self.qkv = self.dense(width, "qkv", token_shape, 0, kernel_initializer=qkv_init, use_bias=switches.qkv_bias,
                              bias_constraint=None if switches.key_bias else ZeroKeyBias())
        self.qkv_widths = (hidden_size, self.num_kv_heads * self.head_dim, self.num_kv_heads * self.head_dim)
        if switches.clipped_linears:  # Gemma 4's: q, k and v each clamp their input and output
            self.clip_bounds("qkv", 3)
            self.clip_bounds("attention_output", 1)
        if switches.value_norm:
            self.value_norm = self.sublayer("value_norm_layer", norm_layer(
                "rms_norm", switches.layer_norm_epsilon, scale=False, name="value_norm",
                dtype=block._sublayer_policy()), (*token_shape[:-1], self.num_kv_heads, self.head_dim))
        self._build_rope()
        if switches.relative_position_bias:
            grid = block.relative_position_grid
            if grid is None:
                raise ValueError(f"{block.name} has a relative position bias (relative_position_bias="
                                 f"{switches.relative_position_bias!r}): give the block its relative_position_grid, "
                                 "the (rows, columns) of its patches.")
            self.relative_positions = RelativePositions(
                switches.relative_position_bias, grid, self.num_heads, token_shape[1] - grid[0] * grid[1],
                switches.relative_position_mlp_dim, block.name)
            self.relative_positions.make_weights(lambda name, shape, initializer: self.weight(
                name, shape=shape, initializer=initializer, autocast=False))
        if switches.decomposed_relative_position:  # SAM's: tables of row and column offsets for the attended grid
            self.decomposed_grid = (block.window_size,) * 2 if block.window_size else block.relative_position_grid
            if self.decomposed_grid is None:
                raise ValueError(f"{block.name} has decomposed relative positions: give the block its "
                                 "relative_position_grid, the (rows, columns) of its patches.")
            for name, side in zip(("rel_pos_h", "rel_pos_w"), self.decomposed_grid):
                self.weight(name, shape=(2 * side - 1, self.head_dim), initializer="zeros", autocast=False)
        if switches.talking_heads:  # CaiT's: (heads, heads) maps over the logits and over the weights
            for stage in ("logit", "weight"):
                self.weight(f"talking_heads_{stage}_kernel", shape=(self.num_heads, self.num_heads),
                            initializer="identity", autocast=False)
                self.weight(f"talking_heads_{stage}_bias", shape=(self.num_heads,), initializer="zeros",
                            autocast=False)
        if switches.qk_norm:  # differential attention normalises each half-width query and key (timm's DiffAttention)
            heads = (self.num_heads, 2, self.head_dim // 2) if switches.differential_attention else (self.num_heads,
                                                                                                     self.head_dim)
            self.query_norm = self.norm("query_norm", (*token_shape[:-1], *heads))
            self.key_norm = self.norm("key_norm", (*token_shape[:-1], self.num_kv_heads, *heads[1:]))
        if switches.attention_output_norm:
            self.output_norm = self.norm("attention_output_norm_layer", token_shape, name="attention_output_norm")
        self.output = self.dense(hidden_size, "attention_output", token_shape, 1, use_bias=switches.projection_bias)
        # Attention probabilities stay float32 (softmax precision), whatever the policy.
        self.attention_dropout = self.dropout("attention_dropout", block.attention_dropout_rate, 6, dtype="float32")
        self.output_dropout = self.dropout("output_dropout", block.dropout_rate, 7)
        if switches.differential_attention:
            # timm's DiffAttention: lambda = exp(q1 . k1) - exp(q2 . k2) + lambda_init, and an RMSNorm (1e-5) per head.
            def initializer():  # one per weight, so that unseeded ones draw different values
                return keras.initializers.RandomNormal(stddev=0.1, seed=block.seed_for(11))

            self.lambdas = [self.weight(name, shape=(self.head_dim // 2,), autocast=False, initializer=initializer())
                            for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")]
            sub_norm = norm_layer("rms_norm", 1e-5, name="attention_sub_norm", dtype=block._sublayer_policy())
            self.sub_norm = self.sublayer("attention_sub_norm", sub_norm, (*token_shape[:-1], self.num_heads,
                                                                           self.head_dim))

    def _build_rope(self):
        switches = self.switches
        if not switches.rope:
            return
        if self.head_dim % 4:
            raise ValueError(f"RoPE rotates pairs of each axis' quarter of a head, so the head width {self.head_dim} "
                             "(hidden_size / num_heads) must be a multiple of 4.")
        if switches.rope == "mixed":  # learned, per head: (2 axes, heads, head_dim / 2)
            initial = rope_module.initial_mixed_frequencies(self.num_heads, self.head_dim, switches.rope_temperature,
                                                            self.block.seed_for(12))
            self.rope_frequencies = self.weight("rope_frequencies", shape=initial.shape, autocast=False,
                                                initializer=lambda shape, dtype=None: ops.cast(initial, dtype))
        else:
            self.rope_frequencies = rope_module.rope_frequencies(switches.rope, self.head_dim,
                                                                 switches.rope_temperature)

    def __call__(self, x, training, return_weights, positions=None, key_mask=None, bias=None):
        """MSA(x) and, where `return_weights` (or differential attention computes them), its float32 weights.

        `key_mask` `(batch, tokens)` leaves out the keys where it is False (NaFlex padding); `bias`
        `(1, heads, tokens, tokens)` is added to the logits (a shared relative position bias), with the
        block's own table's."""
        switches = self.switches
        batch, tokens = ops.shape(x)[0], ops.shape(x)[1]
        # Split the fused projection on its last axis, then reshape each part, rather than
        # reshaping to (..., 3, heads, dim) and slicing: TensorFlow trains better this way
        # (see benchmarks/README.md).
        fused = self.project(self.qkv, x, "qkv", self.qkv_widths)
        if self.num_kv_heads == self.num_heads:
            query, key, value = ops.split(fused, 3, axis=-1)
        else:  # narrower keys and values; sliced, as PyTorch's meta device cannot split at indices
            queries, keys = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
            query, key, value = fused[..., :queries], fused[..., queries:queries + keys], fused[..., queries + keys:]
        query = ops.reshape(query, (batch, tokens, self.num_heads, self.head_dim))
        key, value = (ops.reshape(part, (batch, tokens, self.num_kv_heads, self.head_dim)) for part in (key, value))
        if switches.qk_norm and not switches.differential_attention:
            query, key = self.query_norm(query), self.key_norm(key)
        if switches.value_norm:
            value = self.value_norm(value)
        if switches.rope:
            if positions is None:
                raise ValueError(f"{self.block.name} rotates queries and keys (rope={switches.rope!r}): call it with "
                                 "rope_positions, the RotaryPositions of its tokens.")
            frequencies = self.rope_frequencies
            if not isinstance(frequencies, keras.Variable):
                frequencies = ops.convert_to_tensor(frequencies)
            query, key = rope_module.rotate_queries_and_keys(query, key, positions, frequencies,
                                                             switches.rope_rotate_half, switches.rope_axis_halves)
        if switches.attention_scale is not None:  # every path divides by sqrt(head_dim): the query makes up for it
            query = ops.cast(ops.cast(query, "float32") * (switches.attention_scale * math.sqrt(self.head_dim)),
                             query.dtype)
        if self.num_kv_heads != self.num_heads:
            key, value = self._for_each_query_head(key), self._for_each_query_head(value)
        if switches.decomposed_relative_position:
            own = decomposed_relative_bias(query, self.decomposed_grid, self.block.rel_pos_h, self.block.rel_pos_w)
            bias = own if bias is None else own + ops.cast(bias, "float32")
        if switches.relative_position_bias:
            own = self.relative_positions.bias(self.block)
            bias = own if bias is None else own + ops.cast(bias, "float32")
        if switches.differential_attention:
            context, weights = self._differential(query, key, value, training, key_mask)
            weights = weights if return_weights else None
        elif switches.talking_heads:
            context, weights = self._with_weights(query, key, value, training, key_mask, bias)
            weights = weights if return_weights else None
        elif return_weights or (training and self.attention_dropout.rate > 0):
            context, weights = self._with_weights(query, key, value, training, key_mask, bias)
        else:
            context, weights = kernels.attention(query, key, value, key_mask, bias), None
        context = ops.reshape(context, (batch, tokens, self.num_heads * self.head_dim))
        if switches.attention_output_norm:
            context = self.output_norm(context)
        return self.apply_dropout(self.output_dropout, self.project(self.output, context, "attention_output"),
                                  training), weights

    def _for_each_query_head(self, part):
        """Grouped keys or values `(batch, tokens, num_kv_heads, head_dim)` for each query head: head h takes
        key/value head h // (num_heads / num_kv_heads), as timm's `repeat_interleave`. Broadcast, not `ops.repeat`,
        which PyTorch's meta device (where Keras infers shapes) cannot run."""
        batch, tokens = ops.shape(part)[0], ops.shape(part)[1]
        group = self.num_heads // self.num_kv_heads
        spread = ops.broadcast_to(ops.expand_dims(part, 3), (batch, tokens, self.num_kv_heads, group, self.head_dim))
        return ops.reshape(spread, (batch, tokens, self.num_heads, self.head_dim))

    @property
    def lambda_init(self):
        """Differential attention's depth-dependent offset of lambda, as timm's `DiffAttention.set_lambda_init`."""
        return 0.8 - 0.6 * math.exp(-0.3 * self.block.layer_index)

    def _differential(self, query, key, value, training, key_mask=None):
        """Differential attention (Ye et al., 2024): per head, the softmax of its second half-width query/key pair,
        scaled by lambda, is subtracted from the first's; the combined map weighs the full-width values, then an
        RMSNorm per head and `1 - lambda_init` scale the result. Returns the context and the combined map."""
        batch, tokens = ops.shape(query)[0], ops.shape(query)[1]
        half = self.head_dim // 2
        pairs = (batch, tokens, self.num_heads, 2, half)
        query, key = ops.reshape(query, pairs), ops.reshape(key, pairs)
        if self.switches.qk_norm:
            query, key = self.query_norm(query), self.key_norm(key)
        logits = ops.einsum("bqhpd,bkhpd->bhpqk", query * ops.cast(1.0 / math.sqrt(half), query.dtype), key)
        if key_mask is not None:
            logits = ops.cast(logits, "float32") + kernels.key_mask_bias(key_mask)[:, :, None]
        maps = self.apply_dropout(self.attention_dropout, ops.softmax(ops.cast(logits, "float32"), axis=-1), training)
        q1, k1, q2, k2 = self.lambdas
        lambda_full = ops.exp(ops.sum(q1 * k1)) - ops.exp(ops.sum(q2 * k2)) + self.lambda_init
        combined = maps[:, :, 0] - ops.cast(lambda_full, "float32") * maps[:, :, 1]
        context = ops.einsum("bhqk,bkhd->bqhd", ops.cast(combined, value.dtype), value)
        context = self.sub_norm(context) * ops.cast(1.0 - self.lambda_init, context.dtype)
        return ops.cast(context, value.dtype), combined

    def _mix_heads(self, maps, stage):
        """Talking heads (CaiT's, timm's `TalkingHeadAttn`): each head's map a learned mix of every head's."""
        kernel, bias = (ops.cast(getattr(self.block, f"talking_heads_{stage}_{part}"), "float32")
                        for part in ("kernel", "bias"))
        return ops.einsum("bhqk,hg->bgqk", ops.cast(maps, "float32"), kernel) + bias[None, :, None, None]

    def _with_weights(self, query, key, value, training, key_mask=None, bias=None):
        """Attention as explicit einsums, returning its float32 weights (before dropout); with talking heads, the
        logits are mixed across heads before the softmax and the weights after it."""
        scale = 1.0 / math.sqrt(self.head_dim)
        logits = ops.einsum("bqhd,bkhd->bhqk", query * ops.cast(scale, query.dtype), key)
        if self.switches.talking_heads:
            logits = self._mix_heads(logits, "logit")
        if key_mask is not None:
            logits = ops.cast(logits, "float32") + kernels.key_mask_bias(key_mask)
        if bias is not None:
            logits = ops.cast(logits, "float32") + ops.cast(bias, "float32")
        weights = ops.softmax(ops.cast(logits, "float32"), axis=-1)
        if self.switches.talking_heads:
            weights = self._mix_heads(weights, "weight")
        dropped = self.apply_dropout(self.attention_dropout, weights, training)
        return ops.einsum("bhqk,bkhd->bqhd", ops.cast(dropped, value.dtype), value), weights
