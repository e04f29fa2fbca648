"""The Vision Transformer as a functional Keras model, and its named variants.

`ViT` builds any size; `VARIANTS` is the one table of named sizes (the
paper's Table 1, the Ti and S sizes of the released checkpoints, and the
ResNet+ViT hybrids), from which `ViT_Ti16` ... `ViT_H14` and `ViT_R50_B16`
... `ViT_R50_L32` are made.
"""

import dataclasses

import keras

from keras_vit import checkpoints
from keras_vit.layers import (
    LAYER_NORM_EPSILON,
    AddPositionEmbedding,
    ClassToken,
    LayerNorm,
    PatchEmbedding,
    TokenPooling,
    TransformerBlock,
)
from keras_vit.position_embedding import as_pair
from keras_vit.resnet import apply_resnet, resnet_stride


@dataclasses.dataclass(frozen=True)
class Variant:
    """The sizes that name a ViT, for example `ViT_B16` or the hybrid `ViT_R50_B16`.

    Hybrids have `resnet_layers` (bottleneck units per ResNet stage; `()` for
    the root block alone) and cut the ResNet's feature map into
    `patch_size` patches; `resnet_width` is the root block's width.
    """

    patch_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    mlp_dim: int
    resnet_layers: tuple = None
    resnet_width: int = 64

    @property
    def pixels_per_patch(self):
        """The side in pixels of the image region one token stands for (16 for B/16 and R50+B/16)."""
        if self.resnet_layers is None:
            return self.patch_size
        return self.patch_size * resnet_stride(self.resnet_layers)


# (hidden_size, num_layers, num_heads, mlp_dim) of each model width.
_WIDTHS = {
    "Ti": (192, 12, 3, 768),
    "S": (384, 12, 6, 1536),
    "B": (768, 12, 12, 3072),
    "L": (1024, 24, 16, 4096),
    "H": (1280, 32, 16, 5120),
}
# The hybrids' ResNet stages by (depth, total stride): R50 at /16 is cut after
# its third stage, which gets 9 units instead of 6, as in the released model.
_RESNETS = {("R50", 16): (3, 4, 9), ("R50", 32): (3, 4, 6, 3), ("R26", 32): (2, 2, 2, 2)}
_NAMED = (
    "Ti/16", "S/16", "S/32", "B/8", "B/16", "B/32", "L/16", "L/32", "H/14",
    "R50+B/16", "R26+B/32", "R26+S/32", "R50+L/32",
)


def decode_variant(spec):
    """`"B/16"` -> `Variant(patch_size=16, hidden_size=768, ...)`; `"R50+B/16"` -> its hybrid.

    A hybrid's `/16` is its total stride: the ResNet's feature map is cut
    into 1x1 patches.
    """
    resnet, _, vit = spec.rpartition("+")
    width, _, patch = vit.partition("/")
    if width not in _WIDTHS or not patch.isdigit() or (resnet and (resnet, int(patch)) not in _RESNETS):
        raise ValueError(
            f"Unknown variant {spec!r}; expected e.g. 'B/16' with a width in {list(_WIDTHS)}, "
            f"or a hybrid {sorted(f'{r}+?/{s}' for r, s in _RESNETS)}."
        )
    hidden_size, num_layers, num_heads, mlp_dim = _WIDTHS[width]
    if resnet:
        return Variant(1, hidden_size, num_layers, num_heads, mlp_dim, _RESNETS[(resnet, int(patch))])
    return Variant(int(patch), hidden_size, num_layers, num_heads, mlp_dim)


VARIANTS = {"ViT_" + spec.replace("+", "_").replace("/", ""): decode_variant(spec) for spec in _NAMED}


def variant_name(sizes):
    """The name of the variant with these `Variant` sizes, or `None`."""
    return next((name for name, variant in VARIANTS.items() if variant == sizes), None)


def _image_size(image_size, input_tensor):
    if input_tensor is not None:
        height, width = tuple(input_tensor.shape)[1:3]
        if height is None or width is None:
            raise ValueError(
                f"input_tensor must have a static height and width, got shape {tuple(input_tensor.shape)}."
            )
        if image_size is not None and as_pair(image_size, "image_size") != (height, width):
            raise ValueError(
                f"image_size {image_size} disagrees with input_tensor's {(height, width)}."
            )
        return (height, width)
    return as_pair(224 if image_size is None else image_size, "image_size")


