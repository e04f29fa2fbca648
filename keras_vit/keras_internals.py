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


def has_been_called(model):
    """Whether `model` was called on a tensor (`_called`; Keras' ONNX export asks for it)."""
    return _private(model, "_called")


def reattach_jax_state(model, values):
    """After a JAX `fit`/`evaluate`/`predict` that raised: sync the trainer's state back (`_jax_state`), and give
    every variable Keras left detached (`_value` None) its value from before the call (`values`)."""
    if getattr(model, "_jax_state", None):
        model.jax_state_sync()
    model._jax_state = None
    for variable, value in zip(model.variables, values):
        if _private(variable, "_value") is None:
            variable.assign(value)


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
