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
# The full digits example takes ~2 min a script on these CPUs: it runs on the fastest backend,
# the others run the same scripts with fewer, smaller epochs and check all but the accuracy.
FULL_RUN_BACKEND = "torch"
QUICK = ["--epochs", "2", "--hidden-size", "32", "--num-layers", "2", "--num-heads", "2", "--mlp-dim", "64"]


def _run(script, *flags, cwd):
    env = {**os.environ, "KERAS_BACKEND": BACKEND, "TF_CPP_MIN_LOG_LEVEL": "2",
           "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}  # this checkout's keras_vit
    done = subprocess.run([sys.executable, EXAMPLES[script], "--verbose", "2", *flags], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_examples_are_plain_keras_scripts():
    for path in EXAMPLES.values():
        with open(path) as f:
            source = f.read()
        assert "model.fit(" in source
        assert "keras_vit.cli" not in source
        assert source.startswith('"""') and "python examples/" in source.split('"""')[1]


def test_digits_example_fine_tunes_to_at_least_90_percent(tmp_path):
    full = BACKEND == FULL_RUN_BACKEND
    _run("pretrain", *([] if full else QUICK), cwd=tmp_path)
    assert (tmp_path / "runs" / "pretrain" / "model.keras").exists()
    output = _run("finetune", *([] if full else QUICK), cwd=tmp_path)
    final = output.strip().splitlines()[-1]
    accuracy = float(re.fullmatch(r"top-1 accuracy: (0\.\d{4}|1\.0000)", final).group(1))
    assert accuracy >= (0.90 if full else 0.0)
    for name in ("model.keras", "classes.txt", "log.csv", "learning_curve.png"):
        assert (tmp_path / "runs" / "finetune" / name).exists(), name


def test_pretrain_example_trains_the_weights_the_library_does(tmp_path):
    flags = dict(hidden_size=32, num_layers=2, num_heads=2, mlp_dim=64, epochs=1, warmup_steps=10, verbose=0)
    _run("pretrain", "--output-dir", str(tmp_path / "example"),
         *[f"--{name.replace('_', '-')}={value}" for name, value in flags.items()], cwd=tmp_path)
    training.train(training.PretrainConfig(output_dir=str(tmp_path / "library"), **flags))
    a = keras.saving.load_model(tmp_path / "example" / "model.keras")
    b = keras.saving.load_model(tmp_path / "library" / "model.keras")
    for x, y in zip(a.weights, b.weights):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(x), keras.ops.convert_to_numpy(y), atol=1e-6,
                                   err_msg=x.path)