def ViT(
    image_size=None,
    patch_size=16,
    hidden_size=768,
    num_layers=12,
    num_heads=12,
    mlp_dim=3072,
    resnet_layers=None,
    resnet_width=64,
    classes=None,
    include_top=True,
    weights=None,
    input_tensor=None,
    pooling=None,
    classifier=None,
    representation_size=None,
    dropout_rate=0.0,
    attention_dropout_rate=0.0,
    stochastic_depth_rate=0.0,
    classifier_activation="softmax",
    approximate_gelu=True,
    name=None,
):
    """Build a Vision Transformer (Dosovitskiy et al., 2020).

    Args:
        image_size: int or `(height, width)`, divisible by the pixels one
            patch spans; default 224 (or `input_tensor`'s size).
        patch_size, hidden_size, num_layers, num_heads, mlp_dim: the sizes
            (see `VARIANTS` for the named ones).
        resnet_layers: for a hybrid, the bottleneck units of each ResNet
            stage, e.g. `(3, 4, 9)` for R50+ViT-B/16 (`()`: the root block
            alone); `patch_size` then cuts the ResNet's feature map.
        resnet_width: the ResNet root block's width (stage `i` has
            bottleneck width `resnet_width * 2**i`); a multiple of 32.
        classes: classifier outputs; default the checkpoint's class count
            when `weights` has a head, else 1000.
        include_top: add the classifier (pre-logits and head).
        weights: `None`, a named checkpoint (see `keras_vit.available_weights`),
            or a path to an original `.npz`, a `.keras` or a `.weights.h5` file.
        input_tensor: optional Keras tensor to use as the image input.
        pooling: with `include_top=False`: `None` returns the token sequence,
            `"token"` the class token, `"gap"` the mean of the patch tokens.
        classifier: `"token"` (class token) or `"gap"` (no class token, mean of
            the final patch tokens); default the checkpoint's, else `"token"`.
        representation_size: width of the original pre-logits layer (Dense +
            tanh) before the head; default the checkpoint's; 0 for none.
        dropout_rate: dropout after the position embeddings and every dense
            layer except q/k/v.
        attention_dropout_rate: dropout on the attention probabilities.
        stochastic_depth_rate: drop rate of the last block's residual
            branches, rising linearly from 0 in the first block.
        classifier_activation: activation of the head (computed in float32).
        approximate_gelu: tanh-approximated GELU (the original models') or exact.
        name: model name.

    Returns:
        A `keras.Model` mapping `(batch, height, width, 3)` images in [-1, 1]
        (see `preprocess_input`) to class probabilities or features.

    Example:
    >>> model = ViT(image_size=32, patch_size=8, hidden_size=64, num_layers=2,
    ...             num_heads=4, mlp_dim=128, classes=10)
    >>> model.output_shape
    (None, 10)
    """
    image_size = _image_size(image_size, input_tensor)
    if pooling not in (None, "token", "gap"):
        raise ValueError(f"Unknown pooling {pooling!r}; expected None, 'token' or 'gap'.")
    if classifier not in (None, "token", "gap"):
        raise ValueError(f"Unknown classifier {classifier!r}; expected 'token' or 'gap'.")
    if include_top and pooling is not None:
        raise ValueError("pooling applies only with include_top=False.")
    if resnet_layers is not None:
        resnet_layers = tuple(int(units) for units in resnet_layers)
        if any(units < 1 for units in resnet_layers) or resnet_width < 32 or resnet_width % 32:
            raise ValueError(
                f"resnet_layers {resnet_layers} must count at least one unit per stage and "
                f"resnet_width {resnet_width} must be a multiple of 32 (GroupNorm's 32 groups)."
            )
    sizes = Variant(patch_size, hidden_size, num_layers, num_heads, mlp_dim, resnet_layers, resnet_width)
    step = sizes.pixels_per_patch
    if image_size[0] % step or image_size[1] % step:
        what = f"patch_size {patch_size}" if resnet_layers is None else (
            f"the hybrid's {step} pixels per patch (ResNet stride x patch_size {patch_size})")
        raise ValueError(f"image_size {image_size} is not divisible by {what}.")
    if hidden_size % num_heads:
        raise ValueError(f"hidden_size {hidden_size} is not divisible by num_heads {num_heads}.")
    # Arguments are checked above, before any download.
    source = None
    if weights is not None:
        source = checkpoints.read_weights(weights, variant_name(sizes), image_size)
    if classifier is None:
        classifier = source.classifier if source else "token"
    if representation_size is None:
        representation_size = source.representation_size if source else 0
    if classes is None:
        classes = source.classes if source and source.classes else 1000

    model = _build(
        image_size=image_size,
        sizes=sizes,
        classes=classes,
        include_top=include_top,
        input_tensor=input_tensor,
        pooling=pooling,
        classifier=classifier,
        representation_size=representation_size or 0,
        dropout_rate=dropout_rate,
        attention_dropout_rate=attention_dropout_rate,
        stochastic_depth_rate=stochastic_depth_rate,
        classifier_activation=classifier_activation,
        approximate_gelu=approximate_gelu,
        name=name or variant_name(sizes) or "vit",
    )
    if source is not None:
        checkpoints.load_into(model, source)
    return model


