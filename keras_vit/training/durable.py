"""Training state that survives kill -9, a full disk and a NaN loss.

Each finished epoch writes a new, complete set of the training state (the
model's and the optimizer's variables, and the epoch) into
`backup/epoch-<N>.tmp`, flushes it, renames it to `backup/epoch-<N>` and
only then points `backup/latest` at it; the set before it is kept as a
fallback, older ones are deleted. A restart loads the newest set that reads
back whole. `backup/` is removed only after the run's model.keras is written
(`finish`), so a process killed at any moment loses at most one epoch.

`log.csv` is rewritten whole, atomically, at each epoch end (`DurableLog`),
and a resumed run keeps only the rows of the epochs its state holds.

Test hook: with `KERAS_VIT_TEST_KILL_AT=<point>` in the environment, the
process kills itself with SIGKILL at that point (`kill_point`), so tests
can stop real runs at exact moments: `backup-state` or `backup-state:<N>`
(the weights of a set, or of epoch N's, are written, its state file is
not), `before-save` (training has finished,
nothing is saved yet) and `final-save` (model.keras is written under a
temporary name, not yet renamed).
"""

import csv
import io
import json
import logging
import math
import os
import re
import signal

import keras

from keras_vit.utils import files

logger = logging.getLogger(__name__)

KILL_AT = "KERAS_VIT_TEST_KILL_AT"
WEIGHTS = "model.weights.h5"
STATE = "state.json"
LATEST = "latest"
_SET = re.compile(r"epoch-(\d+)")


def kill_point(name, epoch=None):
    """Test hook: SIGKILL this process here when `KERAS_VIT_TEST_KILL_AT` is `name` (or `name:epoch`)."""
    if os.environ.get(KILL_AT) in (name, f"{name}:{epoch}"):
        os.kill(os.getpid(), signal.SIGKILL)


def backup_dir(output_dir, process_index=0):
    """Where the training state lives: every process its own, only the chief's (0) shared."""
    path = os.path.join(output_dir, "backup")
    return path if process_index == 0 else os.path.join(path, f"process_{process_index}")


def check_output_dir(output_dir, overwrite=False, weights=None, process_index=0):
    """Refuse to train again into a finished `output_dir`, or over the `weights` it starts from.

    A finished run has a model.keras and no backup. With `overwrite` the run
    starts over instead: its backup is deleted (model.keras is replaced only
    once the new one is written).
    """
    model = os.path.join(output_dir, "model.keras")
    if os.path.exists(model) and weights and os.path.exists(weights) and os.path.samefile(weights, model):
        if not overwrite:
            raise FileExistsError(
                f"--weights {weights} is the model.keras of --output-dir {output_dir}, which this run would "
                "replace: choose another --output-dir, or pass --overwrite to replace it.")
    if process_index == 0 and os.path.isdir(output_dir):
        files.remove_temporary(output_dir)  # Left by a process killed while writing.
    if overwrite:
        files.remove(backup_dir(output_dir, process_index))
    elif os.path.exists(model) and not has_state(backup_dir(output_dir)):
        raise FileExistsError(f"{output_dir} holds a finished run: its model is {model}. "
                              "Pass --overwrite to train it again.")


def has_state(backup_dir):
    """Whether `backup_dir` holds training state (a set, or a pointer to one)."""
    if not os.path.isdir(backup_dir):
        return False
    return any(_SET.fullmatch(name) or name == LATEST for name in os.listdir(backup_dir))


def read_set(folder):
    """The epoch a backup set holds; raises `ValueError` saying what is wrong with a damaged one."""
    try:
        with open(os.path.join(folder, STATE)) as f:
            state = json.load(f)
        epoch = int(state["epoch"])
        if files.sha256_of(os.path.join(folder, WEIGHTS)) != state["weights_sha256"]:
            raise ValueError(f"{WEIGHTS} does not match its checksum")
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{type(error).__name__}: {error}") from None
    if os.path.basename(folder) != f"epoch-{epoch}":
        raise ValueError(f"its {STATE} says epoch {epoch}")
    return epoch


def _sets(backup_dir):
    """The complete sets' folders, the one `latest` names first, then newest first; newer ones are unfinished."""
    numbered = sorted(((int(m.group(1)), os.path.join(backup_dir, name)) for name in os.listdir(backup_dir)
                       if (m := _SET.fullmatch(name)) and os.path.isdir(os.path.join(backup_dir, name))),
                      reverse=True)
    try:
        with open(os.path.join(backup_dir, LATEST)) as f:
            latest = _SET.fullmatch(f.read().strip())
    except OSError:
        latest = None
    if latest:
        numbered = [(epoch, path) for epoch, path in numbered if epoch <= int(latest.group(1))]
    return [path for _, path in numbered]


