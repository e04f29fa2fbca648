"""Export a ViT for serving: ONNX on every backend, LiteRT on TensorFlow, a SavedModel on TensorFlow and JAX.

`VisionTransformer.export` (that is, `model.export(path, format=...)`) and
`keras-vit export` both come here. Keras' own exporter does the work, with
what a ViT needs around it:

- the batch dimension stays dynamic in every format;
- on PyTorch, ONNX goes through torch's dynamo exporter with a dynamic batch:
  Keras picks the TorchScript exporter when a dimension is dynamic, and that
  one cannot export LayerNorm's shape (a `SymbolicValueError`) or int8's
  division;
- on JAX, a model that was only used through `predict` counts as called;
- a dynamic-resolution model keeps height and width open on TensorFlow and
  PyTorch (whole patches); on JAX, whose exporters cannot, it exports at the
  size its position table was trained at, and says so;
- a NaFlex model's three inputs (patches, patch_grid, patch_mask) keep the
  batch and the sequence length open, on TensorFlow and PyTorch; JAX's
  exporters and LiteRT cannot, which it says; where PyTorch's exporter
  would fix an open axis to the traced sample's size (it falls back so
  with a log line only), the export is refused;
- LoRA adapters are merged into the kernels first (equal outputs, plain ops);
- a SavedModel keeps the model's precision (`dtype=`); ONNX and LiteRT take
  float32 models (their CPU runtimes have no bfloat16 convolution);
- an ONNX file under 2 GB is one file, its weights inside (jax2onnx writes
  each tensor of 1 MB or more to `<file>.data`); a larger one keeps them in
  `<file>.data` beside it, which is said;
- the file or folder appears whole or not at all;
- torch's exporter says nothing a user can act on: not the torchvision
  operators it skips where torchvision is not installed, nor its own
  deprecations.

ONNX and LiteRT on TensorFlow and PyTorch need the `export` extra (onnx,
onnxruntime, onnxscript, tf2onnx, ai-edge-litert), which installs no
backend; ONNX on JAX needs `export-jax` (jax2onnx, which brings flax); a
SavedModel on JAX needs TensorFlow, whose jax2tf converts it.

Example:
>>> import keras_vit
>>> model = keras_vit.ViT(image_size=32, patch_size=8, hidden_size=32, num_layers=1, num_heads=2,
...                       mlp_dim=64, classes=3)
>>> model.export("/tmp/vit.onnx", format="onnx", verbose=False)  # doctest: +SKIP
"""

import contextlib
import importlib.util
import logging
import os
import warnings

import keras

from keras_vit.configs import FORMATS, QUANTIZE_MODES
from keras_vit.model.description import is_naflex
from keras_vit.model.lora import merge_lora
from keras_vit.utils import files
from keras_vit.utils.keras_internals import has_been_called, sublayers

logger = logging.getLogger("keras_vit")
BACKENDS = {"onnx": ("jax", "tensorflow", "torch"), "litert": ("tensorflow",), "tf_saved_model": ("jax", "tensorflow")}
# The packages each format needs on each backend (import names), and how to install them.
_EXPORT = "pip install 'keras-vision-transformer[export]'"
_EXPORT_JAX = "pip install 'keras-vision-transformer[export-jax]'"
_PACKAGES = {
    ("onnx", "tensorflow"): (("onnx", "tf2onnx"), _EXPORT),
    ("onnx", "jax"): (("onnx", "jax2onnx"), _EXPORT_JAX),
    ("onnx", "torch"): (("onnx", "onnxscript"), _EXPORT),
    ("litert", "tensorflow"): (("tensorflow",), _EXPORT),
    ("tf_saved_model", "tensorflow"): (("tensorflow",), _EXPORT),
    # The [export] extras hold no backend, and TensorFlow is one.
    ("tf_saved_model", "jax"): (("tensorflow",), "pip install 'keras-vision-transformer[tensorflow]' (Keras converts "
                                "a JAX model through TensorFlow's jax2tf), then set KERAS_BACKEND=jax, since Keras "
                                "takes TensorFlow by default once it is installed"),
}
ONNX_FILE_LIMIT = 2**31 - 1  # bytes: protobuf's limit, past which an ONNX model's weights must be in other files
_WHY_NOT = {
    ("litert", "jax"): "Keras converts to LiteRT through TensorFlow or litert-torch",
    ("litert", "torch"): "keras_vit supports LiteRT through TensorFlow, the converter its parity is tested with",
    ("tf_saved_model", "torch"): "Keras exports a PyTorch model to a SavedModel only through torch_xla",
}

