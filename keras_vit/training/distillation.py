"""Knowledge distillation with plain `model.fit`: a student learns from a teacher (DeiT's hard or Hinton's soft).

`Distiller` wraps a student and a teacher in one `keras.Model` whose loss
is the distillation loss, so `compile` and `fit` are Keras' own on every
backend and under `keras.distribution` or a `tf.distribute` strategy:

- `method="hard"` (Touvron et al., 2021, "Training data-efficient image
  transformers & distillation through attention", eq. 3): the student's
  class logits learn the labels and its distillation logits the teacher's
  decision, `(1 - alpha) CE(psi(Z_cls), y) + alpha CE(psi(Z_dist), argmax Z_t)`,
  `alpha = 1/2` in DeiT. A distilled DeiT (keras_vit's `distillation_token=True`)
  is trained through its two heads (`head`, `head_dist`), though the model
  itself predicts their average; a student with one output (any model)
  uses that output for both terms.
- `method="soft"` (Hinton et al., 2015): `(1 - alpha) CE(psi(Z_cls), y) +
  alpha tau^2 KL(psi(Z_t / tau) || psi(Z_dist / tau))`, the heads split as
  in DeiT's `DistillationLoss` (its section 5); a one-output student uses
  its output for both.

The teacher runs in inference mode (`training=False`; dropout and
stochastic depth off), its weights frozen, in whatever dtype it was built
with (a `mixed_bfloat16` teacher beside a float32 student, say); its
logits are cast to float32. A teacher that ends in a softmax (`ViT`'s and
`from_pretrained`'s default) gives probabilities, read as such: their
logarithms are its logits up to a constant per example, which neither loss
sees. Labels may be integers or one-hot rows (MixUp, CutMix).

Example:
>>> import keras, numpy as np, keras_vit
>>> sizes = dict(image_size=16, patch_size=8, num_layers=1, num_heads=2, classes=3, classifier_activation=None)
>>> teacher = keras_vit.ViT(hidden_size=32, mlp_dim=64, **sizes)
>>> student = keras_vit.ViT(hidden_size=16, mlp_dim=32, **sizes)
>>> distiller = Distiller(student, teacher, method="hard")
>>> distiller.compile(optimizer="adam")
>>> history = distiller.fit(np.zeros((4, 16, 16, 3)), np.array([0, 1, 2, 0]), epochs=1, verbose=0)
"""

import keras
from keras import ops

from keras_vit.model.graph import distillation_heads, has_distillation_heads
from keras_vit.utils.keras_internals import per_replica_loss

METHODS = ("hard", "soft")


def _cross_entropy(labels, logits):
    """Per-example cross-entropy from logits, for integer labels or one-hot (or soft) rows."""
    if len(labels.shape) == len(logits.shape):
        return ops.categorical_crossentropy(ops.cast(labels, "float32"), logits, from_logits=True)
    return ops.sparse_categorical_crossentropy(ops.cast(labels, "int32"), logits, from_logits=True)


def hard_distillation_loss(labels, class_logits, distillation_logits, teacher_logits, alpha=0.5):
    """DeiT's hard-label distillation, per example: `(1 - alpha) CE(Z_cls, y) + alpha CE(Z_dist, argmax Z_t)`."""
    teacher_labels = ops.argmax(ops.cast(teacher_logits, "float32"), axis=-1)
    return ((1.0 - alpha) * _cross_entropy(labels, ops.cast(class_logits, "float32"))
            + alpha * _cross_entropy(teacher_labels, ops.cast(distillation_logits, "float32")))


def soft_distillation_loss(labels, class_logits, distillation_logits, teacher_logits, alpha=0.5, temperature=1.0):
    """Hinton's soft distillation, per example: `(1 - alpha) CE(Z_cls, y) + alpha tau^2 KL(psi(Z_t/tau) || psi(Z_dist/tau))`.

    A student with one output passes it as both `class_logits` and `distillation_logits`.
    """
    teacher = ops.log_softmax(ops.cast(teacher_logits, "float32") / temperature, axis=-1)
    student = ops.log_softmax(ops.cast(distillation_logits, "float32") / temperature, axis=-1)
    divergence = ops.sum(ops.exp(teacher) * (teacher - student), axis=-1)
    return ((1.0 - alpha) * _cross_entropy(labels, ops.cast(class_logits, "float32"))
            + alpha * temperature**2 * divergence)


def _built_output(model):
    """`(the last layer, the class count of the first output)` of a model with known outputs, else `(None, None)`."""
    try:
        outputs = model.outputs
    except (AttributeError, ValueError):  # a subclassed or unbuilt model
        return None, None
    if not outputs:
        return None, None
    return model.layers[-1] if model.layers else None, outputs[0].shape[-1]


def _softmax_layer(model):
    """The last layer of `model` where it ends in a softmax (gives probabilities), else None."""
    last, _ = _built_output(model)
    if isinstance(last, keras.layers.Softmax) or getattr(getattr(last, "activation", None), "__name__", None) == "softmax":
        return last
    return None


