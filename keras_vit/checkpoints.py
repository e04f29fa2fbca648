"""Checkpoints: the named published sets, reading files, and loading them.

This module is the one home of the mapping from the original Flax names
(`Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query/kernel`,
...) to keras_vit's variable paths (`encoderblock_0/qkv/kernel`, ...).

Loading is all-or-nothing: a checkpoint is read and converted into a plain
dict of numpy arrays, every name and shape is checked against the model, and
only then are the variables assigned. Any mismatch raises `CheckpointError`
from the model constructor, so no half-loaded model is ever returned.
"""

import dataclasses
import itertools
import logging
import math
import os
import re
import zipfile

import keras
import numpy as np

from keras_vit.position_embedding import resize_position_embeddings
from keras_vit.resnet import resnet_stride

logger = logging.getLogger("keras_vit")

_BUCKET = "https://storage.googleapis.com/vit_models"


class CheckpointError(ValueError):
    """A checkpoint that cannot be read or does not fit the model."""


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """A published checkpoint that `weights=name` downloads.

    `representation_size` is the width of its pre-logits layer (0 if none),
    `classes` the size of its head, `image_size` the resolution it was
    trained or fine-tuned at. `file_hash` (sha256) is checked when known.
    """

    name: str
    variant: str
    image_size: int
    url: str
    classes: int
    representation_size: int = 0
    file_hash: str = None

    @property
    def filename(self):
        return f"{self.variant}-{self.name}-{self.image_size}.npz"


def _original(variant, name, image_size, file, classes, representation_size=0):
    return Checkpoint(name, variant, image_size, f"{_BUCKET}/{file}", classes, representation_size)


_AUGREG = "300ep-lr_0.001-aug_{aug}-wd_{wd}-do_{do}-sd_{do}"
# (variant, pretraining file stem) of the "How to train your ViT?" (AugReg) release.
_AUGREG_I21K = {
    "ViT_Ti16": "Ti_16-i21k-" + _AUGREG.format(aug="none", wd="0.03", do="0.0"),
    "ViT_S32": "S_32-i21k-" + _AUGREG.format(aug="light1", wd="0.03", do="0.0"),
    "ViT_S16": "S_16-i21k-" + _AUGREG.format(aug="light1", wd="0.03", do="0.0"),
    "ViT_B32": "B_32-i21k-" + _AUGREG.format(aug="medium1", wd="0.03", do="0.0"),
    "ViT_B16": "B_16-i21k-" + _AUGREG.format(aug="medium1", wd="0.1", do="0.0"),
    "ViT_B8": "B_8-i21k-" + _AUGREG.format(aug="medium1", wd="0.1", do="0.0"),
    "ViT_L16": "L_16-i21k-" + _AUGREG.format(aug="medium1", wd="0.1", do="0.1"),
}
# The recommended ImageNet-1k fine-tunes: (pretraining stem, fine-tune lr, sizes).
_AUGREG_I21K_FT = {
    "ViT_Ti16": (_AUGREG_I21K["ViT_Ti16"], "0.03", (224, 384)),
    "ViT_S32": (_AUGREG_I21K["ViT_S32"], "0.03", (224, 384)),
    "ViT_S16": (_AUGREG_I21K["ViT_S16"], "0.03", (224, 384)),
    "ViT_B32": (_AUGREG_I21K["ViT_B32"], "0.03", (224,)),
    "ViT_B16": (_AUGREG_I21K["ViT_B16"], "0.01", (224, 384)),
    "ViT_B8": (_AUGREG_I21K["ViT_B8"], "0.01", (224,)),
    "ViT_L16": (_AUGREG_I21K["ViT_L16"], "0.01", (224, 384)),
}
_AUGREG_I1K = {
    "ViT_S16": "S_16-i1k-" + _AUGREG.format(aug="medium2", wd="0.1", do="0.0"),
    "ViT_B32": "B_32-i1k-" + _AUGREG.format(aug="medium2", wd="0.1", do="0.1"),
    "ViT_B16": "B_16-i1k-" + _AUGREG.format(aug="strong2", wd="0.1", do="0.1"),
}

