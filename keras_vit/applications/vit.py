"""The Vision Transformer as a functional Keras model, and its named variants.

`ViT` builds any size; `ViT_Ti16` ... `ViT_H14` and the hybrids
`ViT_R50_B16` ... `ViT_R50_L32` build the sizes of `keras_vit.VARIANTS`.
Checkpoints are read by `keras_vit.checkpoints` and loaded here, after the
model is built.
"""

import dataclasses

from keras_vit import checkpoints
from keras_vit.data.naflex import naflex_preprocessing
from keras_vit.layers import dtype_policy
from keras_vit.model.architecture import Architecture, check_switches, resolve_architecture
from keras_vit.model.graph import ModelOptions, build, position_grid
from keras_vit.model.variants import VARIANTS, Variant, variant_name
from keras_vit.model.vision_transformer import (  # noqa: F401
    DYNAMIC,
    VisionTransformer,
    check_image_size,
    native_image_size,
)
from keras_vit.utils.keras_internals import build_without_values, initialize
from keras_vit.utils.shapes import as_pair


def _image_size(image_size, input_tensor):
    if input_tensor is not None:
        height, width = tuple(input_tensor.shape)[1:3]
        if (height is None) != (width is None):
            raise ValueError(
                f"input_tensor must have a static height and width, or neither, got shape "
                f"{tuple(input_tensor.shape)}."
            )
        if image_size is not None and _pair_or_dynamic(image_size) != (height, width):
            raise ValueError(
                f"image_size {image_size} disagrees with input_tensor's {(height, width)}."
            )
        return (height, width)
    return _pair_or_dynamic(224 if image_size is None else image_size)


def _pair_or_dynamic(image_size):
    if isinstance(image_size, (tuple, list)) and tuple(image_size) == DYNAMIC:
        return DYNAMIC
    if isinstance(image_size, (tuple, list)) and None in tuple(image_size):
        raise ValueError(f"image_size {tuple(image_size)} fixes one side only; pass (None, None) for any size, "
                         "or a (height, width) of ints.")
    return as_pair(image_size, "image_size")


