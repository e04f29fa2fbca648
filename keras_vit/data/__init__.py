"""Input pipelines: tf.data from tensorflow-datasets, image folders or arrays (numpy without TensorFlow).

Training images get an Inception-style random resized crop and a horizontal
flip; evaluation images are resized (optionally centre-cropped). Pixels end
in [-1, 1], as the original models expect. Randomness is stateless and keyed
by `(seed, epoch, example index)`, so a run is reproducible and a resumed run
sees exactly the batches an uninterrupted one would have. An image file
that cannot be decoded is skipped where it is met, with a note naming it.

The pipeline reads as a chain of named steps, like big_vision's
`decode|inception_crop(224)|flip_lr|value_range(-1, 1)`:

    train = make_dataset(source, image_size=224, batch_size=512, training=True)

Model code never imports TensorFlow; only the input pipelines do. Where
TensorFlow is not installed, arrays, the digits and image folders are read
by `keras_vit.data.array_batches` (the same steps in numpy, a Keras PyDataset);
tensorflow-datasets sets need the `[tensorflow]` extra.
"""

import dataclasses
import importlib.util
import inspect
import logging
import os
import zlib

import numpy as np

from keras_vit.data import arrays
from keras_vit.data.arrays import digits  # noqa: F401 (the embedded data set, here too)
from keras_vit.data.naflex import (  # noqa: F401 (NaFlex batches: public here)
    bucket_length,
    check_naflex_batch,
    naflex_batch,
    naflex_image_size,
    naflex_preprocessing,
    patchify,
    sequence_lengths,
)
from keras_vit.data.augmenters import (  # noqa: F401 (make_augmenters: public here)
    make_augmenters,
    per_example_augmenter,
)
from keras_vit.utils.shapes import as_pair


def __getattr__(name):
    """The tf.data steps (`inception_crop`, `resize`, `value_range`, ...), imported with TensorFlow when first used."""
    if name in _TF_STEPS:
        from keras_vit.data import tf_data_steps

        return getattr(tf_data_steps, name)
    raise AttributeError(f"module 'keras_vit.data' has no attribute {name!r}")


_TF_STEPS = ("inception_crop", "resize", "value_range")

logger = logging.getLogger("keras_vit")

# The embedded default data set: UCI's handwritten digits (keras_vit.data.arrays.digits).
DIGITS_CLASSES = 10
# The part of each class an image folder without split folders holds out for evaluation (`load_source`).
HOLDOUT_FRACTION = 0.2


@dataclasses.dataclass
class Source:
    """Examples before preprocessing: a `tf.data.Dataset` of `(uint8 image, int label)`.

    `num_examples` is known for arrays, folders and tfds splits; `class_names`
    when the source names its classes. Arrays and folders also keep
    `examples`, `(uint8 images or file paths, int labels)`, which training
    reads in both pipelines (tf.data decodes only a file's crop window) and
    `keras_vit.data.array_batches` reads where TensorFlow is not installed (then
    `dataset` is None). A folder's `dataset` decodes whole images, for
    evaluation; a file that cannot be decoded comes as a 1x1 image labelled
    -1, which `make_dataset` leaves out. A tensorflow-datasets split that
    stores image files keeps them in `encoded`, `(file bytes, label)`, which
    `dataset` decodes whole and training decodes only each crop window of.
    """

    dataset: object
    num_examples: int
    num_classes: int
    class_names: tuple = None
    name: str = ""
    examples: tuple = None
    encoded: object = None


def _tf():
    import tensorflow as tf

    return tf


def tensorflow_installed():
    """Whether TensorFlow can be imported: then every source is read through tf.data, else through numpy."""
    try:
        import tensorflow  # noqa: F401 (imported to see that it can be)
    except ImportError:
        return False
    return True


def _reads_with_numpy(source):
    return source.examples is not None and (source.dataset is None or not tensorflow_installed())


