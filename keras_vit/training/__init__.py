"""Pretraining and fine-tuning with plain `model.fit`, one step a function.

`train(PretrainConfig(...))` and `train(FinetuneConfig(...))` run a whole job
(the `keras-vit` command calls them). The steps they take are public and take
plain arguments, for scripts that write the loop out themselves, as
`examples/pretrain.py` and `examples/finetune.py` do:

    setup -> load_sources -> ViT (+ zero_head) -> pretraining_recipe / finetuning_recipe
    -> compile_model -> training_data -> make_callbacks -> model.fit -> check_finite
    -> model.evaluate -> save_run -> durable.finish -> report

Nothing is lost to a kill or a full disk: `keras_vit.training.durable` keeps the
training state until model.keras is written, and every file is written
under a temporary name and renamed into place.
"""

import csv
import dataclasses
import importlib
import os

import keras
import numpy as np

from keras_vit import checkpoints, data
from keras_vit.applications.vit import ViT
from keras_vit.configs import (  # noqa: F401 (public here too)
    SIZE_FIELDS,
    FinetuneConfig,
    PretrainConfig,
    check_sizes_agree,
    model_sizes,
    path_errors,
    raise_all,
)
from keras_vit.data import preprocessing
from keras_vit.model.lora import enable_lora
from keras_vit.model.description import architecture_of, is_naflex
from keras_vit.model.vision_transformer import VisionTransformer, check_image_size, eval_transform
from keras_vit.training import distribute, durable, losses, recipes
from keras_vit.training.durable import backup_dir, resumed_epoch  # noqa: F401 (public here too)
from keras_vit.training.distillation import Distiller  # noqa: F401 (public here too)
from keras_vit.training.masked_patch import MaskedPatchPretrainer
from keras_vit.utils import files


def setup(seed=0, distribution="none", model_parallel_size=2, tpu=None):
    """Set every random seed, then choose the `keras_vit.training.distribute` engine."""
    keras.utils.set_random_seed(seed)
    return distribute.setup(distribution, model_parallel_size=model_parallel_size, tpu=tpu)


def precision(mixed_precision, distribution="none"):
    """The run's `dtype=` for `ViT`, a printed choice (not the engine's side effect): "mixed_bfloat16" or "float32"."""
    if mixed_precision:
        print("precision: mixed_bfloat16 (float32 weights, bfloat16 computation; --mixed-precision)")
        return "mixed_bfloat16"
    print("precision: float32" + ("; add --mixed-precision to compute in bfloat16, as TPUs do natively"
                                  if distribution == "tpu" else ""))
    return "float32"


# --- Data ------------------------------------------------------------------


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
    workers=None, eval_transform=None, reprob=0.0, pixel_statistics=None):
    """`(stream, validation)`: the augmented batches of epochs `initial_epoch..epochs-1`, and the held-out ones.

    The held-out images go through `eval_transform` (`evaluation_transform(model)`: the model's own; by default
    keras_vit's resize). Labels are one-hot; `images_only` drops them (masked patch prediction).
    `workers`: decoding processes without TensorFlow (`data.training_stream`).
    `reprob`: timm's random erasing, its noise in the model's normalized space (`pixel_statistics`: its
    `(input_mean, input_std)`).
    With `multi_process` the last partial held-out batch is left out: JAX
    needs static batch sizes across processes.
    """
    augmenters = data.make_augmenters(randaugment, mixup, cutmix, seed, reprob, pixel_statistics)
    # A run killed after its last epoch resumes at `epochs`: fit trains nothing, the stream is never read.
    first = min(initial_epoch, epochs - 1)
    stream = data.training_stream(train_source, image_size, batch_size, epochs, first, seed,
                                  augmenters=augmenters, one_hot=True, min_crop_area=min_crop_area, flip=flip,
                                  workers=workers)
    if multi_process and eval_source.num_examples % eval_batch_size:
        print(f"note: evaluating {eval_source.num_examples // eval_batch_size * eval_batch_size} "
              f"of {eval_source.num_examples} held-out examples (whole batches only across processes)")
    validation = data.make_dataset(eval_source, image_size, eval_batch_size, training=False, one_hot=True,
                                   num_classes=train_source.num_classes, drop_remainder=multi_process,
                                   eval_transform=eval_transform)
    if images_only:  # The targets come from the images themselves.
        stream, validation = data.images_only(stream), data.images_only(validation)
    return stream, validation