def default_path(model_path, format):
    """Where `keras-vit export` writes: beside the model, `vit.keras` -> `vit.onnx`, `vit.tflite`, `vit_saved_model/`."""
    stem = os.path.basename(os.path.normpath(model_path.removeprefix("hf://")))
    for ending in (".keras", ".weights.h5", ".safetensors", ".npz", ".bin", ".pth"):
        stem = stem.removesuffix(ending)
    folder = os.path.dirname(os.path.normpath(model_path)) if not model_path.startswith("hf://") else "."
    ending = {"onnx": ".onnx", "litert": ".tflite", "tf_saved_model": "_saved_model"}[format]
    return os.path.join(folder, stem + ending)


def check_format(format, quantize=None):
    """Refuse a format the running backend cannot write, or whose packages are missing, before any work."""
    if format not in FORMATS:
        raise ValueError(f"Unknown export format {format!r}; choose among {list(FORMATS)}.")
    if quantize not in (None, *QUANTIZE_MODES):
        raise ValueError(f"Unknown quantization {quantize!r}; choose among {list(QUANTIZE_MODES)} or none.")
    backend = keras.backend.backend()
    if backend not in BACKENDS[format]:
        choices = " or ".join(BACKENDS[format])
        raise NotImplementedError(
            f"Export to {format} needs the {choices} backend, not {backend} ({_WHY_NOT[format, backend]}): "
            f"run it with KERAS_BACKEND={BACKENDS[format][-1] if format != 'onnx' else 'tensorflow'}; a .keras "
            "file loads on any backend."
        )
    packages, install = _PACKAGES[format, backend]
    missing = [name for name in packages if importlib.util.find_spec(name) is None]
    if missing:
        raise ImportError(f"Export to {format} on {backend} needs {', '.join(missing)}: {install}.")


def export_model(model, filepath, format="tf_saved_model", verbose=None, input_signature=None, quantize=None,
                 native_image_size=None, patch_pixels=None, **kwargs):
    """Write `model` to `filepath` as `format` ("onnx", "litert" or "tf_saved_model"); returns `filepath`.

    Args:
        model: a keras_vit model (`VisionTransformer`).
        filepath: the `.onnx` / `.tflite` file or the SavedModel folder.
        format: one of `FORMATS`; others go to Keras' exporter unchanged.
        verbose: print Keras' messages; default False.
        input_signature: Keras' `input_signature`; default the model's input
            with a dynamic batch.
        quantize: "int8" for 8-bit weights: Keras' `quantize("int8")` on a copy
            for ONNX and SavedModel, LiteRT's own dynamic-range int8 for LiteRT
            (its converter does not take Keras' int8 matmuls).
        native_image_size: `(height, width)` a dynamic-resolution model exports
            at on JAX (`keras_vit.model.vision_transformer.native_image_size`), and PyTorch
            traces it at.
        patch_pixels: the pixels one patch spans, whose multiples a
            dynamic-resolution model's ONNX file takes on PyTorch.
        **kwargs: passed to Keras' exporter (for LiteRT, converter settings).
    """
    if format not in FORMATS:
        return keras.Model.export(model, filepath, format=format, verbose=verbose, input_signature=input_signature,
                                  **kwargs)
    check_format(format, quantize)
    if format == "litert" and _is_quantized(model):
        raise ValueError(
            "LiteRT's converter cannot take a model after model.quantize('int8') (its int8 matmuls are not LiteRT "
            "ops): export the float model with quantize='int8' (keras-vit export --quantize int8), which applies "
            "LiteRT's own int8."
        )
    names = {layer.name for layer in model.layers}
    timm_resnet = any(getattr(layer, "epsilon_added_to", None) == "variance" for layer in model.layers)
    if format == "onnx" and "conv_root" in names and (keras.backend.backend() == "jax" or (
            keras.backend.backend() == "torch" and timm_resnet)):
        # Measured: JAX's ONNX files of a hybrid fail in onnxruntime (its max pool), and torch's dynamo exporter
        # gives other outputs for timm's ResNet (from the first strided unit on); TensorFlow's path is exact.
        raise ValueError(f"{model.name} is a hybrid, whose ResNet the {keras.backend.backend()} backend does not "
                         "export to ONNX correctly: export it on the tensorflow backend "
                         "(KERAS_BACKEND=tensorflow keras-vit export ...).")
    if keras.backend.backend() == "jax" and is_naflex(model):
        # Measured: jax2onnx gives the prefix tokens and the patches one symbolic length (onnxruntime then fails),
        # and jax2tf cannot solve the sequence length plus the prefix tokens.
        raise ValueError(f"{model.name} is a NaFlex model, whose open sequence length the jax backend does not "
                         f"export to {format}: export it on the tensorflow backend (KERAS_BACKEND=tensorflow).")
    if format == "litert" and is_naflex(model):
        # Measured: the converter keeps FlexStridedSlice ops, which the LiteRT interpreter does not run.
        raise ValueError(f"{model.name} is a NaFlex model, whose open sequence length LiteRT runs only with "
                         "TensorFlow's Flex ops: export it to onnx or tf_saved_model.")
    precision = model.get_layer("embedding").compute_dtype
    if format != "tf_saved_model" and precision != "float32":
        runtime = "ONNX Runtime" if format == "onnx" else "LiteRT"
        raise ValueError(
            f"{model.name} computes in {precision}, which {runtime} cannot run on CPUs (no {precision} "
            f"convolution): export a float32 build of it (keras_vit.from_pretrained(..., dtype='float32')), with "
            f"quantize='int8' for a smaller file, or use format='tf_saved_model', which keeps {precision}."
        )
    model = _plain_copy(model, quantize if format != "litert" else None)
    if format == "litert" and quantize == "int8":
        import tensorflow as tf

        kwargs.setdefault("optimizations", [tf.lite.Optimize.DEFAULT])
    if input_signature is None:
        input_signature = [_default_input_spec(model, native_image_size, filepath)]
    if not has_been_called(model):  # Keras' ONNX export asks for it; `predict` on JAX never sets it.
        model(keras.tree.map_structure(lambda spec: keras.KerasTensor(spec.shape, dtype=spec.dtype),
                                       input_signature[0]))
    # ONNX's exporters write weights over their thresholds to `<file>.data`, which the `.onnx` names.
    writing = files.atomic_path_with_sidecars if format == "onnx" else files.atomic_path
    with writing(filepath) as path:
        if format == "onnx" and keras.backend.backend() == "torch":
            with _quiet_torch_exporter():
                _export_onnx_torch(model, path, input_signature[0], verbose, native_image_size, patch_pixels)
        else:
            keras.Model.export(model, path, format=format, verbose=bool(verbose), input_signature=input_signature,
                               **kwargs)
        beside = _into_one_file(path) if format == "onnx" else []
    if beside:
        folder = os.path.dirname(filepath)
        logger.warning("%s is over ONNX's 2 GB for one file, so its weights are in %s beside it: copy them "
                       "together.", filepath, ", ".join(os.path.join(folder, name) for name in beside))
    return filepath


