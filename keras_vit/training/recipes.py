"""The paper's training recipes (Appendix B) as reusable Keras objects.

Pretraining: Adam (0.9, 0.999) with decoupled weight decay 0.1 on kernels
only, linear warmup (10k steps) then linear decay, global-norm clipping 1.0,
batch 4096 (reached by gradient accumulation when devices cannot hold it).
Fine-tuning: SGD with momentum 0.9, no weight decay, warmup then cosine
decay, clipping 1.0, batch 512, optional Polyak averaging and label smoothing.
"""

import math

import keras
from keras import ops

from keras_vit.utils.keras_internals import check_optimizer_hooks

# Variables that get no weight decay: everything but the kernels.
NO_DECAY = ("bias", "gamma", "beta", "cls", "pos_embedding")


@keras.saving.register_keras_serializable(package="keras_vit")
class WarmupDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup from 0 to `peak_learning_rate`, then linear or cosine decay.

    Example:
    >>> schedule = WarmupDecay(1e-3, total_steps=100, warmup_steps=10, decay="cosine")
    >>> float(schedule(10))
    0.001
    """

    DECAYS = ("linear", "cosine")

    def __init__(self, peak_learning_rate, total_steps, warmup_steps=0, decay="linear", end_learning_rate=0.0):
        if decay not in self.DECAYS:
            raise ValueError(f"Unknown decay {decay!r}; expected one of {self.DECAYS}.")
        if not 0 <= warmup_steps <= total_steps or total_steps <= 0:
            raise ValueError(
                f"Need 0 <= warmup_steps <= total_steps and total_steps > 0, got {warmup_steps}, {total_steps}."
            )
        self.peak_learning_rate = float(peak_learning_rate)
        self.total_steps = int(total_steps)
        self.warmup_steps = int(warmup_steps)
        self.decay = decay
        self.end_learning_rate = float(end_learning_rate)

    def __call__(self, step):
        step = ops.cast(step, "float32")
        peak, end = self.peak_learning_rate, self.end_learning_rate
        warmup = peak * step / max(self.warmup_steps, 1)
        progress = (step - self.warmup_steps) / max(self.total_steps - self.warmup_steps, 1)
        progress = ops.clip(progress, 0.0, 1.0)
        if self.decay == "cosine":
            decayed = end + (peak - end) * 0.5 * (1.0 + ops.cos(math.pi * progress))
        else:
            decayed = peak + (end - peak) * progress
        return ops.where(step < self.warmup_steps, warmup, decayed)

    def get_config(self):
        return dict(
            peak_learning_rate=self.peak_learning_rate,
            total_steps=self.total_steps,
            warmup_steps=self.warmup_steps,
            decay=self.decay,
            end_learning_rate=self.end_learning_rate,
        )


def accumulation_steps(target_batch_size, device_batch_size):
    """Micro-batches to accumulate so that `device_batch_size` reaches the target batch."""
    if target_batch_size is None or target_batch_size <= device_batch_size:
        return None
    if target_batch_size % device_batch_size:
        raise ValueError(
            f"Target batch {target_batch_size} is not a multiple of the batch {device_batch_size}."
        )
    return target_batch_size // device_batch_size


def _in_tf_replica_context():
    if keras.backend.backend() != "tensorflow":
        return False
    import tensorflow as tf

    return tf.distribute.has_strategy() and not tf.distribute.in_cross_replica_context()


class _RecipeOptimizer:
    """What the recipes' optimizers add to Keras': schedules in updates, clipping after the all-reduce.

    - A learning-rate schedule is evaluated at `iterations`, the number of
      updates. Keras (3.15) evaluates it at the count of micro-batches, so
      under gradient accumulation a schedule sized in updates would reach
      its end early and train the rest of the run at its final rate (0).
    - With Polyak averaging (EMA), the model's variables get a copy of the
      averages at the end of `fit`, not the optimizer's own arrays.
    - Under TensorFlow distribution strategies Keras clips each replica's
      share of the gradient before the all-reduce, so `global_clipnorm`
      gives a different update on N replicas than on one device. The
      clipping is moved after the all-reduce; elsewhere it changes nothing.

    The first needs a private `Optimizer` method overridden and the last
    two (Keras has no public hook there); `keras_internals.check_optimizer_hooks`
    refuses a Keras that lacks them rather than let the overrides lapse.
    """

    def __init__(self, *args, **kwargs):
        check_optimizer_hooks(self, overridden=("_get_current_learning_rate", "_clip_gradients",
                                                 "_backend_update_step"))
        super().__init__(*args, **kwargs)

    def apply(self, grads, trainable_variables=None):
        if self.gradient_accumulation_steps and _in_tf_replica_context():
            raise NotImplementedError(
                "Gradient accumulation does not run under a TensorFlow distribution strategy in Keras "
                f"{keras.version()} (its conditional update needs a merge_call inside tf.cond). Use a batch that "
                "fits without accumulation (no --target-batch-size), or the JAX backend's keras.distribution."
            )
        return super().apply(grads, trainable_variables)

    def finalize_variable_values(self, var_list):
        super().finalize_variable_values(var_list)
        if self.use_ema:
            # Keras assigns the average itself, so on JAX the model and the optimizer share one buffer, which
            # the next evaluate() donates: saving then fails with "Array has been deleted".
            for variable in var_list:
                variable.assign(ops.copy(variable))

    def _get_current_learning_rate(self):
        if isinstance(self._learning_rate, keras.optimizers.schedules.LearningRateSchedule):
            return self._learning_rate(self.iterations)
        return super()._get_current_learning_rate()

    def _clip_gradients(self, grads):
        if _in_tf_replica_context():
            return grads  # Clipped in _backend_update_step, once summed.
        return super()._clip_gradients(grads)

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        if not _in_tf_replica_context():
            return super()._backend_update_step(grads, trainable_variables, learning_rate)
        import tensorflow as tf

        # Keras' own TensorFlow step, written with tf.distribute's public API, with the clipping after the sum.
        pairs = [(grad, variable.value if isinstance(variable, keras.Variable) else variable)
                 for grad, variable in zip(grads, trainable_variables) if grad is not None]
        context = tf.distribute.get_replica_context()
        summed = context.all_reduce(tf.distribute.ReduceOp.SUM, [grad for grad, _ in pairs])
        clipped = super()._clip_gradients(summed)

        def update_each(strategy, pairs, learning_rate):
            for grad, variable in pairs:
                strategy.extended.update(variable, lambda v, g, rate: self.update_step(g, v, rate),
                                         args=(grad, learning_rate), group=False)

        context.merge_call(update_each, args=([(g, v) for g, (_, v) in zip(clipped, pairs)], learning_rate))


@keras.saving.register_keras_serializable(package="keras_vit")
class AdamW(_RecipeOptimizer, keras.optimizers.AdamW):
    """`keras.optimizers.AdamW` with a schedule in updates and clipping alike on any number of replicas."""


@keras.saving.register_keras_serializable(package="keras_vit")
class SGD(_RecipeOptimizer, keras.optimizers.SGD):
    """`keras.optimizers.SGD` with a schedule in updates and clipping alike on any number of replicas."""


def pretraining_optimizer(
    learning_rate, weight_decay=0.1, global_clipnorm=1.0, beta_1=0.9, beta_2=0.999, gradient_accumulation_steps=None
):
    """Adam with decoupled weight decay on kernels only and global-norm clipping.

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
    optimizer.exclude_from_weight_decay(var_names=list(NO_DECAY))
    return optimizer


def finetuning_optimizer(
    learning_rate, momentum=0.9, global_clipnorm=1.0, ema_momentum=None, gradient_accumulation_steps=None
):
    """SGD with momentum, no weight decay, global-norm clipping, optional EMA (e.g. 0.9999).

    Example:
    >>> optimizer = finetuning_optimizer(WarmupDecay(0.03, 10_000, 500, "cosine"))
    """
    return SGD(
        learning_rate=learning_rate,
        momentum=momentum,
        global_clipnorm=global_clipnorm,
        use_ema=ema_momentum is not None,
        ema_momentum=ema_momentum or 0.99,
        gradient_accumulation_steps=gradient_accumulation_steps,
    )
