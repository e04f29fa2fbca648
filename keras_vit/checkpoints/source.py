"""The one internal state every weight layout is read into and written out of.

A `WeightsSource` is a checkpoint read into keras_vit's variable paths
(`encoderblock_0/qkv/kernel`, ...) as numpy arrays, with what the file says
about the model it came from. Each layout module turns its files into one
and back; `loading.load_into` puts one into a model.
"""

import dataclasses
import json
import logging
import math
import os
import re
import stat

import keras
import numpy as np

from keras_vit.layers.mlp import GATED
from keras_vit.model.architecture import IMAGENET_PIXEL_STATISTICS, Architecture
from keras_vit.model.description import architecture_of, conv_stem_widths_of, mbconv_of, resnet_layers_of
from keras_vit.model.variants import (
    CONV_STEM_STRIDE,
    MBCONV_PATCH_SIZE,
    VARIANTS,
    Variant,
    mbconv_stride,
    resnet_stride,
)


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


def read_json_object(path, unreadable, expected):
    """The JSON object in the file `path`; a `CheckpointError` "`unreadable`: <why>", or naming the wrong type.

    `expected` says what the object should look like, for a file whose JSON is a list or a value.
    """
    try:
        require_regular_file(path)
        with open(path) as f:
            loaded = json.load(f)
    except (CheckpointError, OSError, ValueError) as error:
        raise CheckpointError(f"{unreadable}: {error}") from error
    if not isinstance(loaded, dict):
        raise CheckpointError(f"{path} is a JSON {type(loaded).__name__}; {expected}")
    return loaded


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
    >>> from keras_vit.model.variants import VARIANTS
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
    if sizes.conv_stem_widths is not None:
        first, second = sizes.conv_stem_widths
        resnet, channels = 16 * 3 * first + 4 * first * second + 4 * (first + second), second
    if sizes.mbconv_widths is not None:  # each block at most 16 (4 + 9/4 + 4 + 1 + norms) width^2 weights
        stem, *stages = sizes.mbconv_widths
        resnet = 36 * stem + 9 * stem * stem + sum(depth * 16 * (2 * width) ** 2 for width, depth
                                                    in zip(stages, sizes.mbconv_depths)) + 9 * stages[-1] * h
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
    `keras_vit.model.graph.ModelOptions` its shapes imply) until a model of that
    layout loads it (`keras_files.read_weights_h5_state`). A `.keras` file's
    `layout` holds the options its saved layers show and its tensors cannot
    (`include_top`, `pooling`), and a folder's the pooling its library gives
    where that is not its classifier's (a SigLIP tower without its head: none).
    """

    description: str
    state: dict
    # The model's name in its file's library, which the model built on it takes: timm's architecture
    # (`beitv2_base_patch16_224`), transformers' model_type (`dinov2`); None where the file names none.
    name: str = None
    grid_size: tuple = None
    representation_size: int = 0
    classes: int = None
    num_heads: int = None
    layout: dict = None
    # What the model is made of: what its tensors show, and from its layout or config what they cannot
    # (activation, epsilon, pooling); None for a .weights.h5 file until it is read.
    architecture: Architecture = None
    class_names: list = None  # Its classes' names, where its files say (id2label, timm's labels, a .keras config).
    dtype_policy: str = None  # The precision it was saved in, where its file keeps one (a .keras model's).
    classifier_activation: str = None  # Its head's activation, where its file keeps one (a .keras model's).
    # (interpolation, antialias): how the file's own library resizes its position table when it loads the file
    # at another size (timm's checkpoint_filter_fn, transformers' interpolate_pos_encoding); None: the paper's
    # bicubic without antialias.
    position_resize: tuple = None
    resize_align_corners: bool = False  # That resize maps corner to corner (RADIO v3's, in timm).
    resize_aspect_preserving: bool = False  # That resize is to a square of the longer side, then cropped (timm's).
    factorized_positions: bool = False  # A NaFlex table of rows and one of columns (timm's pos_embed='factorized').
    # How its library resizes relative position bias tables (BEiT's) to another grid: "timm" (its
    # resize_rel_pos_bias_table) or "transformers" (BeitRelativePositionBias' bilinear interpolate).
    relative_position_resize: str = "timm"
    naflex: bool = False  # A NaFlex model's file (timm's NaFlexVit, transformers' Siglip2): builds one by default.
    # How its library cuts a photo into a NaFlex batch for evaluation, as `keras_vit.data.naflex.naflex_batch`'s
    # keywords: {"rule": "siglip2" or "timm", "max_patches": budget, "interpolation": filter}; None: not NaFlex.
    naflex_preprocessing: dict = None
    # The image size its library runs it at where that is not its table's grid times the patch, the model built
    # at it dropping what whole patches do not cover: timm's so400m/14 at 384 px (a 27x27 grid), a transformers
    # DINOv2 folder's processor crop (224 px beside a 518-pixel table, which transformers resizes on every call).
    input_size: tuple = None
    # How its library preprocesses a photo for evaluation (`keras_vit.data.preprocessing.EvalTransform`); None: keras_vit's own.
    eval_transform: object = None
    # {keras_vit path: the file's own name of that tensor, or a tuple of names where the file keeps it otherwise
    # (split, reshaped)}, so that errors name the file's tensors; None where the names are keras_vit's.
    origins: dict = dataclasses.field(default=None, compare=False)
    # Read for one model alone: loading it empties `state`, dropping each tensor once its variable holds it, so
    # that the state and the model are never both held whole.
    single_use: bool = dataclasses.field(default=False, compare=False)

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
        if conv_stem_widths_of(self.state) is not None:
            resnet = dict(conv_stem_widths=conv_stem_widths_of(self.state))
        patch = int(kernel.shape[0])
        if mbconv_of(self.state) is not None:  # a 3x3 kernel striding by 2
            resnet, patch = dict(zip(("mbconv_widths", "mbconv_depths"), mbconv_of(self.state))), MBCONV_PATCH_SIZE
        return Variant(patch, int(kernel.shape[-1]), self.num_layers, self.num_heads, int(mlp.shape[1]), **resnet)

    @property
    def classifier(self):
        """How the checkpoint's model pools its tokens (`"token"`, `"gap"` or `"map"`)."""
        return self.architecture.classifier

    @property
    def resnet_layers(self):
        """A hybrid's bottleneck units per ResNet stage (None for a plain ViT)."""
        return resnet_layers_of(self.state)

    @property
    def image_size(self):
        """The image size the checkpoint's position embeddings were trained for (its `input_size` where stated)."""
        if self.input_size is not None:
            return self.input_size
        kernel = self.state.get("embedding/kernel")
        if kernel is None or self.grid_size is None:
            return None
        step = kernel.shape[0] * (1 if self.resnet_layers is None else resnet_stride(self.resnet_layers))
        if conv_stem_widths_of(self.state) is not None:
            step = kernel.shape[0] * CONV_STEM_STRIDE
        if mbconv_of(self.state) is not None:
            step = MBCONV_PATCH_SIZE * mbconv_stride(mbconv_of(self.state)[1])
        return (self.grid_size[0] * step, self.grid_size[1] * step)

    @property
    def num_layers(self):
        return len({m.group(1) for m in map(BLOCK.match, self.state) if m})

    def with_heads(self, num_heads=None):
        """This source with its head count: the file's, else `num_heads`, else the named variant's of its width.

        For a model built from the file alone (`from_pretrained`, the
        commands); `ViT(weights=...)` takes the count it is given instead.
        """
        kernel = self.state.get("embedding/kernel")
        if self.num_heads or kernel is None:
            return self
        heads = num_heads or {variant.hidden_size: variant.num_heads for variant in VARIANTS.values()}.get(
            int(kernel.shape[-1]))
        return dataclasses.replace(self, num_heads=heads)

    def with_state(self, state):
        """This source with `state` read (from a model of its `layout`)."""
        return source_from_state(self.description, state, self.grid_size, self.num_heads, self.architecture)