# The AugReg hybrids, as (variant, name, size): file stem; timm's choice per resolution.
_AUGREG_HYBRIDS = {
    ("ViT_R26_S32", "augreg-imagenet21k", 224):
        "R26_S_32-i21k-" + _AUGREG.format(aug="medium2", wd="0.03", do="0.0"),
    ("ViT_R26_S32", "augreg-imagenet21k+imagenet2012", 224):
        "R26_S_32-i21k-" + _AUGREG.format(aug="light0", wd="0.03", do="0.1")
        + "--imagenet2012-steps_20k-lr_0.03-res_224",
    ("ViT_R26_S32", "augreg-imagenet21k+imagenet2012", 384):
        "R26_S_32-i21k-" + _AUGREG.format(aug="medium2", wd="0.03", do="0.0")
        + "--imagenet2012-steps_20k-lr_0.03-res_384",
    ("ViT_R50_L32", "augreg-imagenet21k", 224):
        "R50_L_32-i21k-" + _AUGREG.format(aug="medium2", wd="0.1", do="0.0"),
    ("ViT_R50_L32", "augreg-imagenet21k+imagenet2012", 224):
        "R50_L_32-i21k-" + _AUGREG.format(aug="medium1", wd="0.1", do="0.1")
        + "--imagenet2012-steps_20k-lr_0.01-res_224",
    ("ViT_R50_L32", "augreg-imagenet21k+imagenet2012", 384):
        "R50_L_32-i21k-" + _AUGREG.format(aug="medium2", wd="0.1", do="0.0")
        + "--imagenet2012-steps_20k-lr_0.01-res_384",
}


def _published():
    hidden = {"ViT_B16": 768, "ViT_B32": 768, "ViT_L16": 1024, "ViT_L32": 1024, "ViT_H14": 1280}
    files = {"ViT_B16": "ViT-B_16", "ViT_B32": "ViT-B_32", "ViT_L16": "ViT-L_16",
             "ViT_L32": "ViT-L_32", "ViT_H14": "ViT-H_14"}
    found = []
    # The paper's release: ImageNet-21k with a pre-logits layer and a zeroed head.
    for variant, file in files.items():
        found.append(_original(variant, "imagenet21k", 224, f"imagenet21k/{file}.npz",
                               21843, hidden[variant]))
    # ... fine-tuned on ImageNet-2012 at 384, and at 224 for B/16 and L/16.
    for variant in ("ViT_B16", "ViT_B32", "ViT_L16", "ViT_L32"):
        found.append(_original(variant, "imagenet21k+imagenet2012", 384,
                               f"imagenet21k+imagenet2012/{files[variant]}.npz", 1000))
    for variant in ("ViT_B16", "ViT_L16"):
        found.append(_original(variant, "imagenet21k+imagenet2012", 224,
                               f"imagenet21k+imagenet2012/{files[variant]}-224.npz", 1000))
    # The paper's R50+ViT-B/16 hybrid.
    found.append(_original("ViT_R50_B16", "imagenet21k", 224, "imagenet21k/R50+ViT-B_16.npz", 21843, 768))
    found.append(_original("ViT_R50_B16", "imagenet21k+imagenet2012", 384,
                           "imagenet21k+imagenet2012/R50+ViT-B_16.npz", 1000))
    for (variant, name, size), stem in _AUGREG_HYBRIDS.items():
        classes = 21843 if name == "augreg-imagenet21k" else 1000
        found.append(_original(variant, name, size, f"augreg/{stem}.npz", classes))
    for variant, stem in _AUGREG_I21K.items():
        found.append(_original(variant, "augreg-imagenet21k", 224, f"augreg/{stem}.npz", 21843))
    for variant, (stem, lr, sizes) in _AUGREG_I21K_FT.items():
        for size in sizes:
            file = f"augreg/{stem}--imagenet2012-steps_20k-lr_{lr}-res_{size}.npz"
            found.append(_original(variant, "augreg-imagenet21k+imagenet2012", size, file, 1000))
    for variant, stem in _AUGREG_I1K.items():
        for size in (224, 384):
            file = f"augreg/{stem}--imagenet2012-steps_20k-lr_0.01-res_{size}.npz"
            found.append(_original(variant, "augreg-imagenet2012", size, file, 1000))
    return found


