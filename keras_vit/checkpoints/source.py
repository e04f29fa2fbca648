"""The one internal state every weight layout is read into and written out of.

A `WeightsSource` is a checkpoint read into keras_vit's variable paths
(`encoderblock_0/qkv/kernel`, ...) as numpy arrays, with what the file says
about the model it came from. Each layout module turns its files into one
and back; `loading.load_into` puts one into a model.
"""

import dataclasses
import os
import re
import stat

import keras

from keras_vit.variants import Variant, resnet_stride


class CheckpointError(ValueError):
    """A checkpoint that cannot be read or does not fit the model."""


def require_regular_file(path):
    """Raise `CheckpointError` unless `path` (after symlinks) is a regular file; checked before it is opened.

    A FIFO would block the reader forever, and a device such as `/dev/zero`
    would be read until memory runs out.
    """
    try:
        info = os.stat(path)
    except OSError as error:
        raise CheckpointError(f"Weights file not found or not readable: {path} ({error.strerror}).") from error
    if not stat.S_ISREG(info.st_mode):
        kind = {stat.S_IFIFO: "a FIFO (named pipe)", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
                stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a folder"}.get(stat.S_IFMT(info.st_mode), "not a file")
        target = os.path.realpath(path)
        shown = path if target == os.path.abspath(path) else f"{path} (-> {target})"
        raise CheckpointError(f"{shown} is {kind}, not a regular file; keras_vit reads weights only from files.")
    return info


def check_declared_size(path, declared, stored, what):
    """Refuse an archive whose entries declare far more bytes than the file holds, before decompressing any.

    Checkpoint weights are floats, which deflate compresses by well under
    half; even a zeroed head compresses only where the rest of the file
    does not. So `declared` (the sum of the zip directory's uncompressed
    sizes) may be at most `DECOMPRESSION_RATIO` times the `stored` file size
    plus `DECOMPRESSION_SLACK` bytes (room for a small model with a large
    zero head); deflate itself allows about 1000x, which a decompression
    bomb uses.
    """
    limit = DECOMPRESSION_RATIO * stored + DECOMPRESSION_SLACK
    if declared > limit:
        raise CheckpointError(
            f"{path} declares {declared:,} bytes of {what} in a {stored:,}-byte file, more than "
            f"{DECOMPRESSION_RATIO}x its size plus {DECOMPRESSION_SLACK >> 20} MiB: a decompression bomb or a "
            "corrupt archive; nothing was decompressed."
        )


DECOMPRESSION_RATIO = 64
DECOMPRESSION_SLACK = 64 << 20


@dataclasses.dataclass(frozen=True)
class WeightBudget:
    """The most bytes of weights a checkpoint for one model may declare, and that model in words."""

    limit: int
    model: str

    def check(self, path, declared, what="weights"):
        """Refuse `path` if it declares more than `limit` bytes, before any of it is decompressed or read."""
        if declared > self.limit:
            raise CheckpointError(
                f"{path} declares {declared:,} bytes of {what}, out of proportion to {self.model}, whose "
                f"checkpoints hold at most {self.limit:,} bytes: it is not a checkpoint of this model, or it is "
                "corrupt or a decompression bomb; nothing was read."
            )


# Generous bounds, so that every real checkpoint of a model fits its budget: an
# ImageNet-21k head (21,843 classes) with pre-logits, position embeddings for
# up to a 64x64 patch grid, every array in float64, and 64 MiB for the
# containers' own bytes.
_BUDGET_CLASSES = 21843
_BUDGET_GRID = 64
_BUDGET_SLACK = 64 << 20


def weight_budget(sizes, classes=None):
    """The `WeightBudget` of a model of `sizes` (a `Variant`) with `classes` outputs.

    Example:
    >>> from keras_vit.variants import VARIANTS
    >>> weight_budget(VARIANTS["ViT_B16"]).limit > 8 * 86_000_000
    True
    """
    h, m = sizes.hidden_size, sizes.mlp_dim
    blocks = sizes.num_layers * (4 * h * h + 2 * h * m + m + 9 * h) + 2 * h
    channels, resnet = 3, 0
    if sizes.resnet_layers is not None:
        # Each bottleneck unit holds at most 25 mid^2 weights (1x1, 3x3, 1x1 and a projection).
        width = sizes.resnet_width
        resnet = 147 * width + sum(units * 25 * (width * 2**stage) ** 2
                                   for stage, units in enumerate(sizes.resnet_layers))
        channels = 4 * width * 2 ** max(len(sizes.resnet_layers) - 1, 0)
    embedding = sizes.patch_size**2 * channels * h + h + (1 + _BUDGET_GRID**2) * h
    head = (h + 1) * (h + max(classes or 0, _BUDGET_CLASSES) + 1)
    parameters = blocks + resnet + embedding + head
    model = (f"a ViT of hidden size {h}, {sizes.num_layers} blocks and MLP size {m}"
             + ("" if sizes.resnet_layers is None else f" on a ResNet with stages {sizes.resnet_layers}"))
    return WeightBudget(8 * parameters + _BUDGET_SLACK, model)


@dataclasses.dataclass
class WeightsSource:
    """A checkpoint read into keras_vit's names, before it meets a model.

    `state` maps variable paths to arrays. A `.weights.h5` file holds no
    architecture: it is read as `state=None` with the `layout` (the
    `keras_vit.models.ModelOptions` its shapes imply) until a model of that
    layout loads it (`keras_vit.models.read_checkpoint`).
    """

    description: str
    state: dict
    grid_size: tuple = None
    classifier: str = "token"
    representation_size: int = 0
    classes: int = None
    num_heads: int = None
    layout: dict = None
    approximate_gelu: bool = None  # The GELU the checkpoint was trained with, where its layout says (timm: exact).
    layer_norm_epsilon: float = None  # Its LayerNorm epsilon, where its layout says (transformers: 1e-12).
    class_names: list = None  # Its classes' names, where its files say (id2label, timm's labels, a .keras config).
    dtype_policy: str = None  # The precision it was saved in, where its file keeps one (a .keras model's).
    classifier_activation: str = None  # Its head's activation, where its file keeps one (a .keras model's).

    @property
    def sizes(self):
        """The model sizes this checkpoint was saved from, as a `Variant` (None if unknown)."""
        if self.state is None:  # A .weights.h5 layout: its head count is unknown.
            return None
        kernel = self.state.get("embedding/kernel")
        mlp = self.state.get("encoderblock_0/mlp_hidden/kernel")
        if kernel is None or mlp is None or not self.num_heads or kernel.shape[0] != kernel.shape[1]:
            return None
        resnet = {}
        if "conv_root/kernel" in self.state:
            resnet = dict(resnet_layers=self.resnet_layers, resnet_width=int(self.state["conv_root/kernel"].shape[-1]))
        return Variant(int(kernel.shape[0]), int(kernel.shape[-1]), self.num_layers, self.num_heads,
                       int(mlp.shape[1]), **resnet)

    @property
    def resnet_layers(self):
        """A hybrid's bottleneck units per ResNet stage (None for a plain ViT)."""
        return resnet_layers_of(self.state)

    @property
    def image_size(self):
        """The image size the checkpoint's position embeddings were trained for."""
        kernel = self.state.get("embedding/kernel")
        if kernel is None or self.grid_size is None:
            return None
        step = kernel.shape[0] * (1 if self.resnet_layers is None else resnet_stride(self.resnet_layers))
        return (self.grid_size[0] * step, self.grid_size[1] * step)

    @property
    def num_layers(self):
        return len({m.group(1) for m in map(BLOCK.match, self.state) if m})

    def with_state(self, state):
        """This source with `state` read (from a model of its `layout`)."""
        return source_from_state(self.description, state, self.grid_size, self.num_heads)


BLOCK = re.compile(r"encoderblock_(\d+)/")
UNIT = re.compile(r"block(\d+)_unit(\d+)/")


def resnet_layers_of(names):
    """The bottleneck units per ResNet stage that keras_vit variable `names` hold (None: no ResNet)."""
    if "conv_root/kernel" not in names:
        return None
    units = {}
    for match in map(UNIT.match, names):
        if match:
            stage, unit = int(match.group(1)), int(match.group(2))
            units[stage] = max(units.get(stage, 0), unit)
    return tuple(units[stage] for stage in sorted(units))


def source_from_state(description, state, grid_size=None, num_heads=None):
    """A `WeightsSource` whose head, pre-logits and classifier are read from `state` itself."""
    head = state.get("head/bias")
    pre_logits = state.get("pre_logits/bias")
    return WeightsSource(
        description=description,
        state=state,
        grid_size=grid_size,
        classifier="token" if "class_token/cls" in state else "gap",
        representation_size=0 if pre_logits is None else int(pre_logits.shape[-1]),
        classes=None if head is None else int(head.shape[-1]),
        num_heads=num_heads,
    )


def state_of(model):
    """A model's weights as `{variable path: numpy array}`, the internal state."""
    return {v.path: keras.ops.convert_to_numpy(v) for v in model.weights}


def positive_int_field(fields, key, where, prefix=""):
    """`fields[key]` of a parsed config file as a positive int (None if absent), else a `CheckpointError`.

    The error names the file (`where`) and the field (`prefix + key`).
    """
    value = fields.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CheckpointError(f"{where}: {prefix}{key} is {value!r}; expected a positive int.")
    return value


def refuse_non_float(description, found):
    """Raise for weights that are not floating point, `found` as `[(name, dtype)]`; every reader ends here.

    An integer or boolean array cast into a float model is silent garbage
    (the bytes of 1.0f read as I32 become 1065353216).
    """
    if found:
        listed = ", ".join(f"'{name}' is {dtype}" for name, dtype in sorted(found)[:3])
        more = f" (and {len(found) - 3} more)" if len(found) > 3 else ""
        raise CheckpointError(f"{description}: weights must be floating point, but {listed}{more}; the file is "
                              "corrupt, quantized or not a checkpoint of weights. Nothing was loaded.")


def preview(names, count=5):
    """The first `count` sorted names, and "..." if there are more (for error messages)."""
    names = sorted(names)
    return names[:count] + (["..."] if len(names) > count else [])


def class_names_in_order(labels, state):
    """A file's class names (a list, or a dict from class index to name) in head order, or None.

    None unless there is one name for each of the head's outputs
    (transformers' `id2label`, timm's `label_descriptions` / `label_names`).
    """
    head = state.get("head/kernel")
    if not isinstance(labels, (list, dict)) or head is None or len(labels) != head.shape[-1]:
        return None
    if isinstance(labels, dict):
        try:
            by_index = {int(index): name for index, name in labels.items()}
        except (TypeError, ValueError):  # Not class indices: no names rather than wrong ones.
            return None
        if sorted(by_index) != list(range(len(labels))):
            return None
        return [str(by_index[index]) for index in range(len(labels))]
    return [str(name) for name in labels]
