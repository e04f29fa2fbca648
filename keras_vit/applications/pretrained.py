"""`from_pretrained`: a model whose sizes, head and GELU come from the checkpoint itself.

`keras_vit.ViT(weights=...)` builds the sizes you give and loads a file into
them; `from_pretrained` reads the file first and builds what it holds: an
original `.npz`, a `.keras` file, a timm state dict or Hub folder, or an
`hf://org/name` handle, which `huggingface_hub` resolves into its own cache
(and, once cached, offline).

Example:
>>> import keras_vit
>>> model = keras_vit.from_pretrained("hf://timm/vit_base_patch16_224.augreg2_in21k_ft_in1k")  # doctest: +SKIP
>>> model = keras_vit.from_pretrained("/data/ViT-B_16.npz", classes=37)  # doctest: +SKIP
"""

import dataclasses
import os

import keras

from keras_vit.applications.vit import ViT, named_classes
from keras_vit.checkpoints import CheckpointError, architecture_of, load_keras, read_weights, source_of_saved
from keras_vit.model.variants import Variant
from keras_vit.utils.keras_internals import sublayers


def from_pretrained(source, **overrides):
    """Build the model a checkpoint holds and load it.

    Args:
        source: a path (original `.npz`, `.keras`, `.weights.h5` with
            `num_heads`, timm `.safetensors`/`.bin`/`.pth`, a timm Hub folder)
            or an `hf://org/name` handle.
        **overrides: `keras_vit.ViT` keywords that replace what the file says,
            for example a new `classes` (a fresh head, which gives logits
            unless `classifier_activation` says otherwise, as timm's and
            keras-hub's do; 0: none, the pooled features timm's
            `num_classes=0` gives) and its `class_names`, or `image_size`.

    The patch size, width, depth, MLP size, head count, image size (its
    position grid), architecture (`keras_vit.Architecture`: prefix tokens,
    norms, biases, activation, pooling), pre-logits and class count are
    read from the files, and a `.keras` model's precision (`dtype`), head
    activation, position-embedding resize and dynamic resolution
    (`image_size=(None, None)`) or NaFlex inputs (with its
    `naflex_patch_sizes`, table resize and `naflex_preprocessing`). A file
    without a head (DINOv2, CLIP and SigLIP towers) builds the feature
    model timm's forward gives (`include_top=False`, the file's pooling, or
    `classifier=`'s), a
    SigLIP tower without its head transformers' `last_hidden_state`
    (`pooling=None`), and a `.keras` model without its top the same model
    again (its own `pooling`, `None` included), unless `classes=` asks for
    a new head (`top_options`). A `.keras` model is returned as
    Keras loads it (after the file's checks) unless overrides ask for
    another model or it holds LoRA adapters, which are merged into its
    kernels in a rebuilt model; one that Keras quantized
    (`model.quantize("int8")`) is never rebuilt, and overrides that would
    need it rebuilt are refused.

    Example:
    >>> from keras_vit import checkpoints
    >>> small = ViT(image_size=32, patch_size=8, hidden_size=48, num_layers=2, num_heads=3, mlp_dim=96)
    >>> _ = checkpoints.save_npz(small, "/tmp/small.npz")
    >>> from_pretrained("/tmp/small.npz", classes=10).output_shape
    (None, 10)
    """
    if not isinstance(source, (str, os.PathLike)):
        raise CheckpointError(f"from_pretrained takes a path or an hf://org/name handle, got {type(source).__name__} "
                              f"{source!r}.")
    path = os.fspath(source)
    if path.endswith(".keras"):
        saved = load_keras(path)
        names = overrides.pop("class_names", None)  # names for the saved head need no other model
        if _as_saved(saved, path, overrides):
            if names is not None:
                has_head = any(layer.name == "head" for layer in saved.layers)
                saved.class_names, _ = named_classes(names, saved.output_shape[-1] if has_head else None, has_head)
            return saved
        if names is not None:
            overrides["class_names"] = names
        overrides.setdefault("name", saved.name)  # rebuilt, it keeps its name (timm's architecture, a run's own)
        checkpoint = source_of_saved(saved, path)
        del saved
    else:
        checkpoint = read_weights(path).with_heads(overrides.get("num_heads"))
    state = checkpoint.state
    kernel, mlp = state.get("embedding/kernel"), state.get("encoderblock_0/mlp_hidden/kernel")
    if kernel is None or mlp is None:
        raise CheckpointError(f"{path} holds no ViT encoder (no patch embedding or first block).")
    hidden = int(kernel.shape[-1])
    num_heads = overrides.pop("num_heads", None) or checkpoint.num_heads
    if num_heads is None:
        raise CheckpointError(f"{path} does not store its head count and its width {hidden} is no named "
                              "variant's; pass num_heads=N.")
    sizes = checkpoint.sizes or Variant(int(kernel.shape[0]), hidden, checkpoint.num_layers, num_heads,
                                        int(mlp.shape[-1]))
    del kernel, mlp  # The state is the model's alone, emptied as it loads (single_use).
    saved = checkpoint.layout or {}  # A .keras model's: its pooling without a top, its dynamic resolution
    options = dict(dataclasses.asdict(sizes), num_heads=num_heads,
                   image_size=saved.get("image_size") or checkpoint.image_size or 224)
    if saved.get("naflex_patch_sizes") and overrides.get("naflex", True):  # the sizes a NaFlex model resamples to
        options["naflex_patch_sizes"] = saved["naflex_patch_sizes"]
    if checkpoint.input_size is not None:  # A stated size that patches do not divide: the file's model drops the rest.
        options["drop_remainder"] = True
    if checkpoint.dtype_policy:  # A .keras model keeps its precision and its head's activation unless told.
        options["dtype"] = checkpoint.dtype_policy
    if checkpoint.classifier_activation:
        options["classifier_activation"] = checkpoint.classifier_activation
    options.update(top_options(checkpoint, overrides))
    if checkpoint.name:  # its library's name for it (timm's architecture), not keras_vit's "vit"
        options["name"] = checkpoint.name
    if overrides.get("classes") not in (None, checkpoint.classes):  # a new head, to train: logits, as timm's
        options["classifier_activation"] = None                    # and keras-hub's heads give
    options.update(overrides)
    return ViT(weights=dataclasses.replace(checkpoint, single_use=True), **options)