def from_arrays(images, labels, num_classes=None, class_names=None, name="arrays"):
    """A `Source` from in-memory uint8 images `(N, H, W, 3)` and integer labels."""
    images, labels = np.asarray(images), np.asarray(labels).astype("int64")
    if images.ndim != 4 or images.shape[-1] != 3:
        raise ValueError(f"images must have shape (N, H, W, 3), got {images.shape}.")
    if len(images) != len(labels):
        raise ValueError(f"{len(images)} images but {len(labels)} labels.")
    num_classes = num_classes or int(labels.max()) + 1
    dataset = _tf().data.Dataset.from_tensor_slices((images, labels)) if tensorflow_installed() else None
    return Source(dataset, len(images), num_classes, class_names, name, examples=(images, labels))


def from_tfds(name, split, data_dir=None, shard=None):
    """A `Source` from a tensorflow-datasets split, e.g. `from_tfds("cifar10", "train")`.

    `shard=(index, count)` keeps every `count`-th file for multi-host input.
    Manual-download sets (imagenet2012) need `data_dir` with the prepared files.
    """
    try:
        import tensorflow_datasets as tfds
    except ImportError as error:
        raise ValueError(
            f"The data set {name!r} comes from tensorflow-datasets, which is not installed ({error}): "
            "pip install 'keras-vision-transformer[tensorflow]'."
        ) from None

    check_dataset(name, data_dir)
    try:
        builder = tfds.builder(name, data_dir=data_dir)
    except tfds.core.registered.DatasetNotFoundError:
        raise ValueError(
            f"Unknown data set {name!r}: not 'digits', not a folder and not a tensorflow-datasets "
            "name (see tensorflow_datasets.list_builders())."
        ) from None
    builder.download_and_prepare()
    read_config = tfds.ReadConfig(shuffle_seed=0)
    if shard is not None:
        index, count = shard
        read_config.input_context = _tf().distribute.InputContext(
            num_input_pipelines=count, input_pipeline_id=index
        )
    info = builder.info
    label = info.features["label"]
    image_key = (info.supervised_keys or (None,))[0]
    feature = info.features[image_key] if isinstance(image_key, str) and image_key in info.features else None
    if isinstance(feature, tfds.features.Image) and feature.np_dtype == np.uint8:
        # The files' bytes, as big_vision reads them: training decodes only the crop window of a JPEG.
        from keras_vit.data import tf_data_steps

        encoded = builder.as_dataset(split=split, as_supervised=True, shuffle_files=False, read_config=read_config,
                                     decoders={image_key: tfds.decode.SkipDecoding()})
        dataset = encoded.map(lambda image, y: (tf_data_steps.decode(image), y))
    else:
        encoded = builder.as_dataset(split=split, as_supervised=True, shuffle_files=False, read_config=read_config)
        dataset, encoded = encoded.map(lambda image, y: (_as_rgb(image), y)), None
    try:
        examples = info.splits[split].num_examples
        if shard is not None:
            examples //= shard[1]
    except KeyError:  # No split metadata (e.g. tfds.testing.mock_data): count once.
        examples = int(dataset.reduce(0, lambda count, _: count + 1))
    return Source(dataset, examples, label.num_classes, tuple(label.names), name, encoded=encoded)


def _as_rgb(image):
    tf = _tf()
    if image.shape[-1] == 1:
        image = tf.image.grayscale_to_rgb(image)
    return image


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
    if not tensorflow_installed():
        try:
            arrays.decode_image(path)
        except arrays.UndecodableImage as error:
            return error.reason
        return None
    from keras_vit.data import tf_data_steps

    tf = _tf()
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
    if tensorflow_installed():
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


def _folder_source(root, split, shard, class_names, holdout_fraction):
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


