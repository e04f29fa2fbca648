"""The published checkpoints that `weights=name` names, and their download into the Keras cache.

Example:
>>> available_weights("ViT_B16")["imagenet21k+imagenet2012"]
[224, 384]
"""

import dataclasses
import difflib
import os

from keras_vit.checkpoints.flax_npz import check_npz
from keras_vit.checkpoints.hub import download
from keras_vit.checkpoints.source import CheckpointError, weight_budget
from keras_vit.model.variants import VARIANTS

_BUCKET = "https://storage.googleapis.com/vit_models"


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


def published():
    """Every checkpoint the original repositories publish, as `Checkpoint`s."""
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


for _checkpoint in published():
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
        known = sorted(available_weights(variant)) if variant is not None else \
            sorted({n for names in available_weights().values() for n in names})
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
        hint = f" Did you mean {' or '.join(repr(n) for n in close)}?" if close else ""
        if variant is None:
            raise CheckpointError(
                f"Named weights {name!r} exist only for the named variants "
                f"{sorted(available_weights())}; this model's sizes match none of them.{hint} "
                "Pass a file path instead (or build a named variant, e.g. keras_vit.ViT_B16)."
            )
        raise CheckpointError(
            f"Unknown weights {name!r} for {variant}; valid names: {known or 'none'}, "
            f"or a path to a .npz, .keras or .weights.h5 file.{hint}"
        )
    exact = [c for c in choices if c.image_size in (image_size[0], image_size[1])]
    if exact and image_size[0] == image_size[1]:
        return exact[0]
    # No checkpoint at this resolution: take the largest; it is resized on load.
    return max(choices, key=lambda c: c.image_size)


def cache_dir():
    """Where named checkpoints are cached: `$KERAS_HOME/models/keras_vit` (default `~/.keras`), created private.

    Never a folder that another user can write (see `download.private_folder`):
    where the default is refused, there is no fallback to a shared temp
    folder; set `KERAS_HOME` to a folder of your own.
    """
    home = os.environ.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras")
    hint = "Set KERAS_HOME to a folder only you can write (for example KERAS_HOME=$HOME/.keras)."
    return download.private_folder(home, "models/keras_vit", hint)


def fetch(checkpoint, verbose=None):
    """The path of a named checkpoint in the cache, downloaded and checked first if it is not there.

    `verbose=0` downloads without a progress bar (see `download.cached`).

    A download enters the cache only complete and readable (see
    `keras_vit.checkpoints.hub.download`); a cached file is re-hashed on each use.
    """
    target = os.path.join(cache_dir(), checkpoint.filename)
    sizes = VARIANTS.get(checkpoint.variant)  # A registered custom variant has no sizes here.
    budget = None if sizes is None else weight_budget(sizes, checkpoint.classes)

    def check(path, description):
        check_npz(path, description, budget)

    try:
        return download.cached(checkpoint.url, target, check, checkpoint.file_hash, verbose)
    except download.DownloadError as error:
        raise CheckpointError(
            f"Could not get weights {checkpoint.name!r} for {checkpoint.variant} from {checkpoint.url}: {error} "
            f"Nothing was cached. If this machine is offline, download the file elsewhere and pass "
            f"weights=PATH, its path, or place it at {target}."
        ) from error
