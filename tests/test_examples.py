"""The examples: plain Keras scripts that train the digits example to the promised accuracy."""

import os
import re
import subprocess
import sys

import keras
import numpy as np
import pytest

pytest.importorskip("tensorflow")

from keras_vit import training  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = {name: os.path.join(ROOT, "examples", f"{name}.py") for name in ("pretrain", "finetune")}
BACKEND = keras.backend.backend()
# The full digits example takes 1.5-3 min for both scripts on these CPUs (README): it runs in one pass, on the fastest backend.
# Every backend runs both scripts small and checks them against the library step for step.
FULL_RUN_BACKEND = "torch"


def _run(script, *flags, cwd):
    env = {**os.environ, "KERAS_BACKEND": BACKEND, "TF_CPP_MIN_LOG_LEVEL": "2",
           "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}  # this checkout's keras_vit
    done = subprocess.run([sys.executable, EXAMPLES[script], "--verbose", "2", *flags], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.backend_independent
def test_examples_are_plain_keras_scripts():
    for path in EXAMPLES.values():
        with open(path) as f:
            source = f.read()
        assert "model.fit(" in source
        assert "keras_vit.cli" not in source
        assert source.startswith('"""') and "python examples/" in source.split('"""')[1]


@pytest.mark.skipif(BACKEND != FULL_RUN_BACKEND, reason=f"the full digits example runs in the {FULL_RUN_BACKEND} pass")
def test_digits_example_fine_tunes_to_at_least_90_percent(tmp_path):
    """The README's main job, as the README runs it."""
    _run("pretrain", cwd=tmp_path)
    assert (tmp_path / "runs" / "pretrain" / "model.keras").exists()
    output = _run("finetune", "--image-size", "32", cwd=tmp_path)
    final = output.strip().splitlines()[-1]
    accuracy = float(re.fullmatch(r"top-1 accuracy: (0\.\d{4}|1\.0000)", final).group(1))
    assert accuracy >= 0.90
    for name in ("model.keras", "classes.txt", "log.csv", "learning_curve.png"):
        assert (tmp_path / "runs" / "finetune" / name).exists(), name


def assert_same_weights(a, b):
    a, b = keras.saving.load_model(a), keras.saving.load_model(b)
    assert len(a.weights) == len(b.weights)
    for x, y in zip(a.weights, b.weights):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(x), keras.ops.convert_to_numpy(y), atol=1e-6,
                                   err_msg=x.path)


SMALL_FLAGS = dict(hidden_size=32, num_layers=2, num_heads=2, mlp_dim=64, epochs=1, warmup_steps=10, verbose=0)


def as_flags(**values):
    return [f"--{name.replace('_', '-')}={value}" for name, value in values.items()]


@pytest.mark.backend_independent  # the scripts call the same library steps on each backend
def test_pretrain_and_finetune_examples_train_the_weights_the_library_does(tmp_path):
    """Both scripts, step by step, equal `training.train`, and write what the library writes."""
    _run("pretrain", "--output-dir", str(tmp_path / "example"), *as_flags(**SMALL_FLAGS), cwd=tmp_path)
    training.train(training.PretrainConfig(output_dir=str(tmp_path / "library"), **SMALL_FLAGS))
    assert_same_weights(tmp_path / "example" / "model.keras", tmp_path / "library" / "model.keras")

    pretrained = str(tmp_path / "library" / "model.keras")
    tune = dict(SMALL_FLAGS, image_size=24, warmup_steps=2)
    output = _run("finetune", "--weights", pretrained, "--output-dir", str(tmp_path / "example_ft"),
                  *as_flags(**tune), cwd=tmp_path)
    top1 = training.train(training.FinetuneConfig(weights=pretrained, output_dir=str(tmp_path / "library_ft"), **tune))
    assert output.strip().splitlines()[-1] == f"top-1 accuracy: {top1:.4f}"
    assert_same_weights(tmp_path / "example_ft" / "model.keras", tmp_path / "library_ft" / "model.keras")
    for name in ("model.keras", "classes.txt", "log.csv", "learning_curve.png"):
        assert (tmp_path / "example_ft" / name).exists(), name