def ViT(
    image_size=None,
    patch_size=16,
    hidden_size=768,
    num_layers=12,
    num_heads=None,
    mlp_dim=3072,
    resnet_layers=None,
    resnet_width=64,
    conv_stem_widths=None,
    mbconv_widths=None,
    mbconv_depths=None,
    classes=None,
    class_names=None,
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
    approximate_gelu=None,
    position_embedding_interpolation=None,
    position_embedding_antialias=None,
    naflex=None,
    naflex_patch_sizes=None,
    position_embedding_aspect_preserving=None,
    position_embedding_align_corners=None,
    position_embedding_factorized=None,
    drop_remainder=False,
    dtype=None,
    name=None,
    architecture=None,
    **switches,
):
    """Build a Vision Transformer (Dosovitskiy et al., 2020).

    Args:
        image_size: int or `(height, width)`, divisible by the pixels one
            patch spans; default 224 (or `input_tensor`'s size).
            `(None, None)` takes any size that divides into patches, with
            the position embeddings resized to each input's grid on every
            call (dynamic resolution); the table keeps the checkpoint's grid,
            or 224 pixels' worth of patches.
        patch_size, hidden_size, num_layers, num_heads, mlp_dim: the sizes
            (see `VARIANTS` for the named ones). `num_heads` defaults to the
            checkpoint's (an `.npz` or `.keras` file stores it), else 12; a
            `.weights.h5` file does not store it, so pass it with one.
        resnet_layers: for a hybrid, the bottleneck units of each ResNet
            stage, e.g. `(3, 4, 9)` for R50+ViT-B/16 (`()`: the root block
            alone); `patch_size` then cuts the ResNet's feature map.
        resnet_width: the ResNet root block's width (stage `i` has
            bottleneck width `resnet_width * 2**i`); a multiple of 32.
        conv_stem_widths: for MobileCLIP's hybrid (timm's `vit_base_mci_224`),
            the two widths of its convolutional stem (`keras_vit.layers.conv_stem`),
            which puts 8 pixels in each position before `patch_size` patches.
        mbconv_widths, mbconv_depths: for ViTamin (timm's `vitamin_*`), the
            widths of its MbConv stem (the stem's, then each stage's) and
            the blocks of each stage (`keras_vit.layers.mbconv`); its patch
            embedding is then a 3x3 convolution striding by `patch_size` (2).
        classes: classifier outputs; default the number of `class_names`,
            else the checkpoint's class count when `weights` has a head,
            else 1000.
        class_names: one name per output (e.g. a `keras_vit.data.Source`'s
            `class_names`), kept as `model.class_names` and in its `.keras`
            file, where `decode_predictions` and `keras-vit predict` read
            them; default the checkpoint's, for its own head.
        include_top: add the classifier (pre-logits and head).
        weights: `None`, a named checkpoint (see `keras_vit.available_weights`),
            or a path to an original `.npz`, a `.keras` or a `.weights.h5` file.
        input_tensor: optional Keras tensor to use as the image input.
        pooling: with `include_top=False`: `None` returns the token sequence,
            `"token"` the class token, `"gap"` the mean of the patch tokens,
            `"map"` attention pooling (followed by `fc_norm` where the model has it).
        classifier: how the head pools: `"token"` (class token), `"gap"` (mean
            of the final patch tokens; without a class token unless
            `class_token=True`) or `"map"` (attention pooling, SigLIP's);
            default the checkpoint's, else `"token"`.
        representation_size: width of the original pre-logits layer (Dense +
            tanh) before the head; default the checkpoint's; 0 for none.
        dropout_rate: dropout after the position embeddings and every dense
            layer except q/k/v.
        attention_dropout_rate: dropout on the attention probabilities.
        stochastic_depth_rate: drop rate of the last block's residual
            branches, rising linearly from 0 in the first block.
        classifier_activation: activation of the head (computed in float32).
        approximate_gelu: tanh-approximated GELU (the original checkpoints') or
            exact (timm's); default the checkpoint's form (exact for timm
            weights), else tanh.
        position_embedding_interpolation: `"bicubic"` or `"bilinear"`: how the
            position embeddings are resized, to a checkpoint's new grid and,
            with dynamic resolution, to each input's grid. Default: what the
            checkpoint's library does at load (docs/checkpoints.md), else `"bicubic"`.
        position_embedding_antialias: resize with torch's anti-aliased kernels
            (with `"bicubic"`, timm's `dynamic_img_size`); default as above.
        naflex: take NaFlex batches (`keras_vit.layers.naflex`: images of
            any aspect ratio and size as padded patch sequences, each with
            its own grid), as timm's `use_naflex=True`, and also
            transformers' Siglip2 processor output and plain image batches
            of any size in whole patches; default the checkpoint's (timm's
            NaFlexVit, transformers' Siglip2), else False. Any fixed-size
            model's weights run so.
        naflex_patch_sizes: with `naflex`, other square patch sizes the
            model takes besides `patch_size`, its patch kernel resampled to
            each (FlexiViT; `naflex_batches.NaFlexBatches(patch_sizes=...)`
            trains on them); any other size is refused.
        position_embedding_aspect_preserving, position_embedding_align_corners:
            with `naflex`, resize the position table to a square of the
            longer side and crop it (timm's `pos_embed_ar_preserving`), and
            corner to corner (`pos_embed_align_corners`); default the checkpoint's.
        position_embedding_factorized: with `naflex`, a table of rows and
            one of columns (`keras_vit.layers.naflex.NaFlexFactorizedPositionEmbedding`,
            timm's `pos_embed='factorized'`) instead of one table of the
            grid; default the checkpoint's.
        drop_remainder: take an `image_size` that patches do not divide, as
            timm does: the last rows and columns that fill no patch are not
            seen (SigLIP so400m/14 at 384 px: 6). `from_pretrained` sets it
            for such a checkpoint's own size; else such a size is an error.
        dtype: the precision the model runs in: `"float32"`, `"bfloat16"`,
            `"mixed_bfloat16"` (float32 weights, bfloat16 computation),
            `"float16"`, `"mixed_float16"` or a `keras.DTypePolicy`; default
            the global policy. A float32 checkpoint loads into it. LayerNorm,
            the attention softmax and the logits stay in float32. Kept in the
            `.keras` file.
        architecture: a `keras_vit.Architecture`, the switches of timm's ViT
            family at once; default the checkpoint's, else the paper's.
        **switches: any other field of `keras_vit.Architecture` (its
            docstring describes each), replacing that field of `architecture`:
            e.g. `register_tokens=4`, `layer_scale=1e-5`, `mlp_activation="gelu"`,
            `layer_norm_epsilon=1e-12`, `qk_norm=True`, `rope="axial"`.

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
    policy = dtype_policy(dtype)
    if pooling not in (None, "token", "gap", "map"):
        raise ValueError(f"Unknown pooling {pooling!r}; expected None, 'token', 'gap' or 'map'.")
    if architecture is not None and not isinstance(architecture, Architecture):
        raise ValueError(f"architecture must be a keras_vit.Architecture, got {type(architecture).__name__}.")
    check_switches(switches)
    if approximate_gelu is not None and switches.get("mlp_activation") is None:
        switches["mlp_activation"] = "gelu_tanh" if approximate_gelu else "gelu"
    resolve_architecture(architecture, classifier, switches)  # Bad switches fail before any download.
    class_names, classes = named_classes(class_names, classes, include_top)
    if include_top and pooling is not None:
        raise ValueError("pooling applies only with include_top=False.")
    if resnet_layers is not None:
        resnet_layers = tuple(int(units) for units in resnet_layers)
        if any(units < 1 for units in resnet_layers) or resnet_width < 32 or resnet_width % 32:
            raise ValueError(
                f"resnet_layers {resnet_layers} must count at least one unit per stage and "
                f"resnet_width {resnet_width} must be a multiple of 32 (GroupNorm's 32 groups)."
            )
    if conv_stem_widths is not None:
        conv_stem_widths = tuple(int(width) for width in conv_stem_widths)
        if resnet_layers is not None or len(conv_stem_widths) != 2 or min(conv_stem_widths) < 1:
            raise ValueError(f"conv_stem_widths {conv_stem_widths} must be two widths >= 1, without resnet_layers.")
    if (mbconv_widths is None) != (mbconv_depths is None):
        raise ValueError("mbconv_widths and mbconv_depths come together (ViTamin's MbConv stem); got one of them.")
    if mbconv_widths is not None:
        mbconv_widths, mbconv_depths = (tuple(int(n) for n in values) for values in (mbconv_widths, mbconv_depths))
        if resnet_layers is not None or conv_stem_widths is not None or not mbconv_depths \
                or len(mbconv_widths) != len(mbconv_depths) + 1 or min(mbconv_widths + mbconv_depths) < 1:
            raise ValueError(f"mbconv_widths {mbconv_widths} must be one width (the stem's) more than the stages "
                             f"of mbconv_depths {mbconv_depths}, each >= 1, without another stem.")
    sizes = Variant(patch_size, hidden_size, num_layers, num_heads or 12, mlp_dim, resnet_layers, resnet_width,
                    conv_stem_widths, mbconv_widths, mbconv_depths)
    check_image_size(image_size, sizes, drop_remainder)
    if position_embedding_interpolation not in (None, "bicubic", "bilinear"):
        raise ValueError(f"Unknown position_embedding_interpolation {position_embedding_interpolation!r}; "
                         "expected 'bicubic' or 'bilinear'.")
    if num_heads is not None and hidden_size % num_heads:
        raise ValueError(f"hidden_size {hidden_size} is not divisible by num_heads {num_heads}.")
    # Arguments are checked above, before any download.
    chosen_size = (224, 224) if image_size == DYNAMIC else image_size  # Which published resolution to take.
    source = None if weights is None else checkpoints.read_weights(weights, variant_name(sizes), chosen_size, sizes,
                                                                  classes)
    if num_heads is None and source is not None:
        if source.num_heads is not None:
            sizes = dataclasses.replace(sizes, num_heads=source.num_heads)
        elif variant_name(sizes) is None:  # A .weights.h5 file, which does not store it.
            raise checkpoints.CheckpointError(
                f"{source.description} does not store the number of attention heads, and the sizes match "
                "no named variant; pass num_heads= (named constructors such as keras_vit.ViT_B16 know theirs)."
            )
    if hidden_size % sizes.num_heads:
        raise ValueError(f"hidden_size {hidden_size} is not divisible by num_heads {sizes.num_heads}.")
    architecture = resolve_architecture(architecture or (source.architecture if source else None), classifier,
                                        switches)
    # The resize the file's own library applies when it loads the file at another size, unless told.
    resize = source.position_resize if source and source.position_resize else ("bicubic", False)
    interpolation = position_embedding_interpolation or resize[0]
    antialias = bool(resize[1] if position_embedding_antialias is None else position_embedding_antialias)
    naflex = bool(source.naflex if naflex is None and source else naflex)
    if naflex_patch_sizes and not naflex:
        raise ValueError("naflex_patch_sizes applies to NaFlex models only; pass naflex=True.")
    if naflex and (source is not None or image_size == (224, 224)):  # the checkpoint's table, else 224 px worth
        image_size = DYNAMIC
    naflex_resize = _naflex_resize(naflex, source, position_embedding_aspect_preserving,
                                   position_embedding_align_corners, position_embedding_factorized)
    if representation_size is None:
        representation_size = source.representation_size if source else 0
    if classes is None:
        classes = source.classes if source and source.classes else 1000
    options = ModelOptions(
        image_size=image_size,
        sizes=sizes,
        classes=classes,
        include_top=include_top,
        pooling=pooling,
        architecture=architecture,
        representation_size=representation_size or 0,
        dropout_rate=dropout_rate,
        attention_dropout_rate=attention_dropout_rate,
        stochastic_depth_rate=stochastic_depth_rate,
        classifier_activation=classifier_activation,
        position_grid=position_grid(image_size, sizes, source),
        position_embedding_interpolation=interpolation,
        position_embedding_antialias=antialias,
        naflex=naflex,
        naflex_patch_sizes=tuple(int(size) for size in naflex_patch_sizes) if naflex_patch_sizes else None,
        **naflex_resize,
        drop_remainder=bool(drop_remainder),
        name=name or variant_name(sizes) or "vit",
        dtype=policy,
    )
    if source is None:
        model = build(options, input_tensor)
    else:
        model = _loaded(options, input_tensor, weights, source, include_top, classes)
    if naflex:  # how a photo is cut into its patches: the checkpoint's library's, else keras_vit's own
        model.naflex_preprocessing = naflex_preprocessing(source.naflex_preprocessing if source else None)
    if class_names is not None:
        model.class_names = class_names
    return model


def named_classes(class_names, classes, include_top):
    """`(class_names as a list of str, classes)`: the class count of the names unless `classes` says it, and they
    must agree."""
    if class_names is None:
        return None, classes
    class_names = [str(name) for name in class_names]
    if not include_top:
        raise ValueError("class_names name the outputs of the head, which include_top=False leaves out.")
    if classes is not None and classes != len(class_names):
        raise ValueError(f"classes={classes} disagrees with the {len(class_names)} class_names; leave classes out to "
                         "take their number.")
    return class_names, len(class_names)


def _loaded(options, input_tensor, weights, source, include_top, classes):
    """The model of `options` with `source`'s weights, class names and evaluation preprocessing."""
    if not isinstance(weights, checkpoints.WeightsSource):  # Read here for this model alone.
        source = dataclasses.replace(source, single_use=True)
    # Built without random values, which the checkpoint's would replace: the state loads into bare variables.
    model, variables = build_without_values(lambda: build(options, input_tensor))
    checkpoints.load_into(model, source)
    for variable in variables:  # What the checkpoint does not hold: a new head, the dropout seeds.
        initialize(variable)
    if include_top and source.class_names and len(source.class_names) == classes == source.classes:
        model.class_names = list(source.class_names)  # the file's head, so the file's names
    if source.eval_transform is not None:  # the file's library's evaluation, at this model's size
        model.eval_transform = source.eval_transform.fitted_to(native_image_size(model))
    return model


