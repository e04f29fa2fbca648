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

from keras_vit.layers.dense import Dense
from keras_vit.layers.norm import norm_layer


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
