"""What happens before Keras is imported: the choice of its backend, and whether this process is the command.

Keras reads `KERAS_BACKEND` (else `backend` in keras.json, else TensorFlow)
once, when it is first imported, and fails there if that backend is not
installed. `choose_backend` keeps any choice the user made and fills in the
one gap: nothing chosen and TensorFlow not installed, as after
`pip install 'keras-vision-transformer[jax]'`; where both jax and torch are
installed, it prefers the one the user installed by name over one that only
came as another package's dependency (jax with jax2onnx or flax). This
module imports only the standard library, so the `keras-vit` command can
parse its flags, and answer `--help`, without importing any backend.
"""

import contextlib
import difflib
import importlib.abc
import importlib.metadata
import importlib.util
import json
import logging
import os
import re
import sys
import tempfile

# Keras' backends that keras_vit supports, in the order one is taken when TensorFlow, Keras' default, is missing.
BACKENDS = ("jax", "torch", "tensorflow")
# Every name Keras 3 takes (keras/src/backend/__init__.py): also its inference-only backends. Case counts.
KERAS_BACKENDS = BACKENDS + ("numpy", "openvino")
COMMAND = "keras-vit"
DISTRIBUTION = "keras-vision-transformer"
CHOOSE = "set KERAS_BACKEND=jax|torch|tensorflow to choose"
# The lines TensorFlow's C++ libraries print to stderr on every import (TensorFlow 2.21 prints its oneDNN note twice,
# whatever TF_CPP_MIN_LOG_LEVEL says): absl's note, INFO lines ("I0000 ... port.cc:153] ...") and the CPU
# instructions that follow one of them.
TENSORFLOW_BANNER = re.compile(r"WARNING: All log messages before absl::InitializeLog\(\) is called are written to "
                               r"STDERR$|I\d{4} [\d:. ]+\d+ [\w/.]+:\d+\] |To enable the following instructions: ")


def log(note):
    """Say `note` as a library does: a warning of the "keras_vit" logger (on stderr unless logging is set up)."""
    logging.getLogger("keras_vit").warning(note)


def installed(backend):
    """Whether the package of `backend` ("jax", "torch" or "tensorflow") can be imported, without importing it."""
    return importlib.util.find_spec(backend) is not None


def fallback(available):
    """The backend taken where none is set and TensorFlow is missing: of the installed `available` (from jax and
    torch, in that order), the first the user installed by name, else the first."""
    return ((installed_by_name(available) if len(available) > 1 else []) or available)[0]


def installed_by_name(backends):
    """Those of the installed `backends` that the user installed for themselves, in their order.

    One is, where the installer recorded it as asked for by name (pip's
    `REQUESTED` file, as after `pip install torch`) or no other installed
    distribution needs it; one that another package needs and nobody named
    came as that package's dependency (jax with jax2onnx or flax, torch with
    timm). keras_vit's own extras do not count: which of them were chosen is
    not recorded.
    """
    needed, requested = set(), set()
    for distribution in importlib.metadata.distributions():
        name = _canonical(distribution.metadata.get("Name") or "")
        if name in backends and distribution.read_text("REQUESTED") is not None:
            requested.add(name)
        if name == DISTRIBUTION:
            continue
        for requirement in distribution.requires or ():
            project, _, marker = requirement.partition(";")
            if "extra" not in marker:  # an optional dependency's extra may not have been installed
                needed.add(_canonical(re.match(r"\s*([\w.-]*)", project).group(1)))
    return [backend for backend in backends if backend in requested or backend not in needed]


