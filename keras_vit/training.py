"""Pretraining, fine-tuning, evaluation and prediction with plain `model.fit`.

The examples (`examples/pretrain.py`, `examples/finetune.py`) and the
`keras-vit` command both run these functions; `keras_vit.cli` holds the flags.
"""

import csv
import json
import os

import keras
import numpy as np

from keras_vit import data, distribute, recipes
from keras_vit.imagenet import imagenet_labels
from keras_vit.masked_patch import MaskedPatchPretrainer
from keras_vit.models import ViT, check_image_size, read_checkpoint
from keras_vit.variants import SMALL_VIT, VARIANTS, Variant


def model_sizes(args, source=None):
    """The `Variant` to build: `--model`, else the checkpoint's, else the size flags."""
    if args.model:
        if args.model not in VARIANTS:
            raise ValueError(f"Unknown model {args.model!r}; expected one of {sorted(VARIANTS)}.")
        return VARIANTS[args.model]
    if source is not None and source.sizes is not None:
        return source.sizes
    return Variant(args.patch_size, args.hidden_size, args.num_layers, args.num_heads, args.mlp_dim)


def resumed_epoch(backup_dir):
    """The epoch `keras.callbacks.BackupAndRestore` will resume from (0 for a new run)."""
    path = os.path.join(backup_dir, "training_metadata.json")
    if not os.path.exists(path):
        return 0
    with open(path) as f:
        return int(json.load(f).get("epoch", 0))


def _metrics(num_classes):
    return [
        keras.metrics.CategoricalAccuracy(name="top1"),
        keras.metrics.TopKCategoricalAccuracy(k=min(5, num_classes), name="top5"),
    ]


# The accuracy columns a CSVLogger file may hold, and their plot titles.
_ACCURACY_TITLES = {"top1": "Top-1 accuracy", "corrupted_accuracy": "Corrupted-patch colour accuracy"}


