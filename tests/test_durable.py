"""Nothing lost: training state and outputs survive kill -9 at exact moments, a full disk and a NaN loss.

The killed runs are real processes (`KERAS_VIT_TEST_KILL_AT`, see keras_vit.training.durable); the reruns and the
uninterrupted reference run in this process. Two epochs of a tiny ViT on the digits at 16 px.
"""

import errno
import os
import shutil
import subprocess
import sys

import keras
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from conftest import shared_run  # noqa: E402

import keras_vit  # noqa: E402
from keras_vit import cli, data, training  # noqa: E402
from keras_vit.checkpoints import save_npz  # noqa: E402
from keras_vit.utils import files

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BACKEND = keras.backend.backend()
SIZES = ["--verbose", "0", "--hidden-size", "32", "--num-layers", "2", "--num-heads", "2", "--mlp-dim", "64",
         "--eval-batch-size", "360", "--batch-size", "256"]
QUICK = [*SIZES, "--epochs", "2", "--warmup-steps", "2"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out, _ = shared_run(tmp_path_factory, "uninterrupted", lambda out: cli.main(
        ["pretrain", *QUICK, "--output-dir", str(out)]))
    return out


def pretrain(out, *flags):
    return cli.main(["pretrain", *QUICK, "--output-dir", str(out), *flags])


def killed_at(point, out):
    """Run `keras-vit pretrain` in a new process that kills itself (SIGKILL) at `point`."""
    env = {**os.environ, "KERAS_BACKEND": BACKEND, "TF_CPP_MIN_LOG_LEVEL": "2", "KERAS_VIT_TEST_KILL_AT": point,
           "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "keras_vit.cli", "pretrain", *QUICK, "--output-dir", str(out)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == -9, done.stderr[-3000:]


def assert_same_weights(a, b):
    a, b = keras.saving.load_model(a / "model.keras"), keras.saving.load_model(b / "model.keras")
    for x, y in zip(a.weights, b.weights):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(x), keras.ops.convert_to_numpy(y), atol=1e-6,
                                   err_msg=x.path)


def logged_epochs(out):
    return [int(line.split(",")[0]) for line in (out / "log.csv").read_text().strip().splitlines()[1:]]


def test_run_killed_after_training_saves_on_rerun_without_training_again(uninterrupted, tmp_path, keras_vit_log):
    killed_at("before-save", tmp_path)
    assert not (tmp_path / "model.keras").exists()
    assert (tmp_path / "backup" / "latest").read_text().strip() == "epoch-2"
    log = (tmp_path / "log.csv").read_text()
    pretrain(tmp_path)
    assert f"resumed from {tmp_path / 'backup' / 'epoch-2'} (epoch 2)" in keras_vit_log.text
    assert (tmp_path / "log.csv").read_text() == log  # no epoch trained again
    assert not (tmp_path / "backup").exists()  # removed once model.keras was written
    assert_same_weights(uninterrupted, tmp_path)


def test_run_killed_while_saving_the_model_resumes_to_a_loadable_model(uninterrupted, tmp_path):
    killed_at("final-save", tmp_path)
    assert not (tmp_path / "model.keras").exists()  # only its temporary file was written
    pretrain(tmp_path)
    assert logged_epochs(tmp_path) == [0, 1]
    assert not [name for name in os.listdir(tmp_path) if name.startswith(".tmp-")]
    assert_same_weights(uninterrupted, tmp_path)


def test_run_killed_between_a_backups_weights_and_state_resumes_from_the_epoch_before(uninterrupted, tmp_path,
                                                                                        keras_vit_log):
    killed_at("backup-state:2", tmp_path)
    backup = tmp_path / "backup"
    assert sorted(os.listdir(backup)) == ["epoch-1", "epoch-2.tmp", "latest"]
    assert (backup / "latest").read_text().strip() == "epoch-1"
    pretrain(tmp_path)
    assert f"resumed from {backup / 'epoch-1'} (epoch 1)" in keras_vit_log.text
    assert logged_epochs(tmp_path) == [0, 1]
    assert_same_weights(uninterrupted, tmp_path)


def test_full_disk_at_the_final_save_keeps_the_previous_model_and_the_backup(uninterrupted, tmp_path, monkeypatch,
                                                                             keras_vit_log):
    """...and a rerun whose newest backup set was then damaged falls back to the set before, with a note."""
    run = tmp_path / "run"
    shutil.copytree(uninterrupted, run)
    previous = {name: (run / name).read_bytes() for name in ("model.keras", "classes.txt", "learning_curve.png")}

    def full_disk(model, path, *args, **kwargs):
        with open(path, "wb") as f:
            f.write(b"PK\x03\x04 half a model")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(keras.Model, "save", full_disk)
    with pytest.raises(OSError, match="No space left on device"):
        pretrain(run, "--overwrite")
    monkeypatch.undo()
    assert {name: (run / name).read_bytes() for name in previous} == previous
    assert not [name for name in os.listdir(run) if name.startswith(".tmp-")]
    backup = run / "backup"
    assert sorted(os.listdir(backup)) == ["epoch-1", "epoch-2", "latest"]

    weights = backup / "epoch-2" / "model.weights.h5"
    weights.write_bytes(weights.read_bytes()[:1000])  # half written
    pretrain(run)
    assert (f"the training state in {backup / 'epoch-2'} (ValueError: model.weights.h5 does not match its checksum) "
            f"is damaged; resuming from {backup / 'epoch-1'} (epoch 1) instead") in keras_vit_log.text
    assert logged_epochs(run) == [0, 1] and not backup.exists()
    assert_same_weights(uninterrupted, run)


@pytest.mark.backend_independent
def test_no_usable_backup_names_the_folder_and_how_to_start_over(tmp_path):
    backup = tmp_path / "backup" / "epoch-1"
    os.makedirs(backup)
    (backup / "state.json").write_text("")  # killed mid-write
    with pytest.raises(RuntimeError, match=rf"No usable training state in {tmp_path / 'backup'}: "
                       rf"{backup} \(JSONDecodeError: .*\)\. To start over, delete {tmp_path / 'backup'} "
                       r"or pass --overwrite\."):
        training.resumed_epoch(str(tmp_path / "backup"))


def test_nan_stop_keeps_the_last_finite_epoch_and_says_how_to_resume(tmp_path, monkeypatch, keras_vit_log):
    clean = training.training_data

    def nan_from_the_second_epoch(train_source, eval_source, image_size, batch_size, *args, **kwargs):
        stream, validation = clean(train_source, eval_source, image_size, batch_size, *args, **kwargs)
        steps = data.steps_per_epoch(train_source, batch_size)
        poisoned = stream.enumerate().map(lambda i, batch: (batch[0] * tf.where(i >= steps, np.nan, 1.0), batch[1]))
        return poisoned, validation

    monkeypatch.setattr(training.run, "training_data", nan_from_the_second_epoch)
    backup = tmp_path / "backup"
    with pytest.raises(RuntimeError, match=rf"^Training stopped: the loss became NaN \(TerminateOnNaN\)\. "
                       rf"{backup / 'epoch-1'} keeps the state after epoch 1, the last finite one: rerun the same "
                       r"command with --learning-rate 0\.0005 to resume from it\.$"):
        pretrain(tmp_path, "--learning-rate", "1e-3")
    monkeypatch.undo()
    assert (backup / "latest").read_text().strip() == "epoch-1" and not (tmp_path / "model.keras").exists()
    pretrain(tmp_path, "--learning-rate", "0.0005")
    assert f"resumed from {backup / 'epoch-1'} (epoch 1)" in keras_vit_log.text
    assert logged_epochs(tmp_path) == [0, 1]
    assert np.isfinite(np.loadtxt(tmp_path / "log.csv", delimiter=",", skiprows=1)).all()


def test_finished_output_dir_is_not_trained_again_without_overwrite(uninterrupted, tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    shutil.copytree(uninterrupted, run)
    model = (run / "model.keras").read_bytes()
    finished = rf"{run} holds a finished run: its model is {run / 'model.keras'}\. Pass --overwrite to train it again\."
    with pytest.raises(FileExistsError, match=f"^{finished}$"):
        pretrain(run)
    monkeypatch.setattr(sys, "argv", ["keras-vit", "pretrain", *QUICK, "--output-dir", str(run)])
    assert cli.console_main() == 2
    assert capsys.readouterr().err.strip() == f"keras-vit: error: {run} holds a finished run: its model is " \
                                              f"{run / 'model.keras'}. Pass --overwrite to train it again."
    assert (run / "model.keras").read_bytes() == model
    cli.main(["pretrain", *SIZES, "--epochs", "1", "--warmup-steps", "1", "--output-dir", str(run), "--overwrite"])
    assert logged_epochs(run) == [0] and (run / "model.keras").read_bytes() != model


def test_finetune_refuses_to_replace_its_own_weights_without_overwrite(uninterrupted, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(uninterrupted, run)
    weights = str(run / "model.keras")
    finetune = ["finetune", *SIZES, "--epochs", "1", "--warmup-steps", "1", "--weights", weights,
                "--output-dir", str(run)]
    with pytest.raises(FileExistsError, match=rf"^--weights {weights} is the model\.keras of --output-dir {run}, "
                       r"which this run would replace: choose another --output-dir, or pass --overwrite to replace "
                       r"it\.$"):
        cli.main(finetune)
    before = keras.saving.load_model(weights)
    cli.main([*finetune, "--overwrite"])
    after = keras.saving.load_model(weights)
    assert after.name == "vit_finetune" and before.name == "vit_pretrain"


@pytest.mark.backend_independent
def test_atomic_writes_leave_the_old_file_whole_when_writing_fails(tmp_path, monkeypatch):
    target = tmp_path / "vit.npz"
    model = keras_vit.ViT(image_size=16, patch_size=8, hidden_size=8, num_layers=1, num_heads=1, mlp_dim=16,
                         classes=2)
    save_npz(model, str(target))
    good = target.read_bytes()

    def full_disk(file, **arrays):
        file.write(b"PK\x03\x04")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(np, "savez", full_disk)
    with pytest.raises(OSError, match="No space left"):
        save_npz(model, str(target))
    with pytest.raises(OSError, match="No space left"):
        with files.atomic_path(str(tmp_path / "classes.txt")) as path:
            open(path, "w").write("half")
            raise OSError(errno.ENOSPC, "No space left on device")
    assert target.read_bytes() == good and sorted(os.listdir(tmp_path)) == ["vit.npz"]


@pytest.mark.backend_independent
def test_figures_and_converted_models_are_replaced_whole_or_not_at_all(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from keras_vit.tools import analysis, inference

    figure_path = tmp_path / "distances.png"
    analysis.plot_mean_attention_distance(np.ones((2, 3)), str(figure_path))
    good_figure = figure_path.read_bytes()
    source = tmp_path / "vit.npz"
    save_npz(keras_vit.ViT(image_size=16, patch_size=8, hidden_size=8, num_layers=1, num_heads=1, mlp_dim=16,
                          classes=2), str(source))
    converted = tmp_path / "vit.keras"
    inference.convert(str(source), str(converted))
    good_model = converted.read_bytes()

    import keras
    import matplotlib.figure

    def full_disk(self, path, *args, **kwargs):
        open(path, "wb").write(b"\x89PNG half")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", full_disk)
    monkeypatch.setattr(keras.Model, "save", full_disk)
    with pytest.raises(OSError, match="No space left"):
        analysis.plot_mean_attention_distance(np.ones((2, 3)), str(figure_path))
    with pytest.raises(OSError, match="No space left"):
        inference.convert(str(source), str(converted))
    assert figure_path.read_bytes() == good_figure and converted.read_bytes() == good_model
    assert sorted(os.listdir(tmp_path)) == ["distances.png", "vit.keras", "vit.npz"]
