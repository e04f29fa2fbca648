"""Epoch time of the main job's small ViT against keras-hub's ViTBackbone of the same size.

    KERAS_BACKEND=jax python benchmarks/small_model.py [--rounds 5] [--steps-per-execution 1] [--without-attention]

Both train one epoch of the embedded digits (1,437 images, 32 px, batch 64)
with the same head and optimizer on the same batches: one augmented epoch is
made once and held in memory, so that the timing is the models' and not the
augmentation pipeline's. An epoch is timed from Keras' `on_epoch_begin` to
`on_epoch_end` (set-up and tear-down of `fit`'s iterator excluded: on this
2-core machine they sometimes stall for ~1 s, for either model); the first
(compiling) epoch is not timed; the models train in turn, round after round,
and the median epoch time is reported with the ratio.

--without-attention adds a third model, keras_vit with every block's
attention replaced by its values (`keras_vit.layers.kernels.attention` returning
`value`): not a ViT, but the bound on what a faster attention could give,
measured in the same rounds.
"""

import argparse
import statistics
import time

import keras
import numpy as np
import tensorflow as tf

import keras_vit
from keras_vit import data
from keras_vit.layers import kernels
from keras_vit.model.variants import SMALL_VIT


def build(contender):
    sizes = SMALL_VIT
    if contender in ("keras_vit", "without_attention"):
        return keras_vit.ViT(image_size=32, patch_size=sizes.patch_size, hidden_size=sizes.hidden_size,
                             num_layers=sizes.num_layers, num_heads=sizes.num_heads, mlp_dim=sizes.mlp_dim,
                             classes=10, classifier_activation=None)
    import keras_hub

    backbone = keras_hub.models.ViTBackbone(image_shape=(32, 32, 3), patch_size=sizes.patch_size,
                                            num_layers=sizes.num_layers, num_heads=sizes.num_heads,
                                            hidden_dim=sizes.hidden_size, mlp_dim=sizes.mlp_dim)
    return keras.Model(backbone.input, keras.layers.Dense(10)(backbone.output[:, 0]))


class EpochTimer(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.seconds = []

    def on_epoch_begin(self, epoch, logs=None):
        self.start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.seconds.append(time.perf_counter() - self.start)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps-per-execution", type=int, default=1)
    parser.add_argument("--without-attention", action="store_true",
                        help="also keras_vit with attention replaced by its values (a bound, not a ViT)")
    args = parser.parse_args()
    (x, y), _ = data.digits(image_size=32)
    source = data.from_arrays(x, y)
    steps = data.steps_per_epoch(source, 64)
    # One epoch of augmented batches, made once: both contenders then train on the same arrays, so
    # that the timing is the model's and not the tf.data pipeline's (which competes for the 2 cores).
    stream = data.training_stream(source, 32, 64, epochs=1, one_hot=True, flip=False, min_crop_area=0.6)
    batches = list(stream.take(steps).as_numpy_iterator())
    epoch = tf.data.Dataset.from_tensor_slices(tuple(np.stack(parts) for parts in zip(*batches)))
    fit = {"x": epoch.prefetch(2), "epochs": 1, "verbose": 0}
    models = {}
    attention = kernels.attention

    def use_attention_of(contender):  # Read when a step is traced (JAX, TensorFlow) or run (PyTorch).
        kernels.attention = (lambda query, key, value: value) if contender == "without_attention" else attention

    for contender in ("keras_vit", "keras_hub") + (("without_attention",) if args.without_attention else ()):
        keras.utils.set_random_seed(0)
        use_attention_of(contender)
        model = build(contender)
        model.compile(optimizer=keras.optimizers.AdamW(1e-3), steps_per_execution=args.steps_per_execution,
                      loss=keras.losses.CategoricalCrossentropy(from_logits=True))
        model.fit(**fit)  # compile
        models[contender] = model
    times = {name: EpochTimer() for name in models}
    for _ in range(args.rounds):
        for name, model in models.items():
            use_attention_of(name)
            model.fit(**fit, callbacks=[times[name]])
    use_attention_of("keras_vit")
    times = {name: timer.seconds for name, timer in times.items()}
    medians = {name: statistics.median(t) for name, t in times.items()}
    print(f"backend {keras.backend.backend()}; {steps} steps of 64 images, 32 px; "
          f"steps_per_execution {args.steps_per_execution}")
    for name, seconds in medians.items():
        rounds = " ".join(f"{t:.2f}" for t in times[name])
        print(f"{name:17s} {seconds:6.2f} s/epoch  {medians['keras_hub'] / seconds:5.2f}x keras-hub  (rounds: {rounds})")


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()