_REGISTRY = {}


def register(checkpoint):
    """Add (or replace) a named checkpoint, for example a private mirror.

    Example:
    >>> register(Checkpoint("my-mirror", "ViT_B16", 224, "https://example.com/b16.npz", 1000))
    """
    _REGISTRY[(checkpoint.variant, checkpoint.name, checkpoint.image_size)] = checkpoint


for _checkpoint in _published():
    register(_checkpoint)


def available_weights(variant=None):
    """Named checkpoints as `{variant: {name: [image sizes]}}`, or for one variant.

    Example:
    >>> available_weights("ViT_B16")["imagenet21k+imagenet2012"]
    [224, 384]
    """
    table = {}
    for (name_variant, name, size) in sorted(_REGISTRY):
        table.setdefault(name_variant, {}).setdefault(name, []).append(size)
    if variant is None:
        return table
    return table.get(variant, {})


def find_checkpoint(variant, name, image_size):
    """The registered checkpoint for `weights=name`, preferring `image_size`."""
    choices = [c for (v, n, _), c in _REGISTRY.items() if v == variant and n == name]
    if not choices:
        known = available_weights(variant)
        if variant is None:
            raise CheckpointError(
                f"Named weights {name!r} exist only for the named variants "
                f"{sorted(available_weights())}; this model's sizes match none of them. "
                "Pass a file path instead."
            )
        raise CheckpointError(
            f"Unknown weights {name!r} for {variant}; valid names: {sorted(known) or 'none'}, "
            "or a path to a .npz, .keras or .weights.h5 file."
        )
    exact = [c for c in choices if c.image_size in (image_size[0], image_size[1])]
    if exact and image_size[0] == image_size[1]:
        return exact[0]
    # No checkpoint at this resolution: take the largest; it is resized on load.
    return max(choices, key=lambda c: c.image_size)


def cache_dir():
    """Where named checkpoints are cached: `$KERAS_HOME/models/keras_vit` (default `~/.keras`)."""
    home = os.environ.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras")
    return os.path.join(home, "models", "keras_vit")


def fetch(checkpoint):
    """Download a named checkpoint into the Keras cache (or reuse it) and return its path."""
    directory = cache_dir()
    try:
        return keras.utils.get_file(
            fname=checkpoint.filename,
            origin=checkpoint.url,
            file_hash=checkpoint.file_hash,
            cache_dir=os.path.dirname(os.path.dirname(directory)),
            cache_subdir=os.path.join("models", "keras_vit"),
        )
    except ValueError as error:  # The download does not match the known hash.
        target = os.path.join(directory, checkpoint.filename)
        if os.path.exists(target):
            os.remove(target)  # Our own cache entry, known to be bad.
        raise CheckpointError(
            f"The download of weights {checkpoint.name!r} for {checkpoint.variant} from "
            f"{checkpoint.url} does not match its known sha256 {checkpoint.file_hash} "
            "(corrupt or changed file); it was discarded."
        ) from error
    except Exception as error:  # get_file raises bare Exceptions for network errors.
        cache = os.path.join(directory, checkpoint.filename)
        raise CheckpointError(
            f"Could not get weights {checkpoint.name!r} for {checkpoint.variant} "
            f"from {checkpoint.url}: {error}. If this machine is offline, download the "
            f"file elsewhere and pass its path as weights=, or place it at {cache}."
        ) from error


@dataclasses.dataclass
class WeightsSource:
    """A checkpoint read into keras_vit's names, before it meets a model."""

    description: str
    state: dict
    grid_size: tuple = None
    classifier: str = "token"
    representation_size: int = 0
    classes: int = None
    num_heads: int = None

    @property
    def sizes(self):
        """The model sizes this checkpoint was saved from, as a `Variant` (None if unknown)."""
        from keras_vit.models import Variant

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
        return _resnet_layers_of(self.state)

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
        return len({m.group(1) for m in map(_BLOCK.match, self.state) if m})