def _naflex_resize(naflex, source, aspect_preserving, align_corners, factorized):
    """The NaFlex position-table options of `ModelOptions`: the caller's, else the checkpoint's."""
    if factorized is None:
        factorized = bool(source and source.factorized_positions)
    elif source is not None and bool(factorized) != source.factorized_positions:
        what = "factorized position tables" if source.factorized_positions else "one position table of its grid"
        raise ValueError(f"{source.description} holds {what}; leave position_embedding_factorized unset.")
    if not naflex:
        if factorized:
            raise ValueError("Factorized position tables apply to NaFlex models only, as timm's NaFlexVit builds them; "
                             "pass naflex=True.")
        if aspect_preserving is not None or align_corners is not None:
            raise ValueError("position_embedding_aspect_preserving and position_embedding_align_corners apply to "
                             "NaFlex models only; pass naflex=True.")
        return {}
    if aspect_preserving is None:
        aspect_preserving = bool(source and source.resize_aspect_preserving)
    if align_corners is None:
        align_corners = bool(source and source.resize_align_corners)
    if factorized and align_corners:
        raise ValueError("Factorized position tables resize without aligned corners, as timm's NaFlexVit does; leave "
                         "position_embedding_align_corners unset.")
    return {"position_embedding_aspect_preserving": bool(aspect_preserving),
            "position_embedding_align_corners": bool(align_corners),
            "position_embedding_factorized": bool(factorized)}


