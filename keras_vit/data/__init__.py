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

import importlib.util
import inspect
import logging
import os

import numpy as np

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
from keras_vit.data import folders
from keras_vit.data.folders import (  # noqa: F401 (public here)
    IMAGE_EXTENSIONS,
    SPLIT_FOLDERS,
    class_folders,
    from_folder,
    image_files,
    split_folder,
)
from keras_vit.data import source as source_module
from keras_vit.data.source import Source, tensorflow_installed  # noqa: F401 (public here)
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


def _tf():
    import tensorflow as tf

    return tf


def _reads_with_numpy(source):
    return source.examples is not None and (source.dataset is None or not source_module.tensorflow_installed())


def from_arrays(images, labels, num_classes=None, class_names=None, name="arrays"):
    """A `Source` from in-memory uint8 images `(N, H, W, 3)` and integer labels."""
    images, labels = np.asarray(images), np.asarray(labels).astype("int64")
    if images.ndim != 4 or images.shape[-1] != 3:
        raise ValueError(f"images must have shape (N, H, W, 3), got {images.shape}.")
    if len(images) != len(labels):
        raise ValueError(f"{len(images)} images but {len(labels)} labels.")
    num_classes = num_classes or int(labels.max()) + 1
    dataset = _tf().data.Dataset.from_tensor_slices((images, labels)) if source_module.tensorflow_installed() else None
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
        return folders.folder_source(name, split, shard, class_names, holdout_fraction)
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
                 eval_transform=None, aug_repeats=0):
    """Batched, prefetched `(images in [-1, 1], labels)` for one pass over `source`.

    Training: shuffle (per `seed` and `epoch`), `inception_crop` (keeping at
    least `min_crop_area` of the image), random horizontal flip (if `flip`),
    then the `augmenters` (`make_augmenters`'): keras_vit's `RandAugment` or DeiT III's
    `ThreeAugment` on each example, then the batched Keras layers (timm's random erasing; its MixUp and
    CutMix, `mixing.MixUpCutMix`, need `one_hot=True`; any other Keras augmentation
    layer). Evaluation: `eval_transform`
    (a model's is `keras_vit.eval_transform(model)`: its checkpoint's own
    preprocessing), by default keras_vit's `resize` with `crop_fraction`.
    `aug_repeats`: timm's repeated augmentation (`array_batches.example_order`).

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
                            eval_transform=eval_transform, randaugment=randaugment, aug_repeats=aug_repeats)
    from keras_vit.data import tf_data_steps

    examples = tf_data_steps.examples(source, as_pair(image_size, "image_size"), training, seed, epoch, crop_fraction,
                                      min_crop_area, flip, eval_transform, randaugment, aug_repeats)
    if drop_remainder is None:
        drop_remainder = training
    folder = source.examples is not None and not isinstance(source.examples[0], np.ndarray)
    return tf_data_steps.batched(examples, batch_size, drop_remainder, num_classes or source.num_classes, one_hot,
                                 augmenters, left_out=folder and not training, seed=seed, first_epoch=epoch)


def images_only(dataset):
    """Drop the labels of an `(images, labels)` dataset, for objectives that need none."""
    from keras_vit.data.array_batches import ArrayBatches

    if isinstance(dataset, ArrayBatches):
        dataset.images_only = True
        return dataset
    if inspect.isgenerator(dataset):
        return ((batch[0],) for batch in dataset)
    return dataset.map(lambda images, labels: images)


def steps_per_epoch(source, batch_size, aug_repeats=0):
    """Full batches in one training epoch (the last partial batch is dropped); with timm's repeated augmentation
    (`aug_repeats`), of its `epoch_length`."""
    from keras_vit.data.array_batches import epoch_length  # imports Keras, which `keras-vit --help` need not

    examples = epoch_length(source.num_examples, aug_repeats)
    steps = examples // batch_size
    if steps < 1 and examples < source.num_examples:
        raise ValueError(
            f"Batch size {batch_size} is larger than the {examples} examples an epoch of repeated augmentation keeps "
            f"of {source.num_examples} (a multiple of 256, as timm's); pass batch_size={examples} or less.")
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
    one_hot=False, min_crop_area=0.05, flip=True, workers=None, aug_repeats=0,
):
    """Epochs `initial_epoch .. epochs-1` of training batches, as one dataset.

    Passed to `model.fit(..., steps_per_epoch=steps_per_epoch(source, batch_size))`,
    each epoch gets its own shuffle and crops, decided by `(seed, epoch)` alone,
    so a run resumed at epoch k sees the batches an uninterrupted run would.
    Without TensorFlow, `workers` processes decode and crop (`default_workers`
    when None); tf.data sizes its own threads. `aug_repeats`: timm's repeated augmentation
    (`array_batches.example_order`), the steps then `steps_per_epoch(source, batch_size, aug_repeats)`.
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
                                randaugment=randaugment, aug_repeats=aug_repeats)
    per_epoch = steps_per_epoch(source, batch_size, aug_repeats) * batch_size
    # The epochs one after another, each cut to whole batches, then batched once: distribution engines can read
    # the batch size.
    from keras_vit.data import tf_data_steps

    examples = tf_data_steps.training_examples(source, size, seed, range(initial_epoch, epochs), per_epoch,
                                               min_crop_area, flip, randaugment, aug_repeats)
    return tf_data_steps.batched(examples, batch_size, True, num_classes or source.num_classes, one_hot, augmenters,
                                 seed=seed, first_epoch=initial_epoch, steps_per_epoch=per_epoch // batch_size)
