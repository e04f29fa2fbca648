"""`Source`: a data set's examples before preprocessing, as every input pipeline takes them; and the one switch
between the pipelines, `tensorflow_installed`.

Example:
>>> import numpy as np
>>> from keras_vit.data import from_arrays
>>> from_arrays(np.zeros((2, 8, 8, 3), "uint8"), [0, 1]).num_classes  # doctest: +SKIP
2
"""

import dataclasses


@dataclasses.dataclass
class Source:
    """Examples before preprocessing: a `tf.data.Dataset` of `(uint8 image, int label)`.

    `num_examples` is known for arrays, folders and tfds splits; `class_names`
    when the source names its classes. Arrays and folders also keep
    `examples`, `(uint8 images or file paths, int labels)`, which training
    reads in both pipelines (tf.data decodes only a file's crop window) and
    `keras_vit.data.array_batches` reads where TensorFlow is not installed (then
    `dataset` is None). A folder's `dataset` decodes whole images, for
    evaluation; a file that cannot be decoded comes as a 1x1 image labelled
    -1, which `make_dataset` leaves out. A tensorflow-datasets split that
    stores image files keeps them in `encoded`, `(file bytes, label)`, which
    `dataset` decodes whole and training decodes only each crop window of.
    """

    dataset: object
    num_examples: int
    num_classes: int
    class_names: tuple = None
    name: str = ""
    examples: tuple = None
    encoded: object = None


def tensorflow_installed():
    """Whether TensorFlow can be imported: then every source is read through tf.data, else through numpy."""
    try:
        import tensorflow  # noqa: F401 (imported to see that it can be)
    except ImportError:
        return False
    return True