def _canonical(name):
    """A distribution's name as PEP 503 compares it: `Keras_Vision.Transformer` -> `keras-vision-transformer`."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _keras_json_backend():
    """`(path, backend)` of the keras.json Keras will read, or `(path, None)`; the same file Keras finds."""
    if "KERAS_HOME" in os.environ:
        folder = os.environ["KERAS_HOME"]
    else:
        home = os.path.expanduser("~")
        folder = os.path.join(home if os.access(home, os.W_OK) else "/tmp", ".keras")
    path = os.path.expanduser(os.path.join(folder, "keras.json"))
    try:
        with open(path) as f:
            config = json.load(f)
    except (OSError, ValueError):
        return path, None
    return path, config.get("backend") if isinstance(config, dict) else None


def choose_backend(say):
    """Set `KERAS_BACKEND` where Keras would otherwise import a TensorFlow that is not installed, and `say` which.

    A backend named by `KERAS_BACKEND` or keras.json is kept (an error if it
    is one of `BACKENDS` and not installed, or a name Keras does not take,
    such as `JAX` or `pytorch`). With neither, or keras.json's
    `"tensorflow"` (which Keras writes there itself on its first import),
    and no TensorFlow, the first of JAX and PyTorch that the user installed
    by name (`installed_by_name`) is taken, else the first installed, and
    `say` gets a one-line note saying so. Raises `ImportError` (one line)
    when no backend is installed. Once Keras is imported this does nothing.
    """
    if "keras" in sys.modules:
        return
    path, saved = _keras_json_backend()
    wanted, where = os.environ.get("KERAS_BACKEND"), "KERAS_BACKEND={}"
    if not wanted and saved and saved != "tensorflow":
        wanted, where = saved, f'{path} sets "backend": "{{}}"'
    available = [backend for backend in BACKENDS if installed(backend)]
    if wanted:
        if wanted not in KERAS_BACKENDS:
            close = difflib.get_close_matches(wanted.lower(), KERAS_BACKENDS, n=1)
            raise ValueError(f"{where.format(wanted)}, which is not a Keras backend"
                             f"{f' (did you mean {close[0]}?)' if close else ''}: set jax, torch or tensorflow, "
                             "or Keras' inference-only numpy or openvino.")
        if wanted in BACKENDS and wanted not in available:
            others = f"; installed: {', '.join(available)}" if available else ""
            raise ImportError(f"{where.format(wanted)}, but {wanted} is not installed: "
                              f"pip install 'keras-vision-transformer[{wanted}]', or {CHOOSE}{others}.")
        return None
    if "tensorflow" in available:
        return None
    if not available:
        raise ImportError(f"KERAS_BACKEND is not set and none of {', '.join(BACKENDS)} is installed: pip install "
                          "'keras-vision-transformer[jax]' (or [torch] or [tensorflow]), then set "
                          "KERAS_BACKEND=jax|torch|tensorflow if more than one is installed.")
    chosen = fallback(available)
    os.environ["KERAS_BACKEND"] = chosen
    say(f"KERAS_BACKEND is not set and TensorFlow is not installed; using {chosen} ({CHOOSE}).")


def started_as_command():
    """Whether this process runs `keras-vit` (the console script) or `python -m keras_vit`.

    The command parses its flags before it imports Keras, so
    `keras_vit/__init__` leaves the imports of the public API to it.
    """
    program = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    for ending in ("-script.pyw", "-script.py", ".exe"):  # the launchers pip writes on Windows
        program = program.removesuffix(ending)
    if program == COMMAND:
        return True
    return _module_run() in ("keras_vit", "keras_vit.cli")


def _module_run():
    """The module of `python [options] -m MODULE ...`, or None (a script, `-c`, or the interactive prompt)."""
    arguments = iter(getattr(sys, "orig_argv", ())[1:])
    for argument in arguments:
        if argument == "-m":
            return next(arguments, None)
        if argument.startswith("-m"):
            return argument[2:]
        if argument in ("-X", "-W", "--check-hash-based-pycs"):  # options that take the next argument
            next(arguments, None)
        elif argument == "-c" or not argument.startswith("-"):
            return None
    return None


def hide_import_banner(module="tensorflow", banner=TENSORFLOW_BANNER):
    """Make the next import of `module` leave out the stderr lines that match `banner`; every other line stays.

    The `keras-vit` command calls this before Keras loads, so that a command
    on TensorFlow (or reading data with tf.data) starts without its banner.
    A library leaves stderr as it is.
    """
    if module not in sys.modules and not any(isinstance(f, _QuietImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _QuietImport(module, banner))


class _QuietImport(importlib.abc.MetaPathFinder):
    """Finds `module` as the other finders do, with a loader that runs it under `stderr_without(banner)`; once."""

    def __init__(self, module, banner):
        self.module, self.banner = module, banner

    def find_spec(self, name, path=None, target=None):
        if name != self.module:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            spec.loader = _QuietLoader(spec.loader, self.banner)
        return spec


class _QuietLoader(importlib.abc.Loader):
    def __init__(self, loader, banner):
        self.loader, self.banner = loader, banner

    def __getattr__(self, name):
        return getattr(self.loader, name)

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        with stderr_without(self.banner):
            self.loader.exec_module(module)


@contextlib.contextmanager
def stderr_without(unwanted):
    """Leave out of file descriptor 2 the lines that match `unwanted` while the block runs (C++ libraries write
    there, not to `sys.stderr`); the other lines are written once it ends, in order."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no stderr to filter
        yield
        return
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            lines = captured.read().decode(errors="replace").splitlines(keepends=True)
            sys.stderr.write("".join(line for line in lines if not unwanted.match(line)))
            sys.stderr.flush()
