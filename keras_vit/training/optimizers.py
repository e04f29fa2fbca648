"""The optimizers of the training recipes, and the schedule they run on.

- `AdamW` and `SGD`: Keras' own, with the schedule evaluated in updates and
  the clipping after the all-reduce (`_RecipeOptimizer`): the paper's.
- `LayerDecayAdamW` and `LayerDecayLamb`: torch's `AdamW` and timm's `Lamb`,
  step for step, with each variable's own rate scale and weight decay
  (`param_groups.parameter_groups`: timm's layer-wise rate decay and
  no-decay lists), for the recipes of BEiT, MAE, DeiT, DeiT III and EVA-02.
- `WarmupDecay`: linear warmup, then linear or cosine decay.

Example:
>>> import keras_vit
>>> from keras_vit.training import param_groups
>>> model = keras_vit.ViT(image_size=32, patch_size=8, hidden_size=24, num_layers=2, num_heads=3, mlp_dim=48,
...                       classes=5)
>>> optimizer = LayerDecayAdamW(WarmupDecay(1e-3, 100, 5, "cosine"),
...                             param_groups.parameter_groups(model, layer_decay=0.65), weight_decay=0.05)
"""

import math

import keras
from keras import ops

from keras_vit.layers import kernels
from keras_vit.utils.keras_internals import check_optimizer_hooks


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




def _dense(gradient):
    """`gradient` as one dense tensor: TensorFlow gives a gathered table (relative positions) `IndexedSlices`,
    whose rows Keras' sparse arithmetic would step as if the other rows had no moments to decay."""
    if keras.backend.backend() != "tensorflow":
        return gradient
    import tensorflow as tf

    return tf.convert_to_tensor(gradient) if isinstance(gradient, tf.IndexedSlices) else gradient


class _LayerDecay(_RecipeOptimizer):
    """What both timm-grouped optimizers share: each variable's rate scale and decay, taken by its path.

    `parameter_groups`: `{variable path: (rate scale, decays)}` for every
    variable the optimizer updates (`param_groups.parameter_groups`). The
    rate in force for a variable is the schedule's times its scale, and
    its weight decay is taken at that scaled rate, as torch applies a
    param group's `lr` to both.
    """

    def __init__(self, learning_rate, parameter_groups, weight_decay=0.05, **kwargs):
        if weight_decay is None or weight_decay < 0:
            raise ValueError(f"weight_decay must be at least 0, got {weight_decay!r}.")
        super().__init__(learning_rate=learning_rate, **kwargs)
        self.parameter_groups = {str(path): (float(scale), bool(decays))
                                 for path, (scale, decays) in dict(parameter_groups).items()}
        self.decoupled_weight_decay = float(weight_decay)

    def build(self, var_list):
        if self.built:
            return
        missing = [variable.path for variable in var_list if variable.path not in self.parameter_groups]
        if missing:
            raise ValueError(
                f"{type(self).__name__} has no parameter group for {', '.join(missing[:3])}"
                f"{f' and {len(missing) - 3} more' if len(missing) > 3 else ''}: build it from the model it trains, "
                "after enable_lora or any other change to what is trainable "
                "(param_groups.parameter_groups(model, layer_decay)).")
        super().build(var_list)
        self._momentums, self._velocities = self.add_optimizer_variables(var_list, ["momentum", "velocity"])
        self._scales = [self.parameter_groups[variable.path][0] for variable in var_list]
        self._decays = [self.parameter_groups[variable.path][1] and self.decoupled_weight_decay > 0
                        for variable in var_list]

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        """On PyTorch, the whole step by the class's `_torch_kernel` (torch's `_foreach_` ops per param group)."""
        if not kernels.use_torch_kernels():
            return super()._backend_update_step(grads, trainable_variables, learning_rate)
        indices = [self._get_variable_index(variable) for variable in trainable_variables]
        getattr(kernels, self._torch_kernel)(
            trainable_variables, [_dense(grad) for grad in grads], [self._momentums[i] for i in indices],
            [self._velocities[i] for i in indices], int(ops.convert_to_numpy(self.iterations)) + 1,
            ops.convert_to_numpy(learning_rate), [(self._scales[i], self._decays[i]) for i in indices],
            self.decoupled_weight_decay, self.beta_1, self.beta_2, self.epsilon)

    def _moments(self, gradient, variable):
        """Update and return the variable's first and second moments (torch's `lerp_` and `addcmul_`) and
        the bias corrections of this step."""
        index = self._get_variable_index(variable)
        m, v = self._momentums[index], self._velocities[index]
        step = ops.cast(self.iterations + 1, variable.dtype)
        self.assign_add(m, ops.multiply(ops.subtract(gradient, m), 1 - self.beta_1))
        self.assign(v, ops.add(ops.multiply(v, self.beta_2), ops.multiply(ops.square(gradient), 1 - self.beta_2)))
        correction_1 = 1 - ops.power(ops.cast(self.beta_1, variable.dtype), step)
        correction_2 = 1 - ops.power(ops.cast(self.beta_2, variable.dtype), step)
        return m, v, correction_1, correction_2, self._scales[index], self._decays[index]

    def get_config(self):
        config = super().get_config()
        config.update(parameter_groups={path: list(group) for path, group in self.parameter_groups.items()},
                      weight_decay=self.decoupled_weight_decay, beta_1=self.beta_1, beta_2=self.beta_2,
                      epsilon=self.epsilon)
        return config


