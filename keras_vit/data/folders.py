"""Image folders as data sets: one sub-folder per class, split folders or a held-out part of each class.

`load_source` reads a folder through `folder_source`; `from_folder` reads
one split's class folders. A file that is not a whole image is told apart
(`_image_problem`) before training, and a folder without split folders
holds out the same images of each class on every run (`_held_out_part`).

Example:
>>> from keras_vit.data import folders
>>> folders.from_folder("photos/")  # doctest: +SKIP
"""

import logging
import os
import zlib

import numpy as np

from keras_vit.data import arrays, source
from keras_vit.data.source import Source

logger = logging.getLogger("keras_vit")


IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif")
# Folder names that hold splits rather than classes, and which of them a split name may use.
SPLIT_FOLDERS = {
    "train": ("train",),
    "test": ("test", "val", "validation"),
    "val": ("val", "validation"),
    "validation": ("validation", "val"),
}
_SKIPPED_FOLDERS = ("__MACOSX",)


def _visible(names):
    """Folder entries a user meant: no hidden files (`.ipynb_checkpoints`, `.DS_Store`) or `__MACOSX`."""
    return sorted(n for n in names if not n.startswith(".") and n not in _SKIPPED_FOLDERS)


def class_folders(path):
    """The class sub-folders of an image folder, sorted by name, hidden ones left out."""
    return [d for d in _visible(os.listdir(path)) if os.path.isdir(os.path.join(path, d))]


def image_files(folder):
    """Every image file under `folder` (`IMAGE_EXTENSIONS`), nested sub-folders' too, sorted; hidden ones left out."""
    found = []
    for directory, subdirectories, files in os.walk(folder):
        subdirectories[:] = _visible(subdirectories)
        found += [os.path.join(directory, f) for f in _visible(files) if f.lower().endswith(IMAGE_EXTENSIONS)]
    return sorted(found)


def _image_problem(path):
    """Why an image file cannot be decoded, or None. Only files whose first and last bytes look wrong are decoded."""
    size = os.path.getsize(path)
    if size == 0:
        return "empty file"
    with open(path, "rb") as f:
        head = f.read(16)
        f.seek(max(size - 64, 0))
        tail = f.read().rstrip(b"\x00")
    looks_whole = (
        (head.startswith(b"\x89PNG\r\n\x1a\n") and b"IEND" in tail)
        or (head.startswith(b"\xff\xd8") and tail.endswith(b"\xff\xd9"))
        or (head.startswith((b"GIF87a", b"GIF89a")) and tail.endswith(b";"))
        or (head.startswith(b"BM") and size >= int.from_bytes(head[2:6], "little"))
    )
    if looks_whole:
        return None
    if not source.tensorflow_installed():
        try:
            arrays.decode_image(path)
        except arrays.UndecodableImage as error:
            return error.reason
        return None
    from keras_vit.data import tf_data_steps

    import tensorflow as tf

    try:
        tf_data_steps.decode(tf.io.read_file(path))
    except (tf.errors.InvalidArgumentError, tf.errors.OutOfRangeError, tf.errors.DataLossError) as error:
        return error.message.splitlines()[0]
    return None


