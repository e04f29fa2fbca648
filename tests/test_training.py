"""The examples and the keras-vit command, end to end on the embedded digits."""

import os
import shutil
import signal
import subprocess
import sys
import time

import keras
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from conftest import SMALL, fixture, reference, shared_run  # noqa: E402

from keras_vit import CheckpointError, cli, data, training  # noqa: E402
from keras_vit.model.variants import SMALL_VIT, VARIANTS, Variant  # noqa: E402
from keras_vit.tools import inference

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BACKEND = keras.backend.backend()
QUICK = ["--verbose", "0", "--hidden-size", "32", "--num-layers", "2", "--num-heads", "2", "--mlp-dim", "64",
         "--eval-batch-size", "360"]


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    return shared_run(tmp_path_factory, "pretrained", lambda out: cli.main(
        ["pretrain", *QUICK, "--epochs", "3", "--output-dir", str(out), "--warmup-steps", "10"]))


def test_pretrain_writes_logs_curve_and_model(pretrained):
    out, top1 = pretrained
    for name in ("model.keras", "log.csv", "learning_curve.png", "classes.txt"):
        assert (out / name).exists(), name
    assert os.listdir(out / "tensorboard")
    assert 0.2 < top1 <= 1.0  # three short epochs learn something on 10 classes
    assert len((out / "log.csv").read_text().strip().splitlines()) == 4
    assert not (out / "backup").exists()  # removed once training finished
    model = keras.saving.load_model(out / "model.keras")
    assert model.input_shape == (None, 16, 16, 3)


def test_finetune_resizes_embeddings_replaces_head_and_evaluates(pretrained, tmp_path, caplog, capsys):
    out, _ = pretrained
    top1 = cli.main(["finetune", *QUICK, "--weights", str(out / "model.keras"), "--epochs", "1",
                     "--output-dir", str(tmp_path), "--image-size", "24"])
    assert "from a 4x4 to a 6x6 patch grid" in caplog.text
    assert f"top-1 accuracy: {top1:.4f}" in capsys.readouterr().out
    model = keras.saving.load_model(tmp_path / "model.keras")
    assert model.input_shape == (None, 24, 24, 3)
    results = cli.main(["evaluate", "--weights", str(tmp_path / "model.keras"), "--verbose", "0"])
    assert results["top1"] == pytest.approx(top1, abs=1e-6)
    # The same split, scored by hand from the model's logits.
    _, (images, labels) = data.digits(image_size=24)
    batches = data.make_dataset(data.from_arrays(images, labels), 24, 360, training=False)
    logits = np.concatenate([keras.ops.convert_to_numpy(model(x, training=False)) for x, _ in batches])
    ranked = np.argsort(-logits, axis=1)
    assert results["top1"] == pytest.approx(np.mean(ranked[:, 0] == labels), abs=1e-6)
    assert results["top5"] == pytest.approx(np.mean((ranked[:, :5] == labels[:, None]).any(axis=1)), abs=1e-6)


def test_library_fine_tunes_at_the_checkpoints_own_size_and_evaluates_with_plain_arguments(pretrained, tmp_path,
                                                                                              capsys, caplog):
    out, _ = pretrained
    config = training.FinetuneConfig(weights=str(out / "model.keras"), output_dir=str(tmp_path), epochs=1,
                                     eval_batch_size=360, verbose=0)
    top1 = training.train(config)
    assert "Resized position embeddings" not in caplog.text  # the checkpoint's 16 px, not the digits' 32
    assert capsys.readouterr().out.strip().splitlines()[-1] == f"top-1 accuracy: {top1:.4f}"
    for name in ("model.keras", "log.csv", "learning_curve.png", "classes.txt"):
        assert (tmp_path / name).exists(), name
    results = inference.evaluate(str(tmp_path / "model.keras"), eval_batch_size=360, verbose=0)
    assert results["top1"] == pytest.approx(top1, abs=1e-6)
    model = inference.load_for_inference(str(tmp_path / "model.keras"))
    assert model.input_shape == (None, 16, 16, 3)
    assert inference.class_names(model, str(tmp_path / "model.keras")) == [str(i) for i in range(10)]