def _build(
    image_size,
    sizes,
    classes,
    include_top,
    input_tensor,
    pooling,
    classifier,
    representation_size,
    dropout_rate,
    attention_dropout_rate,
    stochastic_depth_rate,
    classifier_activation,
    approximate_gelu,
    name,
):
    if pooling == "token" and classifier == "gap":
        raise ValueError("pooling='token' needs a class token, but classifier='gap' has none.")
    shape = (*image_size, 3)
    if input_tensor is None:
        images = keras.Input(shape=shape, name="images")
    elif not keras.backend.is_keras_tensor(input_tensor):
        images = keras.Input(tensor=input_tensor, shape=shape, name="images")
    else:
        images = input_tensor
    step = sizes.pixels_per_patch
    grid_size = (image_size[0] // step, image_size[1] // step)
    num_prefix_tokens = 1 if classifier == "token" else 0

    x = images
    if sizes.resnet_layers is not None:
        x = apply_resnet(x, sizes.resnet_layers, sizes.resnet_width)
    x = PatchEmbedding(sizes.patch_size, sizes.hidden_size, name="embedding")(x)
    if num_prefix_tokens:
        x = ClassToken(name="class_token")(x)
    x = AddPositionEmbedding(grid_size, num_prefix_tokens, name="position_embedding")(x)
    x = keras.layers.Dropout(dropout_rate, name="embedding_dropout")(x)
    for index in range(sizes.num_layers):
        depth_rate = stochastic_depth_rate * index / max(sizes.num_layers - 1, 1)
        x = TransformerBlock(
            num_heads=sizes.num_heads,
            mlp_dim=sizes.mlp_dim,
            dropout_rate=dropout_rate,
            attention_dropout_rate=attention_dropout_rate,
            stochastic_depth_rate=depth_rate,
            approximate_gelu=approximate_gelu,
            name=f"encoderblock_{index}",
        )(x)
    x = LayerNorm(epsilon=LAYER_NORM_EPSILON, name="encoder_norm")(x)

    if include_top:
        x = TokenPooling(classifier, num_prefix_tokens, name="pool")(x)
        if representation_size:
            x = keras.layers.Dense(representation_size, activation="tanh", name="pre_logits")(x)
        x = keras.layers.Dense(classes, kernel_initializer="zeros", name="head")(x)
        x = keras.layers.Activation(classifier_activation, dtype="float32", name="predictions")(x)
    elif pooling is not None:
        x = TokenPooling(pooling, num_prefix_tokens, name="pool")(x)

    inputs = images if input_tensor is None else keras.utils.get_source_inputs(input_tensor)
    return keras.Model(inputs, x, name=name)


def _named_constructor(name, variant):
    def constructor(weights=None, image_size=None, **kwargs):
        return ViT(weights=weights, image_size=image_size, **dataclasses.asdict(variant), **kwargs)

    constructor.__name__ = constructor.__qualname__ = name
    resnet = "" if variant.resnet_layers is None else f"ResNet stages {variant.resnet_layers} + "
    constructor.__doc__ = f"""{name}: {resnet}patch {variant.patch_size}, hidden {variant.hidden_size}, \
{variant.num_layers} layers, {variant.num_heads} heads, MLP {variant.mlp_dim}.

    Takes the keywords of `keras_vit.ViT` except the sizes. Named weights for
    this variant: `keras_vit.available_weights("{name}")`.

    Example:
    >>> model = keras_vit.{name}(weights=None, image_size=224, classes=10)
    """
    return constructor


for _name, _variant in VARIANTS.items():
    globals()[_name] = _named_constructor(_name, _variant)
