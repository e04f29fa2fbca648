"""Distillation (`keras_vit.training.distillation`): the losses DeiT and Hinton define, what fit really applies."""

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.model.graph import distillation_heads
from keras_vit.training.distillation import Distiller, hard_distillation_loss, soft_distillation_loss

SIZES = dict(image_size=16, patch_size=8, num_layers=1, num_heads=2, classes=3, classifier_activation=None)
LABELS = np.array([0, 2, 1, 1])
CLASS = np.array([[2.0, 0.5, -1.0], [0.1, 0.2, 0.3], [-2.0, 1.0, 0.0], [0.0, 0.0, 4.0]], "float32")
DISTILLATION = np.array([[1.0, 1.5, -1.0], [0.3, -0.2, 0.9], [0.5, 0.0, 2.0], [1.0, -1.0, 0.0]], "float32")
TEACHER = np.array([[0.0, 3.0, 1.0], [2.0, 0.0, 1.0], [0.0, 0.0, 5.0], [1.0, 2.0, 0.0]], "float32")


def log_softmax(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def numpy_of(x):
    return np.asarray(keras.ops.convert_to_numpy(x), "float64")


@pytest.mark.backend_independent
def test_hard_distillation_is_deits_eq_3_on_a_fixed_batch():
    # By hand: the teacher's decisions are argmax rows of TEACHER = [1, 0, 2, 1].
    teacher_labels = np.array([1, 0, 2, 1])
    by_hand = [0.5 * -log_softmax(CLASS)[i, LABELS[i]] + 0.5 * -log_softmax(DISTILLATION)[i, teacher_labels[i]]
               for i in range(4)]
    got = numpy_of(hard_distillation_loss(LABELS, CLASS, DISTILLATION, TEACHER, alpha=0.5))
    np.testing.assert_allclose(got, by_hand, rtol=1e-6)
    one_hot = np.eye(3, dtype="float32")[LABELS]
    np.testing.assert_allclose(numpy_of(hard_distillation_loss(one_hot, CLASS, DISTILLATION, TEACHER)), by_hand,
                               rtol=1e-6)


def soft_by_hand(labels, class_logits, distillation_logits, teacher_log_probabilities, alpha=0.5, tau=1.0):
    """Hinton's loss per example in numpy, the heads split as DeiT's `DistillationLoss` splits them."""
    teacher, student = np.exp(log_softmax(teacher_log_probabilities / tau)), log_softmax(distillation_logits / tau)
    kl = (teacher * (np.log(teacher) - student)).sum(-1)
    return (1 - alpha) * -log_softmax(class_logits)[np.arange(len(labels)), labels] + alpha * tau**2 * kl


def hard_by_hand(labels, class_logits, distillation_logits, teacher_scores, alpha=0.5):
    """DeiT's eq. 3 per example in numpy; `teacher_scores` are logits or probabilities (the same argmax)."""
    rows, decisions = np.arange(len(labels)), np.argmax(teacher_scores, axis=-1)
    return ((1 - alpha) * -log_softmax(class_logits)[rows, labels]
            + alpha * -log_softmax(distillation_logits)[rows, decisions])


@pytest.mark.backend_independent
def test_soft_distillation_is_hintons_with_the_labels_on_the_class_head_and_the_teacher_on_the_other():
    tau, alpha = 2.0, 0.3
    by_hand = soft_by_hand(LABELS, CLASS, DISTILLATION, TEACHER, alpha, tau)
    got = numpy_of(soft_distillation_loss(LABELS, CLASS, DISTILLATION, TEACHER, alpha=alpha, temperature=tau))
    np.testing.assert_allclose(got, by_hand, rtol=1e-6)


def two_headed_student():
    """A student with DeiT's two heads: [class logits, distillation logits]."""
    images = keras.Input((16, 16, 3))
    features = keras.layers.GlobalAveragePooling2D()(images)
    return keras.Model(images, [keras.layers.Dense(3, name="head")(features),
                                keras.layers.Dense(3, name="head_dist")(features)])


def test_fit_applies_deits_loss_with_the_teacher_in_inference_mode_and_frozen():
    keras.utils.set_random_seed(0)
    # Dropout in the teacher: were it run in training mode, its logits would differ from predict's.
    teacher = keras_vit.ViT(hidden_size=16, mlp_dim=32, dropout_rate=0.5, **SIZES)
    student = two_headed_student()
    images = np.random.default_rng(1).uniform(-1, 1, (4, 16, 16, 3)).astype("float32")
    distiller = Distiller(student, teacher, method="hard")
    distiller.compile(optimizer=keras.optimizers.SGD(0.0))
    teacher_weights = [w.copy() for w in teacher.get_weights()]
    class_logits, distillation_logits = (numpy_of(o) for o in student(images))
    expected = hard_distillation_loss(LABELS, class_logits, distillation_logits, numpy_of(teacher(images)))
    applied = distiller.train_on_batch(images, LABELS)
    np.testing.assert_allclose(applied, float(np.mean(numpy_of(expected))), rtol=1e-5)
    distiller.compile(optimizer=keras.optimizers.Adam(0.1))
    distiller.fit(images, LABELS, epochs=2, verbose=0)
    for before, after in zip(teacher_weights, teacher.get_weights()):
        np.testing.assert_array_equal(before, after)
    np.testing.assert_allclose(numpy_of(distiller(images)), sum(numpy_of(o) for o in student(images)) / 2, atol=1e-6)


@pytest.mark.backend_independent
@pytest.mark.parametrize("method", ["hard", "soft"])
def test_a_keras_vit_distilled_deit_learns_through_its_two_heads_not_their_average(method):
    keras.utils.set_random_seed(0)
    teacher = keras_vit.ViT(hidden_size=16, mlp_dim=32, **SIZES)
    student = keras_vit.ViT(hidden_size=8, mlp_dim=16, architecture=keras_vit.Architecture(distillation_token=True),
                            **SIZES)
    for name in ("head", "head_dist"):  # distinct heads, so their average differs from each
        layer = student.get_layer(name)
        layer.set_weights([np.random.default_rng(len(name)).normal(size=w.shape) for w in layer.get_weights()])
    images = np.random.default_rng(1).uniform(-1, 1, (4, 16, 16, 3)).astype("float32")
    heads = distillation_heads(student)
    class_logits, distillation_logits = (numpy_of(o) for o in heads(images))
    teacher_logits = numpy_of(teacher(images))
    by_hand = {"hard": hard_by_hand, "soft": soft_by_hand}[method]
    expected = by_hand(LABELS, class_logits, distillation_logits, teacher_logits)
    average = (class_logits + distillation_logits) / 2
    assert abs(np.mean(expected) - np.mean(by_hand(LABELS, average, average, teacher_logits))) > 0.05
    distiller = Distiller(student, teacher, method=method)
    distiller.compile(optimizer=keras.optimizers.SGD(0.0), run_eagerly=True)
    np.testing.assert_allclose(distiller.train_on_batch(images, LABELS), np.mean(expected), rtol=1e-5)
    assert len(distiller.trainable_weights) == len(student.trainable_weights)
    np.testing.assert_allclose(numpy_of(distiller(images)), numpy_of(student(images)), atol=1e-6)


@pytest.mark.backend_independent
def test_a_teacher_ending_in_a_softmax_teaches_by_its_probabilities():
    keras.utils.set_random_seed(0)
    logits_teacher = keras_vit.ViT(hidden_size=16, mlp_dim=32, **SIZES)
    for weight in logits_teacher.weights:  # large logits: probabilities taken for logits would barely differ
        weight.assign(np.random.default_rng(len(weight.path)).normal(0, 1, weight.shape))
    # ViT's and from_pretrained's default: an Activation("softmax") named "predictions".
    teacher = keras_vit.ViT(hidden_size=16, mlp_dim=32, **dict(SIZES, classifier_activation="softmax"))
    teacher.set_weights(logits_teacher.get_weights())
    student = keras_vit.ViT(hidden_size=8, mlp_dim=16, **SIZES)
    images = np.random.default_rng(1).uniform(-1, 1, (4, 16, 16, 3)).astype("float32")
    teacher_logits, student_logits = numpy_of(logits_teacher(images)), numpy_of(student(images))
    for method, by_hand in (("soft", soft_by_hand), ("hard", hard_by_hand)):
        distiller = Distiller(student, teacher, method=method)
        distiller.compile(optimizer=keras.optimizers.SGD(0.0), run_eagerly=True)
        expected = np.mean(by_hand(LABELS, student_logits, student_logits, teacher_logits))
        np.testing.assert_allclose(distiller.train_on_batch(images, LABELS), expected, rtol=1e-5)
    softmax_layer = keras.Sequential([keras.Input((16, 16, 3)), logits_teacher, keras.layers.Softmax(name="probs")])
    assert Distiller(student, softmax_layer).teacher_from_logits is False
    assert Distiller(student, logits_teacher).teacher_from_logits is True
    for model, name in ((teacher, "predictions"), (softmax_layer, "probs")):
        with pytest.raises(ValueError) as error:
            Distiller(student, model, method="soft", teacher_from_logits=True)
        assert str(error.value) == (f"teacher_from_logits=True, but the teacher ends in a softmax ('{name}') and "
                                    "gives probabilities: leave teacher_from_logits out to read them as such.")


@pytest.mark.backend_independent
def test_a_bfloat16_teacher_teaches_a_float32_student():
    teacher = keras_vit.ViT(hidden_size=16, mlp_dim=32, dtype="mixed_bfloat16", **SIZES)
    distiller = Distiller(keras_vit.ViT(hidden_size=8, mlp_dim=16, **SIZES), teacher, method="soft", temperature=2.0)
    distiller.compile(optimizer="adam", metrics=["accuracy"])
    history = distiller.fit(np.zeros((4, 16, 16, 3), "float32"), LABELS, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0]) and "accuracy" in history.history


