"""The learning rate each optimizer update really applies, read back from the weights it moved.

A linear model whose loss is its output has a gradient of exactly 1 for every
weight, so plain SGD (no momentum, no clipping) moves each weight by minus the
rate in force. `measure(engine)` runs 20 micro-batches with 4 accumulated per
update and returns the 5 rates. Run as a script for the distribution engines,
which need their virtual devices before the backend starts:

    XLA_FLAGS=--xla_force_host_platform_device_count=8 KERAS_BACKEND=jax python applied_rates.py data_parallel
    KERAS_BACKEND=tensorflow python applied_rates.py mirrored
"""

import json
import os
import sys

ACCUMULATION, UPDATES, BATCH = 4, 5, 8


def schedule():
    from keras_vit.training import recipes

    return recipes.WarmupDecay(0.01, total_steps=UPDATES, warmup_steps=1, decay="linear")


def measure(engine_name="none"):
    import keras
    import numpy as np

    from keras_vit.training import distribute, recipes

    engine = distribute.setup(engine_name)
    with engine.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")])
        optimizer = recipes.finetuning_optimizer(schedule(), momentum=0.0, global_clipnorm=None,
                                                 gradient_accumulation_steps=ACCUMULATION)
        model.compile(optimizer=optimizer, loss=lambda labels, outputs: outputs[:, 0])
    images, labels = np.ones((BATCH, 3), "float32"), np.zeros((BATCH, 1), "float32")
    kernels = [keras.ops.convert_to_numpy(model.layers[0].kernel)[0, 0]]
    for _ in range(ACCUMULATION * UPDATES):
        model.train_on_batch(images, labels)
        kernels.append(keras.ops.convert_to_numpy(model.layers[0].kernel)[0, 0])
    after_updates = kernels[::ACCUMULATION]
    return [float(before - after) for before, after in zip(after_updates, after_updates[1:])]


if __name__ == "__main__":
    engine_name = sys.argv[1]
    if os.environ.get("KERAS_BACKEND") == "tensorflow":
        import tensorflow as tf

        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    print("RATES " + json.dumps(measure(engine_name)), flush=True)