def from_folder(path, shard=None, class_names=None, holdout=None):
    """A `Source` from `path/<class name>/<image files>`; classes sorted by name.

    `class_names` fixes the label of each class (the training split's, or a
    model's `classes.txt`); a class folder outside it is an error.
    `holdout=(split, fraction)` keeps a stratified, deterministic part of
    every class for a held-out split (`"test"`), and the rest for `"train"`.
    Images in nested sub-folders count for their class; hidden files and
    folders are skipped, and so are files whose first or last bytes show them
    broken (named in the log). Reading every file whole here would cost what
    an epoch costs; a file that fails to decode later is skipped where the
    pipeline meets it, with a note naming it (`keras_vit.data.array_batches`).
    """
    if not os.path.isdir(path):
        raise FileNotFoundError(f"Image folder not found: {path}")
    found = class_folders(path)
    if not found:
        raise ValueError(f"No images found under {os.path.join(path, '<class>', '')} (extensions {IMAGE_EXTENSIONS}).")
    if class_names is None:
        if len(found) < 2:
            raise ValueError(f"{path} has one class folder ({found[0]!r}); a classifier needs at least two (expected "
                             f"{os.path.join(path, '<class>', '<images>')} with one folder per class).")
        class_names = found
    class_names = tuple(class_names)
    unknown = [name for name in found if name not in class_names]
    if unknown:
        raise ValueError(
            f"{path} has class folders {unknown} that the model does not know; its {len(class_names)} "
            f"classes are {list(class_names[:10])}{' ...' if len(class_names) > 10 else ''}."
        )
    files, labels, skipped = [], [], []
    for class_name in found:
        images = image_files(os.path.join(path, class_name))
        if not images:
            raise ValueError(f"Class folder {os.path.join(path, class_name)} holds no images ({IMAGE_EXTENSIONS}); "
                             "remove it or add images.")
        if holdout is not None:
            kept = _held_out_part(images, class_name, *holdout)
            if not kept and holdout[0] == "train":
                raise ValueError(f"holdout_fraction {holdout[1]} holds out all {len(images)} images of class "
                                 f"{class_name!r} under {path}, which leaves it none to train on; lower "
                                 "holdout_fraction (--holdout-fraction) or add images.")
            images = kept
        for file in images:
            problem = _image_problem(file)
            if problem:
                skipped.append(f"{file} ({problem})")
                continue
            files.append(file)
            labels.append(class_names.index(class_name))
    if skipped:
        logger.warning("Skipped %d image files that cannot be decoded: %s", len(skipped), "; ".join(skipped[:20]))
    if not files:
        raise ValueError(f"No readable images under {path}." if holdout is None or skipped else
                         f"The held-out {holdout[0]!r} split of {path} is empty: a class of one image keeps it for "
                         f"training; add images, or put them in train/ and {holdout[0]}/ folders.")
    if shard is not None:
        index, count = shard
        files, labels = files[index::count], labels[index::count]

    labels = np.asarray(labels, "int64")
    dataset = None
    if source.tensorflow_installed():
        from keras_vit.data import tf_data_steps

        dataset = tf_data_steps.decoded_files(files, labels)
    return Source(dataset, len(files), len(class_names), class_names, os.path.basename(os.path.normpath(path)),
                  examples=(files, labels))


def _held_out_part(files, class_name, split, fraction):
    """The `split` part of one class's files: `fraction` of them held out, chosen by a hash of the class name."""
    order = np.random.default_rng(zlib.crc32(class_name.encode())).permutation(len(files))
    held = set(order[: max(1, int(fraction * len(files) + 0.5)) if len(files) > 1 else 0].tolist())
    return [file for i, file in enumerate(files) if (i in held) == (split != "train")]


def split_folder(root, split):
    """The sub-folder of `root` that holds `split` (`"test"`: `test/`, `val/` or `validation/`), or None."""
    return next((c for c in SPLIT_FOLDERS.get(split, (split,)) if os.path.isdir(os.path.join(root, c))), None)


def folder_source(root, split, shard, class_names, holdout_fraction):
    """A split of an image folder: a split sub-folder (`train`, `test`, `val`, ...) or a held-out part."""
    splits = [d for d in class_folders(root) if d in {n for names in SPLIT_FOLDERS.values() for n in names}]
    candidates = SPLIT_FOLDERS.get(split, (split,))
    folder = split_folder(root, split)
    if folder is None and splits:
        raise ValueError(
            f"{root} has split folders {splits} but none for the {split!r} split (looked for {list(candidates)})."
        )
    if class_names is None and split != "train" and os.path.isdir(os.path.join(root, "train")):
        class_names = class_folders(os.path.join(root, "train"))  # One class list: the training split's.
    if folder is not None:
        return from_folder(os.path.join(root, folder), shard, class_names)
    if holdout_fraction is None:  # The whole folder is this split (a folder of test images, say).
        return from_folder(root, shard, class_names)
    if not 0.0 < holdout_fraction < 1.0:
        raise ValueError(f"holdout_fraction must be between 0 and 1, got {holdout_fraction}.")
    if split != "train":  # said once, with the held-out split, which every training run reads too
        logger.warning(
            "%s has no train/test sub-folders: the %r split is a held-out %.0f%% of each class's images, and "
            "'train' the rest, chosen the same way on every run; set the size with holdout_fraction "
            "(--holdout-fraction).", root, split, 100 * holdout_fraction,
        )
    return from_folder(root, shard, class_names, holdout=(split, holdout_fraction))
