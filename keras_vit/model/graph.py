"""The Keras graph of a ViT, from sizes and switches that `keras_vit.ViT` has already resolved and checked.

`ModelOptions` holds them (a checkpoint's defaults included); `build` lays
out the layers: the input normalisation, a hybrid's stem, the patches,
position embeddings and prefix tokens, the blocks, the pooling and the
head. It reads no file: `keras_vit.applications.vit` reads checkpoints and loads them
after the model is built.

Example:
>>> from keras_vit.model.variants import Variant
>>> build(ModelOptions(image_size=(32, 32), sizes=Variant(8, 24, 1, 3, 48), classes=5), None).output_shape
(None, 5)
"""

import dataclasses

import keras

from keras_vit.layers import (
    AddPositionEmbedding,
    AttentionPooling,
    ClassToken,
    DistillationToken,
    InputNormalization,
    PatchEmbedding,
    RegisterTokens,
    TokenPooling,
    TransformerBlock,
    norm_layer,
)
from keras_vit.layers.axis_positions import AxisPositionEmbedding
from keras_vit.layers.blocks import BlockSwitches
from keras_vit.layers.class_attention import ClassAttentionBlock
from keras_vit.layers.conv_stem import apply_conv_stem
from keras_vit.layers.mbconv import MbConvEmbedding, apply_mbconv_stem
from keras_vit.layers.mlp import GATED
from keras_vit.layers.naflex import (
    NaFlexFactorizedPositionEmbedding,
    NaFlexPatchEmbedding,
    NaFlexPositionEmbedding,
    NaFlexRotaryPositions,
    NaFlexTokenMask,
)
from keras_vit.layers.relative_position import RelativePositionBias
from keras_vit.layers.resnet import apply_resnet
from keras_vit.layers.rope import RotaryPositions
from keras_vit.layers.soft_tokens import SoftTokenPooling
from keras_vit.layers.windows import SamNeck
from keras_vit.model.architecture import Architecture
from keras_vit.model.variants import Variant
from keras_vit.model.vision_transformer import DYNAMIC, VisionTransformer


