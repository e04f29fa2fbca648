"""Train a small ViT (with the paper's SGD, and with the recipes' layer-decay AdamW and EMA), a distilled student
and a masked-patch pretrainer for a few steps under one distribution engine and save their weights: `model.fit`'s
own loss and the trainers' `compute_loss`.

Run by tests/test_distribute.py in fresh processes, because virtual devices and
multi-process JAX must be configured before the backend starts:

    XLA_FLAGS=--xla_force_host_platform_device_count=8 KERAS_BACKEND=jax \\
        python distributed_worker.py data_parallel out.npz
    KERAS_BACKEND=tensorflow python distributed_worker.py mirrored out.npz
    KERAS_BACKEND=jax python distributed_worker.py multi_host out.npz 127.0.0.1:PORT 2 PROCESS_ID
"""

import json
import os
import sys

engine_name, output = sys.argv[1], sys.argv[2]
if os.environ.get("KERAS_BACKEND") == "tensorflow":
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
if engine_name == "multi_host":
    address, processes, process_id = sys.argv[3], sys.argv[4], sys.argv[5]
    os.environ.update(
        KERAS_DISTRIBUTION_JOB_ADDRESSES=address,
        KERAS_DISTRIBUTION_NUM_PROCESSES=processes,
        KERAS_DISTRIBUTION_PROCESS_ID=process_id,
    )

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402  (input pipeline only)

import keras_vit  # noqa: E402
from keras_vit.training import distribute, param_groups, recipes  # noqa: E402

engine = distribute.setup(engine_name, model_parallel_size=2)
keras.utils.set_random_seed(0)
rng = np.random.default_rng(0)
images = rng.uniform(-1, 1, (32, 16, 16, 3)).astype("float32")
labels = rng.integers(0, 5, 32)
dataset = tf.data.Dataset.from_tensor_slices((images, labels)).batch(8)
with engine.scope():
    model = keras_vit.ViT(image_size=16, patch_size=4, hidden_size=32, num_layers=2, num_heads=4,
                          mlp_dim=64, classes=5, representation_size=16)
    # The recipe's global-norm clipping (1.0) is active here: the gradients are larger.
    model.compile(optimizer=recipes.finetuning_optimizer(0.05), loss="sparse_categorical_crossentropy")
model.fit(dataset, epochs=2, verbose=0)
# The fine-tuning recipes' optimizer under the same engine: timm's groups with layer decay, clipping and an EMA.
with engine.scope():
    tuned = keras_vit.ViT(image_size=16, patch_size=4, hidden_size=32, num_layers=2, num_heads=4, mlp_dim=64,
                          classes=5, name="tuned")
    # eps 1e-3, not torch's 1e-8: Adam divides by the root of the second moment, which makes whole steps of the
    # engines' rounding wherever a gradient is ~0 (the key bias's is 0 in exact arithmetic).
    tuned.compile(optimizer=recipes.LayerDecayAdamW(0.01, param_groups.parameter_groups(tuned, 0.65), epsilon=1e-3,
                                                    global_clipnorm=1.0, use_ema=True, ema_momentum=0.5),
                  loss="sparse_categorical_crossentropy")
tuned.fit(dataset, epochs=1, verbose=0)

# The two trainers that compute their own loss must average over the global batch as Keras' losses do (the
# data-parallel engines; model parallelism and multi-host split no batch differently).
student = pretrainer = None
if engine_name in ("none", "data_parallel", "mirrored"):
    with engine.scope():
        student = keras_vit.ViT(image_size=16, patch_size=4, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=32,
                                classes=5, classifier_activation=None, name="student",
                                architecture=keras_vit.Architecture(distillation_token=True))
        distiller = keras_vit.Distiller(student, model, method="hard", teacher_from_logits=False)
        distiller.compile(optimizer=keras.optimizers.SGD(0.5))
        encoder = keras_vit.ViT(image_size=16, patch_size=4, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=32,
                                include_top=False, name="encoder")
        # Every patch masked: the corruption draws nothing that differs between one device and several replicas.
        pretrainer = keras_vit.MaskedPatchPretrainer(encoder, corruption_rate=1.0, mask_rate=1.0, random_rate=0.0,
                                                     seed=0)
        pretrainer.compile(optimizer=keras.optimizers.SGD(0.5))
    distiller.fit(dataset, epochs=1, verbose=0)
    pretrainer.fit(tf.data.Dataset.from_tensor_slices(images).batch(8), epochs=1, verbose=0)

report = {"engine": engine_name, "replicas": engine.num_replicas}
if engine_name == "model_parallel":
    kernel = model.get_layer("encoderblock_0").qkv.kernel.value
    report["qkv_sharding"] = str(kernel.sharding.spec)
    report["qkv_shard_shape"] = list(kernel.addressable_shards[0].data.shape)


def local(variable):
    value = variable.value
    if hasattr(value, "addressable_shards") and not value.is_fully_addressable:
        return np.asarray(value.addressable_shards[0].data)
    return keras.ops.convert_to_numpy(value)


if engine.is_chief:
    trained = {"vit": model.weights}
    if student is not None:
        trained.update(student=student.weights, pretrainer=pretrainer.trainable_weights)
    found = {f"{name}:{v.path}": local(v) for name, weights in trained.items() for v in weights}
    found.update({f"vit:tuned:{v.path}": local(v) for v in tuned.weights})
    np.savez(output, **found)
print("REPORT " + json.dumps(report), flush=True)
