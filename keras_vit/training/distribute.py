"""One switch for the distribution engines our users run on (no home-made ones).

`setup("tpu")` gives TensorFlow's `TPUStrategy`,
`"mirrored"` TensorFlow's `MirroredStrategy`, `"data_parallel"` and
`"model_parallel"` Keras' JAX distribution API (`keras.distribution`), and
`"multi_host"` the same data parallelism across JAX processes after
`keras.distribution.initialize()` (Keras then gives each process its share of
every global batch). Build and compile the model inside `engine.scope()`.
"""

import contextlib
import dataclasses
import os
import threading

import keras

from keras_vit.configs import ENGINES

# Seconds to find and initialise a TPU; TensorFlow's resolver and connect have no timeout of their own.
TPU_TIMEOUT = 300.0
# The attention and MLP kernels are split over the "model" mesh axis (Megatron style:
# column-parallel in, row-parallel out); everything else is replicated.
MODEL_PARALLEL_RULES = {
    r".*qkv/kernel": (None, "model"),
    r".*qkv/bias": ("model",),
    r".*attention_output/kernel": ("model", None),
    r".*mlp_hidden/kernel": (None, "model"),
    r".*mlp_hidden/bias": ("model",),
    r".*mlp_output/kernel": ("model", None),
}


@dataclasses.dataclass
class Engine:
    """A chosen engine: `scope()` to build models in, and how many replicas share a batch."""

    name: str
    num_replicas: int = 1
    strategy: object = None
    process_index: int = 0
    process_count: int = 1

    def scope(self):
        return self.strategy.scope() if self.strategy is not None else contextlib.nullcontext()

    def check_batch_size(self, batch_size):
        if batch_size % self.num_replicas:
            raise ValueError(
                f"Batch size {batch_size} is not divisible by the {self.num_replicas} replicas of "
                f"the {self.name!r} engine."
            )

    @property
    def is_chief(self):
        """Whether this process writes logs and checkpoints."""
        return self.process_index == 0


def _require_backend(name, backend):
    if keras.backend.backend() != backend:
        raise ValueError(
            f"The {name!r} engine needs the {backend} backend (KERAS_BACKEND={backend}); "
            f"this process runs {keras.backend.backend()}."
        )


def model_parallel_layout(mesh):
    """The `LayoutMap` that shards ViT attention and MLP kernels over `mesh`'s model axis."""
    layout_map = keras.distribution.LayoutMap(mesh)
    for pattern, axes in MODEL_PARALLEL_RULES.items():
        layout_map[pattern] = axes
    return layout_map


MULTI_HOST_VARIABLES = (
    "KERAS_DISTRIBUTION_JOB_ADDRESSES", "KERAS_DISTRIBUTION_NUM_PROCESSES", "KERAS_DISTRIBUTION_PROCESS_ID",
)


def _connect_tpu(tf, tpu):
    """Resolve, connect to and initialise the TPU at `tpu`, or raise `TimeoutError` after `TPU_TIMEOUT` s.

    TensorFlow's calls block without a limit on an unreachable address, so
    they run in a daemon thread; one that times out is left behind.
    """
    result = {}

    def connect():
        try:
            resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu)
            tf.config.experimental_connect_to_cluster(resolver)
            tf.tpu.experimental.initialize_tpu_system(resolver)
            result["resolver"] = resolver
        except Exception as error:  # Raised again in the calling thread.
            result["error"] = error

    thread = threading.Thread(target=connect, name="keras_vit-tpu-connect", daemon=True)
    thread.start()
    thread.join(TPU_TIMEOUT)
    where = f"the TPU {tpu!r}" if tpu else "the TPU named by TPU_NAME or this VM's metadata"
    if thread.is_alive():
        raise TimeoutError(
            f"Could not reach {where} within {TPU_TIMEOUT:g} s. Check the address (a TPU name, or "
            "grpc://HOST:8470) and that this machine can reach it, e.g. `gcloud compute tpus list` or "
            "`nc -zv HOST 8470`; keras_vit.training.distribute.TPU_TIMEOUT sets the wait."
        )
    if "error" in result:
        raise RuntimeError(f"Could not connect to {where}: {result['error']}") from result["error"]
    return result["resolver"]


def setup(name="none", model_parallel_size=2, tpu=None):
    """Choose and set up a distribution engine; see `ENGINES`.

    Example:
    >>> engine = setup("none")
    >>> with engine.scope():
    ...     model = keras_vit.ViT_Ti16(image_size=32, classes=10)
    """
    if name not in ENGINES:
        raise ValueError(f"Unknown distribution {name!r}; expected one of {ENGINES}.")
    if name == "none":
        return Engine(name)
    if name in ("mirrored", "tpu"):
        _require_backend(name, "tensorflow")
        import tensorflow as tf

        if name == "mirrored":
            strategy = tf.distribute.MirroredStrategy()
        else:
            strategy = tf.distribute.TPUStrategy(_connect_tpu(tf, tpu))  # precision: the model's dtype=
        return Engine(name, strategy.num_replicas_in_sync, strategy)
    _require_backend(name, "jax")
    import jax

    if name == "multi_host":
        try:  # CPU processes need a collectives library to talk to each other.
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
        except AttributeError:
            pass
        # Reads KERAS_DISTRIBUTION_JOB_ADDRESSES / _NUM_PROCESSES / _PROCESS_ID, or TPU metadata.
        missing = [name for name in MULTI_HOST_VARIABLES if not os.environ.get(name)]
        if missing and keras.distribution.list_devices()[0].split(":")[0].lower() != "tpu":
            raise ValueError(
                f"--distribution multi_host needs {', '.join(missing)} set on every process: "
                "KERAS_DISTRIBUTION_JOB_ADDRESSES=host0:port,host1:port (the first is the coordinator), "
                "KERAS_DISTRIBUTION_NUM_PROCESSES=<count>, KERAS_DISTRIBUTION_PROCESS_ID=<0..count-1>."
            )
        keras.distribution.initialize()
    devices = keras.distribution.list_devices()
    if name == "model_parallel":
        if len(devices) % model_parallel_size:
            raise ValueError(
                f"{len(devices)} devices cannot be split into model-parallel groups of {model_parallel_size}."
            )
        mesh = keras.distribution.DeviceMesh(
            shape=(len(devices) // model_parallel_size, model_parallel_size),
            axis_names=("batch", "model"),
            devices=devices,
        )
        distribution = keras.distribution.ModelParallel(layout_map=model_parallel_layout(mesh), batch_dim_name="batch")
        replicas = len(devices) // model_parallel_size
    else:
        distribution = keras.distribution.DataParallel(devices=devices)
        replicas = len(devices)
    keras.distribution.set_distribution(distribution)
    return Engine(name, replicas, None, jax.process_index(), jax.process_count())