# --- Model and optimizer recipe --------------------------------------------


def zero_head(model):
    """The paper's fine-tuning head: one zero-initialised layer (kernel and bias set to 0)."""
    head = model.get_layer("head")
    head.kernel.assign(np.zeros(head.kernel.shape, "float32"))
    head.bias.assign(np.zeros(head.bias.shape, "float32"))
    return model


def update_steps(steps_per_epoch, epochs, accumulation=None):
    """Optimizer updates in the whole run (at least one), `accumulation` batches each."""
    return max(steps_per_epoch // (accumulation or 1) * epochs, 1)


def pretraining_recipe(learning_rate, total_updates, warmup_steps=None, weight_decay=0.1, decay="linear",
                       clipnorm=1.0, accumulation=None, model=None):
    """`recipes.pretraining_optimizer` (AdamW, `model`'s variables decayed as timm's groups say) on a
    warmup-then-`decay` schedule of `total_updates` (warmup: `warmup_steps`, else `recipes.warmup_updates`')."""
    warmup = recipes.warmup_updates(total_updates, warmup_steps, recipes.PRETRAINING_WARMUP)
    schedule = recipes.WarmupDecay(learning_rate, total_updates, warmup, decay)
    return recipes.pretraining_optimizer(schedule, weight_decay=weight_decay, global_clipnorm=clipnorm,
                                         gradient_accumulation_steps=accumulation, model=model)


def finetuning_recipe(learning_rate, total_updates, warmup_steps=None, clipnorm=1.0, ema=None, accumulation=None,
                      opt="sgd", weight_decay=None, layer_decay=None, model=None):
    """`recipes.finetuning_optimizer` (`opt`: the paper's SGD, or AdamW / LAMB with timm's groups over `model`) on
    a warmup-then-cosine schedule of `total_updates` (warmup: `warmup_steps`, else `recipes.warmup_updates`')."""
    warmup = recipes.warmup_updates(total_updates, warmup_steps)
    schedule = recipes.WarmupDecay(learning_rate, total_updates, warmup, "cosine")
    return recipes.finetuning_optimizer(schedule, global_clipnorm=clipnorm, ema_momentum=ema,
                                        gradient_accumulation_steps=accumulation, opt=opt,
                                        weight_decay=weight_decay, layer_decay=layer_decay, model=model)


def training_settings(config, warmup, total_updates):
    """What a fine-tuning run used, for its model.keras: the recipe, each setting it filled or the user gave, and
    the schedule's warmup of its updates."""
    from keras_vit.fine_tuning_recipes import RECIPE_FIELDS

    settings = {"recipe": config.recipe, **{name: getattr(config, name) for name in RECIPE_FIELDS},
                "warmup_updates": warmup, "total_updates": total_updates, "epochs": config.epochs,
                "batch_size": config.batch_size, "target_batch_size": config.target_batch_size}
    return {key: list(value) if isinstance(value, tuple) else value for key, value in settings.items()}


def accuracy_metrics(num_classes):
    """Top-1 ("top1"), and with more than 5 classes top-5 ("top5"), for one-hot labels.

    Of 5 classes or fewer, every label is among the top 5: a top-5 of 1.0 says nothing.
    """
    top5 = [keras.metrics.TopKCategoricalAccuracy(k=5, name="top5")] if num_classes > 5 else []
    return [keras.metrics.CategoricalAccuracy(name="top1"), *top5]


def compile_model(model, optimizer, num_classes, masked_patch=False, label_smoothing=0.0, seed=0,
                  steps_per_execution=1, bce_loss=False, bce_target_thresh=None):
    """Compile `model` for classification from logits (the softmax crossentropy, or with `bce_loss` timm's binary
    cross-entropy of classes, `losses.BinaryCrossentropyOfClasses`), or wrap it in `MaskedPatchPretrainer`.

    Returns the model to fit.
    """
    if masked_patch:
        model = MaskedPatchPretrainer(model, seed=seed, name="masked_patch_pretrainer")
        model.compile(optimizer=optimizer, steps_per_execution=steps_per_execution)
        return model
    model.compile(
        optimizer=optimizer,
        loss=losses.BinaryCrossentropyOfClasses(label_smoothing, bce_target_thresh) if bce_loss else
        keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=label_smoothing),
        metrics=accuracy_metrics(num_classes),
        steps_per_execution=steps_per_execution,
    )
    return model