def latest_state(backup_dir):
    """`(folder, epoch)` of the newest backup set that reads back whole, or `(None, 0)` for a new run.

    A damaged set is passed over with a note naming it; if every set is
    damaged, the error names the folder and how to start over.
    """
    if not has_state(backup_dir):
        return None, 0
    problems = []
    for folder in _sets(backup_dir):
        try:
            epoch = read_set(folder)
        except ValueError as error:
            problems.append(f"{folder} ({error})")
            continue
        if problems:
            logger.warning("note: the training state in %s is damaged; resuming from %s (epoch %d) instead",
                           "; ".join(problems), folder, epoch)
        return folder, epoch
    raise RuntimeError(f"No usable training state in {backup_dir}: "
                       f"{'; '.join(problems) or 'no complete epoch-<N> set'}. To start over, delete {backup_dir} "
                       "or pass --overwrite.")


def resumed_epoch(backup_dir):
    """The epoch a run with this `backup_dir` resumes from (0 for a new run)."""
    return latest_state(backup_dir)[1]


def finish(backup_dir):
    """Delete the training state, once the run's outputs are written."""
    files.remove(backup_dir)


class DurableBackup(keras.callbacks.Callback):
    """Back up the training state at each epoch end, as a new set renamed into place; restore it on start.

    Replaces `keras.callbacks.BackupAndRestore`. `initial_epoch` is the
    epoch `resumed_epoch(backup_dir)` gave (fit's `initial_epoch`); the
    state of that epoch is loaded when training begins. An epoch whose
    loss is not finite is not backed up, so a NaN stop keeps the last
    finite epoch. Nothing is deleted when training ends: call `finish`
    after saving the model.
    """

    def __init__(self, backup_dir, initial_epoch=0, keep=2):
        super().__init__()
        self.backup_dir = backup_dir
        self.initial_epoch = initial_epoch
        self.keep = keep

    def on_train_begin(self, logs=None):
        if not self.initial_epoch:
            return
        folder = os.path.join(self.backup_dir, f"epoch-{self.initial_epoch}")
        try:
            read_set(folder)
            if self.model.optimizer is not None and not self.model.optimizer.built:
                self.model.optimizer.build(self.model.trainable_variables)
            self.model.load_weights(os.path.join(folder, WEIGHTS))
        except (OSError, ValueError) as error:
            raise RuntimeError(f"Cannot resume from the training state in {folder}: {error}. To start over, "
                               f"delete {self.backup_dir} or pass --overwrite.") from error
        logger.warning("note: resumed from %s (epoch %d)", folder, self.initial_epoch)

    def on_epoch_end(self, epoch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(float(loss)):
            return  # Keep the last finite epoch's state.
        self.save(epoch + 1)

    def save(self, epoch):
        """Write the set of `epoch` (epochs finished), point `latest` at it, then delete the older ones."""
        os.makedirs(self.backup_dir, exist_ok=True)
        final = os.path.join(self.backup_dir, f"epoch-{epoch}")
        temporary = final + ".tmp"
        files.remove(temporary)
        os.makedirs(temporary)
        weights = os.path.join(temporary, WEIGHTS)
        self.model.save_weights(weights)
        kill_point("backup-state", epoch)
        state = {"epoch": epoch, "weights_sha256": files.sha256_of(weights)}
        with open(os.path.join(temporary, STATE), "w") as f:
            json.dump(state, f)
        for path in (weights, os.path.join(temporary, STATE), temporary):
            files.fsync_path(path)
        files.remove(final)  # A damaged set of this epoch, passed over on resuming.
        os.replace(temporary, final)
        files.fsync_path(self.backup_dir)
        files.write_text(os.path.join(self.backup_dir, LATEST), f"epoch-{epoch}\n")
        self._prune(epoch)

    def _prune(self, epoch):
        kept = sorted((int(m.group(1)) for name in os.listdir(self.backup_dir)
                       if (m := _SET.fullmatch(name)) and int(m.group(1)) <= epoch), reverse=True)[: self.keep]
        for name in os.listdir(self.backup_dir):
            m = _SET.fullmatch(name.removesuffix(".tmp"))
            if m and (name.endswith(".tmp") or int(m.group(1)) not in kept):
                files.remove(os.path.join(self.backup_dir, name))


class DurableLog(keras.callbacks.Callback):
    """`log.csv` as `keras.callbacks.CSVLogger` writes it, but rewritten whole and atomically at each epoch end.

    A run resumed at `initial_epoch` keeps the rows of the epochs before it
    and drops any row of an epoch whose state was lost.
    """

    def __init__(self, path, initial_epoch=0):
        super().__init__()
        self.path = path
        self.initial_epoch = initial_epoch
        self.rows = []

    def on_train_begin(self, logs=None):
        self.rows = []
        if self.initial_epoch and os.path.exists(self.path):
            with open(self.path, newline="") as f:
                self.rows = [row for row in csv.DictReader(f) if int(row["epoch"]) < self.initial_epoch]

    def on_epoch_end(self, epoch, logs=None):
        self.rows = [row for row in self.rows if int(row["epoch"]) < epoch]
        self.rows.append({"epoch": epoch, **{key: float(value) for key, value in (logs or {}).items()}})
        keys = sorted({key for row in self.rows for key in row} - {"epoch"})
        text = io.StringIO()
        writer = csv.DictWriter(text, ["epoch", *keys], restval="", lineterminator="\n")
        writer.writeheader()
        writer.writerows(self.rows)
        files.write_text(self.path, text.getvalue())
