"""Distribution engines against one device: same weights after a few steps.

Each engine runs in fresh processes (virtual devices must be set before the
backend starts): JAX with 8 host devices for DataParallel and ModelParallel,
two JAX processes on 127.0.0.1 for multi-host, TensorFlow with two logical
CPUs for MirroredStrategy.
"""

import json
import os
import socket
import subprocess
import sys

import keras
import numpy as np
import pytest

from conftest import xla_flags_for
from keras_vit.training import distribute

WORKER = os.path.join(os.path.dirname(__file__), "distributed_worker.py")
BACKEND = keras.backend.backend()


def run_worker(backend, engine, output, *extra, devices=None, background=False):
    env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env["XLA_FLAGS"] = xla_flags_for(devices)
    command = [sys.executable, WORKER, engine, str(output), *extra]
    if background:
        return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(done.stdout.split("REPORT ", 1)[1].splitlines()[0])


def assert_same_weights(path_a, path_b, trainers=True):
    """The ViT's weights agree, and the distilled student's and masked-patch pretrainer's where `trainers`."""
    with np.load(path_a) as a, np.load(path_b) as b:
        expected = sorted(a.files) if trainers else sorted(k for k in a.files if k.startswith("vit:"))
        assert sorted(b.files) == expected and any(k.startswith("student:") for k in b.files) == trainers
        for key in b.files:
            np.testing.assert_allclose(a[key], b[key], atol=2e-6, err_msg=key)
        moved = max(np.abs(a[k]).max() for k in a.files)
        assert moved > 0


@pytest.fixture(scope="module")
def single_device(tmp_path_factory):
    path = tmp_path_factory.mktemp("single") / "weights.npz"
    run_worker(BACKEND, "none", path, devices=8 if BACKEND == "jax" else None)
    return path


jax_only = pytest.mark.skipif(BACKEND != "jax", reason="keras.distribution runs on the JAX backend")
tf_only = pytest.mark.skipif(BACKEND != "tensorflow", reason="tf.distribute strategies need TensorFlow")


@jax_only
def test_data_parallel_on_8_devices_matches_one_device(single_device, tmp_path):
    report = run_worker("jax", "data_parallel", tmp_path / "w.npz", devices=8)
    assert report["replicas"] == 8
    assert_same_weights(single_device, tmp_path / "w.npz")


@jax_only
def test_model_parallel_shards_kernels_and_matches_one_device(single_device, tmp_path):
    report = run_worker("jax", "model_parallel", tmp_path / "w.npz", devices=8)
    assert report["replicas"] == 4
    assert report["qkv_sharding"] in ("PartitionSpec(None, 'model')", "P(None, 'model')")
    assert report["qkv_shard_shape"] == [32, 48]  # 96 columns over a model axis of 2
    assert_same_weights(single_device, tmp_path / "w.npz", trainers=False)


