"""What a run leaves behind and says: its callbacks, log, learning curve, model.keras and report.

Example:
>>> from keras_vit.training import run_outputs
>>> run_outputs.report({"top1": 0.975, "loss": 0.1})  # doctest: +SKIP
"""

import csv
import importlib
import os

import keras
import numpy as np

from keras_vit import data
from keras_vit.data import preprocessing
from keras_vit.model.description import is_naflex
from keras_vit.model.vision_transformer import VisionTransformer
from keras_vit.training import durable
from keras_vit.utils import files

# The accuracy columns a CSVLogger file may hold, and their plot titles.
_ACCURACY_TITLES = {"top1": "Top-1 accuracy", "corrupted_accuracy": "Corrupted-patch colour accuracy"}


def make_callbacks(output_dir, backup_dir, initial_epoch=0, is_chief=True):
    """On the chief `durable.DurableLog` (log.csv), then on every process `durable.DurableBackup` and TerminateOnNaN,
    then on the chief TensorBoard.

    The log is written before the backup, so it always has a row for each epoch the backup holds.
    """
    log = [durable.DurableLog(os.path.join(output_dir, "log.csv"), initial_epoch)] if is_chief else []
    callbacks = [*log, durable.DurableBackup(backup_dir, initial_epoch), keras.callbacks.TerminateOnNaN()]
    if is_chief:
        callbacks += tensorboard_callbacks(os.path.join(output_dir, "tensorboard"))
    return callbacks


def optional_package(package, what, install=None):
    """Whether `package` imports; if not, print a one-line note that `what` is skipped and how to install it."""
    try:
        importlib.import_module(package)
        return True
    except ImportError:
        print(f"note: {what} skipped: the optional package {package!r} is not installed (pip install {install or package})")
        return False


def tensorboard_callbacks(log_dir):
    """`[keras.callbacks.TensorBoard(log_dir)]`; `[]` without TensorFlow, and `[]` with a note without tensorboard.

    Keras writes TensorBoard logs with TensorFlow's `tf.summary`: a `[jax]`
    or `[torch]` install goes without them, and is not told to install
    TensorFlow for them (log.csv and learning_curve.png hold the same numbers).
    """
    if not data.tensorflow_installed() or not optional_package("tensorboard", "TensorBoard logs"):
        return []
    return [keras.callbacks.TensorBoard(log_dir)]


def check_finite(history, backup_dir=None, learning_rate=None):
    """Raise if TerminateOnNaN stopped `model.fit` (the last loss is not finite), saying how to resume.

    The backup in `backup_dir` keeps the last finite epoch's state; the
    message suggests rerunning from it at half `learning_rate`.
    """
    if not history.history.get("loss") or np.isfinite(history.history["loss"][-1]):
        return
    message = "Training stopped: the loss became NaN (TerminateOnNaN)."
    folder, epoch = durable.latest_state(backup_dir) if backup_dir else (None, 0)
    rerun = f"rerun the same command with --learning-rate {learning_rate / 2:g}" if learning_rate else "rerun"
    if folder:
        message += f" {folder} keeps the state after epoch {epoch}, the last finite one: {rerun} to resume from it."
    else:
        message += f" No epoch finished: {rerun} to start over."
    raise RuntimeError(message)


def save_run(encoder, output_dir, class_names=None, process_index=0):
    """Write model.keras (`encoder`, which keeps `class_names` as its own), classes.txt (unless `class_names` is
    None) and learning_curve.png, atomically.

    Prints where the model and its log (log.csv, written during training)
    are. Only the chief (process 0) writes; the others save to a scratch file,
    since saving gathers the weights with a collective every process joins.
    """
    durable.kill_point("before-save")
    if isinstance(encoder, VisionTransformer):
        if encoder.eval_transform is None and not is_naflex(encoder):  # keras_vit's resize, as it was evaluated
            encoder.eval_transform = preprocessing.keras_vit()
        if class_names is not None:  # `decode_predictions` and `keras-vit predict` read them from model.keras
            encoder.class_names = [str(name) for name in class_names]
    if process_index != 0:
        scratch = os.path.join(output_dir, f".process_{process_index}.keras")
        encoder.save(scratch)
        os.remove(scratch)
        return
    # Each file is written under a temporary name and renamed into place: a kill leaves the old one whole.
    with files.atomic_path(os.path.join(output_dir, "model.keras")) as path:
        encoder.save(path)
        durable.kill_point("final-save")
    if class_names is not None:
        files.write_text(os.path.join(output_dir, "classes.txt"), "".join(f"{name}\n" for name in class_names))
    plot_learning_curve(os.path.join(output_dir, "log.csv"), os.path.join(output_dir, "learning_curve.png"))
    beside = [name for name in ("classes.txt", "learning_curve.png", "tensorboard")
              if os.path.exists(os.path.join(output_dir, name))]
    print(f"wrote {os.path.join(output_dir, 'model.keras')} and its log {os.path.join(output_dir, 'log.csv')}"
          + (f" (beside them: {', '.join(beside)})" if beside else ""))


def report(results):
    """Print and return the held-out accuracy of `model.evaluate(..., return_dict=True)`.

    `top-1 accuracy: 0.xxxx`, or for masked patch prediction
    `corrupted-patch colour accuracy: 0.xxxx`.
    """
    metric = "top1" if "top1" in results else "corrupted_accuracy"
    print(f"{_ACCURACY_TITLES[metric].lower()}: {results[metric]:.4f}")
    return results[metric]


def plot_learning_curve(log_path, png_path):
    """Write `learning_curve(log_path)` to `png_path` (nothing without matplotlib or a logged epoch)."""
    if not optional_package("matplotlib", "the learning-curve plot"):
        return
    import matplotlib.pyplot as plt

    figure = learning_curve(log_path)
    if figure is None:
        return
    with files.atomic_path(png_path) as path:
        figure.savefig(path, dpi=100)
    plt.close(figure)


def learning_curve(log_path):
    """The figure of loss and accuracy per epoch, training and held-out, from a CSVLogger file; None if it has no row.

    The accuracy is top-1, or for masked patch prediction the corrupted-patch
    colour accuracy, whichever the file has. Every epoch is a marker and
    held-out lines are dashed, so that each line shows: one epoch's (a point
    without a line), one that lies on another, and one at 0 or 1 (the axis
    runs a little past both).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    with open(log_path) as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return None
    epochs = [int(r["epoch"]) + 1 for r in rows]
    metric = next((name for name in _ACCURACY_TITLES if name in rows[0]), "top1")
    title = _ACCURACY_TITLES[metric]
    figure, (loss_axis, accuracy_axis) = plt.subplots(1, 2, figsize=(9, 3.5))
    for axis, key in ((loss_axis, "loss"), (accuracy_axis, metric)):
        for column, label, style in ((key, "train", "o-"), (f"val_{key}", "held-out", "s--")):
            if column in rows[0]:
                axis.plot(epochs, [float(r[column]) for r in rows], style, label=label, markersize=4)
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.legend()
    loss_axis.set(xlabel="epoch", ylabel="loss", title="Loss")
    accuracy_axis.set(xlabel="epoch", ylabel=title.lower(), title=title, ylim=(-0.03, 1.03))
    figure.tight_layout()
    return figure