# --- Callbacks, resuming, and what a run leaves behind ---------------------


def make_callbacks(output_dir, backup_dir, initial_epoch=0, is_chief=True):
    """On the chief `durable.DurableLog` (log.csv), then on every process `durable.DurableBackup` and TerminateOnNaN,
    then on the chief TensorBoard.

    The log is written before the backup, so it always has a row for each epoch the backup holds.
    """
    log = [durable.DurableLog(os.path.join(output_dir, "log.csv"), initial_epoch)] if is_chief else []
    callbacks = [*log, durable.DurableBackup(backup_dir, initial_epoch), keras.callbacks.TerminateOnNaN()]
    if is_chief:
        callbacks += tensorboard_callbacks(os.path.join(output_dir, "tensorboard"))
    return callbacks


def optional_package(package, what, install=None):
    """Whether `package` imports; if not, print a one-line note that `what` is skipped and how to install it."""
    try:
        importlib.import_module(package)
        return True
    except ImportError:
        print(f"note: {what} skipped: the optional package {package!r} is not installed (pip install {install or package})")
        return False


def tensorboard_callbacks(log_dir):
    """`[keras.callbacks.TensorBoard(log_dir)]`; `[]` without TensorFlow, and `[]` with a note without tensorboard.

    Keras writes TensorBoard logs with TensorFlow's `tf.summary`: a `[jax]`
    or `[torch]` install goes without them, and is not told to install
    TensorFlow for them (log.csv and learning_curve.png hold the same numbers).
    """
    if not data.tensorflow_installed() or not optional_package("tensorboard", "TensorBoard logs"):
        return []
    return [keras.callbacks.TensorBoard(log_dir)]


# The accuracy columns a CSVLogger file may hold, and their plot titles.
_ACCURACY_TITLES = {"top1": "Top-1 accuracy", "corrupted_accuracy": "Corrupted-patch colour accuracy"}


def check_finite(history, backup_dir=None, learning_rate=None):
    """Raise if TerminateOnNaN stopped `model.fit` (the last loss is not finite), saying how to resume.

    The backup in `backup_dir` keeps the last finite epoch's state; the
    message suggests rerunning from it at half `learning_rate`.
    """
    if not history.history.get("loss") or np.isfinite(history.history["loss"][-1]):
        return
    message = "Training stopped: the loss became NaN (TerminateOnNaN)."
    folder, epoch = durable.latest_state(backup_dir) if backup_dir else (None, 0)
    rerun = f"rerun the same command with --learning-rate {learning_rate / 2:g}" if learning_rate else "rerun"
    if folder:
        message += f" {folder} keeps the state after epoch {epoch}, the last finite one: {rerun} to resume from it."
    else:
        message += f" No epoch finished: {rerun} to start over."
    raise RuntimeError(message)


def save_run(encoder, output_dir, class_names=None, process_index=0):
    """Write model.keras (`encoder`, which keeps `class_names` as its own), classes.txt (unless `class_names` is
    None) and learning_curve.png, atomically.

    Prints where the model and its log (log.csv, written during training)
    are. Only the chief (process 0) writes; the others save to a scratch file,
    since saving gathers the weights with a collective every process joins.
    """
    durable.kill_point("before-save")
    if isinstance(encoder, VisionTransformer):
        if encoder.eval_transform is None and not is_naflex(encoder):  # keras_vit's resize, as it was evaluated
            encoder.eval_transform = preprocessing.keras_vit()
        if class_names is not None:  # `decode_predictions` and `keras-vit predict` read them from model.keras
            encoder.class_names = [str(name) for name in class_names]
    if process_index != 0:
        scratch = os.path.join(output_dir, f".process_{process_index}.keras")
        encoder.save(scratch)
        os.remove(scratch)
        return
    # Each file is written under a temporary name and renamed into place: a kill leaves the old one whole.
    with files.atomic_path(os.path.join(output_dir, "model.keras")) as path:
        encoder.save(path)
        durable.kill_point("final-save")
    if class_names is not None:
        files.write_text(os.path.join(output_dir, "classes.txt"), "".join(f"{name}\n" for name in class_names))
    plot_learning_curve(os.path.join(output_dir, "log.csv"), os.path.join(output_dir, "learning_curve.png"))
    beside = [name for name in ("classes.txt", "learning_curve.png", "tensorboard")
              if os.path.exists(os.path.join(output_dir, name))]
    print(f"wrote {os.path.join(output_dir, 'model.keras')} and its log {os.path.join(output_dir, 'log.csv')}"
          + (f" (beside them: {', '.join(beside)})" if beside else ""))


