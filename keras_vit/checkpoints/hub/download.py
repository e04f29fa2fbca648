"""Downloading a checkpoint into a private cache, so that nothing partial, foreign or changed is ever loaded.

A download goes to a temporary file beside its target, is checked (the
size the server announced, the file's signature, a readable structure, a
known sha256), and only then is renamed into place, under a per-file lock
so that concurrent processes download once and never see a partial file.
The sha256 of every file that enters the cache is stored beside it
(`<file>.sha256`) and compared on each later use.

`CONNECT_TIMEOUT`, `READ_TIMEOUT` (seconds without a byte), `RETRIES` and
`BACKOFF` are module-level settings; set them to change every download. A
download shows its bytes in a `keras.utils.Progbar` unless `verbose=0`
(by default, when Keras' interactive logging is on).
"""

import contextlib
import glob
import http.client
import logging
import os
import socket
import stat
import tempfile
import time
import urllib.error
import urllib.request

import keras

from keras_vit.checkpoints.source import CheckpointError
from keras_vit.utils import files

try:
    import fcntl
except ImportError:  # Not POSIX (Windows): downloads are still atomic, but two processes may both download.
    fcntl = None

CONNECT_TIMEOUT = 30.0
READ_TIMEOUT = 30.0
RETRIES = 2  # Further attempts after a connection error or timeout (never after an HTTP error status).
BACKOFF = 1.0  # Seconds before the first retry, doubled before each next one.
CHUNK = 1 << 20

logger = logging.getLogger("keras_vit")


class DownloadError(CheckpointError):
    """A download that failed or was refused; nothing of it entered the cache."""


def private_folder(home, subfolder, hint):
    """`home/subfolder`, created with mode 0o700 where missing, refused if another user could change its files.

    `home` and every folder below it down to `subfolder` are checked.
    Refused: a folder we cannot write, a world-writable one (a shared temp
    folder, even with its sticky bit: another user can plant a file we have
    not written yet), one owned by another user (root aside), and a `home`
    inside a world-writable folder without the sticky bit (it could be
    swapped). `hint` says how to choose another folder.
    """
    home = os.path.abspath(home)
    folders = [home]
    for part in subfolder.split("/"):
        folders.append(os.path.join(folders[-1], part))
    for folder in folders:
        try:
            os.makedirs(folder, mode=0o700, exist_ok=True)
        except OSError as error:
            raise CheckpointError(f"Cannot create the checkpoint cache folder {folder}: {error}. {hint}") from error
    parent = os.stat(os.path.dirname(home))
    if parent.st_mode & stat.S_IWOTH and not parent.st_mode & stat.S_ISVTX:
        _refuse(os.path.dirname(home), "is writable by every user without the sticky bit", hint)
    for folder in folders:
        info = os.stat(folder)
        if not os.access(folder, os.W_OK | os.X_OK):
            _refuse(folder, "is not writable by this user", hint)
        if info.st_mode & stat.S_IWOTH:
            _refuse(folder, f"is writable by every user (mode {stat.S_IMODE(info.st_mode):o})", hint)
        if hasattr(os, "getuid") and info.st_uid not in (os.getuid(), 0):
            _refuse(folder, f"belongs to another user (uid {info.st_uid})", hint)
    return folders[-1]


def _refuse(folder, problem, hint):
    raise CheckpointError(
        f"Refusing the checkpoint cache folder {folder}: it {problem}, so a file there could be planted or "
        f"changed by someone else. {hint}"
    )