BLOCK = re.compile(r"encoderblock_(\d+)/")



def source_from_state(description, state, grid_size=None, num_heads=None, architecture=None):
    """A `WeightsSource` whose head, pre-logits and architecture are read from `state` itself.

    `architecture` (default: what `architecture_from_state` reads) says what
    the tensors cannot; `grid_size` defaults to the square grid of the
    position table.
    """
    head = state.get("head/bias")
    pre_logits = state.get("pre_logits/bias")
    architecture = architecture or architecture_from_state(state, grid_size)
    table = state.get("position_embedding/pos_embedding")
    if grid_size is None and table is not None and table.ndim == 3:
        grid_size = architecture.grid_of(table.shape[1])
    return WeightsSource(
        description=description,
        state=state,
        grid_size=grid_size,
        representation_size=0 if pre_logits is None else int(pre_logits.shape[-1]),
        classes=None if head is None else int(head.shape[-1]),
        num_heads=num_heads,
        architecture=architecture,
    )


def architecture_from_state(state, grid_size=None, **known):
    """The `Architecture` that keras_vit-named `state` shows, with `known` fields from the file's layout or config.

    The tensors show the prefix tokens, the norms (and whether they are
    RMSNorms: a weight without a bias), the biases, layer scale,
    query/key normalisation, attention pooling and a gated (SwiGLU) MLP;
    whether the prefix tokens have position embeddings follows from the
    table's length (and `grid_size`, where the file states it). The
    activation of an ungated MLP, the epsilon and, with a class token,
    whether the head pools it or the patch mean come from `known` (default:
    the original checkpoints' tanh GELU, 1e-6, the class token).

    Example:
    >>> import numpy as np
    >>> architecture_from_state({"position_embedding/pos_embedding": np.zeros((1, 16, 8))}).classifier
    'gap'
    """
    names = set(state)
    registers = state.get("register_tokens/registers")
    class_token, distillation_token = "class_token/cls" in names, "distillation_token/dist" in names
    register_tokens = 0 if registers is None else int(registers.shape[1])
    prefix = int(class_token) + int(distillation_token) + register_tokens
    table = state.get("position_embedding/pos_embedding")
    embedded_prefix = True
    if table is not None and table.ndim == 3 and prefix:
        rows = int(table.shape[1])
        if grid_size is not None:
            embedded_prefix = rows != grid_size[0] * grid_size[1]
        else:
            embedded_prefix = not (_is_square(rows) and not _is_square(rows - prefix))
    hidden, output = state.get("encoderblock_0/mlp_hidden/kernel"), state.get("encoderblock_0/mlp_output/kernel")
    gated = hidden is not None and output is not None and hidden.shape[-1] == 2 * output.shape[0]
    table_or_none = "position_embedding/pos_embedding" in names or "embedding/kernel" not in names
    fields = dict(
        class_token=class_token,
        register_tokens=register_tokens,
        distillation_token=distillation_token,
        class_token_position_embedding=embedded_prefix,
        classifier="map" if "attention_pool/probe" in names else "token" if class_token else "gap",
        fc_norm="fc_norm/gamma" in names,
        final_norm="fc_norm/gamma" in names or "encoder_norm/gamma" in names or "embedding/kernel" not in names,
        norm_pre="pre_norm/gamma" in names,
        patch_bias="embedding/bias" in names or "embedding/kernel" not in names,
        qkv_bias="encoderblock_0/qkv/bias" in names or "encoderblock_0/qkv/kernel" not in names,
        qk_norm="encoderblock_0/query_norm/gamma" in names,
        attention_output_norm="encoderblock_0/attention_output_norm/gamma" in names,
        mlp_hidden_norm="encoderblock_0/mlp_hidden_norm/gamma" in names,
        mlp_input_norm="encoderblock_0/mlp_input_norm/gamma" in names,
        position_embedding=table_or_none,
        normalization="rms_norm" if "encoderblock_0/attention_norm/gamma" in names
        and "encoderblock_0/attention_norm/beta" not in names else "layer_norm",
        projection_bias="encoderblock_0/attention_output/bias" in names
        or "encoderblock_0/attention_output/kernel" not in names,
        patch_norm="patch_norm/gamma" in names,
        differential_attention="encoderblock_0/lambda_q1" in names,
        parallel="encoderblock_0/attention_norm/gamma" in names and "encoderblock_0/mlp_norm/gamma" not in names,
        layer_scale=1e-5 if "encoderblock_0/attention_layer_scale" in names or "encoderblock_0/layer_scale" in names
        else None,
    )
    fields.update({key: value for key, value in known.items() if value is not None})
    if gated and fields.get("mlp_activation") not in GATED:  # which gate, only the file's layout shows
        fields["mlp_activation"] = "swiglu"
    elif not gated and fields.get("mlp_activation") in GATED:
        fields.pop("mlp_activation")
    return Architecture(**fields)


