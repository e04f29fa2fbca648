"""The keras-vit command as a user meets it: defaults in --help, one-line errors, validated flags."""

import os
import sys

import keras
import numpy as np
import pytest

pytest.importorskip("tensorflow")

from conftest import fixture  # noqa: E402
from keras_vit import cli, distribute  # noqa: E402

BACKEND = keras.backend.backend()
SMALL_RUN = ["--verbose", "0", "--hidden-size", "32", "--num-layers", "1", "--num-heads", "2", "--mlp-dim", "64",
             "--epochs", "1", "--warmup-steps", "1", "--eval-batch-size", "360"]


@pytest.mark.backend_independent
def test_a_user_error_is_one_line_and_exit_status_2(capsys, tmp_path):
    status = cli.console_main(["pretrain", "--batch-size", "0", "--output-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert status == 2
    assert err == "keras-vit: error: --batch-size must be at least 1, got 0.\n"
    with pytest.raises(ValueError, match="--batch-size must be at least 1, got 0"):
        cli.console_main(["pretrain", "--batch-size", "0", "--debug"])
    with pytest.raises(ValueError, match="--batch-size must be at least 1"):
        cli.console_main(["--debug", "pretrain", "--batch-size", "0"])


@pytest.mark.backend_independent
def test_help_shows_every_default():
    parser = cli.build_parser()
    commands = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction").choices
    assert "(default: runs/pretrain/model.keras)" in commands["finetune"].format_help()
    for name, command in commands.items():
        for action in command._actions:
            if action.option_strings and action.nargs != 0 and action.dest != "help":
                assert "default" in (action.help or ""), f"{name} {action.option_strings}"


@pytest.mark.backend_independent
def test_an_unknown_model_is_named_with_the_closest_names(capsys):
    # The default --weights (runs/pretrain/model.keras) does not exist here: the model name is the error.
    assert cli.console_main(["finetune", "--model", "ViT_B_16"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("keras-vit: error: Unknown model 'ViT_B_16'. Did you mean ViT_B16 or ")
    assert cli.console_main(["evaluate", "--model", "vit_b16"]) == 2
    assert "Did you mean ViT_B16" in capsys.readouterr().err


@pytest.mark.parametrize("flags,message", [
    (["--batch-size", "0"], "--batch-size must be at least 1, got 0."),
    (["--patch-size", "0"], "--patch-size must be at least 1, got 0."),
    (["--num-layers", "0"], "--num-layers must be at least 1, got 0."),
    (["--steps-per-execution", "0"], "--steps-per-execution must be at least 1, got 0."),
    (["--learning-rate", "-0.01"], "--learning-rate must be positive, got -0.01."),
    (["--label-smoothing", "5"], r"--label-smoothing must be in \[0, 1\), got 5.0."),
    (["--dropout", "1"], r"--dropout must be in \[0, 1\), got 1.0."),
    (["--holdout-fraction", "0"], "--holdout-fraction must be between 0 and 1, got 0.0."),
    (["--image-size", "16", "16", "3"], r"--image-size takes SIZE or HEIGHT WIDTH, got 3 values"),
    (["--model", "ViT_Ti16", "--hidden-size", "32"],
     "--hidden-size 32 disagrees with --model ViT_Ti16, whose hidden_size is 192; leave the size flags out"),
    (["--weights", fixture("vit_token.npz"), "--num-heads", "4"],
     "--num-heads 4 disagrees with --weights .*vit_token.npz, whose num_heads is 3"),
])
@pytest.mark.backend_independent
def test_numeric_and_size_flags_are_checked_before_training(flags, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        cli.main(["pretrain", "--verbose", "0", "--output-dir", str(tmp_path), *flags])
    assert not (tmp_path / "log.csv").exists()


# Flag parsing; non-square models are checked on every backend by test_position_embedding and test_models.
@pytest.mark.backend_independent
def test_image_size_takes_height_and_width(tmp_path):
    cli.main(["pretrain", *SMALL_RUN, "--image-size", "16", "24", "--output-dir", str(tmp_path)])
    model = keras.saving.load_model(tmp_path / "model.keras")
    assert model.input_shape == (None, 16, 24, 3)
    results = cli.main(["evaluate", "--weights", str(tmp_path / "model.keras"), "--verbose", "0"])
    assert 0.0 <= results["top1"] <= 1.0


@pytest.mark.backend_independent
def test_a_tfds_name_without_tensorflow_datasets_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)
    with pytest.raises(ValueError, match=r"'mnist' comes from tensorflow-datasets, which is not installed .*: "
                       r"pip install 'keras-vision-transformer\[tensorflow\]'"):
        cli.main(["pretrain", *SMALL_RUN, "--dataset", "mnist", "--output-dir", str(tmp_path)])


@pytest.mark.backend_independent
def test_every_extra_with_tensorflow_datasets_installs_what_it_imports():
    # tensorflow-datasets imports importlib_resources but declares it only for Python < 3.9, so our extras must.
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    with open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pyproject.toml"), "rb") as f:
        extras = tomllib.load(f)["project"]["optional-dependencies"]
    with_tfds = {name: deps for name, deps in extras.items() if any(d.startswith("tensorflow-datasets") for d in deps)}
    assert with_tfds, "no extra installs tensorflow-datasets"
    for name, deps in with_tfds.items():
        assert any(d.startswith("importlib_resources") for d in deps), name


@pytest.mark.skipif(BACKEND != "jax", reason="multi-host runs on the JAX backend")
def test_multi_host_without_its_environment_names_the_variables(monkeypatch):
    for name in distribute.MULTI_HOST_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match="--distribution multi_host needs KERAS_DISTRIBUTION_JOB_ADDRESSES, "
                       "KERAS_DISTRIBUTION_NUM_PROCESSES, KERAS_DISTRIBUTION_PROCESS_ID set on every process"):
        distribute.setup("multi_host")


def test_convert_of_a_weights_h5_file_asks_for_the_variant(tmp_path):
    import keras_vit

    model = keras_vit.ViT_Ti16(image_size=32, classes=10)
    model.get_layer("head").kernel.assign(np.ones((192, 10), "float32"))
    path = str(tmp_path / "ti.weights.h5")
    model.save_weights(path)
    with pytest.raises(ValueError, match=r"ti.weights.h5 does not store all its sizes \(a .weights.h5 file or a bare "
                       r"state dict has no head count\); name its variant with `model` \(--model\), e.g. ViT_B16, or "
                       r"pass `num_heads` \(--num-heads\)\."):
        cli.main(["convert", path, str(tmp_path / "ti.keras")])
    cli.main(["convert", path, str(tmp_path / "ti.keras"), "--model", "ViT_Ti16"])
    converted = keras.saving.load_model(tmp_path / "ti.keras")
    images = np.random.default_rng(0).uniform(-1, 1, (1, 32, 32, 3)).astype("float32")
    np.testing.assert_allclose(keras.ops.convert_to_numpy(converted(images)),
                               keras.ops.convert_to_numpy(model(images)), atol=1e-6)
    assert os.path.exists(tmp_path / "ti.keras")
