"""The layers a Vision Transformer is made of, one concept per module.

`InputNormalization` maps the [-1, 1] input to a checkpoint's own pixel
statistics, `PatchEmbedding` cuts an image into patches and projects them, `ClassToken`
prepends the learned [class] token and `RegisterTokens` the register
tokens, `AddPositionEmbedding` adds learned position embeddings (resizing
them when the grid changes), `TransformerBlock` is one
encoder block (paper Eq. 2-3) composed of self-attention, an MLP and norms, and `TokenPooling` or
`AttentionPooling` reduces the tokens to one vector for the head. Every layer uses `keras.ops` only, so it runs on JAX, TensorFlow and
PyTorch alike, and every weight keeps the layout of the original Flax
checkpoints. How attention and LayerNorm are differentiated on each platform
is `keras_vit.layers.kernels`' business, not the layers'.

- `embedding`: input scaling, patch embedding, class and register tokens, token pooling;
- `position_embedding`: learned position tables and the one place that resizes them (and patch kernels);
- `rope`: rotary position embeddings;
- `relative_position`: BEiT's relative position bias tables (a block's own, or one shared), their resize;
- `blocks`: the Transformer encoder block in its four shapes (pre-norm, post-norm, parallel, sandwich) and its
  switches, `BlockSwitches`;
- `attention`: multi-head self-attention (plain, with weights, differential; RoPE, q/k norm, key bias);
- `mlp`: the MLP (GELU, QuickGELU, SwiGLU, GeGLU with exact or tanh GELU; its input and hidden norms) and its
  activations;
- `parts`: what the block's parts share (Gemma 4's clamped projections among it), and why they are plain Python
  rather than Keras layers;
- `attention_pooling`: multi-head attention pooling (MAP);
- `class_attention`: CaiT's class-attention block, in which the class token alone attends;
- `windows`: SAM's windowed attention, decomposed relative positions and convolutional neck;
- `axis_positions`, `soft_tokens`: Gemma 4's position tables (one per axis) and its soft-token pooling;
- `naflex`: NaFlex inputs (pre-cut patches, each image's own grid, padding masks);
- `norm`, `dense`: the LayerNorm/RMSNorm and the projections every block uses;
- `conv_stem`, `resnet`, `mbconv`: the stems of the hybrid models (MobileCLIP's, the ResNet, ViTamin's);
- `kernels`: the speed kernels and their switches.

This package imports nothing from the rest of keras_vit but `keras_vit.utils`.
"""

from keras_vit.layers.attention_pooling import AttentionPooling
from keras_vit.layers.axis_positions import AxisPositionEmbedding
from keras_vit.layers.blocks import BlockSwitches, TransformerBlock
from keras_vit.layers.embedding import (
    PRECISIONS,
    ClassToken,
    DistillationToken,
    InputNormalization,
    PatchEmbedding,
    RegisterTokens,
    TokenPooling,
    dtype_policy,
)
from keras_vit.layers.norm import LAYER_NORM_EPSILON, LayerNorm, RMSNorm, norm_layer
from keras_vit.layers.position_embedding import AddPositionEmbedding
from keras_vit.layers.soft_tokens import SoftTokenPooling

__all__ = [
    "AddPositionEmbedding",
    "AttentionPooling",
    "AxisPositionEmbedding",
    "BlockSwitches",
    "ClassToken",
    "DistillationToken",
    "InputNormalization",
    "LAYER_NORM_EPSILON",
    "LayerNorm",
    "PRECISIONS",
    "PatchEmbedding",
    "RMSNorm",
    "RegisterTokens",
    "SoftTokenPooling",
    "TokenPooling",
    "TransformerBlock",
    "dtype_policy",
    "norm_layer",
]
