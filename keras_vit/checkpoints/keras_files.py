"""Keras' own layouts: a saved `.keras` model, and a `.weights.h5` file of a keras_vit model.

A `.keras` file carries its architecture, so its grid and head count are
read from the saved layers; one that Keras quantized (`model.quantize`) is
loaded as saved (`load_keras`), its 8-bit kernels being no weights for
another model. A `.weights.h5` file carries none: its layout
(sizes, grid, head) is inferred from the stored shapes, and
`read_weights_h5_state` builds a model of that layout (`keras_vit.model.graph`) for Keras'
loader to read it into.
"""

import contextlib
import io
import itertools
import json
import logging
import math
import struct
import tempfile
import zipfile

import keras
import numpy as np

from keras_vit.checkpoints.source import (
    CheckpointError,
    WeightsSource,
    check_declared_size,
    non_finite,
    preview,
    refuse_non_float,
    require_regular_file,
    source_from_state,
    state_of,
    weight_budget,
)
from keras_vit.layers import PRECISIONS
from keras_vit.layers.naflex import NaFlexFactorizedPositionEmbedding
from keras_vit.model.architecture import Architecture
from keras_vit.model.description import architecture_of, is_naflex, native_grid
from keras_vit.model.graph import ModelOptions, build
from keras_vit.model.variants import Variant
from keras_vit.utils.keras_internals import stored_kernel, sublayers

logger = logging.getLogger("keras_vit")

# A saved keras_vit model's config.json is tens of kilobytes; far more is no model of ours.
_MAX_CONFIG_BYTES = 16 << 20

def read_keras(path, budget=None):
    """Read the weights of a keras_vit model saved as `.keras`.

    `budget` (a `WeightBudget`) bounds its size by the model it is meant
    for; without one, by the model its own `config.json` describes. Its
    `layout` says whether the saved model has its top and how it pools
    without one, and its `image_size` if it takes any (`(None, None)`) or
    the other patch sizes of a NaFlex model (`naflex_patch_sizes`), and
    `position_resize` how it resizes its position table.
    """
    if _declares_quantization(path):
        raise CheckpointError(f"{path} holds a model quantized by Keras (model.quantize): its 8-bit kernels are no "
                              "weights to load into another model. Load it as saved, with keras_vit.from_pretrained "
                              "or keras.saving.load_model.")
    _check_archive(path, budget)
    return source_of_saved(_load(path), path)


def source_of_saved(saved, path):
    """The `WeightsSource` of a float keras_vit model loaded from the `.keras` file `path` (LoRA merged)."""
    grid = num_heads = precision = architecture = resize = position = None
    try:
        grid = native_grid(saved)
        position = saved.get_layer("position_embedding") if any(
            layer.name == "position_embedding" for layer in saved.layers) else None
        resize = None if position is None else (position.interpolation, bool(position.antialias))
        block = saved.get_layer("encoderblock_0")
        num_heads, precision = block.num_heads, block.dtype_policy.name
        architecture = architecture_of(saved)
    except ValueError:
        pass
    source = source_from_state(path, _merged_lora_state(saved, path), grid, num_heads, architecture)
    source.position_resize = resize
    names = {layer.name for layer in saved.layers}
    pooling = "map" if "attention_pool" in names else getattr(saved.get_layer("pool"), "method", None) \
        if "pool" in names else None
    source.layout = dict(include_top=True) if "head" in names else dict(include_top=False, pooling=pooling)
    if is_naflex(saved):  # NaFlex inputs, the table's per-image resize and the patch sizes: no tensor shows them
        source.naflex, source.naflex_preprocessing = True, getattr(saved, "naflex_preprocessing", None)
        if position is not None:
            source.resize_aspect_preserving = bool(position.aspect_preserving)
            source.resize_align_corners = bool(position.align_corners)
            source.factorized_positions = isinstance(position, NaFlexFactorizedPositionEmbedding)
        embedding = saved.get_layer("embedding")
        others = tuple(size for size in embedding.patch_sizes if size != embedding.patch_size[0])
        if others:
            source.layout["naflex_patch_sizes"] = others
    elif tuple(saved.input_shape[1:3]) == (None, None):  # Dynamic resolution, which the tensors cannot show
        source.layout["image_size"] = (None, None)
    source.class_names = getattr(saved, "class_names", None)
    source.eval_transform = getattr(saved, "eval_transform", None)
    source.dtype_policy = precision if precision in PRECISIONS else None  # An int8 model's is its own
    try:
        activation = keras.activations.serialize(saved.get_layer("predictions").activation)
        source.classifier_activation = activation if isinstance(activation, str) else None
    except ValueError:  # No classifier.
        pass
    return source