_BLOCK = re.compile(r"encoderblock_(\d+)/")
_UNIT = re.compile(r"block(\d+)_unit(\d+)/")


def _resnet_layers_of(names):
    """The bottleneck units per ResNet stage that keras_vit variable `names` hold (None: no ResNet)."""
    if "conv_root/kernel" not in names:
        return None
    units = {}
    for match in map(_UNIT.match, names):
        if match:
            stage, unit = int(match.group(1)), int(match.group(2))
            units[stage] = max(units.get(stage, 0), unit)
    return tuple(units[stage] for stage in sorted(units))


# ---------------------------------------------------------------------------
# The key map: original Flax checkpoints -> keras_vit variable paths.
# ---------------------------------------------------------------------------

_PREFIXES = ("", "opt/target/", "params/", "params/img/")


def _flax_block_names(big_vision):
    """Per-block Flax sub-names: (attention, second LayerNorm, MLP) modules."""
    if big_vision:
        return "MultiHeadDotProductAttention_0", "LayerNorm_1", "MlpBlock_0"
    return "MultiHeadDotProductAttention_1", "LayerNorm_2", "MlpBlock_3"


def from_flax(arrays, description="checkpoint"):
    """Convert original `.npz` arrays to `{keras_vit variable path: array}`.

    Understands the original (pre-Linen) vision_transformer names, the Linen
    and big_vision names (`params/` prefixes, `MultiHeadDotProductAttention_0`,
    a top-level `pos_embedding`) and scanned blocks (`Transformer/encoderblock/`
    with a leading layer axis). Every array must be used; anything left over
    raises `CheckpointError`, as does anything missing.
    """
    prefix = next((p for p in _PREFIXES if f"{p}embedding/kernel" in arrays), None)
    if prefix is None:
        raise CheckpointError(
            f"{description} is not a ViT checkpoint: no 'embedding/kernel' "
            f"(found {_preview(arrays)})."
        )
    used = set()

    def take(key):
        full = prefix + key
        if full not in arrays:
            raise CheckpointError(f"{description} is missing '{full}'.")
        used.add(full)
        return np.asarray(arrays[full])

    scanned = f"{prefix}Transformer/encoderblock/LayerNorm_0/scale" in arrays
    big_vision = prefix.startswith("params/") or f"{prefix}pos_embedding" in arrays or scanned
    state = _resnet_from_flax(arrays, prefix, take) if f"{prefix}conv_root/kernel" in arrays else {}
    state.update({"embedding/kernel": take("embedding/kernel"), "embedding/bias": take("embedding/bias")})
    if prefix + "cls" in arrays:
        state["class_token/cls"] = take("cls")
    position_key = "pos_embedding" if big_vision else "Transformer/posembed_input/pos_embedding"
    state["position_embedding/pos_embedding"] = take(position_key)

    attention, second_norm, mlp = _flax_block_names(big_vision)
    if scanned:
        depth = arrays[f"{prefix}Transformer/encoderblock/LayerNorm_0/scale"].shape[0]
        blocks = [("Transformer/encoderblock/", index) for index in range(depth)]
    else:
        blocks = [
            (f"Transformer/encoderblock_{index}/", None) for index in _block_indices(arrays, prefix)
        ]
    stacked = {}

    def block_array(base, key, index):
        if index is None:
            return take(base + key)
        if base + key not in stacked:
            stacked[base + key] = take(base + key)
        return stacked[base + key][index]

    for number, (base, index) in enumerate(blocks):
        get = lambda key: block_array(base, key, index)  # noqa: E731
        ours = f"encoderblock_{number}/"
        hidden = get("LayerNorm_0/scale").shape[0]
        state[ours + "attention_norm/gamma"] = get("LayerNorm_0/scale")
        state[ours + "attention_norm/beta"] = get("LayerNorm_0/bias")
        state[ours + "qkv/kernel"] = np.concatenate(
            [get(f"{attention}/{n}/kernel").reshape(hidden, -1) for n in ("query", "key", "value")],
            axis=1,
        )
        state[ours + "qkv/bias"] = np.concatenate(
            [get(f"{attention}/{n}/bias").reshape(-1) for n in ("query", "key", "value")]
        )
        state[ours + "attention_output/kernel"] = get(f"{attention}/out/kernel").reshape(-1, hidden)
        state[ours + "attention_output/bias"] = get(f"{attention}/out/bias")
        state[ours + "mlp_norm/gamma"] = get(f"{second_norm}/scale")
        state[ours + "mlp_norm/beta"] = get(f"{second_norm}/bias")
        for flax_dense, our_dense in (("Dense_0", "mlp_hidden"), ("Dense_1", "mlp_output")):
            state[ours + f"{our_dense}/kernel"] = get(f"{mlp}/{flax_dense}/kernel")
            state[ours + f"{our_dense}/bias"] = get(f"{mlp}/{flax_dense}/bias")

    state["encoder_norm/gamma"] = take("Transformer/encoder_norm/scale")
    state["encoder_norm/beta"] = take("Transformer/encoder_norm/bias")
    for layer in ("pre_logits", "head"):
        if f"{prefix}{layer}/kernel" in arrays:
            state[f"{layer}/kernel"] = take(f"{layer}/kernel")
            state[f"{layer}/bias"] = take(f"{layer}/bias")

    unused = sorted(set(arrays) - used)
    if unused:
        raise CheckpointError(
            f"{description} has {len(unused)} entries this ViT does not use, "
            f"for example {unused[:5]} (another architecture?)."
        )
    return state