def _named(name, weights, image_size, kwargs):
    """A named variant: `ViT` with the sizes of `VARIANTS[name]`."""
    return ViT(weights=weights, image_size=image_size, **dataclasses.asdict(VARIANTS[name]), **kwargs)


def ViT_Ti16(weights=None, image_size=None, **kwargs):
    """ViT-Ti/16: patch 16, hidden 192, 12 layers, 3 heads, MLP 768; takes `ViT`'s keywords."""
    return _named("ViT_Ti16", weights, image_size, kwargs)


def ViT_S16(weights=None, image_size=None, **kwargs):
    """ViT-S/16: patch 16, hidden 384, 12 layers, 6 heads, MLP 1536; takes `ViT`'s keywords."""
    return _named("ViT_S16", weights, image_size, kwargs)


def ViT_S32(weights=None, image_size=None, **kwargs):
    """ViT-S/32: patch 32, hidden 384, 12 layers, 6 heads, MLP 1536; takes `ViT`'s keywords."""
    return _named("ViT_S32", weights, image_size, kwargs)


def ViT_B8(weights=None, image_size=None, **kwargs):
    """ViT-B/8: patch 8, hidden 768, 12 layers, 12 heads, MLP 3072; takes `ViT`'s keywords."""
    return _named("ViT_B8", weights, image_size, kwargs)