def report(results):
    """Print and return the held-out accuracy of `model.evaluate(..., return_dict=True)`.

    `top-1 accuracy: 0.xxxx`, or for masked patch prediction
    `corrupted-patch colour accuracy: 0.xxxx`.
    """
    metric = "top1" if "top1" in results else "corrupted_accuracy"
    print(f"{_ACCURACY_TITLES[metric].lower()}: {results[metric]:.4f}")
    return results[metric]


def check_inputs(config, process_index=0):
    """Raise one error that names every input of `config` that is wrong: its `dataset` and `data_dir`
    (`data.check_dataset`), its `weights` file, its `output_dir` (`durable.check_output_dir`); before anything is
    read or downloaded.

    A user fixes them all in one go, not one run at a time.
    """
    errors = path_errors(config)
    try:
        durable.check_output_dir(config.output_dir, config.overwrite, config.weights, process_index)
    except (ValueError, OSError) as error:
        errors.append(error)
    raise_all(errors)


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


def train(config):
    """Run a `PretrainConfig` or `FinetuneConfig` end to end; returns the held-out accuracy.

    That is top-1, or with `objective="masked-patch"` the accuracy of the
    predicted mean colours of corrupted patches; that objective saves the
    encoder alone (no head) as `model.keras`, ready for fine-tuning.
    """
    stage = config.stage
    masked_patch = getattr(config, "objective", "classification") == "masked-patch"
    engine = setup(config.seed, config.distribution, config.model_parallel_size, config.tpu)
    dtype = precision(config.mixed_precision, config.distribution)
    engine.check_batch_size(config.batch_size)
    check_inputs(config, engine.process_index)

    checkpoint = None
    if config.weights:  # a named checkpoint's file at image_size, else at 224 px (ViT's) where it has one
        checkpoint = checkpoints.read_weights(config.weights, config.model, config.image_size or (224, 224),
                                              verbose=config.verbose).with_heads(config.num_heads)
    config = config.at_checkpoint_size(checkpoint)
    sizes = config.sizes(checkpoint)
    check_image_size(config.image_size, sizes, config.drop_remainder)
    train_source, eval_source = load_sources(config.dataset, config.image_size, config.train_split,
                                             config.eval_split, config.data_dir, config.holdout_fraction)
    num_classes = train_source.num_classes
    config = dataclasses.replace(config, batch_size=fitted_batch_size(config.batch_size, train_source.num_examples,
                                                                      engine.num_replicas))
    steps = data.steps_per_epoch(train_source, config.batch_size)
    accumulation = recipes.accumulation_steps(config.target_batch_size, config.batch_size)
    total_updates = update_steps(steps, config.epochs, accumulation)
    warmup_share = None
    if stage == "finetune":  # the recipe fills what the user left open, and says so
        config, warmup_share, note = config.with_recipe(sizes.num_layers,
                                                        config.target_batch_size or config.batch_size)
        print(note)
    warmup = recipes.warmup_updates(total_updates, config.warmup_steps, config.longest_warmup, warmup_share)

    os.makedirs(config.output_dir, exist_ok=True)
    with engine.scope():
        encoder = ViT(
            image_size=config.image_size, **sizes.__dict__, classes=num_classes, include_top=not masked_patch,
            weights=checkpoint, representation_size=getattr(config, "representation_size", 0),
            classifier=config.classifier, dropout_rate=config.dropout, stochastic_depth_rate=config.stochastic_depth,
            classifier_activation=None, name=getattr(checkpoint, "name", None) or f"vit_{stage}", dtype=dtype,
            drop_remainder=config.drop_remainder,
        )
        if stage == "finetune":
            zero_head(encoder)
            if config.lora_rank:
                enable_lora(encoder, config.lora_rank)
            optimizer = finetuning_recipe(config.learning_rate, total_updates, warmup, config.clipnorm, config.ema,
                                          accumulation, config.opt, config.weight_decay, config.layer_decay, encoder)
            encoder.training_settings = training_settings(config, warmup, total_updates)
        else:
            optimizer = pretraining_recipe(config.learning_rate, total_updates, warmup, config.weight_decay,
                                           config.decay, config.clipnorm, accumulation, encoder)
        model = compile_model(encoder, optimizer, num_classes, masked_patch, config.label_smoothing, config.seed,
                              config.steps_per_execution, config.bce_loss, config.bce_target_thresh)

    backup = backup_dir(config.output_dir, engine.process_index)
    initial_epoch = resumed_epoch(backup)
    min_crop_area, flip = augmentation_defaults(config.dataset, config.min_crop_area, config.flip)
    stream, validation = training_data(
        train_source, eval_source, config.image_size, config.batch_size, config.epochs, initial_epoch, config.seed,
        config.eval_batch_size, config.randaugment, config.mixup, config.cutmix, min_crop_area, flip,
        images_only=masked_patch, multi_process=engine.process_count > 1, workers=config.workers,
        eval_transform=evaluation_transform(encoder), reprob=config.reprob,
        pixel_statistics=pixel_statistics(encoder),
    )
    history = model.fit(
        stream,
        epochs=config.epochs,
        initial_epoch=initial_epoch,
        steps_per_epoch=steps,
        validation_data=validation,
        callbacks=make_callbacks(config.output_dir, backup, initial_epoch, engine.is_chief),
        shuffle=False,  # The stream is already shuffled, per (seed, epoch).
        verbose=config.verbose,
    )
    check_finite(history, backup, config.learning_rate)
    results = model.evaluate(validation, verbose=0, return_dict=True)
    names = None if masked_patch else (train_source.class_names or range(num_classes))
    save_run(encoder, config.output_dir, names, engine.process_index)
    durable.finish(backup)  # Only now that model.keras is written.
    return report(results)