def train(args, stage):
    """Run `stage` ("pretrain" or "finetune") as the flags in `args` say; returns the held-out accuracy.

    That is top-1, or with `--objective masked-patch` the accuracy of the
    predicted mean colours of corrupted patches; that objective saves the
    encoder alone (no head) as `model.keras`, ready for fine-tuning.
    """
    masked_patch = args.objective == "masked-patch"
    if args.mixed_precision:
        keras.config.set_dtype_policy("mixed_bfloat16")
    keras.utils.set_random_seed(args.seed)
    engine = distribute.setup(args.distribution, model_parallel_size=args.model_parallel_size, tpu=args.tpu)
    engine.check_batch_size(args.batch_size)

    source = None
    if args.weights:
        source = read_checkpoint(args.weights, args.model, (args.image_size, args.image_size))
    sizes = model_sizes(args, source)
    check_image_size((args.image_size, args.image_size), sizes)
    train_source = data.load_source(args.dataset, args.train_split, args.data_dir, args.image_size)
    eval_source = data.load_source(args.dataset, args.eval_split, args.data_dir, args.image_size)
    num_classes = train_source.num_classes
    steps = data.steps_per_epoch(train_source, args.batch_size)
    accumulation = recipes.accumulation_steps(args.target_batch_size, args.batch_size)
    updates_per_epoch = steps // (accumulation or 1)
    total_updates = max(updates_per_epoch * args.epochs, 1)
    warmup = min(args.warmup_steps, total_updates)

    os.makedirs(args.output_dir, exist_ok=True)
    with engine.scope():
        model = ViT(
            image_size=args.image_size,
            **sizes.__dict__,
            classes=num_classes,
            include_top=not masked_patch,
            weights=source,
            representation_size=args.representation_size,
            classifier=args.classifier,
            dropout_rate=args.dropout,
            stochastic_depth_rate=args.stochastic_depth,
            classifier_activation=None,
            name=f"vit_{stage}",
        )
        if stage == "finetune":
            # The paper's fine-tuning: the whole head becomes one zero-initialised layer.
            head = model.get_layer("head")
            head.kernel.assign(np.zeros(head.kernel.shape, "float32"))
            head.bias.assign(np.zeros(head.bias.shape, "float32"))
            schedule = recipes.WarmupDecay(args.learning_rate, total_updates, warmup, "cosine")
            optimizer = recipes.finetuning_optimizer(
                schedule, global_clipnorm=args.clipnorm, ema_momentum=args.ema,
                gradient_accumulation_steps=accumulation,
            )
        else:
            schedule = recipes.WarmupDecay(args.learning_rate, total_updates, warmup, args.decay)
            optimizer = recipes.pretraining_optimizer(
                schedule, weight_decay=args.weight_decay, global_clipnorm=args.clipnorm,
                gradient_accumulation_steps=accumulation,
            )
        encoder = model
        if masked_patch:
            model = MaskedPatchPretrainer(encoder, seed=args.seed, name="masked_patch_pretrainer")
            model.compile(optimizer=optimizer, steps_per_execution=args.steps_per_execution)
        else:
            model.compile(
                optimizer=optimizer,
                loss=keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=args.label_smoothing),
                metrics=_metrics(num_classes),
                steps_per_execution=args.steps_per_execution,
            )

    backup_dir = os.path.join(args.output_dir, "backup")
    if not engine.is_chief:  # Every process restores its own state; only the chief's is shared.
        backup_dir = os.path.join(backup_dir, f"process_{engine.process_index}")
    initial_epoch = resumed_epoch(backup_dir)
    digits = args.dataset == "digits"
    augment = dict(
        augmenters=data.make_augmenters(args.randaugment, args.mixup, args.cutmix, args.seed),
        one_hot=True,
        min_crop_area=args.min_crop_area if args.min_crop_area is not None else (0.6 if digits else 0.05),
        flip=args.flip if args.flip is not None else not digits,
    )
    stream = data.training_stream(
        train_source, args.image_size, args.batch_size, args.epochs, initial_epoch, args.seed, **augment
    )
    # Multi-process JAX needs static batch sizes: the last partial evaluation batch is left out there.
    multi_process = engine.process_count > 1
    if multi_process and eval_source.num_examples % args.eval_batch_size:
        print(f"note: evaluating {eval_source.num_examples // args.eval_batch_size * args.eval_batch_size} "
              f"of {eval_source.num_examples} held-out examples (whole batches only across processes)")
    validation = data.make_dataset(eval_source, args.image_size, args.eval_batch_size, training=False, one_hot=True,
                                   num_classes=num_classes, drop_remainder=multi_process)
    if masked_patch:  # The targets come from the images themselves.
        stream, validation = data.images_only(stream), data.images_only(validation)
    callbacks = [
        keras.callbacks.BackupAndRestore(backup_dir),
        keras.callbacks.TerminateOnNaN(),
    ]
    if engine.is_chief:
        callbacks += [
            keras.callbacks.CSVLogger(os.path.join(args.output_dir, "log.csv"), append=initial_epoch > 0),
            keras.callbacks.TensorBoard(os.path.join(args.output_dir, "tensorboard")),
        ]
    history = model.fit(
        stream,
        epochs=args.epochs,
        initial_epoch=initial_epoch,
        steps_per_epoch=steps,
        validation_data=validation,
        callbacks=callbacks,
        shuffle=False,  # The stream is already shuffled, per (seed, epoch).
        verbose=args.verbose,
    )
    if history.history.get("loss") and not np.isfinite(history.history["loss"][-1]):
        raise RuntimeError("Training stopped: the loss became NaN (TerminateOnNaN).")
    results = model.evaluate(validation, verbose=0, return_dict=True)
    if not engine.is_chief:
        # Saving gathers the weights with a collective: every process must take part.
        scratch = os.path.join(args.output_dir, f".process_{engine.process_index}.keras")
        encoder.save(scratch)
        os.remove(scratch)
    else:
        encoder.save(os.path.join(args.output_dir, "model.keras"))
        if not masked_patch:
            with open(os.path.join(args.output_dir, "classes.txt"), "w") as f:
                f.writelines(f"{name}\n" for name in (train_source.class_names or range(num_classes)))
        plot_learning_curve(os.path.join(args.output_dir, "log.csv"), os.path.join(args.output_dir, "learning_curve.png"))
    metric = "corrupted_accuracy" if masked_patch else "top1"
    print(f"{_ACCURACY_TITLES[metric].lower()}: {results[metric]:.4f}")
    return results[metric]


