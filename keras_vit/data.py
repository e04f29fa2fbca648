"""Input pipelines: tf.data from tensorflow-datasets, image folders or arrays.

Training images get an Inception-style random resized crop and a horizontal
flip; evaluation images are resized (optionally centre-cropped). Pixels end
in [-1, 1], as the original models expect. Randomness is stateless and keyed
by `(seed, epoch, example index)`, so a run is reproducible and a resumed run
sees exactly the batches an uninterrupted one would have.

The pipeline reads as a chain of named steps, like big_vision's
`decode|inception_crop(224)|flip_lr|value_range(-1, 1)`:

    train = make_dataset(source, image_size=224, batch_size=512, training=True)

Model code never imports TensorFlow; only this module (input pipelines) does.
"""

import dataclasses
import logging
import os
import zlib

import numpy as np

from keras_vit.arrays import digits  # noqa: F401 (the embedded data set, here too)
from keras_vit.position_embedding import as_pair

logger = logging.getLogger("keras_vit")

# The embedded default data set: UCI's handwritten digits (keras_vit.arrays.digits).
DIGITS_CLASSES = 10


@dataclasses.dataclass
class Source:
    """Examples before preprocessing: a `tf.data.Dataset` of `(uint8 image, int label)`.

    `num_examples` is known for arrays, folders and tfds splits; `class_names`
    when the source names its classes.
    """

    dataset: object
    num_examples: int
    num_classes: int
    class_names: tuple = None
    name: str = ""


def _tf():
    import tensorflow as tf

    return tf


def from_arrays(images, labels, num_classes=None, class_names=None, name="arrays"):
    """A `Source` from in-memory uint8 images `(N, H, W, 3)` and integer labels."""
    tf = _tf()
    images, labels = np.asarray(images), np.asarray(labels).astype("int64")
    if images.ndim != 4 or images.shape[-1] != 3:
        raise ValueError(f"images must have shape (N, H, W, 3), got {images.shape}.")
    if len(images) != len(labels):
        raise ValueError(f"{len(images)} images but {len(labels)} labels.")
    num_classes = num_classes or int(labels.max()) + 1
    dataset = tf.data.Dataset.from_tensor_slices((images, labels))
    return Source(dataset, len(images), num_classes, class_names, name)


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

    if data_dir is not None and not os.path.isdir(data_dir):
        raise FileNotFoundError(f"Data directory not found: {data_dir}")
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
    dataset = builder.as_dataset(split=split, as_supervised=True, shuffle_files=False, read_config=read_config)
    info = builder.info
    label = info.features["label"]
    dataset = dataset.map(lambda image, y: (_as_rgb(image), y))
    try:
        examples = info.splits[split].num_examples
        if shard is not None:
            examples //= shard[1]
    except KeyError:  # No split metadata (e.g. tfds.testing.mock_data): count once.
        examples = int(dataset.reduce(0, lambda count, _: count + 1))
    return Source(dataset, examples, label.num_classes, tuple(label.names), name)


def decode_image_tensor(path):
    """In a tf.data map: an image file (JPEG, PNG, GIF's first frame, BMP) as uint8 `(height, width, 3)`, grey
    made RGB. Eager code decodes with `keras_vit.arrays.decode_image`, which needs no TensorFlow."""
    tf = _tf()
    return tf.io.decode_image(tf.io.read_file(path), channels=3, expand_animations=False)


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


def _image_files(folder):
    """Every image file under `folder`, in nested sub-folders too, sorted; hidden entries left out."""
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
    tf = _tf()
    try:
        decode_image_tensor(path)
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
    folders are skipped, and so are files that cannot be decoded (named in
    the log).
    """
    tf = _tf()
    if not os.path.isdir(path):
        raise FileNotFoundError(f"Image folder not found: {path}")
    found = class_folders(path)
    if not found:
        raise ValueError(f"No images found under {path}/<class>/ (extensions {IMAGE_EXTENSIONS}).")
    if class_names is None:
        if len(found) < 2:
            raise ValueError(
                f"{path} has one class folder ({found[0]!r}); a classifier needs at least two "
                f"(expected {path}/<class>/<images> with one folder per class)."
            )
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
        images = _image_files(os.path.join(path, class_name))
        if not images:
            raise ValueError(
                f"Class folder {os.path.join(path, class_name)} holds no images ({IMAGE_EXTENSIONS}); "
                "remove it or add images."
            )
        if holdout is not None:
            images = _held_out_part(images, class_name, *holdout)
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
        raise ValueError(f"No readable images under {path}.")
    if shard is not None:
        index, count = shard
        files, labels = files[index::count], labels[index::count]

    def decode(file, label):
        return decode_image_tensor(file), label

    dataset = tf.data.Dataset.from_tensor_slices((files, np.asarray(labels, "int64"))).map(decode)
    return Source(dataset, len(files), len(class_names), class_names, os.path.basename(os.path.normpath(path)))


def _held_out_part(files, class_name, split, fraction):
    """The `split` part of one class's files: `fraction` of them held out, chosen by a hash of the class name."""
    order = np.random.default_rng(zlib.crc32(class_name.encode())).permutation(len(files))
    held = set(order[: max(1, int(fraction * len(files) + 0.5)) if len(files) > 1 else 0].tolist())
    return [file for i, file in enumerate(files) if (i in held) == (split != "train")]