def ViT_B16(weights=None, image_size=None, **kwargs):
    """ViT-B/16: patch 16, hidden 768, 12 layers, 12 heads, MLP 3072; takes `ViT`'s keywords."""
    return _named("ViT_B16", weights, image_size, kwargs)


def ViT_B32(weights=None, image_size=None, **kwargs):
    """ViT-B/32: patch 32, hidden 768, 12 layers, 12 heads, MLP 3072; takes `ViT`'s keywords."""
    return _named("ViT_B32", weights, image_size, kwargs)


def ViT_L16(weights=None, image_size=None, **kwargs):
    """ViT-L/16: patch 16, hidden 1024, 24 layers, 16 heads, MLP 4096; takes `ViT`'s keywords."""
    return _named("ViT_L16", weights, image_size, kwargs)


def ViT_L32(weights=None, image_size=None, **kwargs):
    """ViT-L/32: patch 32, hidden 1024, 24 layers, 16 heads, MLP 4096; takes `ViT`'s keywords."""
    return _named("ViT_L32", weights, image_size, kwargs)


def ViT_H14(weights=None, image_size=None, **kwargs):
    """ViT-H/14: patch 14, hidden 1280, 32 layers, 16 heads, MLP 5120; takes `ViT`'s keywords."""
    return _named("ViT_H14", weights, image_size, kwargs)


def ViT_R50_B16(weights=None, image_size=None, **kwargs):
    """R50+ViT-B/16: ResNet (3, 4, 9), hidden 768, 12 layers, 12 heads, MLP 3072; takes `ViT`'s keywords."""
    return _named("ViT_R50_B16", weights, image_size, kwargs)


def ViT_R26_B32(weights=None, image_size=None, **kwargs):
    """R26+ViT-B/32: ResNet (2, 2, 2, 2), hidden 768, 12 layers, 12 heads, MLP 3072; takes `ViT`'s keywords."""
    return _named("ViT_R26_B32", weights, image_size, kwargs)


def ViT_R26_S32(weights=None, image_size=None, **kwargs):
    """R26+ViT-S/32: ResNet (2, 2, 2, 2), hidden 384, 12 layers, 6 heads, MLP 1536; takes `ViT`'s keywords."""
    return _named("ViT_R26_S32", weights, image_size, kwargs)


def ViT_R50_L32(weights=None, image_size=None, **kwargs):
    """R50+ViT-L/32: ResNet (3, 4, 6, 3), hidden 1024, 24 layers, 16 heads, MLP 4096; takes `ViT`'s keywords."""
    return _named("ViT_R50_L32", weights, image_size, kwargs)
