"""Shared helpers, and where each test runs.

The backend is chosen by KERAS_BACKEND before pytest starts, and CI runs the
suite once per backend. A test whose result cannot depend on the backend
(download and cache logic, file-header checks, flag parsing, data-folder
labelling, README and registry consistency) carries
`@pytest.mark.backend_independent` and runs in the `BACKEND_INDEPENDENT_PASS`
only; every other test runs on every backend. Set
KERAS_VIT_TEST_EVERY_BACKEND=1 to run the marked tests in any pass.
"""

import fcntl
import json
import logging
import os
import shutil
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def share_the_cores_between_workers():
    """Each xdist worker, and every process its tests start, gets its share of the cores in threads.

    Left alone, torch, TensorFlow and XLA each size their thread pools to every core, in every worker:
    on CI's 2 cores, 2 workers then run 4 or more compute threads that spend the tests' tiny matmuls
    waking and waiting on one another. A value the user set is kept.
    """
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers < 2:
        return
    threads = max(1, (os.cpu_count() or 1) // workers)
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "TF_NUM_INTRAOP_THREADS"):
        os.environ.setdefault(name, str(threads))
    if threads == 1 and "xla_cpu_multi_thread_eigen" not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false").strip()


share_the_cores_between_workers()


def xla_flags_for(devices=None):
    """XLA_FLAGS for a process a test starts: this worker's thread limit, and `devices` simulated CPU devices."""
    flags = [flag for flag in os.environ.get("XLA_FLAGS", "").split() if "device_count" not in flag]
    if devices:
        flags.append(f"--xla_force_host_platform_device_count={devices}")
    return " ".join(flags)


# Downloads in tests land in a throw-away Keras cache, never the user's ~/.keras.
os.environ["KERAS_HOME"] = tempfile.mkdtemp(prefix="keras_vit_tests_")
if os.environ.get("KERAS_BACKEND") == "jax":
    # One XLA compilation cache for the run, shared by the workers and the processes tests start: many tests
    # compile the same small models, and the cache hands back the executable XLA built for the same program.
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", tempfile.mkdtemp(prefix="keras_vit_tests_xla_"))
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")

# The sizes of the small reference models written by tools/make_fixtures.py.
SMALL = dict(patch_size=8, hidden_size=48, num_layers=2, num_heads=3, mlp_dim=96)
# ... and of the small hybrids: a two-stage ResNet (8 pixels per feature) cut into 1x1 patches.
SMALL_HYBRID = dict(SMALL, patch_size=1, resnet_layers=(1, 2), resnet_width=32)


# The pass that runs the backend-independent tests: torch's, where the tiny models some of them build cost least.
BACKEND_INDEPENDENT_PASS = "torch"


def pytest_xdist_auto_num_workers(config):
    """`-n auto`'s worker count: one more than the cores. The tests also wait (on the processes they start, on
    files, on a shared run's lock), and a third worker on 2 cores keeps the cores busy meanwhile."""
    cores = os.cpu_count() or 1
    return cores + 1 if cores > 1 else 1


def pytest_configure(config):
    config.addinivalue_line("markers", "backend_independent: the result cannot depend on the Keras backend; the "
                                       f"test runs in the {BACKEND_INDEPENDENT_PASS} pass only")


def runs_backend_independent_tests():
    return keras.backend.backend() == BACKEND_INDEPENDENT_PASS or os.environ.get("KERAS_VIT_TEST_EVERY_BACKEND") == "1"


# Files of minute-long tests (whole guides, the digits job, fresh distributed processes), handed out first: xdist's
# two workers then finish together, not one idle while the other runs a long test it got last.
LONG_FIRST = ("test_examples.py", "test_guides.py", "test_distribute.py")


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: item.path.name not in LONG_FIRST)  # stable: each file keeps its order
    if runs_backend_independent_tests():
        return
    left = [item for item in items if item.get_closest_marker("backend_independent")]
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = [item for item in items if not item.get_closest_marker("backend_independent")]


def pytest_report_header(config):
    if runs_backend_independent_tests():
        return f"backend-independent tests: run in this ({keras.backend.backend()}) pass"
    return f"backend-independent tests: deselected here, they run in the {BACKEND_INDEPENDENT_PASS} pass"


def fixture(name):
    return os.path.join(FIXTURES, name)


def shared_run(tmp_path_factory, name, run):
    """The folder `run(folder)` fills, made once per pytest run and shared by every xdist worker.

    A module fixture is built again in each worker that runs the module's tests; a training run made once
    and read by all saves that time. Returns `(folder, run's JSON-able result)`.
    """
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's folder, above each worker's own
    folder, done = root / name, root / f"{name}.done"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the other workers wait here for the first one's run
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            done.write_text(json.dumps(run(folder)))
    return folder, json.loads(done.read_text())


def reference(case):
    with np.load(fixture(f"{case}_reference.npz")) as data:
        return data["images"], data["logits"]


def predict(model, inputs):
    return np.asarray(keras.ops.convert_to_numpy(model(inputs, training=False)))


@pytest.fixture(autouse=True)
def _fresh_keras_state():
    keras.config.set_dtype_policy("float32")
    keras.utils.set_random_seed(0)
    yield
    keras.config.set_dtype_policy("float32")


@pytest.fixture
def keras_vit_log(caplog):
    caplog.set_level(logging.INFO, logger="keras_vit")
    return caplog


@pytest.fixture
def xla_compiles():
    """The names of the XLA programs JAX compiles meanwhile (its own monitoring events)."""
    import jax

    compiles = []

    def listen(event, duration, **kwargs):
        if "backend_compile" in event:
            compiles.append(event)

    jax.monitoring.register_event_duration_secs_listener(listen)
    yield compiles
    jax.monitoring.unregister_event_duration_listener(listen)
