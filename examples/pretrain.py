"""Pretrain a ViT from scratch with the paper's recipe (Adam, weight decay, warmup).

With no flags this is the digits example: it runs offline on the embedded
digits (UCI's handwritten digits, shipped with keras_vit, upsampled), trains the small ViT
(`keras_vit.model.variants.SMALL_VIT`) at 16 px for 60 epochs and saves it to
runs/pretrain/model.keras for examples/finetune.py:

    python examples/pretrain.py

Any tensorflow-datasets name, image folder, variant and checkpoint work too:

    python examples/pretrain.py --dataset cifar10 --model ViT_S16 --image-size 224

The flags are those of `keras-vit pretrain` (see `--help`), which runs these
same steps in one call, `keras_vit.training.train(PretrainConfig(...))`.
"""

import os

import keras

import keras_vit
from keras_vit import checkpoints, data, training
from keras_vit.applications.vit import check_image_size
from keras_vit.flags import parse_config
from keras_vit.training import durable, recipes

config = parse_config(training.PretrainConfig, description=__doc__.splitlines()[0])
masked_patch = config.objective == "masked-patch"  # self-supervised: predict corrupted patches' colours

# Seeds, the distribution engine (one device by default) and the precision.
engine = training.setup(config.seed, config.distribution, config.model_parallel_size, config.tpu)
dtype = training.precision(config.mixed_precision, config.distribution)  # float32, or mixed_bfloat16 when asked
engine.check_batch_size(config.batch_size)
# A finished --output-dir is not trained again, nor are --weights replaced by their own run, without --overwrite.
durable.check_output_dir(config.output_dir, config.overwrite, config.weights, engine.process_index)

# The sizes: --model, else those of --weights, else the size flags (the small digits ViT);
# the resolution: --image-size, else that of --weights, else the digits'.
checkpoint = None
if config.weights:  # a named checkpoint's file at --image-size, else at 224 px where it has one
    checkpoint = checkpoints.read_weights(config.weights, config.model, config.image_size or (224, 224))
config = config.at_checkpoint_size(checkpoint)
sizes = config.sizes(checkpoint)
check_image_size(config.image_size, sizes, config.drop_remainder)

# The data: training and held-out splits (the embedded digits by default).
train_source, eval_source = training.load_sources(config.dataset, config.image_size, config.train_split,
                                                  config.eval_split, config.data_dir, config.holdout_fraction)
num_classes = train_source.num_classes
steps = data.steps_per_epoch(train_source, config.batch_size)
accumulation = recipes.accumulation_steps(config.target_batch_size, config.batch_size)
total_updates = training.update_steps(steps, config.epochs, accumulation)

os.makedirs(config.output_dir, exist_ok=True)
with engine.scope():
    # The model, with logits out (the loss applies the softmax).
    encoder = keras_vit.ViT(
        image_size=config.image_size, **sizes.__dict__, classes=num_classes, include_top=not masked_patch,
        weights=checkpoint, representation_size=config.representation_size, classifier=config.classifier,
        dropout_rate=config.dropout, stochastic_depth_rate=config.stochastic_depth, classifier_activation=None,
        name="vit_pretrain", dtype=dtype, drop_remainder=config.drop_remainder,
    )
    # The paper's recipe: AdamW, linear warmup then linear (or cosine) decay, global-norm clipping.
    warmup = recipes.warmup_updates(total_updates, config.warmup_steps, config.longest_warmup)
    schedule = recipes.WarmupDecay(config.learning_rate, total_updates, warmup, config.decay)
    optimizer = recipes.pretraining_optimizer(schedule, weight_decay=config.weight_decay,
                                              global_clipnorm=config.clipnorm, gradient_accumulation_steps=accumulation,
                                              model=encoder)
    if masked_patch:
        model = keras_vit.MaskedPatchPretrainer(encoder, seed=config.seed, name="masked_patch_pretrainer")
        model.compile(optimizer=optimizer, steps_per_execution=config.steps_per_execution)
    else:
        model = encoder
        model.compile(
            optimizer=optimizer,
            loss=keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=config.label_smoothing),
            metrics=training.accuracy_metrics(num_classes),  # "top1" and "top5"
            steps_per_execution=config.steps_per_execution,
        )

# A killed run restarts from its last finished epoch: DurableBackup keeps the state (a new set
# each epoch, renamed into place), and the augmented batches depend on (seed, epoch) alone.
backup = training.backup_dir(config.output_dir, engine.process_index)
initial_epoch = training.resumed_epoch(backup)
min_crop_area, flip = training.augmentation_defaults(config.dataset, config.min_crop_area, config.flip)
stream, validation = training.training_data(
    train_source, eval_source, config.image_size, config.batch_size, config.epochs, initial_epoch, config.seed,
    config.eval_batch_size, config.randaugment, config.mixup, config.cutmix, min_crop_area, flip,
    images_only=masked_patch, multi_process=engine.process_count > 1, workers=config.workers,
)
callbacks = [durable.DurableBackup(backup, initial_epoch), keras.callbacks.TerminateOnNaN()]
if engine.is_chief:  # One process writes the logs; log.csv first, so it has a row for every backed-up epoch.
    callbacks = [
        durable.DurableLog(os.path.join(config.output_dir, "log.csv"), initial_epoch),
        *callbacks,
        *training.tensorboard_callbacks(os.path.join(config.output_dir, "tensorboard")),  # if installed
    ]

history = model.fit(
    stream,
    epochs=config.epochs,
    initial_epoch=initial_epoch,
    steps_per_epoch=steps,
    validation_data=validation,
    callbacks=callbacks,
    shuffle=False,  # The stream is already shuffled, per (seed, epoch).
    verbose=config.verbose,
)
training.check_finite(history, backup, config.learning_rate)  # a NaN stop says how to resume
results = model.evaluate(validation, verbose=0, return_dict=True)

# model.keras (the encoder alone for masked patch prediction), classes.txt, learning_curve.png.
class_names = None if masked_patch else (train_source.class_names or range(num_classes))
training.save_run(encoder, config.output_dir, class_names, engine.process_index)
durable.finish(backup)  # The training state goes only once model.keras is written.
training.report(results)  # prints "top-1 accuracy: 0.xxxx"
