"""The Transformer encoder block: `TransformerBlock`, its switches (`BlockSwitches`), and `_QuantizableSublayers`.

`TransformerBlock` composes its parts, `keras_vit.layers.attention.SelfAttention`
and `keras_vit.layers.mlp.Mlp`, with its norms, layer scales and
stochastic depth, in one of four shapes: pre-norm (the paper's Eq. 2-3),
post-norm (timm's `ResPostBlock`), parallel (timm's
`ParallelScalingBlock`) or sandwich (Gemma 4's, norms before and after each
branch). `BlockSwitches` declares the switches it reads,
once: they are fields of `keras_vit.model.architecture.Architecture` too,
and they drive the block's keywords and its config. `_QuantizableSublayers`
rebuilds quantized sublayers from a `.keras` file (the attention pooling
head uses it too). Every layer uses `keras.ops` only.
"""

import dataclasses
import math

import keras
from keras import ops

from keras_vit.layers import rope as rope_module
from keras_vit.layers.attention import SelfAttention
from keras_vit.layers.mlp import ACTIVATIONS, Mlp
from keras_vit.layers.norm import LAYER_NORM_EPSILON, NORMALIZATIONS
from keras_vit.layers.parts import BlockPart
from keras_vit.layers.relative_position import MLP_DIM, relative_position_form
from keras_vit.layers.windows import window_partition, window_unpartition
from keras_vit.utils.keras_internals import stored_kernel, sublayers


