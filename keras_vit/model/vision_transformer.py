"""The `keras.Model` class of every ViT, and what can be read back from a built one.

`VisionTransformer` is the functional model `keras_vit.ViT` returns; it
checks the images at every entry point and carries its own description
(`keras_vit.model.description`).
"""

import numbers
from collections.abc import Mapping

import keras
import numpy as np

from keras_vit.data import preprocessing
from keras_vit.data.naflex import check_naflex_batch, check_naflex_shapes, naflex_preprocessing
from keras_vit.layers import kernels
from keras_vit.layers.naflex import NAFLEX_INPUTS, NaFlexImagePatches
from keras_vit.model import deployment
from keras_vit.model.description import describe, is_naflex, native_grid, read_description, sizes_of
from keras_vit.utils.keras_internals import keep_variables_on_error, with_numpy_outputs

# The image_size of a dynamic-resolution model: any height and width that divide into patches.
DYNAMIC = (None, None)


def check_image_size(image_size, sizes, drop_remainder=False):
    """Raise `ValueError` unless `(height, width)` divides into the patches of `sizes` (a `Variant`).

    With `drop_remainder`, any size of at least one patch passes.
    """
    step = sizes.pixels_per_patch
    if image_size == DYNAMIC:
        return
    if drop_remainder and min(image_size) >= step:
        return
    if image_size[0] % step or image_size[1] % step:
        what = f"patch_size {sizes.patch_size}" if sizes.resnet_layers is None else (
            f"the hybrid's {step} pixels per patch (ResNet stride x patch_size {sizes.patch_size})")
        raise ValueError(f"image_size {image_size} is not divisible by {what}; pass drop_remainder=True to leave "
                         "out the last rows and columns that fill no patch, as timm does.")



def native_image_size(model):
    """The `(height, width)` a model takes: its input's, or for dynamic resolution its position table's.

    Tools that must pick one size for a dynamic model (`keras-vit evaluate`,
    `predict`, `inspect`) resize images to the size its position embeddings
    were trained at.
    """
    size = (None, None) if is_naflex(model) else tuple(model.input_shape[1:3])
    if None not in size:
        return size
    step = sizes_of(model).pixels_per_patch
    rows, cols = native_grid(model)
    return (rows * step, cols * step)


def eval_transform(model, image_size=None, crop_fraction=None, interpolation=None, **overrides):
    """The preprocessing of `model`'s checkpoint for evaluation, as a callable `preprocessing.EvalTransform`.

    A timm checkpoint's is its `pretrained_cfg`'s (crop_pct, filter), a
    transformers folder's its `preprocessor_config.json`'s, an original
    `.npz` file's vit_jax's, and a model keras_vit trained or built
    keras_vit's own. Each field can be overridden (`None` keeps it), as
    timm's `resolve_data_config(args)` does; the size is the model's unless
    `image_size` says otherwise. A NaFlex model has none (its
    `naflex_preprocessing` cuts photos): refused.

    Example:
    >>> import numpy as np, keras_vit
    >>> model = keras_vit.ViT(image_size=32, patch_size=8, hidden_size=16, num_layers=1, num_heads=2,
    ...                       mlp_dim=32, classes=3)
    >>> transform = keras_vit.eval_transform(model, crop_fraction=0.875, interpolation="bicubic")
    >>> model.predict(transform(np.zeros((375, 500, 3), "uint8"))[None], verbose=0).shape
    (1, 3)
    """
    if is_naflex(model):
        raise ValueError(f"{model.name} is a NaFlex model: it takes each photo whole, cut into its own grid of "
                         "patches, not an image of one size; make its batches with keras_vit.data.naflex_batch("
                         "photos, model.sizes.patch_size, **model.naflex_preprocessing).")
    transform = getattr(model, "eval_transform", None) or preprocessing.keras_vit()
    transform = transform.fitted_to(native_image_size(model))
    return transform.replace(image_size=image_size, crop_fraction=crop_fraction, interpolation=interpolation,
                             **overrides)


