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
    (["--image-size", "16x16x3"], r"^--image-size takes SIZE or HEIGHTxWIDTH in pixels, one argument such as 224 or "
                                  r"224x320; got '16x16x3'\.$"),
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
    cli.main(["pretrain", *SMALL_RUN, "--image-size", "16x24", "--output-dir", str(tmp_path)])
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


def test_convert_of_a_weights_h5_file_takes_the_heads_of_its_width_or_asks_for_the_variant(tmp_path):
    import keras_vit

    unnamed = keras_vit.ViT(image_size=32, patch_size=8, hidden_size=24, num_layers=1, num_heads=2, mlp_dim=48)
    unnamed.save_weights(str(tmp_path / "unnamed.weights.h5"))
    with pytest.raises(ValueError, match=r"unnamed.weights.h5 does not store all its sizes \(a .weights.h5 file or a "
                       r"bare state dict has no head count\); name its variant with `model` \(--model\), e.g. ViT_B16, "
                       r"or pass `num_heads` \(--num-heads\)\."):
        cli.main(["convert", str(tmp_path / "unnamed.weights.h5"), str(tmp_path / "unnamed.keras")])
    model = keras_vit.ViT_Ti16(image_size=32, classes=10)
    model.get_layer("head").kernel.assign(np.ones((192, 10), "float32"))
    path = str(tmp_path / "ti.weights.h5")
    model.save_weights(path)
    cli.main(["convert", path, str(tmp_path / "ti.keras")])  # width 192 is Ti's: 3 heads, as from_pretrained reads it
    converted = keras.saving.load_model(tmp_path / "ti.keras")
    assert converted.get_layer("encoderblock_0").num_heads == 3
    images = np.random.default_rng(0).uniform(-1, 1, (1, 32, 32, 3)).astype("float32")
    np.testing.assert_allclose(keras.ops.convert_to_numpy(converted(images)),
                               keras.ops.convert_to_numpy(model(images)), atol=1e-6)
    assert os.path.exists(tmp_path / "ti.keras")


@pytest.mark.backend_independent
def test_image_size_is_one_argument_so_predict_keeps_the_image_path():
    from keras_vit import flags

    args = cli.build_parser().parse_args(["predict", "--image-size", "96", "img.png"])
    assert (args.images, flags.image_size_flag(args.image_size)) == (["img.png"], 96)
    for value in ("96x128", "96,128", "96X128"):
        args = cli.build_parser().parse_args(["predict", "--image-size", value, "a.png", "b.png"])
        assert (args.images, flags.image_size_flag(args.image_size)) == (["a.png", "b.png"], (96, 128))
    assert flags.image_size_flag(cli.build_parser().parse_args(["convert", "a.npz", "a.keras", "--image-size",
                                                                "64x32"]).image_size) == (64, 32)
    for value in ("96 128", "96x", "x96", "1.5", "96x128x3", "big"):
        with pytest.raises(ValueError, match=rf"^--image-size takes SIZE or HEIGHTxWIDTH in pixels, one argument such "
                                             rf"as 224 or 224x320; got '{value}'\.$"):
            flags.image_size_flag(value)


def hub_cache(root, repos):
    """A Hugging Face cache holding one snapshot of each `{repo: fixture folder}`, laid out as huggingface_hub writes it."""
    import shutil

    commit = "0" * 40
    for repo, folder in repos.items():
        repository = root / f"models--{repo.replace('/', '--')}"
        (repository / "refs").mkdir(parents=True)
        (repository / "refs" / "main").write_text(commit)
        shutil.copytree(fixture(folder), repository / "snapshots" / commit)
    return root


@pytest.mark.backend_independent
def test_predict_and_inspect_take_hf_handles_and_a_headless_folder_needs_no_head(tmp_path, monkeypatch, capsys,
                                                                               keras_vit_log):
    constants = pytest.importorskip("huggingface_hub.constants")
    import tensorflow as tf

    import keras_vit

    cache = hub_cache(tmp_path / "hub", {"timm/deit_test": "timm_family/deit", "timm/dinov2_test": "timm_family/dinov2"})
    for name, value in (("HF_HUB_CACHE", str(cache)), ("HF_HUB_OFFLINE", True)):  # read once, when it is imported
        monkeypatch.setenv(name, str(int(value)) if value is True else value)
        monkeypatch.setattr(constants, name, value)
    image = tmp_path / "digit.png"
    tf.io.write_file(str(image), tf.io.encode_png(np.random.default_rng(0).integers(0, 256, (32, 32, 3), np.uint8)))

    (found,) = cli.main(["predict", "--weights", "hf://timm/deit_test", str(image)])
    model = keras_vit.from_pretrained(fixture("timm_family/deit"), classifier_activation=None)
    pixels = keras_vit.eval_transform(model).load(str(image))  # timm's eval transform (test_preprocessing.py)
    assert model.eval_transform.convention == "timm"
    logits = keras.ops.convert_to_numpy(model(pixels[None])).astype("float64")[0]
    probabilities = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    best = np.argsort(probabilities)[::-1][:5]
    assert [name for name, _ in found] == [str(index) for index in best]
    np.testing.assert_allclose([p for _, p in found], probabilities[best], atol=1e-5, rtol=0)

    # A feature model (DINOv2 has no head) is inspected without one: nothing starts at zero.
    keras_vit_log.clear()
    written = cli.main(["inspect", "--weights", "hf://timm/dinov2_test", str(image), "--output-dir", str(tmp_path)])
    assert sorted(written) == ["attention_rollout", "embedding_filters", "mean_attention_distance",
                               "position_embedding_similarity"]
    assert keras_vit_log.text == ""
    assert capsys.readouterr().out.splitlines()[-4:] == [f"wrote {written[name]}" for name in written]
