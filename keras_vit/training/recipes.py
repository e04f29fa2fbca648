"""The paper's training recipes (Appendix B) as reusable Keras objects.

Pretraining: Adam (0.9, 0.999) with decoupled weight decay 0.1 on kernels
only, linear warmup (10k steps) then linear decay, global-norm clipping 1.0,
batch 4096 (reached by gradient accumulation when devices cannot hold it).
Fine-tuning: SGD with momentum 0.9, no weight decay, warmup then cosine
decay, clipping 1.0, batch 512, optional Polyak averaging and label smoothing;
or, as BEiT, MAE, DeiT and EVA-02 fine-tune, AdamW or LAMB with timm's
parameter groups and layer-wise rate decay (`finetuning_optimizer(opt=...)`).
"""

from keras_vit.configs import OPTIMIZERS, check_optimizer  # noqa: F401 (OPTIMIZERS public here too)
from keras_vit.fine_tuning_recipes import RECIPES, Recipe, recipe_settings  # noqa: F401 (public here too)
from keras_vit.training import param_groups
from keras_vit.training.optimizers import (  # noqa: F401 (public here too)
    SGD,
    AdamW,
    LayerDecayAdamW,
    LayerDecayLamb,
    WarmupDecay,
)
# The share of a run's updates its warmup takes by default (timm's 5 warmup epochs of 100 are 0.05; guide 2's 0.1).
WARMUP_SHARE = 0.1
# The paper's warmups: 500 updates fine-tuning (batch 512), 10k pretraining (batch 4096).
FINETUNING_WARMUP, PRETRAINING_WARMUP = 500, 10_000

# Variables that get no weight decay: everything but the kernels.
NO_DECAY = ("bias", "gamma", "beta", "cls", "pos_embedding")


def accumulation_steps(target_batch_size, device_batch_size):
    """Micro-batches to accumulate so that `device_batch_size` reaches the target batch."""
    if target_batch_size is None or target_batch_size <= device_batch_size:
        return None
    if target_batch_size % device_batch_size:
        raise ValueError(
            f"Target batch {target_batch_size} is not a multiple of the batch {device_batch_size}."
        )
    return target_batch_size // device_batch_size


def warmup_updates(total_updates, warmup_steps=None, longest=FINETUNING_WARMUP, share=None):
    """The warmup of a run of `total_updates`: `warmup_steps` where given (at most the run), else `share` of the
    updates (a recipe's warmup epochs over its epochs), else `WARMUP_SHARE` of them (as timm's warmup epochs and
    guide 2's are) at most `longest`.

    A warmup that outlasts the run would leave its first (or only) update at rate 0.

    Example:
    >>> warmup_updates(1000), warmup_updates(3), warmup_updates(3, warmup_steps=2)
    (100, 0, 2)
    """
    if warmup_steps is not None:
        return min(int(warmup_steps), total_updates)
    if share is not None:
        return int(total_updates * share)
    return min(int(total_updates * WARMUP_SHARE), longest)


def pretraining_optimizer(
    learning_rate, weight_decay=0.1, global_clipnorm=1.0, beta_1=0.9, beta_2=0.999, gradient_accumulation_steps=None,
    model=None,
):
    """Adam with decoupled weight decay on kernels only and global-norm clipping.

    The variables named in `NO_DECAY` are not decayed, nor, with `model`,
    those timm's parameter groups leave undecayed (`param_groups`: every
    1-D variable, and the tables and tokens each class lists: register
    tokens, relative position tables, layer scales, ...).

    Example:
    >>> optimizer = pretraining_optimizer(WarmupDecay(1e-3, 100_000, 10_000))
    """
    optimizer = AdamW(
        learning_rate=learning_rate,
        weight_decay=weight_decay,
        beta_1=beta_1,
        beta_2=beta_2,
        global_clipnorm=global_clipnorm,
        gradient_accumulation_steps=gradient_accumulation_steps,
    )
    undecayed = []
    if model is not None:
        groups = param_groups.parameter_groups(model)
        undecayed = [variable for variable in model.trainable_weights if not groups[variable.path][1]]
    optimizer.exclude_from_weight_decay(var_list=undecayed, var_names=list(NO_DECAY))
    return optimizer


def finetuning_optimizer(
    learning_rate, momentum=0.9, global_clipnorm=1.0, ema_momentum=None, gradient_accumulation_steps=None,
    opt="sgd", weight_decay=None, layer_decay=None, model=None,
):
    """The fine-tuning optimizer `opt`, with global-norm clipping and optional EMA (e.g. 0.9999).

    - `"sgd"`: the paper's SGD with momentum, no weight decay.
    - `"adamw"`, `"lamb"`: torch's AdamW or timm's LAMB over `model`'s
      trainable variables with timm's parameter groups: no decay on 1-D
      variables and the class's `no_weight_decay()` names, and with
      `layer_decay` each variable's rate scaled by
      `layer_decay ** (last layer - its layer)` (`param_groups`); weight
      decay 0.05 unless `weight_decay` says otherwise.

    Example:
    >>> optimizer = finetuning_optimizer(WarmupDecay(0.03, 10_000, 500, "cosine"))
    """
    check_optimizer(opt, weight_decay, layer_decay)
    if opt != "sgd":
        if model is None:
            raise ValueError(f"opt={opt!r} groups the variables of the model it trains as timm does: pass model=.")
        groups = param_groups.parameter_groups(model, layer_decay)
        split = param_groups.split_tensors(model) if opt == "lamb" else None
        if split:
            raise ValueError(f"LAMB's trust ratio is one per timm tensor, and timm holds {split} apart, where "
                             f"{model.name} fuses them: use opt='adamw' (--opt adamw), which steps them alike.")
        optimizer_class = LayerDecayAdamW if opt == "adamw" else LayerDecayLamb
        return optimizer_class(
            learning_rate, groups, weight_decay=0.05 if weight_decay is None else weight_decay,
            global_clipnorm=global_clipnorm, use_ema=ema_momentum is not None, ema_momentum=ema_momentum or 0.99,
            gradient_accumulation_steps=gradient_accumulation_steps)
    return SGD(
        learning_rate=learning_rate,
        momentum=momentum,
        global_clipnorm=global_clipnorm,
        use_ema=ema_momentum is not None,
        ema_momentum=ema_momentum or 0.99,
        gradient_accumulation_steps=gradient_accumulation_steps,
    )

