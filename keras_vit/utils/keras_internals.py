"""The Keras internals keras_vit reads where Keras has no public API, each behind one function.

Tested with Keras 3.10 to 3.15 (pyproject.toml pins `keras<3.16`). Each
function names the private attribute it reads, so that a Keras release that
drops one fails here with the Keras version and the tested range, not with
an `AttributeError` deep inside a call. `check_optimizer_hooks` does the
same for the private `Optimizer` methods the recipes' optimizers override,
which a Keras without them would otherwise skip without a word.

Example:
>>> layer = keras.layers.Dense(2)
>>> layer.build((None, 3))
>>> stored_kernel(layer).path
'dense/kernel'
"""

import keras
import numpy as np

TESTED_KERAS = "3.10 to 3.15"


def _private(owner, name):
    try:
        return getattr(owner, name)
    except AttributeError:
        raise RuntimeError(
            f"keras_vit reads Keras' private {type(owner).__name__}.{name}, which Keras {keras.__version__} does not "
            f"have; keras_vit is tested with Keras {TESTED_KERAS}: pip install 'keras<3.16'."
        ) from None


def sublayers(layer, include_self=True):
    """Every layer inside `layer`, nested ones included (Keras' `_flatten_layers`; Keras has no public walk)."""
    return list(_private(layer, "_flatten_layers")(include_self=include_self))


def stored_kernel(dense):
    """A `Dense` layer's stored kernel variable (`_kernel`); its `kernel` property adds any LoRA adapters."""
    return _private(dense, "_kernel")


def build_without_values(function):
    """`function()` with the Keras variables it creates left without values, and the list of those variables.

    Keras defers a variable's initialisation inside a `StatelessScope`
    (`initialize_variables=False`): the layers build and trace with their
    shapes alone, and no initializer runs. The variables are taken out of
    Keras' global list of variables to initialise (`uninitialized_variables`),
    so each must get its value through `set_value` (or `initialize` for its
    own initializer's) before the model is used; a model whose load failed
    is dropped with them.
    """
    from keras.src.backend.common import global_state

    pending = _private(global_state, "get_global_attribute")("uninitialized_variables", [], set_to_default=True)
    start = len(pending)
    try:
        with keras.StatelessScope(initialize_variables=False):
            result = function()
    finally:
        created = pending[start:]
        del pending[start:]
    return result, created


def load_model_without_initializers(path, **options):
    """`keras.saving.load_model(path, **options)`, each variable given the file's value without its initializer's
    first.

    Keras builds every layer, which runs each variable's initializer, then
    assigns the file's values; on JAX every initializer compiles on its own
    (a tiny model's 70 XLA compiles were 5 s of its 6 s load). Built
    without values (`build_without_values`), the model's assignments stay
    in the `StatelessScope` it loads in, and are given from there; a
    variable the file does not hold gets its own initializer's value.
    """
    scope = keras.StatelessScope(initialize_variables=False)

    def load():
        with scope:
            return keras.saving.load_model(path, **options)

    model, created = build_without_values(load)
    for variable in created:
        value = scope.get_current_value(variable)
        if value is None:
            initialize(variable)
        else:
            set_value(variable, value)
    return model


def set_value(variable, value):
    """Give `variable` `value`: its first value where `build_without_values` left it without one (`_value`)."""
    if _private(variable, "_value") is not None:
        variable.assign(value)
        return
    value = np.ascontiguousarray(value)  # a transposed view would keep its strides on torch, and compute off by an ulp
    value = _private(variable, "_convert_to_tensor")(value, dtype=_private(variable, "_dtype"))
    _private(variable, "_initialize")(value)
    variable._initializer = None  # Its own initializer, never run.


def initialize(variable):
    """Give `variable` its own initializer's value where `build_without_values` left it without one."""
    if _private(variable, "_value") is None:
        _private(variable, "_deferred_initialize")()


def has_been_called(model):
    """Whether `model` was called on a tensor (`_called`; Keras' ONNX export asks for it)."""
    return _private(model, "_called")


def keep_variables_on_error(model, step_function, kind):
    """`step_function` (`model.train_function`, `test_function` or `predict_function`, by `kind`), made to leave
    the model usable when it raises.

    - Keras' JAX `fit`, `evaluate` and `predict` detach every variable's value (`_value` None) while they loop
      and re-attach them only when the loop ends, so an error in a step (a wrong image size found while
      tracing) left a model that could neither predict nor save. The step's `state` argument holds those
      values, in the order of the lists below.
    - A TensorFlow step whose first trace failed cannot be traced again once the optimizer has variables, so
      a function that never ran through is dropped and the next call makes a new one.
    """
    if step_function is None or getattr(step_function, "keeps_variables", False):
        return step_function
    owners = {"train": lambda: [model.trainable_variables, model.non_trainable_variables,
                                model.optimizer.variables, model.metrics_variables],
              "test": lambda: [model.trainable_variables, model.non_trainable_variables, model.metrics_variables],
              "predict": lambda: [model.trainable_variables, model.non_trainable_variables]}[kind]

    def step(*args):
        try:
            result = step_function(*args)
        except BaseException as error:
            ends_epoch = isinstance(error, StopIteration) or type(error).__name__ == "OutOfRangeError"
            if keras.backend.backend() == "tensorflow" and not step.ran and not ends_epoch:
                setattr(model, f"{kind}_function", None)
            if keras.backend.backend() == "jax":
                for variables, values in zip(owners(), args[0]):
                    for variable, value in zip(variables, values):
                        if _private(variable, "_value") is None:
                            variable.assign(value)
            raise
        step.ran = True
        return result

    step.keeps_variables, step.ran = True, False
    return step