# Keras' crossentropy losses by name, which take probabilities (from_logits=False).
_PROBABILITY_LOSSES = ("categorical_crossentropy", "sparse_categorical_crossentropy", "binary_crossentropy",
                       "categorical_focal_crossentropy", "binary_focal_crossentropy")


def check_loss_reads_outputs(model, loss):
    """Refuse a crossentropy `loss` that takes logits where `model` ends in a softmax (or sigmoid), or
    probabilities where it gives logits (`classifier_activation=None`): either trains on the wrong numbers, without
    a word from Keras. Other losses, and models without their top, pass.

    Example:
    >>> import keras, keras_vit
    >>> model = keras_vit.ViT(image_size=32, patch_size=8, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=32,
    ...                       classes=3)
    >>> check_loss_reads_outputs(model, keras.losses.CategoricalCrossentropy(from_logits=True))
    Traceback (most recent call last):
    ...
    ValueError: vit ends in a softmax (classifier_activation='softmax'), but its loss CategoricalCrossentropy takes \
logits (from_logits=True): build the model with classifier_activation=None, or pass from_logits=False.
    """
    try:
        activation = model.get_layer("predictions").activation
    except ValueError:
        return
    name = getattr(activation, "__name__", str(activation))
    if isinstance(loss, str):
        from_logits, what = (False if loss in _PROBABILITY_LOSSES else None), loss
    else:
        from_logits, what = getattr(loss, "from_logits", None), type(loss).__name__
    if from_logits is None or name not in ("softmax", "sigmoid", "linear"):
        return
    if from_logits and name != "linear":
        raise ValueError(f"{model.name} ends in a {name} (classifier_activation={name!r}), but its loss {what} takes "
                         "logits (from_logits=True): build the model with classifier_activation=None, or pass "
                         "from_logits=False.")
    if not from_logits and name == "linear":
        raise ValueError(f"{model.name} gives logits (classifier_activation=None), but its loss {what} takes "
                         "probabilities (from_logits=False): pass from_logits=True, or build the model with "
                         "classifier_activation='softmax'.")


