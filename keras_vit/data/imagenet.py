"""Input scaling and ImageNet-1k label decoding, in the keras.applications style."""

import functools
import os

import keras
import ml_dtypes
import numpy as np
from keras import ops

from keras_vit.data.arrays import minus_one_to_one

_LABELS = os.path.join(os.path.dirname(__file__), "imagenet1k_labels.txt")


def preprocess_input(images):
    """Scale pixels from [0, 255] to [-1, 1], as the original ViT models expect.

    Accepts uint8 or float images (numpy arrays or tensors) and returns
    float32 of the same kind.

    Example:
    >>> import numpy as np
    >>> preprocess_input(np.array([0, 255], "uint8"))
    array([-1.,  1.], dtype=float32)
    """
    if isinstance(images, np.ndarray) or np.isscalar(images) or isinstance(images, list):
        return minus_one_to_one(images)
    return ops.cast(images, "float32") / 127.5 - 1.0


@functools.lru_cache(maxsize=1)
def imagenet_labels():
    """The 1,000 ImageNet-2012 classes as `(wnid, name)` pairs in index order."""
    with open(_LABELS) as f:
        return tuple(tuple(line.rstrip("\n").split("\t")) for line in f)


def decode_predictions(preds, top=5, class_names=None, from_logits=None):
    """Decode `(batch, classes)` predictions into `(class_id, name, probability)` lists, best first.

    Without `class_names`, ImageNet-1k's `(wnid, name, probability)`. With
    them (a model's own `model.class_names`, read from its checkpoint's
    labels or given to `keras_vit.ViT(class_names=...)`; or your data's,
    `source.class_names`), the id is the class index as a string.

    The scores are probabilities. A model built with
    `classifier_activation=None` (as fine-tuning builds it) outputs logits,
    which are put through a softmax: `from_logits=True` says so (for
    `keras_vit.tools.inference.outputs_logits(model)`), `False` takes the
    scores as they are, and `None` decides from them: predictions that are
    not probabilities (a score outside [0, 1], or a row whose sum is not 1)
    are logits. A row of probabilities sums to 1 within what rounding to
    their dtype leaves (`sum_tolerance`: bfloat16's 0.016).

    Example:
    >>> import numpy as np
    >>> scores = np.zeros((1, 1000)); scores[0, 1] = 1.0
    >>> decode_predictions(scores, top=1)
    [[('n01443537', 'goldfish', 1.0)]]
    >>> decode_predictions(np.array([[0.2, 0.8]]), top=1, class_names=["cat", "dog"])
    [[('1', 'dog', 0.8)]]
    >>> decode_predictions(np.array([[0.0, np.log(3)]]), top=1, class_names=["cat", "dog"])  # logits
    [[('1', 'dog', 0.75)]]
    """
    dtype = keras.backend.standardize_dtype(getattr(preds, "dtype", "float64"))
    preds = np.asarray(ops.convert_to_numpy(preds), "float64")
    if class_names is not None:
        if preds.ndim != 2 or preds.shape[1] != len(class_names):
            raise ValueError(f"decode_predictions got predictions of shape {preds.shape} for {len(class_names)} "
                             f"class names; expected (batch, {len(class_names)}).")
        labels = [(str(index), name) for index, name in enumerate(class_names)]
    elif preds.ndim != 2 or preds.shape[1] != 1000:
        raise ValueError(
            "decode_predictions expects ImageNet-1k predictions of shape (batch, 1000), "
            f"got {preds.shape}; pass class_names=, the model's own (model.class_names, kept by "
            "keras_vit.ViT(class_names=...) and by keras_vit's training) or your data's (source.class_names)."
        )
    else:
        labels = imagenet_labels()
    if from_logits is None:
        from_logits = not is_probabilities(preds, sum_tolerance(dtype))
    if from_logits:
        preds = np.exp(preds - preds.max(axis=-1, keepdims=True))
        preds /= preds.sum(axis=-1, keepdims=True)
    results = []
    for row in preds:
        best = np.argsort(-row, kind="stable")[:top]  # ties: the first class first
        results.append([(*labels[i], float(row[i])) for i in best])
    return results


def sum_tolerance(dtype):
    """How far from 1 a row of probabilities in `dtype` may sum: 1e-3, or two of its epsilons where those are more
    (bfloat16's softmax rounds each score by up to half of one: a 1000-class row sums 0.005 off 1).

    Example:
    >>> sum_tolerance("float32"), sum_tolerance("bfloat16")
    (0.001, 0.015625)
    """
    if not keras.backend.is_float_dtype(dtype):
        return 1e-3
    return max(1e-3, 2 * float(ml_dtypes.finfo(dtype).eps))


def is_probabilities(preds, tolerance=1e-3):
    """Whether every row of `preds` is a probability distribution: scores in [0, 1] that sum to 1 (within
    `tolerance`)."""
    preds = np.asarray(preds)
    return bool(np.all((preds >= 0) & (preds <= 1)) and np.all(np.abs(preds.sum(axis=-1) - 1) <= tolerance))