@pytest.mark.backend_independent
def test_training_takes_the_checkpoints_own_image_size_unless_told():
    from keras_vit import checkpoints, flags
    from keras_vit.model.vision_transformer import check_image_size

    patch_14 = checkpoints.read_weights(fixture("timm_family/aimv2")).with_heads()  # timm's: 28 px, 14 px patches
    # timm's: a stated 46 px in 14 px patches, 4 px that fill no patch left out
    remainder = checkpoints.read_weights(fixture("timm_family/siglip_remainder")).with_heads()
    for config_class, digits in ((training.FinetuneConfig, 32), (training.PretrainConfig, 16)):
        config = flags.parse_config(config_class, ["--weights", "a checkpoint"]).at_checkpoint_size(patch_14)
        assert (config.image_size, config.drop_remainder) == ((28, 28), False)
        check_image_size(config.image_size, config.sizes(patch_14), config.drop_remainder)
        config = flags.parse_config(config_class, ["--weights", "a checkpoint"]).at_checkpoint_size(remainder)
        assert (config.image_size, config.drop_remainder) == ((46, 46), True)
        check_image_size(config.image_size, config.sizes(remainder), config.drop_remainder)
        told = flags.parse_config(config_class, ["--image-size", "56"]).at_checkpoint_size(patch_14)
        assert (told.image_size, told.drop_remainder) == ((56, 56), False)  # its position table is resized
        assert flags.parse_config(config_class, ["--weights", "none"]).at_checkpoint_size(None).image_size == (
            digits, digits)


@pytest.mark.backend_independent
def test_model_sizes_prefer_the_named_variant_then_the_checkpoint():
    assert training.model_sizes() == SMALL_VIT
    assert training.model_sizes("ViT_B16") == VARIANTS["ViT_B16"]
    custom = Variant(patch_size=2, hidden_size=8, num_layers=1, num_heads=1, mlp_dim=16)
    assert training.model_sizes(None, None, custom) == custom
    assert training.PretrainConfig(hidden_size=8).sizes().hidden_size == 8
    with pytest.raises(ValueError, match="Unknown model 'ViT_X99'"):
        training.model_sizes("ViT_X99")


@pytest.mark.backend_independent
def test_training_batches_resume_mid_run_with_the_same_augmentations():
    train_source, eval_source = training.load_sources("digits", 16)
    crop, flip = training.augmentation_defaults("digits")
    assert (crop, flip) == (0.6, False) and training.augmentation_defaults("cifar10") == (0.05, True)
    steps = data.steps_per_epoch(train_source, 64)
    whole, validation = training.training_data(train_source, eval_source, 16, 64, 2, 0, 0, 360,
                                               min_crop_area=crop, flip=flip)
    resumed, _ = training.training_data(train_source, eval_source, 16, 64, 2, 1, 0, 360,
                                        min_crop_area=crop, flip=flip)
    second_epoch = [x for x, _ in whole.skip(steps).take(1)][0]
    np.testing.assert_array_equal(second_epoch, [x for x, _ in resumed.take(1)][0])
    images, labels = next(iter(validation))
    assert images.shape == (360, 16, 16, 3) and labels.shape == (360, 10)


def test_predict_prints_top5_labels_of_image_files(pretrained, tmp_path, capsys):
    out, _ = pretrained
    _, (images, labels) = data.digits(image_size=16)
    paths = []
    for i in range(2):
        path = tmp_path / f"digit{i}.png"
        tf.io.write_file(str(path), tf.io.encode_png(images[i]))
        paths.append(str(path))
    results = cli.main(["predict", "--weights", str(out / "model.keras"), *paths])
    printed = capsys.readouterr().out
    assert len(results) == 2 and all(len(r) == 5 for r in results)
    assert {name for name, _ in results[0]} <= {str(i) for i in range(10)}
    assert paths[0] in printed
    probabilities = [p for _, p in results[0]]
    assert probabilities == sorted(probabilities, reverse=True)
    assert all(0.0 < p <= 1.0 for p in probabilities) and sum(probabilities) <= 1.0 + 1e-6
    with pytest.raises(FileNotFoundError, match="Image not found"):
        cli.main(["predict", "--weights", str(out / "model.keras"), str(tmp_path / "missing.png")])


def test_convert_npz_to_keras_keeps_the_logits(tmp_path):
    target = tmp_path / "vit.keras"
    cli.main(["convert", fixture("vit_token.npz"), str(target)])
    model = keras.saving.load_model(target)
    images, logits = reference("vit_token")
    probabilities = keras.ops.convert_to_numpy(model(images))
    expected = np.exp(logits - logits.max(-1, keepdims=True))
    np.testing.assert_allclose(probabilities, expected / expected.sum(-1, keepdims=True), atol=1e-5)
    assert model.get_layer("encoderblock_0").num_heads == SMALL["num_heads"]