@keras.saving.register_keras_serializable(package="keras_vit")
class VisionTransformer(keras.Model):
    """The functional model `ViT` returns: a `keras.Model` that checks its images before running.

    Keras' JAX trainer runs `fit`, `evaluate` and `predict` without the input
    check that `model(images)` makes: an image size that is a few pixels off
    was cropped silently, and an error inside those calls left the model's
    variables empty. Here the model's `call` checks the images' size and
    layout (a grayscale or channels-first batch is named as such) whatever
    the entry point and the kind of data, and a step that fails puts the
    weights back before it raises. A NaFlex model checks its batch's keys and
    shapes there, and the values of a batch of numpy arrays
    (`keras_vit.data.check_naflex_batch`) before `__call__`, `fit`,
    `evaluate` and `predict` compute anything. It takes, at every entry
    point, the inputs users already have (`_graph_inputs`): its own NaFlex
    batch, transformers' `Siglip2ImageProcessor` output as it comes, or a
    plain image batch, as timm's `NaFlexVit` does.

    Example:
    >>> import numpy as np, keras_vit
    >>> model = keras_vit.ViT(image_size=32, patch_size=8, hidden_size=16, num_layers=1, num_heads=2,
    ...             mlp_dim=32, classes=3)
    >>> model.predict(np.zeros((1, 36, 36, 3)), verbose=0)  # doctest: +SKIP
    ValueError: Input 0 with name 'images' of layer 'vit' is incompatible with the layer: ...
    """

    def __init__(self, *args, class_names=None, classifier=None, eval_transform=None, architecture=None, sizes=None,
                 native_grid=None, naflex_preprocessing=None, training_settings=None, **kwargs):
        super().__init__(*args, **kwargs)
        # What it is (`keras_vit.model.description`): its `Architecture`, `Variant` sizes and position grid; None in a
        # model loaded from a `.keras` file saved before models carried them, which is read from its layers.
        self.architecture, self.sizes = architecture, sizes
        self.native_grid = None if native_grid is None else tuple(native_grid)
        # How its checkpoint's library preprocesses a photo for evaluation (`keras_vit.data.preprocessing`), or None.
        self.eval_transform = eval_transform
        self.naflex_preprocessing = naflex_preprocessing
        # One name per output, where the checkpoint named its classes (transformers' id2label, timm's labels).
        self.class_names = list(class_names) if class_names else None
        # How its head pools ("token", "gap" or "map"): no layer shows it in a model without its top that returns
        # the token sequence (include_top=False, pooling=None), nor in one pooled otherwise than its head.
        self.classifier = classifier
        # What the fine-tuning run that made it used (`keras-vit finetune`'s recipe and settings), or None.
        self.training_settings = dict(training_settings) if training_settings else None

    @property
    def pretrained_cfg(self):
        """timm's `pretrained_cfg` fields of this model: its `input_size`, evaluation `interpolation`, `crop_pct`
        and `crop_mode` (its `eval_transform`'s), and the pixel `mean` and `std` of its checkpoint, on [0, 1]
        pixels (keras_vit applies them inside the model, which takes [-1, 1] images). None for a NaFlex model."""
        if self.naflex_preprocessing:
            return None
        transform = eval_transform(self)
        architecture = self.architecture
        return {"input_size": (3, *transform.image_size), "interpolation": transform.interpolation,
                "crop_pct": transform.crop_fraction, "crop_mode": transform.crop_mode,
                "mean": None if architecture is None else tuple(architecture.input_mean),
                "std": None if architecture is None else tuple(architecture.input_std)}

    @property
    def naflex_preprocessing(self):
        """A NaFlex model's: how a photo is cut into its patches, `keras_vit.data.naflex_batch`'s keywords (checked
        when set, so that a model never carries keywords `naflex_batch` would refuse); None for other models."""
        return self._naflex_preprocessing

    @naflex_preprocessing.setter
    def naflex_preprocessing(self, value):
        self._naflex_preprocessing = naflex_preprocessing(value) if value else None

    def get_config(self):
        config = super().get_config()
        if self.class_names:
            config["class_names"] = list(self.class_names)
        if self.classifier:
            config["classifier"] = self.classifier
        if self.eval_transform is not None:
            config["eval_transform"] = self.eval_transform.get_config()
        if self.naflex_preprocessing:
            config["naflex_preprocessing"] = dict(self.naflex_preprocessing)
        if self.training_settings:
            config["training_settings"] = dict(self.training_settings)
        if self.architecture is not None and self.sizes is not None:
            config.update(describe(self.architecture, self.sizes, self.native_grid))
        return config

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        class_names = config.pop("class_names", None)
        classifier = config.pop("classifier", None)
        transform = config.pop("eval_transform", None)
        naflex = config.pop("naflex_preprocessing", None)
        settings = config.pop("training_settings", None)
        architecture, sizes, grid = read_description(config)
        model = super().from_config(config, custom_objects=custom_objects)
        model.class_names, model.classifier = class_names, classifier
        model.training_settings = settings
        model.architecture, model.sizes, model.native_grid = architecture, sizes, grid
        try:
            model.naflex_preprocessing = naflex
        except ValueError as error:  # what naflex_batch would refuse at the first photo, named now
            raise ValueError(f"The model's naflex_preprocessing {naflex!r} is not naflex_batch's keywords: {error}") \
                from None
        model.eval_transform = None if transform is None else preprocessing.EvalTransform.from_config(transform)
        return model

    def __call__(self, *args, **kwargs):
        if args:
            x = _plain_dict(args[0])
            self._check_naflex_values(x)
            args = (self._graph_inputs(x), *args[1:])
        return super().__call__(*args, **kwargs)

    def compile(self, *args, **kwargs):
        """Keras' `compile`, refusing a crossentropy loss that reads the model's outputs as the other kind: logits
        (`from_logits=True`) of a model that ends in a softmax, or probabilities of one that gives logits."""
        check_loss_reads_outputs(self, kwargs.get("loss", args[1] if len(args) > 1 else None))
        return super().compile(*args, **kwargs)

    def compile_from_config(self, config):
        """A `.keras` file's compile, as Keras' own (which skips a class that overrides `compile`)."""
        self.compile(**keras.saving.deserialize_keras_object(config))
        if hasattr(self, "optimizer") and self.built:
            self.optimizer.build(self.trainable_variables)  # the optimizer's variables, for its saved state

    def fit(self, x=None, *args, **kwargs):
        x = self._check_naflex_values(_plain_dict(x))
        validation = kwargs.get("validation_data")
        if isinstance(validation, (tuple, list)) and validation:
            kwargs["validation_data"] = (self._check_naflex_values(_plain_dict(validation[0])), *validation[1:])
        return super().fit(x, *args, **kwargs)

    def evaluate(self, x=None, *args, **kwargs):
        return super().evaluate(self._check_naflex_values(_plain_dict(x)), *args, **kwargs)

    def predict(self, x, *args, **kwargs):
        return super().predict(self._check_naflex_values(_plain_dict(x)), *args, **kwargs)

    def export(self, filepath, format="tf_saved_model", verbose=None, input_signature=None, **kwargs):
        """Keras' `export`, with a dynamic batch in every format and ONNX on every backend (`keras_vit.model.deployment`).

        Also takes `quantize="int8"`, for an 8-bit copy of the weights.
        """
        return deployment.export_model(self, filepath, format=format, verbose=verbose,
                                       input_signature=input_signature, native_image_size=native_image_size(self),
                                       patch_pixels=sizes_of(self).pixels_per_patch, **kwargs)

    def call(self, inputs, *args, **kwargs):
        # Keras' JAX trainer calls `call` directly, without the input check of `__call__`: every entry point and
        # every kind of data (arrays, tf.data, PyDataset, generators) reaches the model here with its real shape.
        inputs = self._graph_inputs(inputs)
        # The layers' policy (the model itself is built without one): float32 products for a float32 model.
        with kernels.float32_matmuls(self.get_layer("embedding").compute_dtype):
            return super().call(inputs, *args, **kwargs)

    def make_train_function(self, force=False):
        super().make_train_function(force)
        self.train_function = keep_variables_on_error(self, self.train_function, "train")
        return self.train_function

    def make_test_function(self, force=False):
        super().make_test_function(force)
        self.test_function = keep_variables_on_error(self, self.test_function, "test")
        return self.test_function

    def make_predict_function(self, force=False):
        super().make_predict_function(force)
        if not getattr(self.predict_function, "keeps_variables", False):  # not wrapped yet
            self.predict_function = keep_variables_on_error(self, with_numpy_outputs(self.predict_function), "predict")
        return self.predict_function

    def _check_naflex_values(self, x):
        """A NaFlex model refuses a batch of numpy arrays that `check_naflex_batch` refuses, before any compute;
        returns `x`.

        Only numpy arrays: the trainers hand each step eager tensors, whose values a check would copy off the
        device at every step; `call` checks every batch's keys and shapes.
        """
        if hasattr(x, "keys") and all(isinstance(x[key], np.ndarray) for key in x) and is_naflex(self):
            check_naflex_batch(x, self.get_layer("embedding").patch_sizes)
        return x

    def _graph_inputs(self, x):
        """`x` checked (`_check_images`), as the graph takes it.

        A NaFlex model's graph takes its own batch (`keras_vit.layers.naflex`); it is also given transformers'
        processor's dict (`keras_vit.data.naflex.TRANSFORMERS_LAYOUT`: its keys and dtypes mapped, `pixel_values`
        taken back to [-1, 1] by the model's own input normalisation, which is the processor's), or a plain image
        batch, cut into every image's whole grid (`NaFlexImagePatches`), as timm's NaFlexVit takes it.
        """
        naflex = is_naflex(self)
        if not naflex or not hasattr(x, "keys"):
            self._check_images(x)
            return NaFlexImagePatches(self.get_layer("embedding").patch_size, dtype="float32")(x) if naflex else x
        names = check_naflex_shapes(x, self.get_layer("embedding").patch_sizes)
        if names == NAFLEX_INPUTS:
            return x
        patches, grid, mask = (x[name] for name in names)
        normalization = next((layer for layer in self.layers if layer.name == "input_normalization"), None)
        patches = keras.ops.cast(patches, "float32") if normalization is None else normalization.undo(patches)
        return {"patches": patches, "patch_grid": keras.ops.cast(grid, "int32"),
                "patch_mask": keras.ops.cast(mask, "bool")}

    def _check_images(self, x):
        """Refuse another image size, or a grayscale or channels-first batch, with a message that says so.

        A NaFlex model's plain image batch is checked as a dynamic-resolution model's images (its NaFlex batch by
        `check_naflex_shapes`).
        """
        naflex = is_naflex(self)
        if len(self.inputs) != 1 and not naflex:
            return
        found = _images_shape(x)
        expected = (None, None, None, 3) if naflex else tuple(self.inputs[0].shape)
        if naflex and found is None:
            raise ValueError(f"A NaFlex model takes a NaFlex batch (a dict) or images {expected}, got "
                             f"{type(x).__name__}.")
        if found is None or len(expected) != 4:
            return
        if len(found) == 3 and found[-1] in (1, 3, 4):
            raise ValueError(f"Got one image of shape {found}; the model takes a batch {expected}: add a batch axis, "
                             "e.g. images[None].")
        if len(found) == 4 and found[-1] not in (3, None):
            if found[1] == 3:
                fix = "they look channels-first (batch, 3, height, width): transpose them with np.transpose(x, (0, 2, 3, 1))"
            elif found[-1] == 1:
                fix = "they are grayscale (one channel): repeat it with np.repeat(x, 3, axis=-1)"
            elif found[-1] == 4:
                fix = "they have an alpha channel: drop it with x[..., :3]"
            else:
                fix = f"they have {found[-1]} channels"
            raise ValueError(f"Images of shape {found} are not RGB channels-last {expected}; {fix}.")
        if len(found) == 4 and expected[1:3] == DYNAMIC:
            # A TensorFlow graph traced with unknown sizes cannot check them; a "valid" convolution would crop,
            # which only a model built with drop_remainder=True asks for.
            sizes, crop = sizes_of(self), not naflex and self.get_layer("embedding").drop_remainder
            for size, axis in zip(found[1:3], ("height", "width")):
                if size is not None and (size < sizes.pixels_per_patch if crop else size % sizes.pixels_per_patch):
                    what = f"the patch size {sizes.patch_size}" if sizes.resnet_layers is None else \
                        f"the {sizes.pixels_per_patch} pixels one patch spans"
                    fix = ("; a NaFlex model cuts an image batch into whole patches, as timm's NaFlexVit does: resize "
                           f"or crop the images to multiples of {sizes.patch_size} pixels, or cut each photo at its "
                           "own size with keras_vit.data.naflex_batch") if naflex else ""
                    raise ValueError(f"Image {axis} {size} is {'smaller than' if crop else 'not divisible by'} {what} "
                                     f"(input shape {found}){fix}.")
        compatible = len(found) == 4 and all(e is None or f is None or e == f for e, f in zip(expected, found))
        if not compatible and naflex:
            raise ValueError(f"A NaFlex model takes a NaFlex batch (a dict) or images {expected}, got shape {found}.")
        if not compatible:
            raise ValueError(
                f"Input 0 with name '{self.inputs[0].name}' of layer '{self.name}' is incompatible with the layer: "
                f"expected shape={expected}, found shape={found}"
            )


def _plain_dict(x):
    """A mapping that is not a dict (transformers' `BatchFeature`) as a dict, which Keras' data adapters take."""
    return dict(x) if isinstance(x, Mapping) and not isinstance(x, dict) else x


def _images_shape(x):
    """The static shape of a batch of images, or None if unknown."""
    shape = getattr(x, "shape", None)
    if shape is None or isinstance(x, dict):
        return None
    try:
        dims = list(shape)
    except TypeError:
        return None
    # Symbolic sizes (an export's batch dimension, a traced unknown) count as unknown.
    return tuple(int(d) if isinstance(d, numbers.Integral) else None for d in dims)