def plot_learning_curve(log_path, png_path):
    """Write `learning_curve(log_path)` to `png_path` (nothing without matplotlib or a logged epoch)."""
    if not optional_package("matplotlib", "the learning-curve plot"):
        return
    import matplotlib.pyplot as plt

    figure = learning_curve(log_path)
    if figure is None:
        return
    with files.atomic_path(png_path) as path:
        figure.savefig(path, dpi=100)
    plt.close(figure)


def learning_curve(log_path):
    """The figure of loss and accuracy per epoch, training and held-out, from a CSVLogger file; None if it has no row.

    The accuracy is top-1, or for masked patch prediction the corrupted-patch
    colour accuracy, whichever the file has. Every epoch is a marker and
    held-out lines are dashed, so that each line shows: one epoch's (a point
    without a line), one that lies on another, and one at 0 or 1 (the axis
    runs a little past both).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    with open(log_path) as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return None
    epochs = [int(r["epoch"]) + 1 for r in rows]
    metric = next((name for name in _ACCURACY_TITLES if name in rows[0]), "top1")
    title = _ACCURACY_TITLES[metric]
    figure, (loss_axis, accuracy_axis) = plt.subplots(1, 2, figsize=(9, 3.5))
    for axis, key in ((loss_axis, "loss"), (accuracy_axis, metric)):
        for column, label, style in ((key, "train", "o-"), (f"val_{key}", "held-out", "s--")):
            if column in rows[0]:
                axis.plot(epochs, [float(r[column]) for r in rows], style, label=label, markersize=4)
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.legend()
    loss_axis.set(xlabel="epoch", ylabel="loss", title="Loss")
    accuracy_axis.set(xlabel="epoch", ylabel=title.lower(), title=title, ylim=(-0.03, 1.03))
    figure.tight_layout()
    return figure
