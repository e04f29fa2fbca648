"""The recipes' losses beside Keras' crossentropy: timm's binary cross-entropy of classes (DeiT III's `--bce-loss`).

Example:
>>> import numpy as np
>>> loss = BinaryCrossentropyOfClasses(label_smoothing=0.1)
>>> round(float(loss(np.eye(3)[[0, 2]], np.zeros((2, 3)))), 4)
0.6931
"""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_vit")
class BinaryCrossentropyOfClasses(keras.losses.Loss):
    """timm's `BinaryCrossEntropy`: each class's logit scored as its own yes/no, the mean over classes and batch.

    The targets are one-hot or mixed (MixUp, CutMix) rows. `label_smoothing`
    `s` makes them `y (1 - s) + s / classes`, as timm smooths one-hot and
    mixed targets (Keras' `BinaryCrossentropy` moves them towards 0.5
    instead); `target_threshold` then makes each 1 above it, else 0
    (timm's `--bce-target-thresh`).
    """

    def __init__(self, label_smoothing=0.0, target_threshold=None, name="binary_crossentropy_of_classes", **kwargs):
        super().__init__(name=name, **kwargs)
        if not 0 <= label_smoothing < 1:
            raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing!r}.")
        self.label_smoothing = float(label_smoothing)
        self.target_threshold = None if target_threshold is None else float(target_threshold)

    def call(self, y_true, y_pred):
        if len(y_true.shape) != len(y_pred.shape) or y_true.shape[-1] != y_pred.shape[-1]:
            raise ValueError(f"The binary cross-entropy of classes scores one-hot or mixed targets of the logits' shape "
                             f"(batch, classes) = {tuple(y_pred.shape)}, got targets of shape {tuple(y_true.shape)}: "
                             "pass one-hot labels (one_hot=True).")
        targets = ops.cast(y_true, y_pred.dtype)
        if self.label_smoothing:
            targets = targets * (1.0 - self.label_smoothing) + self.label_smoothing / y_pred.shape[-1]
        if self.target_threshold is not None:
            targets = ops.cast(targets > self.target_threshold, y_pred.dtype)
        return ops.mean(ops.binary_crossentropy(targets, y_pred, from_logits=True), axis=-1)

    def get_config(self):
        config = super().get_config()
        config.update(label_smoothing=self.label_smoothing, target_threshold=self.target_threshold)
        return config