def _into_one_file(path):
    """Move the weights an ONNX writer put beside `path` back into it, where the whole fits in one file.

    jax2onnx writes every tensor of 1 MB or more to `<file>.data` (torch's
    and tf2onnx's exporters only past 2 GB), and a `.onnx` copied without it
    does not load. `path` is alone in a folder of its own
    (`files.atomic_path_with_sidecars`), so every other file there is the
    writer's. Returns those kept beside it: none under ONNX's 2 GB, the
    largest protobuf.
    """
    folder, name = os.path.split(path)
    beside = sorted(set(os.listdir(folder)) - {name})
    if not beside or sum(os.path.getsize(os.path.join(folder, file)) for file in [name, *beside]) > ONNX_FILE_LIMIT:
        return beside
    import onnx

    proto = onnx.load(path)  # reads the external tensors in
    if proto.ByteSize() > ONNX_FILE_LIMIT:
        return beside
    onnx.save_model(proto, path)
    for file in beside:
        os.remove(os.path.join(folder, file))
    return []


def _is_quantized(model):
    return any(getattr(layer, "quantization_mode", None) for layer in sublayers(model))


def _plain_copy(model, quantize):
    """`model` with LoRA merged and, with `quantize`, a quantized copy (the caller's model stays as it was)."""
    has_lora = any(getattr(layer, "lora_rank", None) for layer in model.layers)
    if has_lora:
        model = merge_lora(model)
    if quantize:
        if _is_quantized(model):
            raise ValueError(f"{model.name} is already quantized; export it without quantize=.")
        if not has_lora:
            copy = model.__class__.from_config(model.get_config())
            copy.set_weights(model.get_weights())
            model = copy
        with warnings.catch_warnings():  # Keras names every layer that has nothing to quantize
            warnings.filterwarnings("ignore", message=".*does not have a `quantize` method.*")
            model.quantize(quantize)
    return model


