import json
import math

import keras
import numpy as np
import pytest

from conftest import xla_flags_for
from keras_vit.training import recipes


def test_warmup_then_linear_and_cosine_decay():
    linear = recipes.WarmupDecay(1.0, total_steps=110, warmup_steps=10, decay="linear")
    cosine = recipes.WarmupDecay(1.0, total_steps=110, warmup_steps=10, decay="cosine", end_learning_rate=0.1)
    value = lambda schedule, step: float(keras.ops.convert_to_numpy(schedule(step)))  # noqa: E731
    assert value(linear, 0) == 0.0 and value(linear, 5) == pytest.approx(0.5)
    assert value(linear, 10) == pytest.approx(1.0) and value(linear, 60) == pytest.approx(0.5)
    assert value(linear, 110) == pytest.approx(0.0) and value(linear, 500) == pytest.approx(0.0)
    assert value(cosine, 60) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert value(cosine, 110) == pytest.approx(0.1)


def test_schedule_serializes():
    schedule = recipes.WarmupDecay(3e-3, 1000, 100, "cosine", 1e-5)
    clone = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(schedule))
    assert clone.get_config() == schedule.get_config()
    optimizer = recipes.finetuning_optimizer(schedule)
    restored = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    assert isinstance(restored._learning_rate, recipes.WarmupDecay)
    assert restored._learning_rate.get_config() == schedule.get_config()
    with pytest.raises(ValueError, match="Unknown decay 'step'"):
        recipes.WarmupDecay(1.0, 10, 1, "step")
    with pytest.raises(ValueError, match="0 <= warmup_steps <= total_steps"):
        recipes.WarmupDecay(1.0, 10, 20)


def _tiny_model():
    import keras_vit

    return keras_vit.ViT(image_size=8, patch_size=4, hidden_size=8, num_layers=1, num_heads=2, mlp_dim=8,
                         classes=3, representation_size=4)


def test_weight_decay_touches_kernels_only():
    model = _tiny_model()
    for v in model.trainable_variables:
        v.assign(np.ones(v.shape, "float32"))
    optimizer = recipes.pretraining_optimizer(learning_rate=0.5, weight_decay=0.1)
    optimizer.apply_gradients([(keras.ops.zeros(v.shape), v) for v in model.trainable_variables])
    for v in model.trainable_variables:
        value = keras.ops.convert_to_numpy(v)
        if v.name == "kernel":
            np.testing.assert_allclose(value, 1.0 - 0.5 * 0.1, rtol=1e-6, err_msg=v.path)
        else:
            np.testing.assert_array_equal(value, 1.0, err_msg=v.path)


def test_global_norm_clipping_bounds_the_update():
    variable = keras.Variable(np.zeros(4, "float32"))
    optimizer = recipes.finetuning_optimizer(learning_rate=0.1, momentum=0.0, global_clipnorm=1.0)
    optimizer.apply_gradients([(keras.ops.convert_to_tensor(np.full(4, 5.0, "float32")), variable)])
    np.testing.assert_allclose(keras.ops.convert_to_numpy(variable), -0.1 * 0.5, rtol=1e-5)


def test_gradient_accumulation_equals_the_large_batch():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(8, 3)).astype("float32"), rng.normal(size=(8, 1)).astype("float32")

    def trained(batch_size, accumulation):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        optimizer = recipes.finetuning_optimizer(0.1, momentum=0.0, global_clipnorm=None,
                                                 gradient_accumulation_steps=accumulation)
        model.compile(optimizer=optimizer, loss="mse")
        model.fit(x, y, batch_size=batch_size, epochs=1, shuffle=False, verbose=0)
        return [keras.ops.convert_to_numpy(w) for w in model.weights]

    for a, b in zip(trained(8, None), trained(2, recipes.accumulation_steps(8, 2))):
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_accumulation_steps():
    assert recipes.accumulation_steps(4096, 512) == 8
    assert recipes.accumulation_steps(None, 512) is None
    assert recipes.accumulation_steps(256, 512) is None
    with pytest.raises(ValueError, match="Target batch 1000 is not a multiple of the batch 512"):
        recipes.accumulation_steps(1000, 512)


def test_finetuning_optimizer_options():
    optimizer = recipes.finetuning_optimizer(0.01, ema_momentum=0.9999)
    assert optimizer.use_ema and optimizer.ema_momentum == 0.9999
    assert optimizer.momentum == 0.9 and optimizer.global_clipnorm == 1.0
    assert not recipes.finetuning_optimizer(0.01).use_ema


def expected_rates():
    from applied_rates import UPDATES, schedule

    return [float(keras.ops.convert_to_numpy(schedule()(update))) for update in range(UPDATES)]


def test_gradient_accumulation_applies_the_schedule_per_update():
    from applied_rates import measure

    # Warmup over the first update, then linear decay over updates 1..4: none of them at 0 after the first.
    assert expected_rates() == pytest.approx([0.0, 0.01, 0.0075, 0.005, 0.0025])
    np.testing.assert_allclose(measure("none"), expected_rates(), atol=1e-7)


def run_applied_rates(backend, engine, devices):
    import os
    import subprocess
    import sys

    if keras.backend.backend() != backend:
        pytest.skip(f"runs in the {backend} pass")
    worker = os.path.join(os.path.dirname(__file__), "applied_rates.py")
    env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "2", "XLA_FLAGS": xla_flags_for(devices)}
    return subprocess.run([sys.executable, worker, engine], env=env, capture_output=True, text=True, timeout=600)


def test_gradient_accumulation_applies_the_schedule_per_update_on_8_data_parallel_devices():
    done = run_applied_rates("jax", "data_parallel", 8)
    assert done.returncode == 0, done.stderr[-3000:]
    rates = json.loads(done.stdout.split("RATES ", 1)[1].splitlines()[0])
    np.testing.assert_allclose(rates, expected_rates(), atol=1e-7)


def test_gradient_accumulation_under_a_tensorflow_strategy_is_refused_with_the_way_out():
    done = run_applied_rates("tensorflow", "mirrored", None)
    assert done.returncode != 0
    assert "Gradient accumulation does not run under a TensorFlow distribution strategy in Keras" in done.stderr
    assert "or the JAX backend's keras.distribution" in done.stderr