def plot_learning_curve(log_path, png_path):
    """Loss and accuracy per epoch, training and held-out, from a CSVLogger file.

    The accuracy is top-1, or for masked patch prediction the corrupted-patch
    colour accuracy, whichever the file has.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(log_path) as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return
    epochs = [int(r["epoch"]) + 1 for r in rows]
    figure, (loss_axis, accuracy_axis) = plt.subplots(1, 2, figsize=(9, 3.5))
    for key, label in (("loss", "train"), ("val_loss", "held-out")):
        if key in rows[0]:
            loss_axis.plot(epochs, [float(r[key]) for r in rows], label=label)
    metric = next((name for name in _ACCURACY_TITLES if name in rows[0]), "top1")
    for key, label in ((metric, "train"), (f"val_{metric}", "held-out")):
        if key in rows[0]:
            accuracy_axis.plot(epochs, [float(r[key]) for r in rows], label=label)
    title = _ACCURACY_TITLES[metric]
    loss_axis.set(xlabel="epoch", ylabel="loss", title="Loss")
    accuracy_axis.set(xlabel="epoch", ylabel=title.lower(), title=title, ylim=(0, 1))
    loss_axis.legend(), accuracy_axis.legend()
    figure.tight_layout()
    figure.savefig(png_path, dpi=100)
    plt.close(figure)


def load_for_inference(args):
    """A model from `--weights` (a `.keras` file, an `.npz` or a named checkpoint)."""
    weights = args.weights
    if weights.endswith(".keras") and os.path.exists(weights):
        return keras.saving.load_model(weights, compile=False)
    source = read_checkpoint(weights, args.model, (args.image_size, args.image_size))
    sizes = model_sizes(args, source)
    return ViT(image_size=args.image_size, **sizes.__dict__, weights=source, classifier_activation=None)


def _check_has_classifier(model, weights):
    if len(model.output_shape) != 2:
        raise ValueError(
            f"{weights} is an encoder without a classifier (its output has shape {model.output_shape}), "
            "for example from `pretrain --objective masked-patch`; fine-tune it first: "
            f"examples/finetune.py --weights {weights}"
        )


def _outputs_logits(model):
    try:
        activation = model.get_layer("predictions").activation
    except ValueError:
        return True
    return activation is keras.activations.linear or getattr(activation, "__name__", "") == "linear"


def evaluate(args):
    """Top-1 and top-5 of a saved model on a data-set split."""
    model = load_for_inference(args)
    _check_has_classifier(model, args.weights)
    image_size = model.input_shape[1]
    num_classes = model.output_shape[-1]
    source = data.load_source(args.dataset, args.eval_split, args.data_dir, image_size)
    dataset = data.make_dataset(source, image_size, args.eval_batch_size, training=False, one_hot=True,
                                num_classes=num_classes)
    model.compile(loss=keras.losses.CategoricalCrossentropy(from_logits=_outputs_logits(model)),
                  metrics=_metrics(num_classes))
    results = model.evaluate(dataset, verbose=args.verbose, return_dict=True)
    print(f"top-1 accuracy: {results['top1']:.4f}")
    print(f"top-5 accuracy: {results['top5']:.4f}")
    return results


def class_names(args, model):
    """Names for the model's outputs: --labels, classes.txt beside the model, or ImageNet's."""
    path = args.labels or os.path.join(os.path.dirname(os.path.abspath(args.weights)), "classes.txt")
    if os.path.exists(path):
        with open(path) as f:
            return [line.strip() for line in f]
    if model.output_shape[-1] == 1000:
        return [name for _, name in imagenet_labels()]
    return [str(i) for i in range(model.output_shape[-1])]


def predict(args):
    """Print the top-5 classes of each image file."""
    import tensorflow as tf

    model = load_for_inference(args)
    _check_has_classifier(model, args.weights)
    size = model.input_shape[1:3]
    names = class_names(args, model)
    results = []
    for path in args.images:
        if not os.path.exists(path):
            raise FileNotFoundError(f"Image not found: {path}")
        image = tf.io.decode_image(tf.io.read_file(path), channels=3, expand_animations=False)
        image = data.value_range(data.resize(image, size, args.crop_fraction))
        scores = keras.ops.convert_to_numpy(model(image.numpy()[None], training=False))[0].astype("float64")
        probabilities = scores
        if _outputs_logits(model):
            probabilities = np.exp(scores - scores.max())
            probabilities /= probabilities.sum()
        best = np.argsort(probabilities)[::-1][:5]
        print(path)
        for index in best:
            print(f"  {names[index]:>24s}  {probabilities[index]:.4f}")
        results.append([(names[i], float(probabilities[i])) for i in best])
    return results


def inspect(args):
    """Write attention rollout, mean attention distance, position-embedding and filter plots."""
    import tensorflow as tf

    from keras_vit import analysis

    model = load_for_inference(args)
    if not os.path.exists(args.image):
        raise FileNotFoundError(f"Image not found: {args.image}")
    image = tf.io.decode_image(tf.io.read_file(args.image), channels=3, expand_animations=False)
    image = tf.cast(tf.clip_by_value(data.resize(image, model.input_shape[1:3]), 0, 255), "uint8").numpy()
    written = analysis.inspect(model, image, args.output_dir)
    for path in written.values():
        print("wrote", path)
    return written


def convert(args):
    """Convert a checkpoint (original `.npz`, `.weights.h5`) to a `.keras` model."""
    source = read_checkpoint(args.weights, args.model, (args.image_size or 224,) * 2)
    sizes = model_sizes(args, source)
    image_size = args.image_size or (source.image_size[0] if source.image_size else 224)
    model = ViT(image_size=image_size, **sizes.__dict__, weights=source, classes=args.classes)
    model.save(args.output)
    print(f"wrote {args.output}: {model.name}, {model.count_params():,} parameters, {image_size} px")
    return model