def _is_square(number):
    side = int(round(max(number, 0) ** 0.5))
    return side * side == number


def state_of(model):
    """A model's weights as `{variable path: numpy array}`, the internal state."""
    return {v.path: keras.ops.convert_to_numpy(v) for v in model.weights}


def warn_unkept_pixel_statistics(model, where_they_go):
    """Log that `model`'s pixel statistics (not the paper's) are not in the tensors a writer writes."""
    architecture = architecture_of(model)
    if architecture.normalizes_input:
        logging.getLogger("keras_vit").warning(
            "%s normalises its [-1, 1] input to pixel mean %s and std %s, which the written tensors do not keep: "
            "%s.", model.name, list(architecture.input_mean), list(architecture.input_std), where_they_go)


def pixel_statistics(mean, std, where, fields=("mean", "std")):
    """`{"input_mean": ..., "input_std": ...}` of a config's normalisation (empty where it names none).

    Each is three finite numbers on the [0, 1] pixel scale (a std above 0):
    booleans, NaN, infinities and the 0-255 scale (`[123.7, 116.3, 103.5]`)
    are refused, the error naming the file (`where`) and the field (`fields`).

    Example:
    >>> pixel_statistics([0.485, 0.456, 0.406], None, "config.json")
    {'input_mean': (0.485, 0.456, 0.406)}
    """
    found = {}
    for key, value, field in (("input_mean", mean, fields[0]), ("input_std", std, fields[1])):
        if value is None:
            continue
        channels = value if isinstance(value, (list, tuple)) else None
        if channels is None or len(channels) != 3 or any(isinstance(c, bool) or not isinstance(c, (int, float))
                                                         for c in channels):
            raise CheckpointError(f"{where}: {field} is {value!r}; expected three per-channel numbers on the [0, 1] "
                                  "pixel scale, such as ImageNet's "
                                  f"{list(IMAGENET_PIXEL_STATISTICS[key])}.")
        channels = tuple(float(c) for c in channels)
        if not all(math.isfinite(c) for c in channels):
            raise CheckpointError(f"{where}: {field} is {list(value)!r}, which is not finite.")
        low = 0.0 if key == "input_mean" else None
        if any(c > 1 for c in channels):
            raise CheckpointError(f"{where}: {field} is {list(value)!r}, on the 0-255 scale; timm and transformers "
                                  f"keep pixel statistics on the [0, 1] scale ({[round(c / 255, 4) for c in channels]}).")
        if (low is not None and any(c < low for c in channels)) or (low is None and any(c <= 0 for c in channels)):
            raise CheckpointError(f"{where}: {field} is {list(value)!r}; a {'mean' if low is not None else 'std'} "
                                  f"on the [0, 1] pixel scale is {'>= 0' if low is not None else '> 0'}.")
        found[key] = channels
    return found