def _default_input_spec(model, native_image_size, filepath):
    """The model's input with a dynamic batch; on JAX a dynamic-resolution model's native size, said.

    A NaFlex model's is its three inputs, the batch and the sequence length both dynamic, the patches of the
    model's own patch size.
    """
    if is_naflex(model):
        width = model.get_layer("embedding").patch_width
        return {tensor.name: keras.InputSpec(shape=(*tensor.shape[:2], width) if tensor.name == "patches" else
                                             tensor.shape, dtype=tensor.dtype, name=tensor.name)
                for tensor in model.inputs}
    shape = tuple(model.inputs[0].shape)
    if None in shape[1:3] and keras.backend.backend() == "jax" and native_image_size:
        shape = (None, *native_image_size, shape[3])
        # Measured: jax2onnx cannot reshape by a product of symbolic sizes (the patch grid's rows times columns).
        logger.warning("%s takes images of any size, but the JAX backend exports it at one: %s takes %dx%d images; "
                       "export it on the tensorflow or torch backend to keep height and width open.", model.name,
                       filepath, *native_image_size)
    return keras.InputSpec(shape=shape, dtype=model.inputs[0].dtype, name=model.inputs[0].name)


@contextlib.contextmanager
def _quiet_torch_exporter():
    """torch's ONNX exporter without its four "torchvision is not installed. Skipping torchvision::nms" (...)
    warnings, which keras_vit's models never need, nor the FutureWarning of its own pytree class."""
    registration = logging.getLogger("torch.onnx._internal.exporter._registration")

    def needed(record):
        return "torchvision is not installed" not in record.getMessage()

    registration.addFilter(needed)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", r"`isinstance\(treespec, LeafSpec\)` is deprecated", FutureWarning)
            yield
    finally:
        registration.removeFilter(needed)


def _export_onnx_torch(model, path, spec, verbose, native_image_size, patch_pixels):
    """PyTorch's dynamo ONNX exporter with a dynamic batch (Keras' TorchScript path fails on a ViT).

    A dynamic-resolution model is traced at its native size, its height and
    width left open as multiples of `patch_pixels`.
    """
    import torch

    if isinstance(spec, dict):
        return _export_naflex_onnx_torch(model, path, spec, verbose)
    axes = {0: torch.export.Dim("batch", min=1)}
    size = spec.shape[1:3]
    if None in size:
        rows, cols = torch.export.Dim("rows", min=1), torch.export.Dim("cols", min=1)
        axes.update({1: patch_pixels * rows, 2: patch_pixels * cols})
        size = native_image_size
    sample = torch.zeros((2, *size, spec.shape[3]), dtype=getattr(torch, spec.dtype))
    model.eval()
    # A Keras layer's forward takes *args, so its dynamic shapes are one tuple per positional argument.
    program = torch.onnx.export(model, (sample,), dynamo=True, input_names=[spec.name or "images"],
                                dynamic_shapes=((axes,),), verbose=bool(verbose))
    _check_open_axes(model, program, {spec.name or "images": axes})
    program.optimize()
    program.save(path)


def _export_naflex_onnx_torch(model, path, specs, verbose):
    """A NaFlex model's three inputs, traced on 2 images of 4 x 4 patches, the batch and sequence length open."""
    import torch

    batch, length = torch.export.Dim("batch", min=1), torch.export.Dim("length", min=1)
    width = specs["patches"].shape[-1]
    sample = {"patches": torch.zeros((2, 16, width)), "patch_grid": torch.full((2, 2), 4, dtype=torch.int32),
              "patch_mask": torch.ones((2, 16), dtype=torch.bool)}
    axes = {"patches": {0: batch, 1: length}, "patch_grid": {0: batch}, "patch_mask": {0: batch, 1: length}}
    model.eval()
    # The empty dict is the keyword arguments: torch.onnx.export takes a trailing dict as them.
    program = torch.onnx.export(model, (sample, {}), dynamo=True, input_names=list(sample),
                                dynamic_shapes=((axes,),), verbose=bool(verbose))
    _check_open_axes(model, program, axes)
    program.optimize()
    program.save(path)


def _check_open_axes(model, program, axes):
    """Refuse an ONNX program in which PyTorch fixed an axis it was asked to leave open: where `torch.export` cannot
    keep a size symbolic, `torch.onnx.export` falls back to the traced sample's shapes with a log line only."""
    fixed = [f"{value.name}[{', '.join(str(size) for size in value.shape)}]" for value in program.model.graph.inputs
             if any(isinstance(value.shape[axis], int) for axis in axes.get(value.name, ()))]
    if fixed:
        raise ValueError(f"PyTorch's ONNX exporter fixed the open axes of {model.name} to the traced sample's "
                         f"({', '.join(fixed)}), so the file would refuse every other shape: export it on the "
                         "tensorflow backend (KERAS_BACKEND=tensorflow).")