def outputs_to_numpy(outputs):
    """Keras' `convert_to_numpy` of a step's outputs (a tensor or a structure of them), bfloat16 read as bits on torch.

    Keras' torch backend turns a bfloat16 tensor into numpy by moving it to
    the host, converting it to float32 there, copying it, and converting it
    back to bfloat16 on one thread (`keras/src/backend/torch/core.py`): several
    times a plain copy. Here its 16 bits are viewed as int16, copied to the
    host once and viewed as `ml_dtypes.bfloat16`: the same values, bit for
    bit. Every other tensor, and every other backend, goes through Keras'
    `convert_to_numpy`.

    Example:
    >>> import numpy as np
    >>> outputs_to_numpy({"logits": keras.ops.ones((2, 3), dtype="bfloat16")})["logits"].dtype.name
    'bfloat16'
    """
    if keras.backend.backend() != "torch":
        return keras.tree.map_structure(keras.ops.convert_to_numpy, outputs)
    import ml_dtypes
    import torch  # The torch backend's own tensors.

    def to_numpy(tensor):
        if not isinstance(tensor, torch.Tensor) or tensor.dtype != torch.bfloat16:
            return keras.ops.convert_to_numpy(tensor)
        bits = tensor.detach().view(torch.int16)
        on_host = bits.cpu()
        # `.cpu()` of a host tensor is the tensor itself: copy, so that the array owns its memory as Keras' does.
        array = on_host.numpy() if on_host is not bits else on_host.numpy().copy()
        return array.view(ml_dtypes.bfloat16)

    return keras.tree.map_structure(to_numpy, outputs)


def with_numpy_outputs(predict_function):
    """`predict_function` made to give its outputs as numpy arrays (`outputs_to_numpy`) on the torch backend.

    Keras' torch `predict` and `predict_on_batch` convert the step's outputs
    with `convert_to_numpy`, which is slow for bfloat16 tensors (see
    `outputs_to_numpy`); given arrays, they copy them once. Each batch's
    outputs then leave the device as the step ends instead of piling up
    there until the last batch. Other backends' steps are returned as they
    are.
    """
    if keras.backend.backend() != "torch" or predict_function is None:
        return predict_function

    def step(*args):
        return outputs_to_numpy(predict_function(*args))

    return step


def flash_attention_refusal(query, key, value):
    """Why Keras' JAX backend would not run cuDNN's fused attention on these inputs, or None where it would.

    Keras' `dot_product_attention` asks its private `_can_use_flash_attention`
    and, where it says no, falls back to XLA's attention without a word.
    """
    from keras.src.backend.jax import nn as jax_nn

    try:
        _private(jax_nn, "_can_use_flash_attention")(query, key, value, None, raise_error=True)
    except Exception as error:  # noqa: BLE001 - any refusal is a reason, which the caller logs
        return f"{type(error).__name__}: {error}".strip()
    return None


def check_optimizer_hooks(optimizer, overridden):
    """Refuse to build `optimizer` on a Keras whose `Optimizer` lacks a private method it overrides (`overridden`):
    the override would be skipped silently, and with it what it changes."""
    for name in overridden:
        if not callable(getattr(keras.optimizers.Optimizer, name, None)):
            raise RuntimeError(
                f"{type(optimizer).__name__} overrides Keras' private Optimizer.{name}, which Keras "
                f"{keras.__version__} does not have; keras_vit is tested with Keras {TESTED_KERAS}: "
                "pip install 'keras<3.16'."
            )


def per_replica_loss(loss):
    """`loss` (a mean over this replica's batch) scaled as Keras' own losses are under a `tf.distribute` strategy.

    Keras sums the replicas' gradients, so its losses divide each replica's
    mean by the number of replicas (`keras.src.losses.loss.scale_loss_for_distribution`,
    a no-op on the other backends and on one replica). A `compute_loss`
    override that returns a plain mean would take N replicas' steps N times
    too large.
    """
    from keras.src.losses import loss as loss_module

    return _private(loss_module, "scale_loss_for_distribution")(loss)
