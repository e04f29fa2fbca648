"""Keras' own layouts: a saved `.keras` model, and a `.weights.h5` file of a keras_vit model.

A `.keras` file carries its architecture, so its grid and head count are
read from the saved layers. A `.weights.h5` file carries none: its layout
(sizes, grid, head) is inferred from the stored shapes, and
`keras_vit.models.read_checkpoint` builds a model of that layout to load it.
"""

import itertools
import math
import zipfile

import keras

from keras_vit.checkpoints.source import (
    CheckpointError,
    WeightsSource,
    check_declared_size,
    preview,
    require_regular_file,
    source_from_state,
    state_of,
)
from keras_vit.variants import Variant

def read_keras(path):
    """Read the weights of a keras_vit model saved as `.keras`."""
    _check_archive(path)
    try:
        saved = keras.saving.load_model(path, compile=False)
    except Exception as error:  # Keras raises many types for a bad archive.
        raise CheckpointError(f"{path} is not a loadable .keras model: {error}") from error
    grid = num_heads = None
    try:
        grid = tuple(saved.get_layer("position_embedding").grid_size)
        num_heads = saved.get_layer("encoderblock_0").num_heads
    except ValueError:
        pass
    return source_from_state(path, state_of(saved), grid, num_heads)


def _check_archive(path):
    """A `.keras` file is a zip holding `config.json` and the weights; say which part is broken.

    It must be a regular file, and its entries may not declare far more
    bytes than it holds (`check_declared_size`): both checked before any
    entry is decompressed.
    """
    file_size = require_regular_file(path).st_size
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            check_declared_size(path, sum(entry.file_size for entry in archive.infolist()), file_size, "entries")
            broken = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError) as error:
        raise CheckpointError(f"{path} is not a .keras archive (a zip file), or it is truncated: {error}") from error
    if broken is not None:
        raise CheckpointError(f"{path} is corrupt: its entry {broken!r} fails its checksum.")
    if "config.json" not in names:
        raise CheckpointError(f"{path} is a zip file but not a saved Keras model: it has no config.json.")


def read_weights_h5(path):
    """Read the layout of a `.weights.h5` file saved from a keras_vit model.

    The file holds no architecture, so the saved model's depth, head and
    position grid are inferred from its shapes into `layout` (the options
    of `keras_vit.models.ModelOptions`); the arrays are read by a model of
    that layout (`keras_vit.models.read_checkpoint`). The head count is not
    stored in the file.
    """
    import h5py  # A Keras dependency.

    require_regular_file(path)
    try:
        with h5py.File(path, "r") as archive:
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
        classifier="token" if num_prefix_tokens else "gap",
        include_top=bool(dense),
        classes=int(shapes[dense[-1]][1][0]) if dense else 1000,
        representation_size=int(shapes[dense[0]][1][0]) if len(dense) == 2 else 0,
    )
    return WeightsSource(path, state=None, grid_size=(side, side), layout=layout)


def _layer_order(name):
    _, _, number = name.partition("_")
    return int(number) if number.isdigit() else 0