@dataclasses.dataclass(frozen=True)
class BlockSwitches:
    """The switches of an encoder block, the fields of `Architecture` it reads; the defaults are the paper's block.

    Attributes:
        qkv_bias: the q/k/v projection has a bias.
        qk_norm: a norm over each head's queries and keys (each half, with
            differential attention).
        layer_scale: the initial value of learned per-channel scales on both
            residual branches (CaiT, DeiT-III, DINOv2), or `None` for none.
        attention_only_layer_scale: with `layer_scale`, only the attention
            branch is scaled, not the MLP (timm's `attn_only_layer_scale`,
            Sapiens2's).
        mlp_activation: one of `keras_vit.layers.mlp.ACTIVATIONS`.
        post_norm: each block normalises its branches' outputs, not their
            inputs (`x + LN(MSA(x))`, timm's `ResPostBlock`).
        normalization: the kind of every norm of the model, one of
            `NORMALIZATIONS` (timm's `norm_layer`; AIMv2's RMSNorm).
        projection_bias: biases on attention's output projection and both
            MLP layers (timm's `proj_bias`; AIMv2 has none).
        differential_attention: each head attends with the difference of
            two softmax maps (timm's `DiffAttention`, `attn_layer="diff"`).
        parallel: each block adds attention and the MLP, both on one norm
            of its input, under one layer scale (ViT-22B's; timm's
            `ParallelScalingBlock`).
        attention_output_norm, mlp_hidden_norm: a norm before the
            attention's output projection, and before the second MLP layer
            (timm's `scale_attn_norm` and `scale_mlp_norm`, BEiT-3's).
        mlp_input_norm: a norm on the MLP's input, after the block's own
            (timm's `GeGluMlp`, ViTamin's).
        rope: rotary position embeddings in every attention, one form of
            `keras_vit.layers.rope.ROPE_FORMS`, or None; `rope_temperature`
            and `rope_rotate_half` (half-split instead of interleaved pairs)
            are timm's `Eva` settings of the same names; `rope_axis_halves`:
            each axis turns its own half of the head (Gemma 4's
            multidimensional RoPE, with `rope_rotate_half`).
        key_bias: with `qkv_bias`, whether the keys have one too (EVA's
            attention has q and v biases only).
        layer_norm_epsilon: every norm's epsilon (1e-6 in the original
            checkpoints and timm, 1e-5 in CLIP's, 1e-12 in transformers').
        relative_position_bias: each block's attention adds a learned bias
            per head from the two tokens' offset on the patch grid, its own,
            of one of `keras_vit.layers.relative_position.RELATIVE_POSITION_FORMS`:
            `"table"` (BEiT's `use_rel_pos_bias`, timm's `RelPosBias`;
            `True` means it), `"mlp"` or `"mlp_swin"` (timm's `RelPosMlp`,
            `vit_relpos_*`), or None.
        relative_position_mlp_dim: the hidden width of the MLP forms
            (timm's `rel_pos_dim`, default 128).
        value_norm: an RMSNorm without a gain over each head's values
            (Gemma 4's `v_norm`).
        attention_scale: what the logits `q . k` are multiplied by, or None
            for `1 / sqrt(head_dim)` (Gemma 4's 1.0: its queries and keys
            are normalised).
        sandwich_norm: a norm on each branch's output too, before the
            residual sum (Gemma 4's `post_attention_layernorm` and
            `post_feedforward_layernorm`), besides the pre-norm.
        clipped_linears: every projection clamps its input and its output
            to bounds its checkpoint sets, buffers never trained (Gemma 4's
            `Gemma4ClippableLinear`: q, k and v each their own;
            `keras_vit.layers.parts.clamped_projection`).
        talking_heads: learned `(heads, heads)` maps mix the heads' logits
            before the softmax and their weights after it (CaiT's, timm's
            `TalkingHeadAttn`).
        decomposed_relative_position: SAM's (MViTv2's) relative positions:
            a bias from each query and a table of row offsets and one of
            column offsets (`rel_pos_h`, `rel_pos_w`;
            `keras_vit.layers.windows.decomposed_relative_bias`).
    """

    qkv_bias: bool = True
    qk_norm: bool = False
    layer_scale: float = None
    attention_only_layer_scale: bool = False
    mlp_activation: str = "gelu_tanh"
    post_norm: bool = False
    normalization: str = "layer_norm"
    projection_bias: bool = True
    differential_attention: bool = False
    parallel: bool = False
    attention_output_norm: bool = False
    mlp_hidden_norm: bool = False
    mlp_input_norm: bool = False
    rope: str = None
    rope_temperature: float = 10000.0
    rope_rotate_half: bool = False
    rope_axis_halves: bool = False
    key_bias: bool = True
    layer_norm_epsilon: float = LAYER_NORM_EPSILON
    relative_position_bias: str = None
    relative_position_mlp_dim: int = MLP_DIM
    talking_heads: bool = False
    decomposed_relative_position: bool = False
    value_norm: bool = False
    attention_scale: float = None
    sandwich_norm: bool = False
    clipped_linears: bool = False

    def __post_init__(self):
        for field in dataclasses.fields(BlockSwitches):  # bools and numbers as the config of any version gives them
            value = getattr(self, field.name)
            if field.type in (bool, float) and value is not None:
                try:
                    object.__setattr__(self, field.name, field.type(value))
                except (TypeError, ValueError):
                    raise ValueError(f"{field.name} must be a {field.type.__name__}, got {value!r}.") from None
        if self.mlp_activation not in ACTIVATIONS:
            raise ValueError(f"Unknown mlp_activation {self.mlp_activation!r}; expected one of {ACTIVATIONS}.")
        if self.layer_scale is not None and not self.layer_scale >= 0:
            raise ValueError(f"layer_scale is the initial value of the learned scales, a number >= 0 "
                             f"(1e-5 in DINOv2, 1e-6 in DeiT-III, 0 in timm's Eva with init_values 0), or None for "
                             f"none; got {self.layer_scale!r}.")
        if self.normalization not in NORMALIZATIONS:
            raise ValueError(f"Unknown normalization {self.normalization!r}; expected one of {NORMALIZATIONS}.")
        if self.attention_only_layer_scale and self.parallel:
            raise ValueError("attention_only_layer_scale=True is not supported with parallel=True (a parallel "
                             "block has one layer scale on the sum of both branches).")
        if self.parallel and (self.post_norm or self.attention_output_norm or self.mlp_hidden_norm):
            raise ValueError("parallel=True is not supported with post_norm, attention_output_norm or "
                             "mlp_hidden_norm (timm's parallel blocks have none of them).")
        if self.rope is not None and self.rope not in rope_module.ROPE_FORMS:
            raise ValueError(f"Unknown rope {self.rope!r}; expected one of {rope_module.ROPE_FORMS} or None.")
        if not math.isfinite(self.rope_temperature) or not self.rope_temperature > 0:
            raise ValueError(f"rope_temperature must be a finite number > 0, got {self.rope_temperature!r}.")
        if self.rope == "mixed" and (self.rope_rotate_half or self.rope_axis_halves):
            raise ValueError("Mixed RoPE rotates interleaved pairs over the whole head; rope_rotate_half and "
                             "rope_axis_halves are not supported with it.")
        if self.rope_axis_halves and not (self.rope and self.rope_rotate_half):
            raise ValueError("rope_axis_halves (Gemma 4's RoPE) turns each axis' half of the head by its halves: it "
                             "needs rope (axial) and rope_rotate_half=True.")
        if self.attention_scale is not None and not (math.isfinite(self.attention_scale)
                                                     and self.attention_scale > 0):
            raise ValueError(f"attention_scale must be a finite number > 0, or None for 1 / sqrt(head_dim); got "
                             f"{self.attention_scale!r}.")
        if self.sandwich_norm and (self.post_norm or self.parallel):
            raise ValueError("sandwich_norm=True adds a norm after each branch of a pre-norm block: it is not "
                             "supported with post_norm or parallel.")
        if (self.value_norm or self.clipped_linears or self.attention_scale is not None) and (
                self.differential_attention or self.talking_heads or self.parallel):
            raise ValueError("value_norm, clipped_linears and attention_scale (Gemma 4's) are not supported with "
                             "differential attention, talking heads or parallel blocks (no timm architecture combines "
                             "them).")
        object.__setattr__(self, "relative_position_bias",
                           relative_position_form(self.relative_position_bias, "relative_position_bias"))
        if isinstance(self.relative_position_mlp_dim, bool) or not isinstance(self.relative_position_mlp_dim, int) \
                or self.relative_position_mlp_dim < 1:
            raise ValueError(f"relative_position_mlp_dim must be a whole number >= 1, got "
                             f"{self.relative_position_mlp_dim!r}.")
        if self.relative_position_bias and self.differential_attention:
            raise ValueError("relative_position_bias is not supported with differential_attention=True (no timm "
                             "architecture combines them).")
        if self.decomposed_relative_position and (self.rope or self.differential_attention
                                                  or self.relative_position_bias):
            raise ValueError("decomposed_relative_position is not supported with rope, differential attention or "
                             "relative_position_bias (SAM's encoder has none of them beside it).")
        if self.talking_heads and self.differential_attention:
            raise ValueError("talking_heads=True is not supported with differential_attention=True (no timm "
                             "architecture combines them).")
        if not self.layer_norm_epsilon > 0:
            raise ValueError(f"layer_norm_epsilon must be > 0, got {self.layer_norm_epsilon!r}.")

    @property
    def approximate_gelu(self):
        """Whether the MLP computes the tanh-approximated GELU."""
        return self.mlp_activation == "gelu_tanh"

    @classmethod
    def of(cls, source):
        """The block switches of `source`, an `Architecture` (or anything with these fields)."""
        return cls(**{field.name: getattr(source, field.name) for field in dataclasses.fields(cls)})

    @classmethod
    def take(cls, switches, keywords):
        """`switches` (or the defaults) with the switches among `keywords`, which are removed from it.

        Keywords are a block config's flat keys, of any version: `activation`
        (keras_vit 1.x) and `approximate_gelu` (0.x) name `mlp_activation`.
        """
        given = {field.name: keywords.pop(field.name) for field in dataclasses.fields(cls) if field.name in keywords}
        activation, approximate_gelu = keywords.pop("activation", None), keywords.pop("approximate_gelu", None)
        if activation is None and approximate_gelu is not None:
            activation = "gelu" if approximate_gelu is False else "gelu_tanh"
        if activation is not None:
            given.setdefault("mlp_activation", activation)
        return dataclasses.replace(switches or cls(), **given)

    def changed(self):
        """The switches that differ from the paper's block, as a block's config keeps them."""
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(BlockSwitches)
                if getattr(self, field.name) != field.default}


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