# A hybrid's ResNet: Flax `block{i}/unit{j}/gn1/scale` is keras_vit's `block{i}_unit{j}/gn1/gamma`.
_NORM_NAMES = (("scale", "gamma"), ("bias", "beta"))
_FLAX_UNIT = re.compile(r"block(\d+)/unit(\d+)/")


def _resnet_from_flax(arrays, prefix, take):
    state = {"conv_root/kernel": take("conv_root/kernel")}
    for theirs, ours in _NORM_NAMES:
        state[f"gn_root/{ours}"] = take(f"gn_root/{theirs}")
    units = sorted({
        (int(m.group(1)), int(m.group(2)))
        for m in (_FLAX_UNIT.match(key[len(prefix):]) for key in arrays if key.startswith(prefix)) if m
    })
    for stage, unit in units:
        base, ours = f"block{stage}/unit{unit}/", f"block{stage}_unit{unit}/"
        layers = ["1", "2", "3"] + (["_proj"] if f"{prefix}{base}conv_proj/kernel" in arrays else [])
        for layer in layers:
            state[f"{ours}conv{layer}/kernel"] = take(f"{base}conv{layer}/kernel")
            for theirs_name, our_name in _NORM_NAMES:
                state[f"{ours}gn{layer}/{our_name}"] = take(f"{base}gn{layer}/{theirs_name}")
    return state


def _resnet_to_flax(state):
    out = {}
    for key, value in state.items():
        unit = _UNIT.match(key)
        if unit:
            key = f"block{unit.group(1)}/unit{unit.group(2)}/" + key[unit.end():]
        elif not key.startswith(("conv_root/", "gn_root/")):
            continue
        for theirs, ours in _NORM_NAMES:
            key = re.sub(f"/{ours}$", f"/{theirs}", key)
        out[key] = value
    return out