def _check_student_and_teacher(student, teacher):
    """Refuse a student that gives probabilities, or whose classes are not the teacher's, before any training."""
    last = _softmax_layer(student)
    if last is not None:
        raise ValueError(f"The student ends in a softmax ({last.name!r}): the distiller trains its logits; build it "
                         "without one (keras_vit.ViT(..., classifier_activation=None)).")
    _, student_classes = _built_output(student)
    _, teacher_classes = _built_output(teacher)
    if None not in (student_classes, teacher_classes) and student_classes != teacher_classes:
        raise ValueError(f"The student gives {student_classes} classes and the teacher {teacher_classes}: "
                         "distillation compares them class by class; give the student the teacher's classes "
                         f"(keras_vit.ViT(..., classes={teacher_classes})).")


class Distiller(keras.Model):
    """A student trained against a frozen teacher; `fit` it like any model, keep `distiller.student`.

    Args:
        student: a Keras model giving logits, or `[class logits, distillation logits]`; a keras_vit distilled
            DeiT learns through its two heads.
        teacher: any Keras model giving logits or probabilities.
        method: `"hard"` (DeiT's) or `"soft"` (Hinton's KL).
        alpha: the weight of the teacher's term (DeiT: 0.5).
        temperature: `tau` of the soft method.
        teacher_from_logits: whether the teacher gives logits; None reads it from the teacher (probabilities
            where it ends in a softmax, else logits). `False` for a teacher whose probabilities come from a
            layer the distiller cannot see (a subclassed model, say).

    Calling the distiller gives the student's logits (a two-headed student's average, as DeiT predicts);
    `compile(metrics=...)` metrics see those.
    """

    def __init__(self, student, teacher, method="hard", alpha=0.5, temperature=1.0, teacher_from_logits=None,
                 **kwargs):
        super().__init__(**kwargs)
        if method not in METHODS:
            raise ValueError(f"Unknown distillation method {method!r}; expected one of {METHODS}.")
        if not 0.0 <= alpha <= 1.0 or temperature <= 0:
            raise ValueError(f"alpha must be in [0, 1] and temperature positive, got alpha={alpha}, "
                             f"temperature={temperature}.")
        for role, model in (("student", student), ("teacher", teacher)):
            if not isinstance(model, keras.Model):
                raise ValueError(f"The {role} must be a keras.Model, got {type(model).__name__}.")
        self.student, self.teacher = student, teacher
        # A distilled DeiT predicts its heads' average; training reads the two heads (same layers and weights).
        self._trained_student = distillation_heads(student) if has_distillation_heads(student) else student
        _check_student_and_teacher(self._trained_student, teacher)
        self.teacher.trainable = False
        self.method, self.alpha, self.temperature = method, float(alpha), float(temperature)
        softmax = _softmax_layer(teacher)
        if teacher_from_logits and softmax is not None:
            raise ValueError(f"teacher_from_logits=True, but the teacher ends in a softmax ({softmax.name!r}) and "
                             "gives probabilities: leave teacher_from_logits out to read them as such.")
        self.teacher_from_logits = softmax is None if teacher_from_logits is None else bool(teacher_from_logits)

    def save(self, filepath, *args, **kwargs):
        """Refused: the distiller is for training; keep `distiller.student` (nothing is written)."""
        raise ValueError(f"A Distiller is not saved whole (its teacher is not part of the result): save "
                         f"distiller.student, the model to keep, instead of writing {filepath!r}; during fit, "
                         "keras.callbacks.ModelCheckpoint(..., save_weights_only=True) saves the weights.")

    def _student_heads(self, outputs):
        if isinstance(outputs, (list, tuple)):
            if len(outputs) != 2:
                raise ValueError(f"A student gives logits or [class logits, distillation logits], got "
                                 f"{len(outputs)} outputs.")
            return outputs[0], outputs[1]
        return outputs, outputs

    def call(self, inputs, training=None):
        class_logits, distillation_logits = self._student_heads(self._trained_student(inputs, training=training))
        class_logits, distillation_logits = ops.cast(class_logits, "float32"), ops.cast(distillation_logits, "float32")
        if training:  # both heads, for the loss; `compute_metrics` sees their average
            return ops.stack([class_logits, distillation_logits], axis=1)
        return (class_logits + distillation_logits) / 2.0

    def teacher_logits(self, inputs):
        """The frozen teacher's float32 logits in inference mode (a softmax teacher's log-probabilities)."""
        outputs = ops.stop_gradient(ops.cast(self.teacher(inputs, training=False), "float32"))
        return outputs if self.teacher_from_logits else ops.log(ops.maximum(outputs, 1e-30))

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        if len(y_pred.shape) == 2:  # evaluation: the student's own prediction against the labels
            losses = _cross_entropy(y, y_pred)
        else:
            class_logits, distillation_logits = y_pred[:, 0], y_pred[:, 1]
            teacher = self.teacher_logits(x)
            if self.method == "hard":
                losses = hard_distillation_loss(y, class_logits, distillation_logits, teacher, self.alpha)
            else:
                losses = soft_distillation_loss(y, class_logits, distillation_logits, teacher, self.alpha,
                                                self.temperature)
        if sample_weight is not None:
            losses = losses * ops.cast(ops.reshape(sample_weight, (-1,)), "float32")
        loss = ops.mean(losses)
        regularization = self.student.losses
        if regularization:
            loss = loss + ops.sum(ops.stack(regularization))
        return per_replica_loss(loss)

    def compute_metrics(self, x, y, y_pred, sample_weight=None):
        if len(y_pred.shape) == 3:
            y_pred = ops.mean(y_pred, axis=1)
        return super().compute_metrics(x, y, y_pred, sample_weight)
