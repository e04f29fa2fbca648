"""Files that are either whole or not there: write to a temporary name, flush to disk, then rename.

A leaf module (it imports nothing from keras_vit), so every part of the
package may use it. A process killed or a disk filled while writing leaves
the previous file untouched and, at worst, a `.tmp-*` file beside it.

Example:
>>> with atomic_path("/tmp/classes.txt") as path:
...     with open(path, "w") as f:
...         _ = f.write("cat\\n")
"""

import contextlib
import hashlib
import os
import shutil


def temporary_name(target):
    """A hidden name beside `target` that keeps its ending (`.keras`, `.weights.h5`, `.png`)."""
    folder, name = os.path.split(os.path.abspath(target))
    return os.path.join(folder, f".tmp-{os.getpid()}-{name}")


def fsync_path(path):
    """Flush a file, or a folder's entries (a rename), to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def user_file_mode():
    """The mode a new file gets under the process's umask (0o644 under umask 022)."""
    umask = os.umask(0)  # Python can only read the umask by setting it; restored at once.
    os.umask(umask)
    return 0o666 & ~umask


@contextlib.contextmanager
def atomic_path(target):
    """Yield a temporary path beside `target`; once the block has written it, flush it and rename it to `target`.

    If the block raises (a full disk, say), `target` keeps its old contents
    and the temporary file or folder is removed. A file gets the user's
    umask mode, whatever mode the writer gave it (safetensors writes
    0o600). A folder (a SavedModel) replaces the old folder as a whole; a
    block that wrote nothing is an error.
    """
    temporary = temporary_name(target)
    remove(temporary)  # Left by a killed writer of this process id.
    try:
        yield temporary
        if not os.path.lexists(temporary):
            raise RuntimeError(f"Nothing was written to {temporary}.")
        if os.path.isdir(temporary):
            previous = temporary_name(target + ".old")
            if os.path.isdir(target):
                os.replace(target, previous)
            os.replace(temporary, target)
            remove(previous)
        else:
            os.chmod(temporary, user_file_mode())
            fsync_path(temporary)
            os.replace(temporary, target)
    except BaseException:
        remove(temporary)
        raise
    fsync_path(os.path.dirname(os.path.abspath(target)))


@contextlib.contextmanager
def atomic_path_with_sidecars(target):
    """`atomic_path` for a writer that also writes files named after its file (ONNX's external `<name>.data`).

    Yields `target`'s name inside a hidden temporary folder beside it, so
    what the written file refers to by name is named as it will be. Once
    the block has written it, each sidecar is flushed and renamed beside
    `target` first, then `target` itself; if the block raises, the folder
    is removed and `target` keeps its old contents.
    """
    folder = temporary_name(target)
    remove(folder)  # Left by a killed writer of this process id.
    os.makedirs(folder)
    name = os.path.basename(target)
    try:
        yield os.path.join(folder, name)
        if not os.path.isfile(os.path.join(folder, name)):
            raise RuntimeError(f"Nothing was written to {os.path.join(folder, name)}.")
        destination = os.path.dirname(os.path.abspath(target))
        for written in sorted(set(os.listdir(folder)) - {name}) + [name]:  # `target` last
            os.chmod(os.path.join(folder, written), user_file_mode())
            fsync_path(os.path.join(folder, written))
            os.replace(os.path.join(folder, written), os.path.join(destination, written))
        fsync_path(destination)
    finally:
        remove(folder)


def sha256_of(path, chunk=1 << 20):
    """The sha256 of a file's bytes, as a hex string (read `chunk` bytes at a time)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            digest.update(block)
    return digest.hexdigest()


def write_text(target, text):
    """Replace `target` with `text`, atomically."""
    with atomic_path(target) as path:
        with open(path, "w") as f:
            f.write(text)


def remove(path):
    """Delete a file or a folder tree if it is there."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.remove(path)


def remove_temporary(folder):
    """Delete the temporary files that writers killed mid-write left in `folder`."""
    for name in os.listdir(folder):
        if name.startswith(".tmp-"):
            remove(os.path.join(folder, name))