def to_flax(model):
    """A keras_vit model's weights under the original vision_transformer names and layouts.

    The inverse of `from_flax` (for the original, un-prefixed layout).
    """
    state = {v.path: keras.ops.convert_to_numpy(v) for v in model.weights}
    hidden = state["embedding/kernel"].shape[-1]
    out = {
        "embedding/kernel": state["embedding/kernel"],
        "embedding/bias": state["embedding/bias"],
        "Transformer/posembed_input/pos_embedding": state["position_embedding/pos_embedding"],
        "Transformer/encoder_norm/scale": state["encoder_norm/gamma"],
        "Transformer/encoder_norm/bias": state["encoder_norm/beta"],
        **_resnet_to_flax(state),
    }
    if "class_token/cls" in state:
        out["cls"] = state["class_token/cls"]
    attention, second_norm, mlp = _flax_block_names(big_vision=False)
    index = 0
    while f"encoderblock_{index}/qkv/kernel" in state:
        ours, theirs = f"encoderblock_{index}/", f"Transformer/encoderblock_{index}/"
        heads = model.get_layer(f"encoderblock_{index}").num_heads
        out[theirs + "LayerNorm_0/scale"] = state[ours + "attention_norm/gamma"]
        out[theirs + "LayerNorm_0/bias"] = state[ours + "attention_norm/beta"]
        kernels = np.split(state[ours + "qkv/kernel"], 3, axis=1)
        biases = np.split(state[ours + "qkv/bias"], 3)
        for name, kernel, bias in zip(("query", "key", "value"), kernels, biases):
            out[theirs + f"{attention}/{name}/kernel"] = kernel.reshape(hidden, heads, -1)
            out[theirs + f"{attention}/{name}/bias"] = bias.reshape(heads, -1)
        out[theirs + f"{attention}/out/kernel"] = state[ours + "attention_output/kernel"].reshape(heads, -1, hidden)
        out[theirs + f"{attention}/out/bias"] = state[ours + "attention_output/bias"]
        out[theirs + f"{second_norm}/scale"] = state[ours + "mlp_norm/gamma"]
        out[theirs + f"{second_norm}/bias"] = state[ours + "mlp_norm/beta"]
        for flax_dense, our_dense in (("Dense_0", "mlp_hidden"), ("Dense_1", "mlp_output")):
            out[theirs + f"{mlp}/{flax_dense}/kernel"] = state[ours + f"{our_dense}/kernel"]
            out[theirs + f"{mlp}/{flax_dense}/bias"] = state[ours + f"{our_dense}/bias"]
        index += 1
    for layer in ("pre_logits", "head"):
        if f"{layer}/kernel" in state:
            out[f"{layer}/kernel"], out[f"{layer}/bias"] = state[f"{layer}/kernel"], state[f"{layer}/bias"]
    return out


def save_npz(model, path):
    """Write a keras_vit model as an original-layout `.npz` checkpoint (readable by timm, vit_jax).

    Example:
    >>> save_npz(keras_vit.ViT_Ti16(image_size=32, classes=10), "/tmp/ti16.npz")
    """
    np.savez(path, **to_flax(model))
    return path


def _block_indices(arrays, prefix):
    pattern = re.compile(re.escape(prefix) + r"Transformer/encoderblock_(\d+)/")
    indices = sorted({int(m.group(1)) for m in map(pattern.match, arrays) if m})
    if indices != list(range(len(indices))):
        missing = sorted(set(range(max(indices, default=-1) + 1)) - set(indices))
        raise CheckpointError(f"Checkpoint blocks are not contiguous: missing encoderblock_{missing}.")
    return indices


def _preview(names, count=5):
    names = sorted(names)
    return names[:count] + (["..."] if len(names) > count else [])


# ---------------------------------------------------------------------------
# Reading files and names.
# ---------------------------------------------------------------------------


def read_weights(weights, variant, image_size):
    """Read `weights` (a name or a path) into a `WeightsSource`.

    `variant` is the model's variant name (or `None` for custom sizes) and
    `image_size` its `(height, width)`, used to choose among named files.
    """
    if isinstance(weights, WeightsSource):
        return weights
    if not isinstance(weights, (str, os.PathLike)):
        raise CheckpointError(f"weights must be None, a name or a path, got {type(weights).__name__}.")
    path = os.fspath(weights)
    looks_like_path = os.sep in path or path.endswith((".npz", ".keras", ".h5"))
    if not looks_like_path:
        checkpoint = find_checkpoint(variant, path, image_size)
        source = read_npz(fetch(checkpoint))
        if checkpoint.image_size != image_size[0] or image_size[0] != image_size[1]:
            logger.warning(
                "Using %s weights %r trained at %d px for a %s input.",
                variant, path, checkpoint.image_size, image_size,
            )
        return source
    if not os.path.exists(path):
        raise CheckpointError(f"Weights file not found: {path}")
    if path.endswith(".npz"):
        return read_npz(path)
    if path.endswith(".keras"):
        return read_keras(path)
    if path.endswith(".weights.h5"):
        return read_weights_h5(path)
    raise CheckpointError(
        f"Unrecognised weights file {path}: expected an original .npz, a .keras or a .weights.h5 file."
    )