def top_options(checkpoint, overrides):
    """The `ViT` keywords of the top `from_pretrained` (and `keras-vit convert`) builds on `checkpoint` besides
    `overrides` (the caller's `ViT` keywords).

    A file without a head, or any file with `classes=0` (timm's
    `num_classes=0`, taken out of `overrides`), gives its features unless
    `classes` or `include_top` ask for a head: a `.keras` model without its top pools as it
    did (None: its token sequence), a SigLIP tower without its head as
    transformers (its `last_hidden_state`), any other file as timm's forward
    with `num_classes=0` (the pooled features, `fc_norm` included). The
    caller's `classifier` decides that pooling, and the head's, over the
    file's tokens: its class token is kept (given to `ViT` alone, a
    classifier decides the class token).
    """
    state, top = checkpoint.state, {}
    if overrides.get("classifier") and not {"class_token", "architecture"} & set(overrides):
        top["class_token"] = "class_token/cls" in state
    if overrides.get("classes") == 0 and "include_top" not in overrides:  # timm's num_classes=0: the head goes
        del overrides["classes"]
        state = {}
    if "head/kernel" not in state and "classes" not in overrides and "include_top" not in overrides:
        saved = checkpoint.layout or {}
        top.update(include_top=False,
                   pooling=overrides.get("classifier") or saved.get("pooling", checkpoint.classifier))
    return top


def _as_saved(model, path, overrides):
    """Whether from_pretrained returns the `.keras` model as Keras loaded it: unless `overrides` ask for another
    model, or it holds LoRA adapters to merge. A model Keras quantized has no float weights to rebuild from."""
    quantized = any(getattr(layer, "quantization_mode", None) for layer in sublayers(model))
    if not quantized:
        try:
            architecture_of(model)
        except ValueError:  # Not a plain keras_vit ViT: read its state, as any other file's
            return False
    names = {layer.name for layer in model.layers}
    saved = dict(num_heads=model.get_layer("encoderblock_0").num_heads, include_top="head" in names,
                 image_size=tuple(model.input_shape[1:3]))
    if "head" in names:
        saved["classes"] = model.get_layer("head").units
    if "predictions" in names:
        saved["classifier_activation"] = keras.activations.serialize(model.get_layer("predictions").activation)

    def same(key, value):
        if key == "image_size":
            return (tuple(value) if isinstance(value, (tuple, list)) else (value, value)) == saved[key]
        if key == "classifier_activation":
            return keras.activations.serialize(keras.activations.get(value)) == saved[key]
        return value == saved[key]

    rebuild = [f"{key}={value!r}" for key, value in overrides.items() if key not in saved or not same(key, value)]
    if not quantized:
        return not rebuild and not any(getattr(layer, "lora_enabled", False) for layer in sublayers(model))
    if rebuild:
        raise CheckpointError(
            f"{path} holds a model quantized by Keras (model.quantize), which from_pretrained returns as saved: "
            f"{', '.join(rebuild)} would need it rebuilt, and its 8-bit kernels load into no other model. Pass "
            "them to from_pretrained of the float model, then quantize that (model.quantize('int8')).")
    return True
