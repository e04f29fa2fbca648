"""What the parts of an encoder block share: `BlockPart`, the base of its attention and its MLP.

The parts (`keras_vit.layers.attention.SelfAttention`,
`keras_vit.layers.mlp.Mlp`) are plain Python, not Keras layers. Keras puts
a nested layer's name into the path of every weight under it, and a
`.keras` file stores a sublayer's weights under the attribute name its
layer holds it by; both are the contract with every checkpoint layout and
every saved file (`encoderblock_0/qkv/kernel`). So the sublayers and
weights a part makes are the block's own: made inside the block's `build`,
held by the block under the names they always had.
"""

import keras
from keras import ops

from keras_vit.layers import kernels
from keras_vit.layers.dense import Dense
from keras_vit.layers.norm import norm_layer

# A clipped projection's bounds before a checkpoint sets them: (input_min, input_max, output_min, output_max).
UNBOUNDED = (-float("inf"), float("inf"), -float("inf"), float("inf"))


def _clamp(x, low, high):
    """`x` clamped to `[low, high]` (scalar tensors), by `where`: torch's ONNX export writes `clamp` with tensor
    bounds as a Clip whose bounds it leaves out of the graph."""
    x = ops.where(ops.less(x, low), low, x)
    return ops.where(ops.greater(x, high), high, x)


def clamped_projection(layer, x, bounds, widths=None):
    """`layer(x)` (a `Dense`) where each group of its outputs (q, k and v of a fused projection; `widths` wide, equal
    groups by default) takes `x` clamped to its own input bounds and is clamped to its own output bounds.

    `bounds` is `(groups, 4)`, each row `(input_min, input_max, output_min,
    output_max)`: Gemma 4's `Gemma4ClippableLinear`, one per projection
    that keras_vit fuses. An unquantized layer multiplies each clamped
    input by its group's columns of the kernel (LoRA's included), so the
    product costs what one call does; a quantized one is called once per
    group.

    Example:
    >>> import numpy as np
    >>> layer = Dense(2, use_bias=False, kernel_initializer="ones")
    >>> bounds = np.array([[-1.0, 1.0, -9.0, 9.0], [-9.0, 9.0, -9.0, 3.0]], "float32")
    >>> np.asarray(clamped_projection(layer, np.full((1, 2), 2.0, "float32"), bounds)).tolist()
    [[2.0, 3.0]]
    """
    if not layer.built:
        layer.build(tuple(x.shape))
    bounds = ops.cast(bounds, x.dtype)
    groups = int(bounds.shape[0])
    widths = tuple(widths or (layer.units // groups,) * groups)
    starts = [sum(widths[:group]) for group in range(groups)]
    outputs = []
    for group, (start, width) in enumerate(zip(starts, widths)):
        columns = slice(start, start + width)
        clamped = _clamp(x, bounds[group, 0], bounds[group, 1])
        if groups == 1:
            projected = layer(clamped)
        elif layer.quantization_mode is None:
            dtype = layer.compute_dtype
            bias = None if layer.bias is None else ops.cast(layer.bias[columns], dtype)
            projected = kernels.linear(ops.cast(clamped, dtype), ops.cast(layer.kernel[:, columns], dtype), bias)
        else:
            projected = layer(clamped)[..., columns]
        low, high = (ops.cast(bounds[group, column], projected.dtype) for column in (2, 3))
        outputs.append(_clamp(projected, low, high))
    return outputs[0] if groups == 1 else ops.concatenate(outputs, axis=-1)


class BlockPart:
    """A part of `block` (a `keras_vit.layers.blocks.TransformerBlock`), reading its `switches`.

    `build` (inside the block's) makes its sublayers with the helpers here,
    which collect them in `sublayers` (the block's attribute name -> the
    layer) for the block to track; its weights are the block's own
    (`weight`).
    """

    def __init__(self, block):
        self.block = block
        self.switches = block.switches
        self.sublayers = {}

    def sublayer(self, attribute, layer, input_shape=None):
        """`layer`, built for `input_shape` (if given), which the block holds as `attribute`."""
        self.sublayers[attribute] = layer
        if input_shape is not None:
            layer.build(tuple(input_shape))
        return layer

    def weight(self, name, **options):
        """A weight of the block's own (`encoderblock_0/lambda_q1`), which the block holds as `name` too."""
        variable = self.block.add_weight(name=name, **options)
        setattr(self.block, name, variable)
        return variable

    def norm(self, attribute, input_shape, name=None):
        """The block's kind of norm (`switches.normalization`), never quantized."""
        return self.sublayer(attribute, norm_layer(self.switches.normalization, self.switches.layer_norm_epsilon,
                                                   name=name or attribute, dtype=self.block._sublayer_policy()),
                             input_shape)

    def dense(self, units, name, input_shape, seed_offset, **options):
        """A projection the block may quantize and adapt with LoRA (`lora_targets` names it)."""
        seed = self.block.seed_for(seed_offset)
        options.setdefault("kernel_initializer", keras.initializers.GlorotUniform(seed=seed))
        return self.sublayer(name, Dense(units, name=name, dtype=self.block._sublayer_policy(name),
                                         lora_rank=self.block.lora_rank_of(name), **options), input_shape)

    def clip_bounds(self, name, groups):
        """A clipped projection's bounds (`switches.clipped_linears`), `(groups, 4)`, held by the block as
        `{name}_clip`: buffers a checkpoint sets, never trained (`clamped_projection`)."""
        initial = ops.convert_to_tensor([UNBOUNDED] * groups, "float32")
        return self.weight(f"{name}_clip", shape=(groups, 4), trainable=False, autocast=False,
                           initializer=lambda shape, dtype=None: ops.cast(initial, dtype))

    def project(self, layer, x, name, widths=None):
        """`layer(x)`, clamped by the block's `{name}_clip` bounds where its projections are clipped."""
        if not self.switches.clipped_linears:
            return layer(x)
        return clamped_projection(layer, x, getattr(self.block, f"{name}_clip"), widths)

    def dropout(self, attribute, rate, seed_offset, **options):
        options.setdefault("dtype", self.block._sublayer_policy())
        return self.sublayer(attribute, keras.layers.Dropout(rate, seed=self.block.seed_for(seed_offset), **options))

    @staticmethod
    def apply_dropout(layer, x, training):
        """`layer(x)`, skipped where it is the identity (inference, or rate 0).

        The same result as calling it, cast to the layer's compute dtype as
        its call would (on PyTorch a symbolic `Dense` under mixed precision
        gives float32); there, where Keras runs eagerly, each skipped call
        saves a `Layer.__call__` (a third of a block's).
        """
        if training and layer.rate:
            return layer(x, training=training)
        return ops.cast(x, layer.compute_dtype)