@contextlib.contextmanager
def _locked(path):
    """Hold an exclusive `fcntl.flock` on `path + ".lock"` (no lock where fcntl is missing)."""
    if fcntl is None:
        yield
        return
    with open(path + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def cached(url, target, check, file_hash=None, verbose=None):
    """The verified path of `url`'s file at `target`, downloading it first if it is not there.

    `verbose=0` downloads without a progress bar; None shows one when Keras'
    interactive logging is on (`keras.config.is_interactive_logging_enabled`).

    `check(path, description)` raises `CheckpointError` for a file that is
    not a readable checkpoint. A cached file is compared with the sha256
    recorded when it entered the cache; one without a record (from an older
    keras_vit, or placed by hand) is checked, and discarded if it fails.
    """
    if not os.path.exists(target):
        with _locked(target):
            if not os.path.exists(target):  # Another process may have finished it while we waited.
                _download(url, target, check, file_hash, verbose)
                return target
    _verify_cached(url, target, check, file_hash, verbose)
    return target


def _verify_cached(url, target, check, file_hash, verbose):
    record = target + ".sha256"
    actual = files.sha256_of(target)
    if os.path.exists(record):
        with open(record) as f:
            recorded = f.read().split()[0]
        if actual != recorded:
            raise CheckpointError(
                f"The cached file {target} changed since it was downloaded from {url} (sha256 {actual}, "
                f"recorded {recorded}). Delete it (rm {target} {record}) to download it again."
            )
    else:
        try:
            _check_file(target, target, check)
        except CheckpointError as error:
            with _locked(target):
                _remove(target)
            logger.warning("Discarded the unverified cached file %s: %s Downloading it again.", target, error)
            return cached(url, target, check, file_hash, verbose)
        with open(record, "w") as f:
            f.write(f"{actual}  {os.path.basename(target)}\n")
    if file_hash and actual != file_hash:
        raise CheckpointError(
            f"The cached file {target} does not match the known sha256 {file_hash} of {url} (it has {actual}). "
            f"Delete it (rm {target} {record}) to download it again."
        )


def _download(url, target, check, file_hash, verbose):
    folder = os.path.dirname(target)
    for stale in glob.glob(glob.escape(target) + ".*.part"):  # Left by a killed download; we hold the lock.
        _remove(stale)
    handle, partial = tempfile.mkstemp(dir=folder, prefix=os.path.basename(target) + ".", suffix=".part")
    try:
        with os.fdopen(handle, "wb") as out:
            _get(url, out, keras.config.is_interactive_logging_enabled() if verbose is None else bool(verbose))
        try:
            _check_file(partial, target, check)
        except DownloadError:
            raise
        except CheckpointError as error:
            raise DownloadError(f"the download was refused: {error}") from error
        actual = files.sha256_of(partial)
        if file_hash and actual != file_hash:
            raise DownloadError(f"the download does not match its known sha256 {file_hash} (got {actual}).")
        os.chmod(partial, 0o600)
        with open(target + ".sha256", "w") as f:
            f.write(f"{actual}  {os.path.basename(target)}\n")
        os.replace(partial, target)
    finally:
        _remove(partial)


def _get(url, out, progress=False):
    """Write `url`'s body to `out`, retrying connection errors and timeouts `RETRIES` times; `progress`: a bar."""
    for attempt in range(RETRIES + 1):
        out.seek(0)
        out.truncate()
        waiting = ["connecting or waiting for an answer", CONNECT_TIMEOUT]
        try:
            return _get_once(url, out, waiting, progress)
        except urllib.error.HTTPError as error:
            raise DownloadError(f"the server answered HTTP {error.code} {error.reason}.") from error
        except (TimeoutError, socket.timeout) as error:
            problem, cause = f"timed out after {waiting[1]:g} s {waiting[0]}", error
        except (urllib.error.URLError, ConnectionError, http.client.HTTPException) as error:
            reason = getattr(error, "reason", error)
            if isinstance(reason, (TimeoutError, socket.timeout)):
                problem = f"timed out after {CONNECT_TIMEOUT:g} s connecting"
            else:
                problem = f"failed: {reason}"
            cause = error
        if attempt < RETRIES:
            logger.warning("Download of %s %s; retrying (%d of %d).", url, problem, attempt + 1, RETRIES)
            time.sleep(BACKOFF * 2**attempt)
    raise DownloadError(f"the download {problem} ({RETRIES + 1} attempts).") from cause


def _get_once(url, out, waiting, progress):
    with urllib.request.urlopen(url, timeout=CONNECT_TIMEOUT) as response:
        with contextlib.suppress(AttributeError, OSError):  # The headers are in: from here, the read timeout.
            response.fp.raw._sock.settimeout(READ_TIMEOUT)
            waiting[:] = ["without data", READ_TIMEOUT]
        kind = response.headers.get("Content-Type", "")
        if kind.split(";")[0].strip().lower() in ("text/html", "application/xhtml+xml"):
            raise DownloadError(f"the server served an HTML page (Content-Type {kind}), not a checkpoint.")
        length = response.headers.get("Content-Length")
        expected = int(length) if length and length.isdigit() else None
        received = 0
        bar = keras.utils.Progbar(expected, unit_name="byte") if progress else None
        try:
            for block in iter(lambda: response.read(CHUNK), b""):
                out.write(block)
                received += len(block)
                if bar is not None:
                    bar.update(received, finalize=received == expected)
        except http.client.IncompleteRead as error:
            received += len(error.partial)
        if expected is not None and received != expected:
            raise DownloadError(f"the download ended after {received:,} of {expected:,} bytes.")


_SIGNATURES = {".npz": (b"PK\x03\x04", b"PK\x05\x06"), ".keras": (b"PK\x03\x04",), ".h5": (b"\x89HDF\r\n\x1a\n",)}


def _check_file(path, target, check):
    """Check the signature of `path` (to become `target`), then its structure with `check`."""
    suffix = next((s for s in _SIGNATURES if target.endswith(s)), None)
    if suffix:
        with open(path, "rb") as f:
            start = f.read(16)
        if not start.startswith(_SIGNATURES[suffix]):
            page = " (an HTML or text page?)" if start.lstrip()[:1] == b"<" else ""
            raise CheckpointError(
                f"{target} is not a readable {suffix} checkpoint: it starts with {start!r}{page}, "
                f"not the {suffix} signature {_SIGNATURES[suffix][0]!r}."
            )
    check(path, target)


def _remove(path):
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)