# The sublayers in the order the block held them before it was made of parts: a `.keras` file finds a sublayer's
# weights by the attribute name, an optimizer's saved state (`keras_vit.training.durable`) by the order.
_SUBLAYER_ORDER = ("attention_norm", "qkv", "query_norm", "key_norm", "attention_output_norm_layer",
                   "mlp_hidden_norm_layer", "attention_output", "mlp_norm", "mlp_hidden", "mlp_output",
                   "attention_dropout", "output_dropout", "mlp_hidden_dropout", "mlp_output_dropout",
                   "attention_sub_norm")


@keras.saving.register_keras_serializable(package="keras_vit")
class TransformerBlock(_QuantizableSublayers, keras.layers.Layer):
    """One Transformer encoder block: attention and an MLP on residual branches (paper Eq. 2-3).

    The shape is pre-norm, `x + MSA(LN(x))` then `x + MLP(LN(x))`; with
    the switch `post_norm`, `x + LN(MSA(x))` then `x + LN(MLP(x))`; with
    `parallel`, `x + MSA(LN(x)) + MLP(LN(x))` under one layer scale; with
    `sandwich_norm`, `x + LN(MSA(LN(x)))` then `x + LN(MLP(LN(x)))`.
    `switches` (a `BlockSwitches`, or its fields as keywords) chooses the
    parts' options. Dropout follows every dense layer except q/k/v;
    attention dropout and stochastic depth on both branches are optional.
    `layer_index` sets differential attention's lambda offset; `lora_rank`
    adds LoRA adapters to the dense layers named in `lora_targets`
    (`keras_vit.enable_lora`). With `num_kv_heads` (a divisor of
    `num_heads`) attention is grouped-query: keys and values have that many
    heads, each shared by `num_heads / num_kv_heads` query heads in turn
    (timm's `AttentionRope`). It is called with `rope_positions` (from
    `keras_vit.layers.rope.RotaryPositions`) where it has RoPE, and
    `return_attention_weights=True` returns the float32 attention weights too;
    `key_mask`, `(batch, tokens)` booleans, leaves out the padding of a
    NaFlex batch (`keras_vit.layers.naflex`). With the switch
    `relative_position_bias` the block holds a table for the patch grid
    `relative_position_grid` (the patch grid after any prefix tokens; with
    `window_size`, SAM's, attention is within windows of it);
    `attention_bias` (a shared table's bias,
    `keras_vit.layers.relative_position.RelativePositionBias`) is added
    to every attention logit.

    Example:
    >>> import numpy as np
    >>> block = TransformerBlock(num_heads=4, mlp_dim=128)
    >>> out, weights = block(np.zeros((2, 17, 64)), return_attention_weights=True)
    >>> out.shape, weights.shape
    ((2, 17, 64), (2, 4, 17, 17))
    """

    def __init__(self, num_heads, mlp_dim, dropout_rate=0.0, attention_dropout_rate=0.0, stochastic_depth_rate=0.0,
                 seed=None, lora_rank=None, lora_targets=(), layer_index=0, switches=None, num_kv_heads=None,
                 relative_position_grid=None, window_size=0, **kwargs):
        switches = BlockSwitches.take(switches, kwargs)
        super().__init__(**kwargs)
        # Keras would cast every floating argument to the compute dtype: the tokens are cast in `call`, while the
        # RoPE positions (EVA-02's fractional coordinates) and a shared bias stay the float32 they are computed in.
        self._convert_input_args = False
        # === Config ===
        self.switches = switches
        self.num_heads = int(num_heads)
        self.mlp_dim = int(mlp_dim)
        self.dropout_rate = float(dropout_rate)
        self.attention_dropout_rate = float(attention_dropout_rate)
        self.stochastic_depth_rate = float(stochastic_depth_rate)
        self.seed = seed
        self.lora_rank = lora_rank  # LoRA adapters on the dense layers named in lora_targets (keras_vit.enable_lora)
        self.lora_targets = tuple(lora_targets)
        self.layer_index = int(layer_index)
        self.relative_position_grid = None if relative_position_grid is None else \
            tuple(int(side) for side in relative_position_grid)
        self.window_size = int(window_size)
        if self.window_size and (self.relative_position_grid is None or switches.post_norm or switches.parallel
                                 or switches.sandwich_norm):
            raise ValueError(f"window_size {self.window_size} (SAM's windowed attention) needs the block's patch grid "
                             "(relative_position_grid) and a pre-norm block.")
        self.num_kv_heads = self.num_heads if num_kv_heads is None else num_kv_heads
        if isinstance(self.num_kv_heads, bool) or not isinstance(self.num_kv_heads, int) \
                or self.num_kv_heads < 1 or self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_kv_heads must be a whole number that divides num_heads {self.num_heads} (each "
                             f"key/value head serves num_heads / num_kv_heads query heads); got {num_kv_heads!r}.")
        for name in ("dropout_rate", "attention_dropout_rate", "stochastic_depth_rate"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}.")
        # === Parts ===
        self.attention = SelfAttention(self)
        # A parallel block's MLP input layer always has its bias (timm's mlp_bias), and its one output bias is the
        # attention output's.
        self.mlp = Mlp(self, biases=(switches.projection_bias or switches.parallel,
                                     switches.projection_bias and not switches.parallel))

    def build(self, input_shape):
        token_shape = tuple(input_shape)
        norms = BlockPart(self)  # attention_norm, mlp_norm: the branches' (the parallel block's one) norms
        norms.norm("attention_norm", token_shape)
        if not self.parallel:
            norms.norm("mlp_norm", token_shape)
        if self.sandwich_norm:  # Gemma 4's norms on the branches' outputs
            norms.norm("attention_branch_norm", token_shape)
            norms.norm("mlp_branch_norm", token_shape)
        self.attention.build((None, self.window_size ** 2, token_shape[-1]) if self.window_size else token_shape)
        self.mlp.build(token_shape)
        made = {**norms.sublayers, **self.attention.sublayers, **self.mlp.sublayers}
        for name in sorted(made, key=lambda name: _SUBLAYER_ORDER.index(name) if name in _SUBLAYER_ORDER else 99):
            setattr(self, name, made[name])
        if self.stochastic_depth_rate:
            self.stochastic_depth_seed = keras.random.SeedGenerator(self.seed_for(10))
        hidden_size = token_shape[-1]
        if self.layer_scale is not None and self.parallel:  # one scale on the sum of both branches
            self.branch_layer_scale = self.add_weight(name="layer_scale", shape=(hidden_size,),
                                                      initializer=keras.initializers.Constant(self.layer_scale))
        elif self.layer_scale is not None:
            scale = keras.initializers.Constant(self.layer_scale)
            self.attention_layer_scale = self.add_weight(name="attention_layer_scale", shape=(hidden_size,),
                                                         initializer=scale)
            if not self.attention_only_layer_scale:
                self.mlp_layer_scale = self.add_weight(name="mlp_layer_scale", shape=(hidden_size,),
                                                       initializer=scale)
        if self.lora_rank:
            self.freeze_all_but_lora()

    def lora_rank_of(self, name):
        """The LoRA rank of dense layer `name`: the block's, where `lora_targets` names it."""
        return self.lora_rank if name in self.lora_targets else None

    def freeze_all_but_lora(self):
        """Train only the LoRA adapters: every sublayer, the adapted layers' kernels and biases, and the block's own
        variables (layer scales, differential attention's lambdas) frozen."""
        inner = sublayers(self, include_self=False)
        inner_variables = {id(variable) for layer in inner for variable in layer.weights}
        for variable in self.weights:
            if id(variable) not in inner_variables:
                variable.trainable = False
        for layer in inner:
            layer.trainable = getattr(layer, "lora_enabled", False)  # The setter also resets its variables.
            if layer.trainable:
                stored_kernel(layer).trainable = False
                if layer.bias is not None:
                    layer.bias.trainable = False

    def seed_for(self, offset):
        """Distinct seeds per random op, so that equal seeds give unequal masks."""
        return None if self.seed is None else self.seed + offset

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
        if self.layer_scale is None or (name == "mlp_layer_scale" and self.attention_only_layer_scale):
            return branch
        return branch * ops.cast(getattr(self, name), branch.dtype)

    def __call__(self, inputs, *args, **kwargs):
        if not isinstance(inputs, keras.KerasTensor) and not ops.is_tensor(inputs):  # numpy, lists
            inputs = ops.convert_to_tensor(inputs)  # what Keras' own conversion, switched off above, did
        return super().__call__(inputs, *args, **kwargs)

    def call(self, inputs, rope_positions=None, training=None, return_attention_weights=False, key_mask=None,
             attention_bias=None):
        inputs = ops.cast(inputs, self.compute_dtype)

        def attend(x):
            return self.attention(x, training, return_attention_weights, rope_positions, key_mask, attention_bias)

        if self.parallel:  # x + MSA(LN(x)) + MLP(LN(x)), one layer scale on the sum (ViT-22B's parallel block)
            normed = self.attention_norm(inputs)
            attended, weights = attend(normed)
            x, mlp = inputs, self._scaled(attended + self.mlp(normed, training), "branch_layer_scale")
        elif self.post_norm:  # x + LN(MSA(x)), then x + LN(MLP(x))
            attended, weights = attend(inputs)
            x = inputs + self._drop_path(self._scaled(self.attention_norm(attended), "attention_layer_scale"), training)
            mlp = self._scaled(self.mlp_norm(self.mlp(x, training)), "mlp_layer_scale")
        elif self.window_size:  # SAM's: attention within windows of the grid, zero-padded to whole ones
            windows, padded = window_partition(self.attention_norm(inputs), self.relative_position_grid,
                                               self.window_size)
            attended, weights = attend(windows)
            attended = window_unpartition(attended, self.relative_position_grid, self.window_size, padded)
            x = inputs + self._drop_path(self._scaled(attended, "attention_layer_scale"), training)
            mlp = self._scaled(self.mlp(self.mlp_norm(x), training), "mlp_layer_scale")
        elif self.sandwich_norm:  # Gemma 4's: x + LN(MSA(LN(x))), then x + LN(MLP(LN(x)))
            attended, weights = attend(self.attention_norm(inputs))
            attended = self.attention_branch_norm(attended)
            x = inputs + self._drop_path(self._scaled(attended, "attention_layer_scale"), training)
            mlp = self._scaled(self.mlp_branch_norm(self.mlp(self.mlp_norm(x), training)), "mlp_layer_scale")
        else:
            # Eq. 2: z' = MSA(LN(z)) + z
            attended, weights = attend(self.attention_norm(inputs))
            x = inputs + self._drop_path(self._scaled(attended, "attention_layer_scale"), training)
            # Eq. 3: z = MLP(LN(z')) + z'
            mlp = self._scaled(self.mlp(self.mlp_norm(x), training), "mlp_layer_scale")
        outputs = x + self._drop_path(mlp, training)
        if return_attention_weights:
            return outputs, weights
        return outputs

    def get_config(self):
        config = super().get_config()
        config.update(num_heads=self.num_heads, mlp_dim=self.mlp_dim, dropout_rate=self.dropout_rate,
                      attention_dropout_rate=self.attention_dropout_rate,
                      stochastic_depth_rate=self.stochastic_depth_rate, seed=self.seed)
        # Only the switches that are not the paper block's, as flat keys: older keras_vit reads the paper model's.
        config.update(self.switches.changed())
        if self.differential_attention:
            config.update(layer_index=self.layer_index)
        if self.num_kv_heads != self.num_heads:
            config.update(num_kv_heads=self.num_kv_heads)
        if self.relative_position_grid is not None:
            config.update(relative_position_grid=list(self.relative_position_grid))
        if self.window_size:
            config.update(window_size=self.window_size)
        if self.lora_rank:
            config.update(lora_rank=self.lora_rank, lora_targets=list(self.lora_targets))
        return self._with_quantized_sublayers(config)


# Each switch reads as an attribute of the block too (`block.qk_norm`), as readers of a built model ask it.
for _field in dataclasses.fields(BlockSwitches):
    setattr(TransformerBlock, _field.name, property(lambda block, name=_field.name: getattr(block.switches, name),
                                                    doc=f"The block's switch `{_field.name}` (`BlockSwitches`)."))
TransformerBlock.approximate_gelu = property(lambda block: block.switches.approximate_gelu,
                                             doc=BlockSwitches.approximate_gelu.__doc__)
