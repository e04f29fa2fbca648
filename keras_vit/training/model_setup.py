"""A run's engine, precision, optimizer recipe and compiled model.

Example:
>>> from keras_vit.training import model_setup
>>> optimizer = model_setup.finetuning_recipe(0.01, total_updates=100)  # doctest: +SKIP
"""

import keras
import numpy as np

from keras_vit.fine_tuning_recipes import RECIPE_FIELDS
from keras_vit.training import distribute, losses, recipes
from keras_vit.training.masked_patch import MaskedPatchPretrainer


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