@pytest.mark.parametrize(
    "argv,error,message",
    [
        (["--dataset", "no_such_set_xyz"], ValueError, "Unknown data set 'no_such_set_xyz'"),
        (["--dataset", "imagenet2012", "--data-dir", "/nonexistent/tfds"], FileNotFoundError, "Data directory not found"),
        (["--image-size", "30"], ValueError, r"image_size \(30, 30\) is not divisible by patch_size 4"),
        (["--model", "ViT_R26_S32", "--image-size", "48"], ValueError, "is not divisible by the hybrid's 32 pixels per patch"),
        (["--model", "ViT_X99"], ValueError, "Unknown model 'ViT_X99'"),
        (["--weights", fixture("vit_token.npz"), "--model", "ViT_Ti16"], CheckpointError, "has 2 encoder blocks but the model has 12"),
        (["--distribution", "mirrored" if BACKEND != "tensorflow" else "data_parallel"], ValueError, "engine needs the"),
    ],
)
def test_bad_input_fails_before_training(argv, error, message, tmp_path):
    quick = QUICK if "--model" not in argv else QUICK[:2]  # A named model brings its own sizes.
    with pytest.raises(error, match=message):
        cli.main(["pretrain", *quick, "--epochs", "1", "--output-dir", str(tmp_path), *argv])
    assert not (tmp_path / "log.csv").exists()


def test_mixed_precision_flag_trains_in_bfloat16_as_a_printed_choice_leaving_the_global_policy(tmp_path, capsys):
    top1 = cli.main(["pretrain", *QUICK, "--epochs", "1", "--output-dir", str(tmp_path), "--mixed-precision"])
    assert keras.config.dtype_policy().name == "float32"
    assert "precision: mixed_bfloat16 (float32 weights, bfloat16 computation; --mixed-precision)\n" in \
        capsys.readouterr().out
    model = keras.saving.load_model(tmp_path / "model.keras")
    assert model.get_layer("encoderblock_0").dtype_policy.name == "mixed_bfloat16"
    assert all(v.dtype == "float32" for v in model.weights)
    assert 0.0 <= top1 <= 1.0


def test_nan_loss_stops_training_with_a_message(tmp_path):
    with pytest.raises(RuntimeError, match="loss became NaN"):
        cli.main(["pretrain", *QUICK, "--epochs", "3", "--output-dir", str(tmp_path), "--learning-rate", "1e38",
                  "--clipnorm", "1e30", "--warmup-steps", "0"])
    assert not (tmp_path / "model.keras").exists()


def _pretrain_command(out):
    return [sys.executable, os.path.join(ROOT, "examples", "pretrain.py"), *QUICK, "--epochs", "8",
            "--output-dir", str(out), "--warmup-steps", "10", "--dropout", "0.0"]