@pytest.mark.backend_independent
@pytest.mark.parametrize("kwargs, message", [
    (dict(method="feature"), "Unknown distillation method 'feature'; expected one of ('hard', 'soft')."),
    (dict(alpha=1.5), "alpha must be in [0, 1] and temperature positive, got alpha=1.5, temperature=1.0."),
])
def test_refusals(kwargs, message):
    model = keras_vit.ViT(hidden_size=8, mlp_dim=16, **SIZES)
    with pytest.raises(ValueError) as error:
        Distiller(model, model, **kwargs)
    assert str(error.value) == message


@pytest.mark.backend_independent
def test_a_student_of_other_classes_or_giving_probabilities_is_refused_and_a_distiller_is_not_saved(tmp_path):
    teacher = keras_vit.ViT(hidden_size=8, mlp_dim=16, **SIZES)
    other_classes = keras_vit.ViT(hidden_size=8, mlp_dim=16, **dict(SIZES, classes=5))
    with pytest.raises(ValueError) as error:
        Distiller(other_classes, teacher)
    assert str(error.value) == ("The student gives 5 classes and the teacher 3: distillation compares them class by "
                                "class; give the student the teacher's classes (keras_vit.ViT(..., classes=3)).")
    probabilities = keras_vit.ViT(hidden_size=8, mlp_dim=16, **dict(SIZES, classifier_activation="softmax"))
    with pytest.raises(ValueError) as error:
        Distiller(probabilities, teacher, method="soft")
    assert str(error.value) == ("The student ends in a softmax ('predictions'): the distiller trains its logits; "
                                "build it without one (keras_vit.ViT(..., classifier_activation=None)).")
    distiller = Distiller(keras_vit.ViT(hidden_size=8, mlp_dim=16, **SIZES), teacher)
    path = tmp_path / "distiller.keras"
    with pytest.raises(ValueError, match=r"^A Distiller is not saved whole .*: save distiller.student, the model to "
                                         r"keep, instead of writing"):
        distiller.save(path)
    assert not path.exists()