def load_source(name, split, data_dir=None, image_size=32, shard=None, class_names=None,
                holdout_fraction=HOLDOUT_FRACTION):
    """Resolve a data-set name as the examples take it.

    `"digits"` is the embedded default (split `"train"` or `"test"`). An
    existing directory is an image folder: with split sub-folders
    (`train/`, and `test/`, `val/` or `validation/` for the `"test"` split)
    its labels follow one class list, `class_names` or the training split's.
    Without them, `holdout_fraction` of each class is held out for every
    split but `"train"`, which has the rest (the same files on every run,
    and the command's split, said in the log); `holdout_fraction=None`
    reads the whole folder as the split (a folder of test images, say).
    Anything else is a tensorflow-datasets name.
    """
    if name == "digits":
        if split not in ("train", "test"):
            raise ValueError(f"The digits data set has splits 'train' and 'test', not {split!r}.")
        train, test = digits(image_size=max(*as_pair(image_size, "image_size"), 8))
        images, labels = train if split == "train" else test
        if shard is not None:
            images, labels = images[shard[0]::shard[1]], labels[shard[0]::shard[1]]
        return from_arrays(images, labels, DIGITS_CLASSES, tuple(str(i) for i in range(10)), "digits")
    if os.path.isdir(name):
        return _folder_source(name, split, shard, class_names, holdout_fraction)
    check_dataset(name, data_dir)
    return from_tfds(name, split, data_dir=data_dir, shard=shard)


def check_dataset(name, data_dir=None):
    """Raise where `name` cannot be a data set `load_source` reads: a file, a path to no folder, or a name that is
    no folder where tensorflow-datasets (whose sets have names) is not installed; or where `data_dir` is no folder.
    Reads no image."""
    if name != "digits" and not os.path.isdir(name):
        if os.path.exists(name):
            raise ValueError(f"dataset={name!r} is a file; an image folder holds one sub-folder of images per class.")
        first = name.replace("\\", "/").split("/")[0]
        if name.endswith(("/", "\\")) or name.startswith((".", "~", "/", "\\")) or (
                first != name and os.path.isdir(first)):
            raise FileNotFoundError(f"Image folder not found: {name}; check the path given as dataset=.")
        if importlib.util.find_spec("tensorflow_datasets") is None:
            raise FileNotFoundError(
                f"dataset={name!r} is no folder, and tensorflow-datasets, whose sets have names, is not installed: "
                "check the folder's path, or pip install 'keras-vision-transformer[tensorflow]' for its sets.")
    if data_dir is not None and not os.path.isdir(data_dir):
        raise FileNotFoundError(f"Data directory not found: {data_dir}")


def make_dataset(source, image_size, batch_size, training, seed=0, epoch=0, crop_fraction=None, augmenters=(),
                 num_classes=None, one_hot=False, drop_remainder=None, min_crop_area=0.05, flip=True,
                 eval_transform=None):
    """Batched, prefetched `(images in [-1, 1], labels)` for one pass over `source`.

    Training: shuffle (per `seed` and `epoch`), `inception_crop` (keeping at
    least `min_crop_area` of the image), random horizontal flip (if `flip`),
    then the `augmenters` (`make_augmenters`'): keras_vit's `RandAugment` on each
    example, then the batched Keras layers (timm's random erasing; its MixUp and
    CutMix, `mixing.MixUpCutMix`, need `one_hot=True`; any other Keras augmentation
    layer). Evaluation: `eval_transform`
    (a model's is `keras_vit.eval_transform(model)`: its checkpoint's own
    preprocessing), by default keras_vit's `resize` with `crop_fraction`.

    Example:
    >>> (x, y), _ = digits(image_size=32)
    >>> batches = make_dataset(from_arrays(x, y), (32, 32), 64, training=True)
    """
    # A checkpoint's Pillow preprocessing reads files with Pillow too: TensorFlow's JPEG decoder differs by a few levels.
    pillow_eval = not training and eval_transform is not None and not eval_transform.computed_by_tf_image_resize
    randaugment, augmenters = per_example_augmenter(augmenters)
    if _reads_with_numpy(source) or (pillow_eval and source.examples is not None):
        from keras_vit.data.array_batches import ArrayBatches  # imports Keras, which `keras-vit --help` need not

        return ArrayBatches(source, as_pair(image_size, "image_size"), batch_size, training, seed, epoch, crop_fraction,
                            augmenters, num_classes, one_hot, drop_remainder, min_crop_area, flip,
                            eval_transform=eval_transform, randaugment=randaugment)
    from keras_vit.data import tf_data_steps

    examples = tf_data_steps.examples(source, as_pair(image_size, "image_size"), training, seed, epoch, crop_fraction,
                                      min_crop_area, flip, eval_transform, randaugment)
    if drop_remainder is None:
        drop_remainder = training
    folder = source.examples is not None and not isinstance(source.examples[0], np.ndarray)
    return tf_data_steps.batched(examples, batch_size, drop_remainder, num_classes or source.num_classes, one_hot,
                                 augmenters, left_out=folder and not training)