def _source_from_state(description, state, grid_size=None, num_heads=None):
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


def read_npz(path):
    """Read an original `.npz` checkpoint (vision_transformer or big_vision layout)."""
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {key: archive[key] for key in archive.files}
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, KeyError) as error:
        raise CheckpointError(
            f"{path} is not a readable .npz checkpoint (truncated or corrupt?): {error}"
        ) from error
    state = from_flax(arrays, description=path)
    query = next((v for k, v in sorted(arrays.items()) if k.endswith("query/kernel")), None)
    num_heads = None if query is None else int(query.shape[-2])
    positions = state["position_embedding/pos_embedding"].shape[1] - ("class_token/cls" in state)
    side = math.isqrt(positions)
    grid = (side, side) if side * side == positions else None
    return _source_from_state(path, state, grid, num_heads)


def _state_of(model):
    return {v.path: keras.ops.convert_to_numpy(v) for v in model.weights}


def read_keras(path):
    """Read the weights of a keras_vit model saved as `.keras`."""
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
    return _source_from_state(path, _state_of(saved), grid, num_heads)


def read_weights_h5(path):
    """Read a `.weights.h5` file saved from a keras_vit model.

    The file holds no architecture, so the saved model's depth, head and
    position grid are read from its layout and a model of that shape is
    rebuilt to load it with Keras' own loader.
    """
    import h5py  # A Keras dependency.

    from keras_vit.models import ViT

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
        raise CheckpointError(f"{path} does not hold keras_vit ViT weights (found layers {_preview(names)}).")
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
        hybrid = dict(resnet_layers=tuple(stages), resnet_width=shapes["standardized_conv2d"][0][-1])
    stride = resnet_stride(hybrid["resnet_layers"]) if hybrid else 1
    template = dict(
        **hybrid,
        image_size=side * kernel[0] * stride,
        patch_size=kernel[0],
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=1,
        mlp_dim=block_shapes["mlp_hidden"][-1],
        classifier="token" if num_prefix_tokens else "gap",
        include_top=bool(dense),
        classes=shapes[dense[-1]][1][0] if dense else None,
        representation_size=shapes[dense[0]][1][0] if len(dense) == 2 else 0,
    )
    try:
        model = ViT(**template)
        model.load_weights(path)
    except Exception as error:
        raise CheckpointError(f"{path} could not be loaded as keras_vit weights: {error}") from error
    return _source_from_state(path, _state_of(model), (side, side))


def _layer_order(name):
    _, _, number = name.partition("_")
    return int(number) if number.isdigit() else 0


# ---------------------------------------------------------------------------
# Loading into a model.
# ---------------------------------------------------------------------------

_OPTIONAL = ("pre_logits/", "head/")