def position_grid(image_size, sizes, source):
    """The grid of the position table: the image's, or with dynamic resolution the checkpoint's (else 224 px)."""
    step = sizes.pixels_per_patch
    if image_size != DYNAMIC:
        return (image_size[0] // step, image_size[1] // step)
    if source is not None and source.state is not None:
        if source.grid_size is not None:
            return tuple(source.grid_size)
        table = source.state.get("position_embedding/pos_embedding")
        grid = None if table is None else source.architecture.grid_of(table.shape[1])
        if grid is not None:
            return grid
    return (max(224 // step, 1),) * 2


@dataclasses.dataclass(frozen=True)
class ModelOptions:
    """Everything `ViT` resolved (checkpoint defaults included) that shapes the built model."""

    image_size: tuple
    sizes: Variant
    classes: int = 1000
    include_top: bool = True
    pooling: str = None
    architecture: Architecture = Architecture()
    representation_size: int = 0
    dropout_rate: float = 0.0
    attention_dropout_rate: float = 0.0
    stochastic_depth_rate: float = 0.0
    classifier_activation: str = "softmax"
    position_grid: tuple = None  # Default: the image's grid.
    position_embedding_interpolation: str = "bicubic"
    position_embedding_antialias: bool = False
    naflex: bool = False  # Take NaFlex batches (`keras_vit.layers.naflex`) instead of images.
    naflex_patch_sizes: tuple = None  # NaFlex: other patch sizes it takes, its kernel resampled (FlexiViT).
    position_embedding_aspect_preserving: bool = False  # NaFlex: timm's pos_embed_ar_preserving.
    position_embedding_align_corners: bool = False  # NaFlex: timm's pos_embed_align_corners (RADIO v3).
    position_embedding_factorized: bool = False  # NaFlex: a table of rows and one of columns (timm's 'factorized').
    drop_remainder: bool = False
    name: str = "vit"
    dtype: object = None  # Every layer's keras.DTypePolicy; None: Keras' global policy.


def build(options, input_tensor):
    sizes, image_size = options.sizes, options.image_size
    architecture = options.architecture.with_blocks(sizes.num_layers, sizes.num_heads)
    kv_heads = architecture.kv_heads_per_block(sizes.num_layers, sizes.num_heads)
    if options.pooling == "token" and not architecture.class_token:
        raise ValueError(f"pooling='token' needs a class token, but classifier={architecture.classifier!r} has none.")
    grid_size = options.position_grid or position_grid(image_size, sizes, None)
    num_prefix_tokens = architecture.num_prefix_tokens
    epsilon = architecture.layer_norm_epsilon
    dynamic = image_size == DYNAMIC
    if architecture.on_one_grid and (dynamic or options.naflex):
        raise ValueError("A relative position bias, SAM's windows or its neck are built for one patch grid (as timm's "
                         "Beit, VisionTransformerRelPos and VisionTransformerSAM take one input size at a time): build "
                         "the model at a fixed image_size; loading a checkpoint at another size resizes its tables, as "
                         "timm does.")
    if options.position_embedding_factorized and not options.naflex:
        raise ValueError("Factorized position tables apply to NaFlex models only, as timm's NaFlexVit builds them; "
                         "pass naflex=True.")
    if (architecture.axis_position_table or architecture.soft_token_pool) and options.naflex:
        raise ValueError("Gemma 4's position tables and soft tokens (axis_position_table, soft_token_pool) take whole "
                         "images here, at any size: build the model without naflex=True.")
    typed = {"dtype": options.dtype}  # Given to every layer, so that building never touches the global policy.
    if options.naflex:
        x, patch_grid, inputs, position = _naflex_patches(options, input_tensor, grid_size, typed)
        dynamic = True
    else:
        x, patch_grid, inputs, position = _image_patches(options, input_tensor, grid_size, typed)
    if architecture.patch_norm:
        x = norm_layer(architecture.normalization, epsilon, name="patch_norm", **typed)(x)
    if architecture.axis_position_table:  # Gemma 4's: a table per axis, read at each patch's column and row
        axes = AxisPositionEmbedding(grid_size, architecture.axis_position_table, name="axis_position_embedding",
                                     **typed)
        x = axes(x, patch_grid=patch_grid) if dynamic else axes(x)
    if position is not None and not architecture.class_token_position_embedding:  # no_embed_class: patches only.
        x = _add_positions(position, x, patch_grid, dynamic)
    if architecture.register_tokens:  # [class, registers..., patches], as timm orders them.
        x = RegisterTokens(architecture.register_tokens, name="register_tokens", **typed)(x)
    if architecture.distillation_token:  # [class, distillation, patches], as timm orders them.
        x = DistillationToken(name="distillation_token", **typed)(x)
    if architecture.class_token and not architecture.class_attention_blocks:
        x = ClassToken(name="class_token", **typed)(x)
    if position is not None and architecture.class_token_position_embedding:
        x = _add_positions(position, x, patch_grid, dynamic)
    call_options, pool_options = {}, {}
    if options.naflex:
        token_mask = NaFlexTokenMask(num_prefix_tokens, name="token_mask", **typed)(inputs["patch_mask"],
                                                                                   inputs["patch_grid"])
        call_options["key_mask"] = pool_options["token_mask"] = token_mask
    if architecture.rope and options.naflex:
        call_options["rope_positions"] = NaFlexRotaryPositions(
            architecture.rope, num_prefix_tokens, architecture.rope_grid_offset, architecture.rope_reference_grid,
            architecture.rope_grid_indexing, name="rotary_positions", **typed)(x, inputs["patch_grid"])
    elif architecture.rope:
        rotary = RotaryPositions(grid_size, architecture.rope, num_prefix_tokens, architecture.rope_grid_offset,
                                 architecture.rope_reference_grid, architecture.rope_grid_indexing,
                                 name="rotary_positions", **typed)
        call_options["rope_positions"] = rotary(x, patch_grid=patch_grid) if dynamic else rotary(x)
    if architecture.shared_relative_position_bias:
        call_options["attention_bias"] = RelativePositionBias(
            grid_size, sizes.num_heads, architecture.shared_relative_position_bias,
            architecture.relative_position_mlp_dim, name="relative_position_bias", **typed)(x)
    x = keras.layers.Dropout(options.dropout_rate, name="embedding_dropout", **typed)(x)
    if architecture.norm_pre:
        x = norm_layer(architecture.normalization, epsilon, name="pre_norm", **typed)(x)
    for index in range(sizes.num_layers):
        depth_rate = options.stochastic_depth_rate * index / max(sizes.num_layers - 1, 1)
        x = TransformerBlock(
            num_heads=sizes.num_heads,
            mlp_dim=sizes.mlp_dim,
            dropout_rate=options.dropout_rate,
            attention_dropout_rate=options.attention_dropout_rate,
            stochastic_depth_rate=depth_rate,
            layer_index=index,
            switches=BlockSwitches.of(architecture),
            num_kv_heads=kv_heads[index],
            relative_position_grid=grid_size if architecture.on_one_grid else None,
            window_size=architecture.window_of(index),
            name=f"encoderblock_{index}",
            **typed,
        )(x, **call_options)
    if architecture.class_attention_blocks:  # CaiT: the class token enters now, and attends to the patches alone
        x = ClassToken(name="class_token", **typed)(x)
        ratio = architecture.class_attention_mlp_ratio
        for index in range(architecture.class_attention_blocks):
            x = ClassAttentionBlock(sizes.num_heads, int(sizes.hidden_size * ratio) if ratio else sizes.mlp_dim,
                                    architecture.mlp_activation, architecture.qkv_bias,
                                    1.0 if architecture.layer_scale is None else architecture.layer_scale, epsilon,
                                    name=f"class_attention_{index}", **typed)(x)
    if architecture.soft_token_pool:  # Gemma 4's soft tokens, in place of the patches
        soft = SoftTokenPooling(architecture.soft_token_pool, grid_size, architecture.soft_token_standardize,
                                name="soft_tokens", **typed)
        x = soft(x, patch_grid=patch_grid) if dynamic else soft(x)
    if architecture.neck_channels is not None:  # SAM's image embedding, in place of the final norm
        x = SamNeck(architecture.neck_channels, grid_size, name="neck", **typed)(x)
    elif architecture.final_norm and not architecture.fc_norm:
        x = norm_layer(architecture.normalization, epsilon, name="encoder_norm", scale=architecture.final_norm_scale,
                       **typed)(x)

    pooling = architecture.classifier if options.include_top else options.pooling
    pooled_from = 0 if architecture.pool_include_prefix and pooling != "token" else num_prefix_tokens
    tokens = x
    if pooling == "map":
        activation = "gelu" if architecture.mlp_activation in GATED else architecture.mlp_activation
        heads, ratio = architecture.attention_pool_heads, architecture.attention_pool_mlp_ratio
        x = AttentionPooling(heads or sizes.num_heads, int(sizes.hidden_size * ratio) if ratio else sizes.mlp_dim,
                             activation=activation, layer_norm_epsilon=epsilon,
                             num_prefix_tokens=pooled_from, name="attention_pool", **typed)(x, **pool_options)
    elif pooling is not None:
        x = TokenPooling(pooling, pooled_from, name="pool", **typed)(x, **pool_options)
    if pooling is None and not options.include_top and architecture.neck_channels is not None:
        # SAM's image embedding as a map, channels last: timm's forward_features (batch, channels, h, w)
        x = keras.layers.Reshape((*grid_size, x.shape[-1]), name="neck_grid", **typed)(x)
    if pooling is not None and architecture.fc_norm:
        x = norm_layer(architecture.normalization, epsilon, name="fc_norm", scale=architecture.final_norm_scale,
                       **typed)(x)
    if pooling == "token" and architecture.distillation_token:
        x = _distilled_head(options, x, tokens, typed)
    elif options.include_top:
        if options.representation_size:
            x = keras.layers.Dense(options.representation_size, activation="tanh", name="pre_logits", **typed)(x)
        x = keras.layers.Dense(options.classes, kernel_initializer="zeros", name="head", **typed)(x)
    if options.include_top:
        x = keras.layers.Activation(options.classifier_activation, dtype="float32", name="predictions")(x)

    return VisionTransformer(inputs, x, name=options.name, classifier=architecture.classifier,
                             architecture=architecture, sizes=sizes, native_grid=grid_size)


def _distilled_head(options, class_vector, tokens, typed):
    """DeiT distilled's pooling or heads on the class token `class_vector`, as timm's VisionTransformerDistilled.

    With its top, `head` on the class token and `head_dist` on the
    distillation token, their logits averaged; without it, the mean of the
    two tokens (timm's `forward_head(pre_logits=True)`).
    """
    if options.representation_size:
        raise ValueError("A distilled DeiT (distillation_token=True) has no pre-logits layer; pass "
                         "representation_size=0.")
    dist_vector = TokenPooling("distillation", 2, name="pool_distillation", **typed)(tokens)
    if not options.include_top:
        return keras.layers.Average(name="pool_average", **typed)([class_vector, dist_vector])
    logits = [keras.layers.Dense(options.classes, kernel_initializer="zeros", name=name, **typed)(vector)
              for name, vector in (("head", class_vector), ("head_dist", dist_vector))]
    return keras.layers.Average(name="head_average", **typed)(logits)


def has_distillation_heads(model):
    """Whether `model` is a distilled DeiT with its top: layers `head` and `head_dist` whose logits it averages."""
    return {"head", "head_dist"} <= {layer.name for layer in getattr(model, "layers", ())}


def distillation_heads(model):
    """`model`'s two heads as a `keras.Model` of its inputs: `[class logits, distillation logits]`.

    For a distilled DeiT (`distillation_token=True`, with its top): the
    outputs of `head` (on the class token) and `head_dist` (on the
    distillation token), before their average and the classifier
    activation, sharing `model`'s layers and weights. DeiT's hard
    distillation trains the first on the labels and the second on a
    teacher's predictions.

    Example:
    >>> from keras_vit.model.variants import Variant
    >>> model = build(ModelOptions(image_size=(32, 32), sizes=Variant(8, 24, 1, 3, 48), classes=5,
    ...                            architecture=Architecture(distillation_token=True)), None)
    >>> [tuple(output.shape) for output in distillation_heads(model).outputs]
    [(None, 5), (None, 5)]
    """
    if not has_distillation_heads(model):
        raise ValueError(f"{model.name!r} has no distillation head (head_dist): build a distilled DeiT "
                         "(distillation_token=True) with include_top=True.")
    return keras.Model(model.input, [model.get_layer("head").output, model.get_layer("head_dist").output],
                       name=f"{model.name}_heads")


def _add_positions(position, x, patch_grid, dynamic):
    if isinstance(position, (NaFlexPositionEmbedding, NaFlexFactorizedPositionEmbedding)):
        return position(x, patch_grid)
    return position(x, patch_grid=patch_grid) if dynamic else position(x)


def _image_patches(options, input_tensor, grid_size, typed):
    """The patch tokens of `(batch, height, width, 3)` images: `(tokens, patch grid, inputs, position layer)`."""
    sizes, architecture = options.sizes, options.architecture
    dynamic = options.image_size == DYNAMIC
    shape = (*options.image_size, 3)
    if input_tensor is None:
        images = keras.Input(shape=shape, name="images")
    elif not keras.backend.is_keras_tensor(input_tensor):
        images = keras.Input(tensor=input_tensor, shape=shape, name="images")
    else:
        images = input_tensor
    x = images
    if architecture.normalizes_input:
        x = InputNormalization(architecture.input_mean, architecture.input_std, name="input_normalization", **typed)(x)
    if sizes.resnet_layers is not None:
        x = apply_resnet(x, sizes.resnet_layers, sizes.resnet_width, architecture.resnet_epsilons, options.dtype)
    if sizes.conv_stem_widths is not None:
        x = apply_conv_stem(x, sizes.conv_stem_widths, options.dtype)
    embedding = PatchEmbedding
    if sizes.mbconv_widths is not None:
        x = apply_mbconv_stem(x, sizes.mbconv_widths, sizes.mbconv_depths, options.dtype)
        embedding = MbConvEmbedding
    x = patch_grid = embedding(sizes.patch_size, sizes.hidden_size, flatten=not dynamic,
                               use_bias=architecture.patch_bias, drop_remainder=options.drop_remainder,
                               name="embedding", **typed)(x)
    if dynamic:
        x = keras.layers.Reshape((-1, sizes.hidden_size), name="flatten_patches", **typed)(patch_grid)
    position = AddPositionEmbedding(
        grid_size,
        architecture.position_prefix_rows,
        interpolation=options.position_embedding_interpolation,
        antialias=options.position_embedding_antialias,
        name="position_embedding",
        **typed,
    ) if architecture.position_embedding else None
    inputs = images if input_tensor is None else keras.utils.get_source_inputs(input_tensor)
    return x, patch_grid, inputs, position


def _naflex_patches(options, input_tensor, grid_size, typed):
    """The patch tokens of a NaFlex batch (`keras_vit.layers.naflex`): `(tokens, patch_grid, inputs, position)`."""
    sizes, architecture = options.sizes, options.architecture
    if input_tensor is not None:
        raise ValueError("A NaFlex model takes its three inputs (patches, patch_grid, patch_mask) itself; "
                         "leave input_tensor unset.")
    if sizes.resnet_layers is not None or sizes.conv_stem_widths is not None or sizes.mbconv_widths is not None:
        raise ValueError("A hybrid ViT's convolutional stem needs whole images, and NaFlex cuts the patches before "
                         "the model: build it without naflex=True.")
    # Any patch width: NaFlexPatchEmbedding resamples its kernel to another patch size (FlexiViT).
    inputs = {"patches": keras.Input(shape=(None, None), name="patches"),
              "patch_grid": keras.Input(shape=(2,), dtype="int32", name="patch_grid"),
              "patch_mask": keras.Input(shape=(None,), dtype="bool", name="patch_mask")}
    x = inputs["patches"]
    if architecture.normalizes_input:
        x = InputNormalization(architecture.input_mean, architecture.input_std, name="input_normalization", **typed)(x)
    x = NaFlexPatchEmbedding(sizes.patch_size, sizes.hidden_size, use_bias=architecture.patch_bias,
                             patch_sizes=options.naflex_patch_sizes, name="embedding", **typed)(x)
    if options.position_embedding_factorized and architecture.position_embedding:
        if architecture.position_prefix_rows:
            raise ValueError("Factorized position tables hold the patches' positions alone, as timm's NaFlexVit's; "
                             "pass class_token_position_embedding=False.")
        position = NaFlexFactorizedPositionEmbedding(
            grid_size, aspect_preserving=options.position_embedding_aspect_preserving, name="position_embedding",
            **typed)
        return x, inputs["patch_grid"], inputs, position
    position = NaFlexPositionEmbedding(
        grid_size,
        architecture.position_prefix_rows,
        interpolation=options.position_embedding_interpolation,
        antialias=options.position_embedding_antialias,
        aspect_preserving=options.position_embedding_aspect_preserving,
        align_corners=options.position_embedding_align_corners,
        name="position_embedding",
        **typed,
    ) if architecture.position_embedding else None
    return x, inputs["patch_grid"], inputs, position