def is_float(dtype):
    """Whether `dtype` is floating point: numpy's, or ml_dtypes' bfloat16 and float8 (not numpy's np.floating)."""
    return dtype.kind == "f" or dtype.name.startswith(("bfloat16", "float8"))


def refuse_non_float(description, dtypes):
    """Raise for weights that are not floating point, `dtypes` as `{name: dtype}` in the file's own names.

    Each reader checks the tensors it takes as it reads them (`TensorLayout.read`, `flax_npz.from_flax`, the
    hybrids' stems, a `.keras` archive), and `loading.load_into` any state built otherwise. An integer or
    boolean array cast into a float model is silent garbage (the bytes of 1.0f read as I32 become 1065353216).
    """
    found = [(name, dtype) for name, dtype in dtypes.items() if not is_float(dtype)]
    if found:
        listed = ", ".join(f"'{name}' is {dtype}" for name, dtype in sorted(found)[:3])
        more = f" (and {len(found) - 3} more)" if len(found) > 3 else ""
        raise CheckpointError(f"{description}: weights must be floating point, but {listed}{more}; the file is "
                              "corrupt, quantized or not a checkpoint of weights. Nothing was loaded.")


def non_finite(path, value):
    """Whether weight `path` holding `value` holds what no model computes with: NaN, or an infinity. A clamp's bound
    (Gemma 4's `*_clip`) may be infinite: no clamp there, timm's and transformers' default.

    Example:
    >>> non_finite("encoderblock_0/qkv_clip", [float("-inf"), float("inf")]), non_finite("head/bias", [float("inf")])
    (False, True)
    """
    value = np.asarray(value)
    if str(path).endswith("_clip"):
        return bool(np.any(np.isnan(value)))
    return not bool(np.all(np.isfinite(value)))


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