def load_into(model, source):
    """Check `source` against `model` completely, then assign every variable.

    Resizes the position embeddings to the model's grid; loads the head only
    when its class count matches (else keeps the fresh zero head) and
    raises `CheckpointError` for anything else that does not fit.
    """
    variables = {v.path: v for v in model.weights}
    state = dict(source.state)
    name = source.description
    model_depth = len({m.group(1) for m in map(_BLOCK.match, variables) if m})
    if source.num_layers != model_depth:
        raise CheckpointError(
            f"{name} has {source.num_layers} encoder blocks but the model has {model_depth}."
        )
    checkpoint_token, model_token = "class_token/cls" in state, "class_token/cls" in variables
    if checkpoint_token != model_token:
        raise CheckpointError(
            f"{name} {'has a' if checkpoint_token else 'has no'} class token but the model's "
            f"classifier is {'token' if model_token else 'gap'}; pass "
            f"classifier={'token' if checkpoint_token else 'gap'!r}."
        )
    model_resnet = _resnet_layers_of(variables)
    if source.resnet_layers != model_resnet:
        def describe(layers):
            return "a plain ViT" if layers is None else f"a hybrid with ResNet stages {layers}"
        raise CheckpointError(f"{name} is {describe(source.resnet_layers)} but the model is {describe(model_resnet)}.")
    notes = []  # Said only once the load succeeds.
    _adapt_position_embedding(model, state, source, notes)
    _adapt_head(variables, state, name, notes)

    missing = sorted(k for k in variables if k not in state and not k.startswith(_OPTIONAL))
    unexpected = sorted(k for k in state if k not in variables and not k.startswith(_OPTIONAL))
    if missing:
        raise CheckpointError(f"{name} lacks {len(missing)} model weights: {_preview(missing, 8)}.")
    if unexpected:
        raise CheckpointError(
            f"{name} has {len(unexpected)} weights the model lacks: {_preview(unexpected, 8)}."
        )
    for key, value in state.items():
        if key not in variables:
            continue
        if tuple(value.shape) != tuple(variables[key].shape):
            raise CheckpointError(
                f"{name}: '{key}' has shape {tuple(value.shape)} but the model expects "
                f"{tuple(variables[key].shape)}."
            )
        if not np.all(np.isfinite(value)):
            raise CheckpointError(f"{name}: '{key}' holds NaN or infinite values.")
    for key, value in state.items():
        if key in variables:
            variables[key].assign(value.astype(variables[key].dtype))
    for note in notes:
        logger.warning(note)


def _adapt_position_embedding(model, state, source, notes):
    key = "position_embedding/pos_embedding"
    if key not in state:
        return
    try:
        layer = model.get_layer("position_embedding")
    except ValueError:
        return
    table = state[key]
    target = tuple(layer.pos_embedding.shape)
    if table.ndim != 3 or table.shape[0] != 1 or table.shape[-1] != target[-1]:
        raise CheckpointError(
            f"{source.description}: '{key}' has shape {tuple(table.shape)} but the model "
            f"expects {target}."
        )
    if tuple(table.shape) == target:
        return
    prefix = layer.num_prefix_tokens
    try:
        resized = resize_position_embeddings(
            table.astype("float32"),
            new_grid_size=layer.grid_size,
            old_grid_size=source.grid_size,
            num_prefix_tokens=prefix,
            interpolation=layer.interpolation,
            antialias=layer.antialias,
        )
    except ValueError as error:
        raise CheckpointError(f"{source.description}: cannot resize position embeddings: {error}") from error
    old = source.grid_size or (math.isqrt(table.shape[1] - prefix),) * 2
    notes.append(
        f"Resized position embeddings of {source.description} from a {old[0]}x{old[1]} to a "
        f"{layer.grid_size[0]}x{layer.grid_size[1]} patch grid ({layer.interpolation})."
    )
    state[key] = resized


def _adapt_head(variables, state, name, notes):
    """Drop the checkpoint's pre-logits and head where the model cannot use them."""
    has_pre_logits = "pre_logits/kernel" in variables
    if "pre_logits/kernel" in state and not has_pre_logits:
        del state["pre_logits/kernel"], state["pre_logits/bias"]
        if "head/kernel" in variables and "head/kernel" in state:
            notes.append(
                f"{name}: model has no pre-logits layer, so the checkpoint's head is not loaded; "
                "the head starts at zero."
            )
            del state["head/kernel"], state["head/bias"]
    if has_pre_logits and "pre_logits/kernel" not in state:
        notes.append(f"{name} has no pre-logits layer; the model's is freshly initialised.")
        state.pop("head/kernel", None), state.pop("head/bias", None)
    if "head/kernel" not in variables:
        state.pop("head/kernel", None), state.pop("head/bias", None)
        return
    if "head/kernel" not in state:
        notes.append(f"{name} has no head; the model's head starts at zero.")
        return
    checkpoint_shape, model_shape = state["head/kernel"].shape, tuple(variables["head/kernel"].shape)
    if tuple(checkpoint_shape) != model_shape:
        notes.append(
            f"{name}: head has {checkpoint_shape[-1]} classes, model has {model_shape[-1]}: "
            "the head starts at zero instead."
        )
        del state["head/kernel"], state["head/bias"]