@jax_only
def test_two_jax_processes_on_localhost_match_one_device(single_device, tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    address = f"127.0.0.1:{port}"
    workers = [
        run_worker("jax", "multi_host", tmp_path / "w.npz", address, "2", str(i), background=True) for i in (0, 1)
    ]
    outputs = [worker.communicate(timeout=600)[0] for worker in workers]
    for worker, output in zip(workers, outputs):
        assert worker.returncode == 0, output[-3000:]
        assert json.loads(output.split("REPORT ", 1)[1].splitlines()[0])["replicas"] == 2
    assert_same_weights(single_device, tmp_path / "w.npz", trainers=False)


@tf_only
def test_mirrored_strategy_on_2_devices_matches_one_device(single_device, tmp_path):
    report = run_worker("tensorflow", "mirrored", tmp_path / "w.npz")
    assert report["replicas"] == 2
    assert_same_weights(single_device, tmp_path / "w.npz")


def test_engine_choice_errors():
    with pytest.raises(ValueError, match="Unknown distribution 'horovod'"):
        distribute.setup("horovod")
    other = "mirrored" if BACKEND != "tensorflow" else "data_parallel"
    needed = "tensorflow" if other == "mirrored" else "jax"
    with pytest.raises(ValueError, match=f"The '{other}' engine needs the {needed} backend"):
        distribute.setup(other)
    engine = distribute.Engine("mirrored", num_replicas=8)
    with pytest.raises(ValueError, match="Batch size 12 is not divisible by the 8 replicas of the 'mirrored' engine"):
        engine.check_batch_size(12)
    engine.check_batch_size(16)


def test_layout_map_shards_attention_and_mlp_kernels_only():
    assert distribute.MODEL_PARALLEL_RULES[r".*qkv/kernel"] == (None, "model")
    assert distribute.MODEL_PARALLEL_RULES[r".*mlp_output/kernel"] == ("model", None)
    assert not any("norm" in rule or "embedding" in rule for rule in distribute.MODEL_PARALLEL_RULES)


class BlockingTPU:
    """A stand-in for `tf` whose TPU resolver blocks like one given an unreachable address."""

    def __init__(self):
        self.release = __import__("threading").Event()
        resolver = lambda tpu: self.release.wait(30)  # noqa: E731
        self.distribute = type("distribute", (), {"cluster_resolver": type("cr", (), {"TPUClusterResolver": resolver})})


def test_unreachable_tpu_times_out_with_the_address_and_how_to_check_it(monkeypatch):
    import time

    monkeypatch.setattr(distribute, "TPU_TIMEOUT", 0.3)
    fake = BlockingTPU()
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"Could not reach the TPU 'grpc://10\.255\.255\.1:8470' within 0\.3 s\. "
                                           r"Check the address .*nc -zv HOST 8470"):
        distribute._connect_tpu(fake, "grpc://10.255.255.1:8470")
    fake.release.set()
    assert time.monotonic() - started < 5


@tf_only
def test_tpu_engine_gives_up_on_a_resolver_that_never_answers(monkeypatch):
    import tensorflow as tf

    fake = BlockingTPU()
    monkeypatch.setattr(distribute, "TPU_TIMEOUT", 0.3)
    monkeypatch.setattr(tf.distribute.cluster_resolver, "TPUClusterResolver", fake.distribute.cluster_resolver.TPUClusterResolver)
    with pytest.raises(TimeoutError, match="Could not reach the TPU 'nowhere' within 0.3 s"):
        distribute.setup("tpu", tpu="nowhere")
    fake.release.set()


@tf_only
def test_tpu_engine_leaves_the_precision_to_the_model(monkeypatch, capsys):
    """setup("tpu") once switched the whole process to mixed_bfloat16 unasked; the precision is now a choice."""
    import tensorflow as tf

    from keras_vit import training

    monkeypatch.setattr(distribute, "_connect_tpu", lambda tf, tpu: "resolver")
    monkeypatch.setattr(tf.distribute, "TPUStrategy", lambda resolver: type("S", (), {"num_replicas_in_sync": 8})())
    assert distribute.setup("tpu", tpu="local").num_replicas == 8
    assert keras.config.dtype_policy().name == "float32"
    assert training.precision(False, "tpu") == "float32"
    assert training.precision(True, "tpu") == "mixed_bfloat16"
    assert capsys.readouterr().out == (
        "precision: float32; add --mixed-precision to compute in bfloat16, as TPUs do natively\n"
        "precision: mixed_bfloat16 (float32 weights, bfloat16 computation; --mixed-precision)\n")


@pytest.mark.backend_independent
def test_processes_tests_start_keep_the_workers_xla_thread_limit_and_get_their_own_devices(monkeypatch):
    # A token without dashes in XLA_FLAGS made XLA ignore every flag after it: the device count appended for the
    # distributed workers was lost, so they dropped the thread limit instead.
    import conftest

    for name in ("XLA_FLAGS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "TF_NUM_INTRAOP_THREADS"):
        monkeypatch.delenv(name, raising=False)  # restored afterwards
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", str(2 * (os.cpu_count() or 1)))  # one thread each
    conftest.share_the_cores_between_workers()
    assert os.environ["XLA_FLAGS"].split() and all(flag.startswith("--") for flag in os.environ["XLA_FLAGS"].split())
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false --xla_force_host_platform_device_count=2")
    assert xla_flags_for(8) == "--xla_cpu_multi_thread_eigen=false --xla_force_host_platform_device_count=8"
    assert xla_flags_for() == "--xla_cpu_multi_thread_eigen=false"
