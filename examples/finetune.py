"""Fine-tune a ViT at a higher resolution with the paper's recipe, then evaluate.

With `--image-size 32` this is the second half of the digits example: it
loads runs/pretrain/model.keras (from examples/pretrain.py) at 32 px instead
of 16 (the position embeddings are resized; without the flag it stays at
the checkpoint's own 16 px), replaces the head with a zero-initialised one,
fine-tunes for 10 epochs with SGD and a cosine schedule, writes
runs/finetune/ and prints `top-1 accuracy: 0.xxxx`:

    python examples/pretrain.py && python examples/finetune.py --image-size 32

Named checkpoints work as well:

    python examples/finetune.py --model ViT_B16 --weights imagenet21k --dataset oxford_iiit_pet --image-size 384

The flags are those of `keras-vit finetune` (see `--help`), which runs these
same steps in one call, `keras_vit.training.train(FinetuneConfig(...))`.
"""

import os

import keras

import keras_vit
from keras_vit import checkpoints, data, training
from keras_vit.applications.vit import check_image_size
from keras_vit.flags import parse_config
from keras_vit.training import durable, losses, recipes

config = parse_config(training.FinetuneConfig, description=__doc__.splitlines()[0])

# Seeds, the distribution engine (one device by default) and the precision.
engine = training.setup(config.seed, config.distribution, config.model_parallel_size, config.tpu)
dtype = training.precision(config.mixed_precision, config.distribution)  # float32, or mixed_bfloat16 when asked
engine.check_batch_size(config.batch_size)
# A finished --output-dir is not trained again, nor are --weights replaced by their own run, without --overwrite.
durable.check_output_dir(config.output_dir, config.overwrite, config.weights, engine.process_index)

# The pretrained weights, and the sizes they were trained with (or --model's);
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
# The recipe (--recipe: the paper's SGD, or MAE's, BEiT v2's, EVA-02's AdamW with layer decay) fills every
# setting left open, for this model's depth and this run's batch; the flags given override it.
config, warmup_share, note = config.with_recipe(sizes.num_layers, config.target_batch_size or config.batch_size)
print(note)
warmup = recipes.warmup_updates(total_updates, config.warmup_steps, config.longest_warmup, warmup_share)

os.makedirs(config.output_dir, exist_ok=True)
with engine.scope():
    # The model at the new resolution (ViT resizes the checkpoint's position embeddings),
    # without the checkpoint's pre-logits layer (representation_size=0), as in the paper.
    model = keras_vit.ViT(
        image_size=config.image_size, **sizes.__dict__, classes=num_classes, weights=checkpoint,
        representation_size=0, classifier=config.classifier, dropout_rate=config.dropout,
        stochastic_depth_rate=config.stochastic_depth, classifier_activation=None, name="vit_finetune",
        dtype=dtype, drop_remainder=config.drop_remainder,
    )
    training.zero_head(model)  # The paper's fine-tuning head: one zero-initialised layer.
    if config.lora_rank:  # Low-rank adapters on every block's qkv: only they and the head train.
        keras_vit.enable_lora(model, config.lora_rank)
    # Warmup then cosine decay, global-norm clipping; the paper's SGD with momentum, or --opt adamw / lamb with
    # timm's parameter groups (and --layer-decay), as BEiT and MAE fine-tune.
    schedule = recipes.WarmupDecay(config.learning_rate, total_updates, warmup, "cosine")
    optimizer = recipes.finetuning_optimizer(schedule, global_clipnorm=config.clipnorm, ema_momentum=config.ema,
                                             gradient_accumulation_steps=accumulation, opt=config.opt,
                                             weight_decay=config.weight_decay, layer_decay=config.layer_decay,
                                             model=model)
    model.compile(
        optimizer=optimizer,
        # The softmax crossentropy, or with --bce-loss timm's binary cross-entropy of each class (DeiT III's).
        loss=losses.BinaryCrossentropyOfClasses(config.label_smoothing, config.bce_target_thresh) if config.bce_loss
        else keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=config.label_smoothing),
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
    multi_process=engine.process_count > 1, workers=config.workers,
    eval_transform=training.evaluation_transform(model),  # the checkpoint's own, which model.keras keeps
    # --reprob: timm's random erasing, its noise in the model's own normalized space
    reprob=config.reprob, pixel_statistics=training.pixel_statistics(model),
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

# model.keras, classes.txt and learning_curve.png in runs/finetune/.
training.save_run(model, config.output_dir, train_source.class_names or range(num_classes), engine.process_index)
durable.finish(backup)  # The training state goes only once model.keras is written.
print(f"top-1 accuracy: {results['top1']:.4f}")