def load_keras(path, budget=None):
    """The keras_vit model of a `.keras` file, loaded by Keras as saved, after the archive's checks.

    Float or quantized by Keras (`model.quantize("int8")`, whose integer
    kernels are no float state that another model could load). Its
    floating-point weights must be finite, and a quantized one must be a
    keras_vit ViT.
    """
    quantized = _declares_quantization(path)
    _check_archive(path, budget, quantized=quantized)
    saved = _load(path)
    bad = [variable.path for variable in saved.weights if "float" in str(variable.dtype)
           and non_finite(variable.path, keras.ops.convert_to_numpy(variable))]
    if bad:
        raise CheckpointError(f"{path} holds NaN or infinite weights in {len(bad)} variables: {preview(bad)}.")
    if quantized:
        try:
            architecture_of(saved)
        except ValueError as error:
            raise CheckpointError(f"{path} holds a quantized model that is not a keras_vit ViT: {error}") from None
    return saved


def _load(path):
    try:
        return keras.saving.load_model(path, compile=False)
    except Exception as error:  # Keras raises many types for a bad archive.
        raise CheckpointError(f"{path} is not a loadable .keras model: {error}") from error


def _declares_quantization(path):
    """Whether a `.keras` file's `config.json` gives any layer a quantized dtype policy (False if it has none)."""
    try:
        require_regular_file(path)
        with zipfile.ZipFile(path) as archive:
            if archive.getinfo("config.json").file_size > _MAX_CONFIG_BYTES:
                return False  # Not a model of ours: `_check_archive` says so.
            config = json.loads(archive.read("config.json"))
    except (CheckpointError, zipfile.BadZipFile, KeyError, OSError, EOFError, ValueError):
        return False  # Unreadable: `_check_archive` names the problem.

    def quantized(node):
        if isinstance(node, dict):
            return "Quantized" in str(node.get("class_name", "")) or any(map(quantized, node.values()))
        return isinstance(node, list) and any(map(quantized, node))

    return quantized(config)


def _merged_lora_state(saved, path):
    """The saved model's weights, with any LoRA adapters folded into their kernels (and none left).

    Keras saves an adapted Dense layer's kernel merged and restarts its
    adapters at zero on load, so the merged kernel is the trained one.
    """
    state = state_of(saved)
    adapted = [layer for layer in sublayers(saved) if getattr(layer, "lora_enabled", False)]
    if not adapted:
        return state
    for layer in adapted:
        state[stored_kernel(layer).path] = keras.ops.convert_to_numpy(layer.kernel)  # `kernel` adds the adapters
        for variable in (layer.lora_kernel_a, layer.lora_kernel_b):
            del state[variable.path]
    logger.warning("%s holds LoRA adapters on %d dense layers; they were merged into the kernels, so the model "
                   "has none (keras_vit.enable_lora adds new ones to go on training adapters).", path, len(adapted))
    return state


def _check_archive(path, budget=None, quantized=False):
    """A `.keras` file is a zip holding `config.json` and the weights; say which part is broken.

    It must be a regular file, its entries may not declare far more bytes
    than it holds (`check_declared_size`), nor more than the `budget` of the
    model it is meant for or, without one, of the model its `config.json`
    claims: all checked before the weights are decompressed. Integer arrays
    are refused unless the model is `quantized`.
    """
    file_size = require_regular_file(path).st_size
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            declared = sum(entry.file_size for entry in archive.infolist())
            check_declared_size(path, declared, file_size, "entries")
            if budget is None and "config.json" in names:
                budget = _claimed_budget(path, archive)
            if budget is not None:
                budget.check(path, declared, "entries")
            broken = archive.testzip()
            if broken is None and "model.weights.h5" in names and not quantized:
                import h5py  # A Keras dependency.

                with _seekable_weights(archive, path) as entry, h5py.File(entry, "r") as weights:
                    refuse_integer_datasets(weights, path)
    except (zipfile.BadZipFile, OSError, EOFError) as error:
        raise CheckpointError(f"{path} is not a .keras archive (a zip file), or it is truncated: {error}") from error
    if broken is not None:
        raise CheckpointError(f"{path} is corrupt: its entry {broken!r} fails its checksum.")
    if "config.json" not in names:
        raise CheckpointError(f"{path} is a zip file but not a saved Keras model: it has no config.json.")


