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
    and the temporary file is removed. A file gets the user's umask mode,
    whatever mode the writer gave it (safetensors writes 0o600).
    """
    temporary = temporary_name(target)
    try:
        yield temporary
        if os.path.isfile(temporary):
            os.chmod(temporary, user_file_mode())
        fsync_path(temporary)
        os.replace(temporary, target)
    except BaseException:
        remove(temporary)
        raise
    fsync_path(os.path.dirname(os.path.abspath(target)))


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