def images_only(dataset):
    """Drop the labels of an `(images, labels)` dataset, for objectives that need none."""
    from keras_vit.data.array_batches import ArrayBatches

    if isinstance(dataset, ArrayBatches):
        dataset.images_only = True
        return dataset
    if inspect.isgenerator(dataset):
        return ((batch[0],) for batch in dataset)
    return dataset.map(lambda images, labels: images)


def steps_per_epoch(source, batch_size):
    """Full batches in one training epoch (the last partial batch is dropped)."""
    steps = source.num_examples // batch_size
    if steps < 1:
        raise ValueError(
            f"Batch size {batch_size} is larger than the {source.num_examples} training examples; pass "
            f"batch_size={source.num_examples} or less."
        )
    return steps


def default_workers(source):
    """Decoding processes of the numpy pipeline: every core this process may use but one for image files,
    none for arrays in memory, whose crops cost less than handing batches between processes."""
    if source.examples is None or isinstance(source.examples[0], np.ndarray):
        return 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return cores - 1


def training_stream(
    source, image_size, batch_size, epochs, initial_epoch=0, seed=0, augmenters=(), num_classes=None,
    one_hot=False, min_crop_area=0.05, flip=True, workers=None,
):
    """Epochs `initial_epoch .. epochs-1` of training batches, as one dataset.

    Passed to `model.fit(..., steps_per_epoch=steps_per_epoch(source, batch_size))`,
    each epoch gets its own shuffle and crops, decided by `(seed, epoch)` alone,
    so a run resumed at epoch k sees the batches an uninterrupted run would.
    Without TensorFlow, `workers` processes decode and crop (`default_workers`
    when None); tf.data sizes its own threads.
    """
    if initial_epoch >= epochs:
        raise ValueError(f"initial_epoch {initial_epoch} leaves no epochs before {epochs}.")
    size = as_pair(image_size, "image_size")
    randaugment, augmenters = per_example_augmenter(augmenters)
    if _reads_with_numpy(source):
        from keras_vit.data.array_batches import training_batches

        workers = default_workers(source) if workers is None else workers
        return training_batches(source, size, batch_size, epochs, initial_epoch, seed, workers, augmenters=augmenters,
                                num_classes=num_classes, one_hot=one_hot, min_crop_area=min_crop_area, flip=flip,
                                randaugment=randaugment)
    per_epoch = steps_per_epoch(source, batch_size) * batch_size
    # The epochs one after another, each cut to whole batches, then batched once: distribution engines can read
    # the batch size.
    from keras_vit.data import tf_data_steps

    examples = tf_data_steps.training_examples(source, size, seed, range(initial_epoch, epochs), per_epoch,
                                               min_crop_area, flip, randaugment)
    return tf_data_steps.batched(examples, batch_size, True, num_classes or source.num_classes, one_hot, augmenters)