@contextlib.contextmanager
def _seekable_weights(archive, path):
    """`model.weights.h5` of an opened `.keras` zip as a file h5py can seek in cheaply.

    h5py seeks, and a seek back in a zip entry re-reads it from its start.
    Keras stores the entry uncompressed: then its bytes are read in place
    (the checksums were tested already); a compressed one is copied out once.
    """
    info = archive.getinfo("model.weights.h5")
    if info.compress_type == zipfile.ZIP_STORED:
        with open(path, "rb") as file:
            file.seek(info.header_offset)
            header = file.read(30)  # The local file header: its name and extra field precede the data.
            if len(header) < 30 or header[:4] != b"PK\x03\x04":
                raise zipfile.BadZipFile("the weights' local header is missing")
            name_length, extra_length = struct.unpack("<HH", header[26:30])
            yield _Window(file, info.header_offset + 30 + name_length + extra_length, info.file_size)
        return
    with archive.open(info) as entry, tempfile.TemporaryFile() as copy:
        _copy_entry(entry, copy, path)
        copy.seek(0)
        yield copy


class _Window(io.RawIOBase):
    """Bytes `start .. start + size` of an open binary `file`, as a seekable read-only file."""

    def __init__(self, file, start, size):
        super().__init__()
        self.file, self.start, self.size, self.position = file, start, size, 0

    def readable(self):
        return True

    def seekable(self):
        return True

    def seek(self, offset, whence=io.SEEK_SET):
        self.position = max(0, {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.size}[whence] + offset)
        return self.position

    def tell(self):
        return self.position

    def readinto(self, buffer):
        count = max(0, min(len(buffer), self.size - self.position))
        self.file.seek(self.start + self.position)
        count = self.file.readinto(memoryview(buffer)[:count])
        self.position += count
        return count


def _copy_entry(entry, copy, path):
    """A zip `entry` copied into the file `copy`: a write that fails (a full disk) told apart from a broken archive."""
    while chunk := entry.read(16 << 20):
        try:
            copy.write(chunk)
        except OSError as error:
            raise CheckpointError(f"{path}: its weights could not be copied to a temporary file in "
                                  f"{tempfile.gettempdir()} to be checked ({error}); free space there, or set "
                                  "TMPDIR.") from error


def _claimed_budget(path, archive):
    """The `WeightBudget` of the keras_vit model a `.keras` archive's `config.json` describes (None: not ours)."""
    if archive.getinfo("config.json").file_size > _MAX_CONFIG_BYTES:
        raise CheckpointError(f"{path}: its config.json declares more than {_MAX_CONFIG_BYTES >> 20} MiB; "
                              "it is not a saved keras_vit model.")
    try:
        config = json.loads(archive.read("config.json"))
        layers = {layer["config"]["name"]: layer["config"] for layer in config["config"]["layers"]}
        embedding, block = layers["embedding"], layers["encoderblock_0"]
        depth = sum(1 for name in layers if name.startswith("encoderblock_"))
        sizes = Variant(int(embedding["patch_size"][0]), int(embedding["hidden_size"]), depth,
                        int(block["num_heads"]), int(block["mlp_dim"]))
        classes = int(layers["head"]["units"]) if "head" in layers else None
    except (ValueError, KeyError, TypeError, IndexError):
        return None  # Not a plain keras_vit ViT (a hybrid, a masked-patch model): Keras' loader judges it.
    return weight_budget(sizes, classes)


def refuse_integer_datasets(archive, path):
    """Refuse an h5 weights archive holding integer arrays, which Keras' loader casts into a float model silently."""
    import h5py  # A Keras dependency.

    found = {}  # An optimizer's step counter is an integer: only the layers' arrays are weights.
    archive.visititems(lambda name, item: found.update({name: item.dtype})
                       if isinstance(item, h5py.Dataset) and item.dtype.kind in "iub"
                       and not name.startswith("optimizer/") else None)
    refuse_non_float(path, found)