@keras.saving.register_keras_serializable(package="keras_vit")
class LayerDecayAdamW(_LayerDecay, keras.optimizers.Optimizer):
    """torch's `AdamW` with timm's parameter groups: each variable's rate scaled, decay only where timm decays.

    One step of a variable `p` with gradient `g` at step `t`, rate `lr`
    times its scale `s` (as `torch.optim.AdamW`, eps outside the root):
    `p *= 1 - lr s wd`; `m += (1 - b1)(g - m)`; `v = b2 v + (1 - b2) g^2`;
    `p -= lr s / (1 - b1^t) * m / (sqrt(v / (1 - b2^t)) + eps)`.
    Keras' own `AdamW` puts eps inside the bias correction, and decays at
    the unscaled rate.
    """

    _torch_kernel = "torch_adamw"

    def __init__(self, learning_rate, parameter_groups, weight_decay=0.05, beta_1=0.9, beta_2=0.999, epsilon=1e-8,
                 name="layer_decay_adamw", **kwargs):
        super().__init__(learning_rate, parameter_groups, weight_decay, name=name, **kwargs)
        self.beta_1, self.beta_2, self.epsilon = float(beta_1), float(beta_2), float(epsilon)

    def update_step(self, gradient, variable, learning_rate):
        gradient = ops.cast(_dense(gradient), variable.dtype)
        m, v, correction_1, correction_2, scale, decays = self._moments(gradient, variable)
        rate = ops.cast(learning_rate, variable.dtype) * scale
        if decays:
            self.assign(variable, ops.multiply(variable, 1 - rate * self.decoupled_weight_decay))
        denominator = ops.add(ops.divide(ops.sqrt(v), ops.sqrt(correction_2)), self.epsilon)
        self.assign_sub(variable, ops.multiply(ops.divide(m, denominator), rate / correction_1))


@keras.saving.register_keras_serializable(package="keras_vit")
class LayerDecayLamb(_LayerDecay, keras.optimizers.Optimizer):
    """timm's `Lamb` (its defaults: eps 1e-6, gradients clipped to global norm 1, decay added to the update)
    with timm's parameter groups.

    A variable timm decays gets the update `m_hat / (sqrt(v_hat) + eps) + wd p`
    scaled by its trust ratio `|p| / |update|` (1 where either is 0); the
    others take Adam's update as it is, as timm's `always_adapt=False` does.
    The global-norm clipping is Keras' `global_clipnorm` (1.0 by default),
    which divides the gradients by the same `max(norm, 1)` as timm's
    `max_grad_norm`.
    """

    _torch_kernel = "torch_lamb"

    def __init__(self, learning_rate, parameter_groups, weight_decay=0.05, beta_1=0.9, beta_2=0.999, epsilon=1e-6,
                 global_clipnorm=1.0, name="layer_decay_lamb", **kwargs):
        super().__init__(learning_rate, parameter_groups, weight_decay, global_clipnorm=global_clipnorm, name=name,
                         **kwargs)
        self.beta_1, self.beta_2, self.epsilon = float(beta_1), float(beta_2), float(epsilon)

    def update_step(self, gradient, variable, learning_rate):
        gradient = ops.cast(_dense(gradient), variable.dtype)
        m, v, correction_1, correction_2, scale, decays = self._moments(gradient, variable)
        rate = ops.cast(learning_rate, variable.dtype) * scale
        denominator = ops.add(ops.divide(ops.sqrt(v), ops.sqrt(correction_2)), self.epsilon)
        update = ops.divide(ops.divide(m, correction_1), denominator)  # timm's order: m_hat, then / denominator
        if decays:
            update = ops.add(update, ops.multiply(variable, self.decoupled_weight_decay))
            weight_norm, update_norm = ops.norm(ops.reshape(variable, (-1,))), ops.norm(ops.reshape(update, (-1,)))
            ratio = ops.where(ops.logical_and(weight_norm > 0, update_norm > 0),
                              weight_norm / ops.maximum(update_norm, 1e-30), 1.0)
            update = ops.multiply(update, ratio)
        self.assign_sub(variable, ops.multiply(update, rate))