def _folder_source(root, split, shard, class_names, holdout_fraction):
    """A split of an image folder: a split sub-folder (`train`, `test`, `val`, ...) or a held-out part."""
    splits = [d for d in class_folders(root) if d in {n for names in SPLIT_FOLDERS.values() for n in names}]
    candidates = SPLIT_FOLDERS.get(split, (split,))
    folder = next((c for c in candidates if os.path.isdir(os.path.join(root, c))), None)
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
    logger.warning(
        "%s has no train/test sub-folders: the %r split is %s %.0f%% of each class's images, chosen the same way "
        "on every run; set the size with holdout_fraction (--holdout-fraction).",
        root, split, "all but a held-out" if split == "train" else "a held-out", 100 * holdout_fraction,
    )
    return from_folder(root, shard, class_names, holdout=(split, holdout_fraction))


def load_source(name, split, data_dir=None, image_size=32, shard=None, class_names=None, holdout_fraction=None):
    """Resolve a data-set name as the examples take it.

    `"digits"` is the embedded default (split `"train"` or `"test"`). An
    existing directory is an image folder: with split sub-folders
    (`train/`, and `test/`, `val/` or `validation/` for the `"test"` split)
    its labels follow one class list, `class_names` or the training split's.
    Without them, the whole folder is the split; or, to train and evaluate
    on one folder, `holdout_fraction` of each class is held out for every
    split but `"train"` (the same files on every run). Anything else is a
    tensorflow-datasets name.
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
    return from_tfds(name, split, data_dir=data_dir, shard=shard)


# ---------------------------------------------------------------------------
# Preprocessing steps (TensorFlow ops: they run inside tf.data).
# ---------------------------------------------------------------------------


def inception_crop(image, size, seed, area_range=(0.05, 1.0)):
    """Random crop of 5-100% of the area and 3/4-4/3 aspect, resized to `size`."""
    tf = _tf()
    begin, crop_size, _ = tf.image.stateless_sample_distorted_bounding_box(
        tf.shape(image),
        bounding_boxes=tf.constant([0.0, 0.0, 1.0, 1.0], shape=(1, 1, 4)),
        seed=seed,
        min_object_covered=0.0,
        aspect_ratio_range=(3 / 4, 4 / 3),
        area_range=area_range,
        use_image_if_no_bounding_boxes=True,
    )
    crop = tf.slice(image, begin, crop_size)
    return tf.image.resize(crop, size, method="bilinear")


def resize(image, size, crop_fraction=None):
    """Resize for evaluation; with `crop_fraction`, resize then take the central crop."""
    tf = _tf()
    if crop_fraction:
        larger = [int(round(s / crop_fraction)) for s in size]
        image = tf.image.resize(image, larger, method="bilinear")
        top, left = (larger[0] - size[0]) // 2, (larger[1] - size[1]) // 2
        return image[top : top + size[0], left : left + size[1]]
    return tf.image.resize(image, size, method="bilinear")


def value_range(image, low=-1.0, high=1.0):
    """Map [0, 255] pixels to [low, high]."""
    tf = _tf()
    return tf.cast(image, "float32") / 255.0 * (high - low) + low


def _examples(source, size, training, seed, epoch, crop_fraction, min_crop_area, flip):
    """Per-example preprocessing: uint8 images of `size` (not yet scaled) and labels."""
    tf = _tf()
    dataset = source.dataset
    if not training:
        return dataset.map(
            lambda image, label: (tf.ensure_shape(resize(image, size, crop_fraction), (*size, 3)), label),
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True,
        )
    epoch_seed = int(seed) * 1_000_003 + int(epoch)
    dataset = dataset.shuffle(
        min(source.num_examples or 10_000, 10_000), seed=epoch_seed, reshuffle_each_iteration=False
    )

    def train_step(index, example):
        image, label = example
        key = tf.stack([tf.constant(epoch_seed, tf.int64), index])
        crop_seed, flip_seed = key, key + tf.constant([0, 1 << 40], tf.int64)
        image = inception_crop(image, size, crop_seed, area_range=(min_crop_area, 1.0))
        if flip:
            image = tf.image.stateless_random_flip_left_right(image, flip_seed)
        return tf.ensure_shape(image, (*size, 3)), label

    return dataset.enumerate().map(train_step, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def _batched(dataset, batch_size, drop_remainder, num_classes, one_hot, augmenters):
    """Batch, then the batched steps: one-hot labels, augmenters, pixels to [-1, 1]."""
    tf = _tf()
    dataset = dataset.batch(batch_size, drop_remainder=drop_remainder)
    if one_hot:
        dataset = dataset.map(lambda x, y: (x, tf.one_hot(y, num_classes)))
    for augmenter in augmenters:
        dataset = dataset.map(_apply_augmenter(augmenter), num_parallel_calls=tf.data.AUTOTUNE)
    dataset = dataset.map(lambda x, y: (value_range(x), y), num_parallel_calls=tf.data.AUTOTUNE)
    return dataset.prefetch(tf.data.AUTOTUNE)


def make_dataset(
    source,
    image_size,
    batch_size,
    training,
    seed=0,
    epoch=0,
    crop_fraction=None,
    augmenters=(),
    num_classes=None,
    one_hot=False,
    drop_remainder=None,
    min_crop_area=0.05,
    flip=True,
):
    """Batched, prefetched `(images in [-1, 1], labels)` for one pass over `source`.

    Training: shuffle (per `seed` and `epoch`), `inception_crop` (keeping at
    least `min_crop_area` of the image), random horizontal flip (if `flip`),
    then any batched `augmenters` (e.g. `keras.layers.RandAugment`, `MixUp`,
    `CutMix`; MixUp/CutMix need `one_hot=True`). Evaluation: `resize`.

    Example:
    >>> (x, y), _ = digits(image_size=32)
    >>> batches = make_dataset(from_arrays(x, y), (32, 32), 64, training=True)
    """
    examples = _examples(source, as_pair(image_size, "image_size"), training, seed, epoch, crop_fraction, min_crop_area, flip)
    if drop_remainder is None:
        drop_remainder = training
    return _batched(examples, batch_size, drop_remainder, num_classes or source.num_classes, one_hot, augmenters)


def _apply_augmenter(augmenter):
    """Run a Keras (or keras-cv) augmentation layer on a batch of [0, 255] images."""

    def apply(images, labels):
        if _mixes_labels(augmenter):
            out = augmenter({"images": images, "labels": labels}, training=True)
            return out["images"], out["labels"]
        return augmenter(images, training=True), labels

    return apply


def _mixes_labels(augmenter):
    return type(augmenter).__name__ in ("MixUp", "CutMix")


def make_augmenters(randaugment=None, mixup=0.0, cutmix=0.0, seed=0):
    """Keras-core augmentation layers for the pipeline.

    `randaugment=(num_ops, magnitude)` adds `RandAugment`; `mixup` / `cutmix`
    give the Beta-distribution parameters of `MixUp` / `CutMix` (0 = off).
    """
    import keras

    layers = []
    if randaugment:
        num_ops, magnitude = randaugment
        layers.append(keras.layers.RandAugment(value_range=(0, 255), num_ops=num_ops, factor=magnitude, seed=seed))
    if mixup:
        layers.append(keras.layers.MixUp(alpha=mixup, seed=seed))
    if cutmix:
        layers.append(keras.layers.CutMix(factor=cutmix, seed=seed))
    return layers


def images_only(dataset):
    """Drop the labels of an `(images, labels)` dataset, for objectives that need none."""
    return dataset.map(lambda images, labels: images)


def steps_per_epoch(source, batch_size):
    """Full batches in one training epoch (the last partial batch is dropped)."""
    steps = source.num_examples // batch_size
    if steps < 1:
        raise ValueError(
            f"Batch size {batch_size} is larger than the {source.num_examples} training examples."
        )
    return steps


def training_stream(
    source, image_size, batch_size, epochs, initial_epoch=0, seed=0, augmenters=(), num_classes=None,
    one_hot=False, min_crop_area=0.05, flip=True,
):
    """Epochs `initial_epoch .. epochs-1` of training batches, as one dataset.

    Passed to `model.fit(..., steps_per_epoch=steps_per_epoch(source, batch_size))`,
    each epoch gets its own shuffle and crops, decided by `(seed, epoch)` alone,
    so a run resumed at epoch k sees the batches an uninterrupted run would.
    """
    if initial_epoch >= epochs:
        raise ValueError(f"initial_epoch {initial_epoch} leaves no epochs before {epochs}.")
    size = as_pair(image_size, "image_size")
    per_epoch = steps_per_epoch(source, batch_size) * batch_size
    # Python-level epochs (tf.data's shuffle takes its seed as a constant), each cut to
    # whole batches, then batched once: distribution engines can read the batch size.
    examples = None
    for epoch in range(initial_epoch, epochs):
        one = _examples(source, size, True, seed, epoch, None, min_crop_area, flip).take(per_epoch)
        examples = one if examples is None else examples.concatenate(one)
    return _batched(examples, batch_size, True, num_classes or source.num_classes, one_hot, augmenters)