def read_weights_h5(path, budget=None):
    """Read the layout of a `.weights.h5` file saved from a keras_vit model.

    The file holds no architecture, so the saved model's depth, head and
    position grid are inferred from its shapes into `layout` (the options
    of `keras_vit.model.graph.ModelOptions`); the arrays are read by a model of
    that layout (`read_weights_h5_state`). The head count is not
    stored in the file. `budget` (a `WeightBudget`) bounds the file's size
    and the bytes its arrays declare by the model it is meant for.
    """
    import h5py  # A Keras dependency.

    file_size = require_regular_file(path).st_size
    if budget is not None:
        budget.check(path, file_size, "data")
    try:
        with h5py.File(path, "r") as archive:
            declared = []  # Shapes are metadata: nothing is decompressed to sum them.
            archive.visititems(lambda _, item: declared.append(item.size * item.dtype.itemsize)
                               if isinstance(item, h5py.Dataset) else None)
            refuse_integer_datasets(archive, path)
            check_declared_size(path, sum(declared), file_size, "arrays")
            if budget is not None:
                budget.check(path, sum(declared), "arrays")
            layers = archive["layers"]
            names = list(layers.keys())
            shapes = {
                name: [layers[name]["vars"][str(i)].shape for i in range(len(layers[name]["vars"]))]
                for name in names
                if "vars" in layers[name]
            }
            block_shapes = {
                key: layers["transformer_block"][key]["vars"]["0"].shape
                for key in ("qkv", "mlp_hidden")
            } if "transformer_block" in layers else None
            unit_widths = [
                layers[name]["conv1"]["vars"]["0"].shape[-1]
                for name in sorted((n for n in names if n.startswith("bottleneck_unit")), key=_layer_order)
            ]
    except (OSError, KeyError) as error:
        raise CheckpointError(f"{path} is not a readable keras_vit .weights.h5 file: {error}") from error
    if "patch_embedding" not in shapes or "add_position_embedding" not in shapes or not block_shapes:
        raise CheckpointError(f"{path} does not hold keras_vit ViT weights (found layers {preview(names)}).")
    kernel = shapes["patch_embedding"][0]
    hidden_size = kernel[-1]
    num_prefix_tokens = 1 if "class_token" in shapes else 0
    positions = shapes["add_position_embedding"][0][1] - num_prefix_tokens
    side = math.isqrt(positions)
    if side * side != positions:
        raise CheckpointError(
            f"{path} holds a non-square position grid ({positions} positions); save the model "
            "as .keras to keep its grid."
        )
    dense = sorted((n for n in shapes if n == "dense" or n.startswith("dense_")), key=_layer_order)
    num_layers = sum(1 for n in names if n == "transformer_block" or n.startswith("transformer_block_"))
    hybrid = {}
    if "standardized_conv2d" in shapes:
        # Each ResNet stage doubles the bottleneck width, so runs of equal widths are the stages.
        stages = [len(list(run)) for _, run in itertools.groupby(unit_widths)]
        hybrid = dict(resnet_layers=tuple(stages), resnet_width=int(shapes["standardized_conv2d"][0][-1]))
    sizes = Variant(int(kernel[0]), int(hidden_size), num_layers, 1, int(block_shapes["mlp_hidden"][-1]), **hybrid)
    layout = dict(
        image_size=(side * sizes.pixels_per_patch,) * 2,
        sizes=sizes,
        architecture=Architecture(class_token=bool(num_prefix_tokens), classifier="token" if num_prefix_tokens else "gap"),
        include_top=bool(dense),
        classes=int(shapes[dense[-1]][1][0]) if dense else 1000,
        representation_size=int(shapes[dense[0]][1][0]) if len(dense) == 2 else 0,
    )
    return WeightsSource(path, state=None, grid_size=(side, side), layout=layout)


def read_weights_h5_state(source):
    """`source` (of `read_weights_h5`) with its state: Keras' own loader reads the file into a model of its layout."""
    try:
        template = build(ModelOptions(**source.layout), None)
        template.load_weights(source.description)
    except Exception as error:
        raise CheckpointError(f"{source.description} could not be loaded as keras_vit weights: {error}") from error
    return source.with_state(state_of(template))


def _layer_order(name):
    _, _, number = name.partition("_")
    return int(number) if number.isdigit() else 0
