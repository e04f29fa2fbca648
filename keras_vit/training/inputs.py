"""What a run trains and evaluates on: its splits, augmentations and the held-out preprocessing.

Example:
>>> from keras_vit.training import inputs
>>> train_source, eval_source = inputs.load_sources("digits", image_size=16)  # doctest: +SKIP
"""

from keras_vit import data
from keras_vit.model.description import architecture_of, is_naflex
from keras_vit.model.vision_transformer import eval_transform


def load_sources(dataset="digits", image_size=32, train_split="train", eval_split="test", data_dir=None,
                 holdout_fraction=data.HOLDOUT_FRACTION):
    """The training and held-out `data.Source`s of `dataset`, labelled from one class list.

    An image folder without split folders gives both: `holdout_fraction` of
    each class is held out for evaluation, never trained on.
    """
    train_source = data.load_source(dataset, train_split, data_dir, image_size, holdout_fraction=holdout_fraction)
    eval_source = data.load_source(dataset, eval_split, data_dir, image_size, class_names=train_source.class_names,
                                   holdout_fraction=holdout_fraction)
    return train_source, eval_source


def augmentation_defaults(dataset, min_crop_area=None, flip=None):
    """`(min_crop_area, flip)`, filling in 0.05 and flips, or 0.6 and no flips for the digits (flips change them)."""
    digits = dataset == "digits"
    return (min_crop_area if min_crop_area is not None else (0.6 if digits else 0.05),
            flip if flip is not None else not digits)


def evaluation_transform(model):
    """The one preprocessing of a trained `model`'s evaluation: its checkpoint's own (timm's crop and filter,
    transformers' processor) where it has one, else keras_vit's resize; None for a NaFlex model (it cuts each photo
    whole). The held-out split is evaluated with it and `model.keras` keeps it, so `predict`, `evaluate` and export
    see the pixels the printed accuracy came from. Says which it is, in one line.

    Example:
    >>> import keras_vit
    >>> model = keras_vit.ViT(image_size=32, patch_size=8, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=32)
    >>> evaluation_transform(model).convention
    preprocessing: keras_vit's: both sides to 32x32 (bilinear, tf.image.resize), for evaluation and the saved model
    'keras_vit'
    """
    if is_naflex(model):
        return None
    transform = eval_transform(model)
    print(f"preprocessing: {transform.summary()}, for evaluation and the saved model")
    return transform


def pixel_statistics(model):
    """`(mean, std)`: the pixel statistics `model` normalizes by (on [0, 1] pixels), for timm's random erasing."""
    found = architecture_of(model)
    return tuple(found.input_mean), tuple(found.input_std)


def training_data(
    train_source, eval_source, image_size, batch_size, epochs, initial_epoch=0, seed=0, eval_batch_size=256,
    randaugment=None, mixup=0.0, cutmix=0.0, min_crop_area=0.05, flip=True, images_only=False, multi_process=False,
    workers=None, eval_transform=None, reprob=0.0, pixel_statistics=None, aug_repeats=0, three_augment=False,
    color_jitter=None):
    """`(stream, validation)`: the augmented batches of epochs `initial_epoch..epochs-1`, and the held-out ones.

    The held-out images go through `eval_transform` (`evaluation_transform(model)`: the model's own; by default
    keras_vit's resize). Labels are one-hot; `images_only` drops them (masked patch prediction).
    `workers`: decoding processes without TensorFlow (`data.training_stream`).
    `reprob`: timm's random erasing, its noise in the model's normalized space (`pixel_statistics`: its
    `(input_mean, input_std)`). `aug_repeats`: timm's repeated augmentation; `three_augment` and
    `color_jitter`: DeiT III's 3-Augment (`data.make_augmenters`).
    With `multi_process` the last partial held-out batch is left out: JAX
    needs static batch sizes across processes.
    """
    augmenters = data.make_augmenters(randaugment, mixup, cutmix, seed, reprob, pixel_statistics, three_augment,
                                      color_jitter)
    # A run killed after its last epoch resumes at `epochs`: fit trains nothing, the stream is never read.
    first = min(initial_epoch, epochs - 1)
    stream = data.training_stream(train_source, image_size, batch_size, epochs, first, seed,
                                  augmenters=augmenters, one_hot=True, min_crop_area=min_crop_area, flip=flip,
                                  workers=workers, aug_repeats=aug_repeats)
    if multi_process and eval_source.num_examples % eval_batch_size:
        print(f"note: evaluating {eval_source.num_examples // eval_batch_size * eval_batch_size} "
              f"of {eval_source.num_examples} held-out examples (whole batches only across processes)")
    validation = data.make_dataset(eval_source, image_size, eval_batch_size, training=False, one_hot=True,
                                   num_classes=train_source.num_classes, drop_remainder=multi_process,
                                   eval_transform=eval_transform)
    if images_only:  # The targets come from the images themselves.
        stream, validation = data.images_only(stream), data.images_only(validation)
    return stream, validation


def fitted_batch_size(batch_size, examples, replicas=1):
    """`batch_size`, or where the training split holds fewer `examples`, the largest batch they fill (a multiple of
    `replicas`), with a note: a small folder trains at its own size rather than failing at the default 64."""
    if batch_size <= examples:
        return batch_size
    fitted = examples // replicas * replicas
    if fitted < 1:
        raise ValueError(f"The {examples} training examples are fewer than the {replicas} replicas, which take one "
                         "example each at least: add examples, or train on fewer devices.")
    print(f"note: --batch-size {batch_size} is more than the {examples} training examples; training with batches of "
          f"{fitted}")
    return fitted
