"""`train(config)`: a `PretrainConfig` or `FinetuneConfig` run end to end, from its inputs to model.keras.

Example:
>>> from keras_vit.training import run
>>> from keras_vit.configs import PretrainConfig
>>> run.train(PretrainConfig(epochs=1))  # doctest: +SKIP
"""

import dataclasses
import os

from keras_vit import checkpoints, data
from keras_vit.applications.vit import ViT
from keras_vit.configs import path_errors, raise_all
from keras_vit.model.lora import enable_lora
from keras_vit.model.vision_transformer import check_image_size
from keras_vit.training import durable, recipes
from keras_vit.training.durable import backup_dir, resumed_epoch
from keras_vit.training.inputs import (
    augmentation_defaults,
    evaluation_transform,
    fitted_batch_size,
    load_sources,
    pixel_statistics,
    training_data,
)
from keras_vit.training.model_setup import (
    compile_model,
    finetuning_recipe,
    precision,
    pretraining_recipe,
    setup,
    training_settings,
    update_steps,
    zero_head,
)
from keras_vit.training.run_outputs import check_finite, make_callbacks, report, save_run


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


def note_short_average(ema, total_updates):
    """Say where the EMA's momentum averages over more updates than the run has: Keras puts the average in the
    weights when fit ends, which then stay close to where the run started (DeiT's 0.99996 spans 25,000 updates)."""
    if ema and total_updates < 1.0 / (1.0 - ema):
        print(f"note: --ema {ema:g} averages over about {round(1.0 / (1.0 - ema)):,} updates, more than this run's "
              f"{total_updates:,}; the saved weights, which are the average, stay close to the starting ones "
              "(--ema 0 turns it off)")


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
    warmup_share = None
    if stage == "finetune":  # the recipe fills what the user left open, and says so
        config, warmup_share, note = config.with_recipe(sizes.num_layers,
                                                        config.target_batch_size or config.batch_size)
        print(note)
    steps = data.steps_per_epoch(train_source, config.batch_size, config.aug_repeats)
    accumulation = recipes.accumulation_steps(config.target_batch_size, config.batch_size)
    total_updates = update_steps(steps, config.epochs, accumulation)
    note_short_average(getattr(config, "ema", None), total_updates)
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
        pixel_statistics=pixel_statistics(encoder), aug_repeats=config.aug_repeats,
        three_augment=config.three_augment, color_jitter=config.color_jitter,
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