# A kill at a random moment tests the backups' file mechanics; resuming to equal weights at each kind of
# moment is tested on every backend by test_durable.py's exact kill points.
@pytest.mark.skipif(BACKEND != "jax", reason="runs in the jax pass; test_durable.py resumes on every backend")
def test_killed_training_resumes_to_the_same_weights(tmp_path):
    env = {**os.environ, "KERAS_BACKEND": BACKEND, "TF_CPP_MIN_LOG_LEVEL": "2",
           "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    uninterrupted, resumed = tmp_path / "uninterrupted", tmp_path / "resumed"
    done = subprocess.run(_pretrain_command(uninterrupted), env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]

    process = subprocess.Popen(_pretrain_command(resumed), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    latest = resumed / "backup" / "latest"  # names the newest complete set, backup/epoch-<N>
    deadline = time.time() + 300
    while time.time() < deadline and process.poll() is None:
        if latest.exists() and latest.read_text().strip() != "epoch-1":
            break
        time.sleep(0.02)
    assert process.poll() is None, "training ended before it could be killed"
    process.send_signal(signal.SIGKILL)
    process.wait()
    killed_at = training.resumed_epoch(str(resumed / "backup"))
    assert 2 <= killed_at < 8 and not (resumed / "model.keras").exists()

    done = subprocess.run(_pretrain_command(resumed), env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    log = (resumed / "log.csv").read_text().strip().splitlines()
    assert [int(line.split(",")[0]) for line in log[1:]][-1] == 7
    a = keras.saving.load_model(uninterrupted / "model.keras")
    b = keras.saving.load_model(resumed / "model.keras")
    for x, y in zip(a.weights, b.weights):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(x), keras.ops.convert_to_numpy(y), atol=1e-6,
                                   err_msg=x.path)


def test_trained_model_loads_in_a_fresh_process(pretrained):
    out, _ = pretrained
    code = "import keras, keras_vit, sys; m = keras.saving.load_model(sys.argv[1]); print(m.optimizer.__class__.__name__)"
    done = subprocess.run([sys.executable, "-c", code, str(out / "model.keras")], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "KERAS_BACKEND": BACKEND})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("AdamW")


@pytest.mark.backend_independent
def test_console_entry_point_runs():
    script = os.path.join(os.path.dirname(sys.executable), "keras-vit")
    assert os.path.exists(script), "pip install -e . creates the keras-vit command"
    done = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    for command in ("pretrain", "finetune", "evaluate", "predict", "convert an original .npz checkpoint to .keras"):
        assert command in done.stdout


# --- Nothing silently wrong ---------------------------------------------------------


def test_finetune_with_ema_saves_a_model_that_loads(pretrained, tmp_path):
    """fit -> evaluate -> save with Polyak averaging: on JAX the save failed with 'Array has been deleted'."""
    out, _ = pretrained
    cli.main(["finetune", *QUICK, "--weights", str(out / "model.keras"), "--epochs", "1", "--ema", "0.9",
              "--output-dir", str(tmp_path)])
    model = keras.saving.load_model(tmp_path / "model.keras")
    assert model.output_shape == (None, 10)


def test_finetune_with_lora_trains_only_the_adapters_and_the_head(pretrained, tmp_path):
    out, _ = pretrained
    base = keras.saving.load_model(out / "model.keras")
    cli.main(["finetune", *QUICK, "--weights", str(out / "model.keras"), "--epochs", "1", "--lora-rank", "2",
              "--output-dir", str(tmp_path)])
    model = keras.saving.load_model(tmp_path / "model.keras")
    block = model.get_layer("encoderblock_0")
    assert block.qkv.lora_enabled and block.qkv.lora_rank == 2
    assert sorted({v.path.split("/")[-1] for v in model.trainable_weights}) == [
        "bias", "kernel", "lora_kernel_a", "lora_kernel_b"]  # the head's, and the adapters
    for name in ("attention_norm", "mlp_hidden"):  # frozen base weights
        for trained, pretrained_value in zip(getattr(block, name).weights,
                                             getattr(base.get_layer("encoderblock_0"), name).weights):
            np.testing.assert_array_equal(keras.ops.convert_to_numpy(trained),
                                          keras.ops.convert_to_numpy(pretrained_value))
    with pytest.raises(ValueError, match="--lora-rank must be at least 1, got 0"):
        cli.main(["finetune", *QUICK, "--weights", str(out / "model.keras"), "--lora-rank", "0",
                  "--output-dir", str(tmp_path / "bad")])


def test_training_without_tensorboard_or_matplotlib_skips_them_with_a_note(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # import tensorboard -> ImportError
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    cli.main(["pretrain", *QUICK, "--epochs", "1", "--output-dir", str(tmp_path), "--warmup-steps", "1"])
    printed = capsys.readouterr().out
    assert "note: TensorBoard logs skipped: the optional package 'tensorboard' is not installed" in printed
    assert "note: the learning-curve plot skipped: the optional package 'matplotlib' is not installed" in printed
    assert (tmp_path / "model.keras").exists() and not (tmp_path / "tensorboard").exists()


def test_tensorboard_without_tensorflow_is_left_out_without_telling_to_install_tensorflow(monkeypatch, tmp_path,
                                                                                          capsys):
    # A [jax] install was told "pip install 'keras-vision-transformer[tensorflow]'" on every run.
    monkeypatch.setitem(sys.modules, "tensorflow", None)
    assert training.tensorboard_callbacks(str(tmp_path)) == []
    assert capsys.readouterr().out == ""


@pytest.mark.backend_independent
def test_the_learning_curve_shows_every_line_of_one_epoch_and_lines_on_each_other(tmp_path):
    # One epoch drew each line as one point without a marker, nothing; a held-out line on the training one, or at an
    # accuracy of 1.0 on the axis' edge, hid behind it.
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    (tmp_path / "log.csv").write_text("epoch,loss,top1,val_loss,val_top1\n0,0.5,1.0,0.5,1.0\n")
    figure = training.learning_curve(str(tmp_path / "log.csv"))
    for axis in figure.axes:
        lines = axis.get_lines()
        assert [line.get_label() for line in lines] == ["train", "held-out"]
        assert all(line.get_marker() not in (None, "", "None") for line in lines)
        assert len({(line.get_linestyle(), line.get_marker()) for line in lines}) == 2
    low, high = figure.axes[1].get_ylim()
    assert low < 0 and high > 1
    plt.close(figure)


def write_digit_folders(root, splits):
    _, (images, labels) = data.digits(image_size=16)
    for split, classes in splits.items():
        for label in classes:
            os.makedirs(root / split / str(label), exist_ok=True)
            for i in np.flatnonzero(labels == label)[:4]:
                tf.io.write_file(str(root / split / str(label) / f"{i}.png"), tf.io.encode_png(images[i]))


def test_evaluate_labels_a_folder_with_the_models_classes_and_checks_their_count(pretrained, tmp_path, capsys):
    out, _ = pretrained
    model = keras.saving.load_model(out / "model.keras")
    write_digit_folders(tmp_path, {"test": [0, 2, 7]})  # three of the ten classes the model knows
    results = cli.main(["evaluate", "--weights", str(out / "model.keras"), "--dataset", str(tmp_path / "test"),
                        "--verbose", "0"])
    images = np.stack([tf.io.decode_png(tf.io.read_file(str(p))).numpy()
                       for c in ("0", "2", "7") for p in sorted((tmp_path / "test" / c).iterdir())])
    predicted = np.argmax(keras.ops.convert_to_numpy(model(images / 127.5 - 1.0)), axis=-1)
    truth = np.repeat([0, 2, 7], 4)  # the labels of classes.txt, not 0, 1, 2
    assert results["top1"] == pytest.approx(np.mean(predicted == truth), abs=1e-6)
    write_digit_folders(tmp_path, {"other": [3, 4]})
    alone = tmp_path / "alone"  # the model without the classes.txt beside it (the shared run stays whole)
    alone.mkdir()
    shutil.copy(out / "model.keras", alone / "model.keras")
    with pytest.raises(ValueError, match=r"has 10 classes but '.*other' \(test\) has 2: evaluate a model"):
        cli.main(["evaluate", "--weights", str(alone / "model.keras"), "--dataset", str(tmp_path / "other")])


def test_evaluate_refuses_a_model_with_a_nan_weight(pretrained, tmp_path):
    out, _ = pretrained
    model = keras.saving.load_model(out / "model.keras")
    model.get_layer("head").bias.assign(np.full((10,), np.nan, "float32"))
    model.save(tmp_path / "nan.keras")
    with pytest.raises(CheckpointError, match=r"nan.keras holds NaN or infinite weights in 1 variables: \['head/bias'\]"):
        cli.main(["evaluate", "--weights", str(tmp_path / "nan.keras"), "--verbose", "0"])


def test_predict_checks_the_labels_file(pretrained, tmp_path):
    out, _ = pretrained
    _, (images, _) = data.digits(image_size=16)
    image = tmp_path / "digit.png"
    tf.io.write_file(str(image), tf.io.encode_png(images[0]))
    short = tmp_path / "short.txt"
    short.write_text("zero\none\n")
    with pytest.raises(ValueError, match="short.txt lists 2 class names but the model has 10 outputs"):
        cli.main(["predict", "--weights", str(out / "model.keras"), "--labels", str(short), str(image)])
    binary = tmp_path / "labels.bin"
    binary.write_bytes(bytes(range(256)))
    with pytest.raises(ValueError, match=r"labels.bin is not a text file of class names"):
        cli.main(["predict", "--weights", str(out / "model.keras"), "--labels", str(binary), str(image)])


def test_training_on_a_folder_without_splits_evaluates_on_held_out_images(tmp_path, capsys):
    write_digit_folders(tmp_path, {"all": range(10)})
    top1 = cli.main(["pretrain", *QUICK, "--epochs", "1", "--dataset", str(tmp_path / "all"), "--batch-size", "8",
                     "--output-dir", str(tmp_path / "run"), "--holdout-fraction", "0.25", "--warmup-steps", "1"])
    train, test = training.load_sources(str(tmp_path / "all"), 16, holdout_fraction=0.25)
    assert (train.num_examples, test.num_examples) == (30, 10)
    assert 0.0 <= top1 <= 1.0
