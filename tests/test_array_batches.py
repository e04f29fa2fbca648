"""keras_vit.data.array_batches, the pipeline without TensorFlow, against tf.data's: the same distribution of crops,
flips and augmentations, the same evaluation batches, and a resumed stream equal to an uninterrupted one."""

import numpy as np
import pytest

from keras_vit import data
from keras_vit.data import array_batches, arrays

tf = pytest.importorskip("tensorflow")  # the reference pipeline


@pytest.fixture(scope="module")
def digits():
    return arrays.digits(image_size=16)


@pytest.fixture
def numpy_pipeline(monkeypatch):
    """Sources built while this is active are read as a TensorFlow-less install reads them."""
    monkeypatch.setattr(data.source, "tensorflow_installed", lambda: False)


@pytest.mark.backend_independent
def test_crops_and_flips_are_tensorflows_stateless_draws_bit_for_bit():
    # The numpy pipeline drew its own crops (the same distribution, other boxes) and flips from numpy's generator.
    from keras_vit.data import philox

    rng = np.random.default_rng(1)
    for index in range(600):
        height, width = (int(rng.integers(1, 40)), int(rng.integers(1, 40))) if index % 2 else (
            int(rng.integers(1, 4000)), int(rng.integers(1, 4000)))
        area_range = [(0.05, 1.0), (0.08, 1.0), (0.6, 1.0), (1.0, 1.0), (0.3, 0.5), (0.01, 0.02)][index % 6]
        seed = (int(rng.integers(-2**62, 2**62)), int(rng.integers(0, 2**45)))
        begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
            (height, width, 3), bounding_boxes=tf.constant([0.0, 0.0, 1.0, 1.0], shape=(1, 1, 4)),
            seed=tf.constant(seed, tf.int64), min_object_covered=0.0, aspect_ratio_range=(3 / 4, 4 / 3),
            area_range=area_range, use_image_if_no_bounding_boxes=True)
        expected = (int(begin[0]), int(begin[1]), int(size[0]), int(size[1]))
        assert philox.sample_crop(height, width, seed, area_range) == expected, (height, width, seed, area_range)
        uniform = tf.random.stateless_uniform([], seed=tf.constant(seed, tf.int64)).numpy()
        assert philox.stateless_uniform(seed) == uniform


def test_both_pipelines_give_the_same_evaluation_batches_and_flip_half_the_training_images(digits, numpy_pipeline):
    (x, y), _ = digits
    reference = data.Source(tf.data.Dataset.from_tensor_slices((x[:64], y[:64].astype("int64"))), 64, 10)
    ours = data.from_arrays(x[:64], y[:64])
    assert ours.dataset is None
    tf_batches = [(images.numpy(), labels.numpy()) for images, labels in
                  data.make_dataset(reference, 24, 32, training=False, crop_fraction=0.875)]
    np_batches = data.make_dataset(ours, 24, 32, training=False, crop_fraction=0.875)
    assert isinstance(np_batches, array_batches.ArrayBatches) and len(np_batches) == len(tf_batches) == 2
    for (tf_images, tf_labels), (np_images, np_labels) in zip(tf_batches, (np_batches[0], np_batches[1])):
        np.testing.assert_allclose(np_images, tf_images, atol=1e-5)
        np.testing.assert_array_equal(np_labels, tf_labels)
    # A full-area crop of a digit flipped or not: the flipped share is 1/2 on both pipelines.
    flipped = {}
    for name, source in (("tf.data", reference), ("numpy", ours)):
        batch = next(iter(data.make_dataset(source, 16, 64, training=True, min_crop_area=1.0, seed=3)))
        images = np.asarray(batch[0])
        plain = x[:64] / 127.5 - 1.0
        mirrored = plain[:, :, ::-1]
        order = [int(np.argmin([min(np.abs(image - p).max(), np.abs(image - m).max()) for p, m in zip(plain, mirrored)]))
                 for image in images]
        flipped[name] = np.mean([np.abs(image - mirrored[i]).max() < np.abs(image - plain[i]).max()
                                 for image, i in zip(images, order)])
    assert 0.3 < flipped["numpy"] < 0.7 and 0.3 < flipped["tf.data"] < 0.7


def test_a_resumed_numpy_stream_equals_the_uninterrupted_one_and_epochs_differ(digits, numpy_pipeline):
    source = data.from_arrays(*digits[0])
    steps = data.steps_per_epoch(source, 256)
    whole = [images for images, _ in data.training_stream(source, 16, 256, epochs=3, seed=5)]
    resumed = [images for images, _ in data.training_stream(source, 16, 256, epochs=3, initial_epoch=2, seed=5)]
    assert len(whole) == 3 * steps and len(resumed) == steps
    for a, b in zip(whole[2 * steps:], resumed):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(whole[0], whole[steps])
    assert all(batch.min() >= -1.0 and batch.max() <= 1.0 and batch.dtype == np.float32 for batch in whole)


def test_batches_from_two_worker_processes_equal_the_single_process_ones_and_resume(tmp_path, numpy_pipeline):
    from PIL import Image

    rng = np.random.default_rng(2)
    for index in range(8):
        (tmp_path / f"c{index % 2}").mkdir(exist_ok=True)
        pixels = rng.integers(0, 256, (int(rng.integers(20, 40)), int(rng.integers(20, 40)), 3), dtype="uint8")
        Image.fromarray(pixels).save(tmp_path / f"c{index % 2}" / f"{index}.jpg")
    source = data.from_folder(str(tmp_path))

    def stream(workers, initial_epoch=0, mixup=0.0):
        # MixUp draws from its own seed in the calling process: the same draws, batch after batch, as one process.
        augmenters = data.make_augmenters(mixup=mixup, seed=1)
        return list(data.training_stream(source, 12, 2, 3, initial_epoch, seed=4, augmenters=augmenters,
                                          one_hot=True, workers=workers))

    alone, parallel = stream(0, mixup=0.4), stream(2, mixup=0.4)
    assert len(alone) == len(parallel) == 12
    for (images, labels), (theirs, their_labels) in zip(alone, parallel):
        np.testing.assert_array_equal(images, theirs)
        np.testing.assert_array_equal(labels, their_labels)
    assert any(not np.allclose(labels, np.round(labels)) for _, labels in alone)  # the labels were mixed
    whole, resumed = stream(2), stream(2, initial_epoch=2)
    assert len(resumed) == 4
    for (images, labels), (theirs, their_labels) in zip(whole[8:], resumed):
        np.testing.assert_array_equal(images, theirs)
        np.testing.assert_array_equal(labels, their_labels)


# A script that leaves a stream of worker batches unfinished in a global, as a notebook or a short script does.
UNFINISHED_STREAM = """
import numpy as np
from keras_vit import data
from keras_vit.data import array_batches
images = np.zeros((8, 12, 12, 3), "uint8")
source = data.Source(None, 8, 2, examples=(images, np.arange(8) % 2))
stream = array_batches.training_batches(source, (8, 8), 2, epochs=2, workers=1)
next(stream)
print("done")
"""


@pytest.mark.backend_independent
def test_an_unfinished_worker_stream_exits_without_a_traceback(tmp_path):
    # The pool was stopped while the interpreter tore its modules down: "Exception ignored in: <generator object
    # _batches>" (sys was None) and in Pool.__del__ after every such run on JAX and torch.
    import os
    import subprocess
    import sys

    # Keras' numpy backend: the quickest to import, and no TensorFlow start-up lines on stderr.
    done = subprocess.run([sys.executable, "-c", UNFINISHED_STREAM], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path, env=dict(os.environ, KERAS_BACKEND="numpy"))
    assert (done.returncode, done.stdout, done.stderr) == (0, "done\n", "")


def on_both_pipelines(monkeypatch, make_source, run):
    """`run(source)` on tf.data, then on the numpy pipeline (a source made as a TensorFlow-less install makes it)."""
    results = []
    for installed in (True, False):
        monkeypatch.setattr(data.source, "tensorflow_installed", lambda: installed)
        results.append(run(make_source()))
    monkeypatch.undo()
    return results


def png_folder(folder):
    """PNGs of several sizes in two classes, a 16-bit grey one, and one whose IDAT is corrupt (header and IEND
    whole, so that the folder check passes it)."""
    from PIL import Image

    rng = np.random.default_rng(3)
    for index in range(9):
        (folder / f"c{index % 2}").mkdir(exist_ok=True)
        pixels = rng.integers(0, 256, (int(rng.integers(20, 48)), int(rng.integers(20, 48)), 3), dtype="uint8")
        Image.fromarray(pixels).save(folder / f"c{index % 2}" / f"{index}.png")
    Image.fromarray(rng.integers(0, 65536, (30, 44), dtype="uint16")).save(folder / "c0" / "grey16.png")
    whole = (folder / "c1" / "1.png").read_bytes()
    idat = whole.index(b"IDAT") + 4
    (folder / "c1" / "corrupt.png").write_bytes(whole[:idat + 20] + bytes(30) + whole[idat + 50:])
    return folder


@pytest.mark.backend_independent
def test_both_pipelines_give_the_same_training_batches(digits, tmp_path, monkeypatch):
    # Each drew its own order (numpy's permutation, tf.data's shuffle buffer) and its own crops and flips.
    # RandAugment's draws are keyed by the same (seed, epoch, position) on both (tests/test_randaugment.py).
    (x, y), _ = digits
    tf_batches, np_batches = on_both_pipelines(monkeypatch, lambda: data.from_arrays(x[:96], y[:96]), lambda source: [
        (np.asarray(images), np.asarray(labels)) for images, labels in
        data.training_stream(source, 16, 32, epochs=2, seed=5, workers=0)])
    assert len(tf_batches) == len(np_batches) == 6
    for (tf_images, tf_labels), (np_images, np_labels) in zip(tf_batches, np_batches):
        np.testing.assert_array_equal(np_images, tf_images)
        np.testing.assert_array_equal(np_labels, tf_labels)
    folder = png_folder(tmp_path)
    tf_batches, np_batches = [np.stack([np.asarray(images) for images, _ in stream]) for stream in on_both_pipelines(
        monkeypatch, lambda: data.from_folder(str(folder)), lambda source: list(
            data.training_stream(source, 12, 4, epochs=2, seed=2, workers=0)))]
    assert tf_batches.shape == (4, 4, 12, 12, 3)  # (the numpy pipeline's workers give its own batches: test below)
    np.testing.assert_array_equal(np_batches, tf_batches)


@pytest.mark.backend_independent
def test_both_pipelines_read_bmp_gif_16_bit_cmyk_and_turned_files_alike(tmp_path, monkeypatch):
    # tf.data read the palette BMP's indices as grey, the GIF's transparent pixels as black, the 16-bit grey PNG's
    # high byte and CMYK rounded down, and cropped the turned JPEGs' windows from the unturned picture.
    from test_arrays import DECODED_FILES

    names = ["palette.bmp", "bilevel.bmp", "palette_transparent.gif", "grey_16bit.png", "cmyk.jpg", "orientation_1.jpg",
             "orientation_3.jpg", "orientation_6.jpg", "orientation_6.png", "palette_transparent.png"]
    for index, name in enumerate(names):
        (tmp_path / f"c{index % 2}").mkdir(exist_ok=True)
        (tmp_path / f"c{index % 2}" / name).write_bytes(DECODED_FILES[name]())
    (tf_train, tf_eval), (np_train, np_eval) = on_both_pipelines(
        monkeypatch, lambda: data.from_folder(str(tmp_path)), lambda source: (
            np.stack([np.asarray(x) for x, _ in data.training_stream(source, 8, 5, epochs=1, seed=4, workers=0)]),
            np.concatenate([np.asarray(x) for x, _ in data.make_dataset(source, 8, 5, training=False)])))
    assert tf_train.shape == (2, 5, 8, 8, 3) and tf_eval.shape == (10, 8, 8, 3)
    np.testing.assert_array_equal(np_train, tf_train)
    np.testing.assert_array_equal(np_eval, tf_eval)


@pytest.mark.backend_independent
def test_a_file_that_cannot_be_decoded_is_skipped_mid_epoch_with_a_note_naming_it(tmp_path, monkeypatch, caplog, capfd):
    # The corrupt PNG passed the folder check, then both pipelines stopped mid-epoch with a traceback naming no file.
    folder = png_folder(tmp_path)
    broken = str(folder / "c1" / "corrupt.png")
    note = f"note: skipped {broken}, which cannot be decoded as an image"
    (tf_train, tf_eval), (np_train, np_eval) = on_both_pipelines(
        monkeypatch, lambda: data.from_folder(str(folder)), lambda source: (
            [np.asarray(images) for images, _ in data.make_dataset(source, 12, 4, training=True, seed=1)],
            [(np.asarray(images), np.asarray(labels)) for images, labels in data.make_dataset(source, 12, 4,
                                                                                               training=False)]))
    np.testing.assert_array_equal(np.stack(np_train), np.stack(tf_train))  # every batch full: the next example in
    assert [len(labels) for _, labels in tf_eval] == [len(labels) for _, labels in np_eval] == [4, 4, 2]  # 10 of 11
    np.testing.assert_allclose(np.concatenate([i for i, _ in np_eval]), np.concatenate([i for i, _ in tf_eval]),
                               atol=1e-5)
    printed = capfd.readouterr().err  # tf.data prints its notes; the numpy pipeline logs them
    assert f"{note}; the next example of the epoch took its place" in printed
    assert f"{note}; left out of the evaluation" in printed
    assert f"{note} (broken data stream when reading image file); the next example of the epoch took its place" in (
        caplog.text)
    assert f"{note} (broken data stream when reading image file); left out of the evaluation" in caplog.text


def augmented_statistics(source, augmenters):
    """Per batch: the mean |change| of the pixels against the unaugmented batch, and the mean largest label weight."""
    kwargs = dict(training=True, seed=1, min_crop_area=1.0, flip=False, one_hot=True)
    plain = data.make_dataset(source, 16, 32, **kwargs)
    mixed = data.make_dataset(source, 16, 32, augmenters=augmenters, **kwargs)
    changes, weights = [], []
    for (images, _), (augmented, labels) in zip(plain, mixed):
        changes.append(np.abs(np.asarray(augmented) - np.asarray(images)).mean())
        weights.append(np.asarray(labels).max(-1).mean())
    return np.asarray(changes), np.asarray(weights)


@pytest.mark.parametrize("augmenter", ["mixup", "cutmix"])
def test_augmentations_give_the_same_statistics_on_both_pipelines(digits, monkeypatch, augmenter):
    # timm's MixUp and CutMix (a Keras layer) draw from its seed, in tf.data and in numpy alike: the same distribution, not
    # the same draws (RandAugment's are the same: test_both_pipelines_give_the_same_training_batches).
    (x, y), _ = digits
    options = {"mixup": dict(mixup=0.4), "cutmix": dict(cutmix=1.0)}
    results = {}
    for name in ("tf.data", "numpy"):
        if name == "numpy":
            monkeypatch.setattr(data.source, "tensorflow_installed", lambda: False)
        source = data.from_arrays(x[:128], y[:128])
        results[name] = augmented_statistics(source, data.make_augmenters(**options[augmenter], seed=4))
    (tf_change, tf_weight), (np_change, np_weight) = results["tf.data"], results["numpy"]
    assert np_change.mean() > 0.01 and tf_change.mean() > 0.01  # the layers changed the images
    for ours, theirs in ((np_change, tf_change), (np_weight, tf_weight)):
        spread = np.sqrt(ours.var() / len(ours) + theirs.var() / len(theirs)) + 1e-3
        assert abs(ours.mean() - theirs.mean()) < 4 * spread + 0.1 * theirs.mean(), (ours, theirs)
    assert 0.5 <= np_weight.mean() < 0.99 and 0.5 <= tf_weight.mean() < 0.99  # labels mixed


@pytest.mark.backend_independent
def test_an_image_folder_reads_the_same_without_tensorflow(tmp_path, monkeypatch):
    from PIL import Image

    rng = np.random.default_rng(5)
    for name in ("cat", "dog"):
        (tmp_path / name).mkdir()
        for index in range(3):
            Image.fromarray(rng.integers(0, 256, (20 + index, 24, 3), dtype="uint8")).save(tmp_path / name / f"{index}.png")
    (tmp_path / "dog" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    with_tf = data.from_folder(str(tmp_path))
    expected = [(images.numpy(), labels.numpy()) for images, labels in data.make_dataset(with_tf, 16, 4, training=False)]
    monkeypatch.setattr(data.source, "tensorflow_installed", lambda: False)
    without = data.from_folder(str(tmp_path))
    assert without.dataset is None and without.num_examples == with_tf.num_examples == 6
    assert without.class_names == with_tf.class_names == ("cat", "dog")
    ours = data.make_dataset(without, 16, 4, training=False)
    for (images, labels), index in zip(expected, range(len(ours))):
        np.testing.assert_allclose(ours[index][0], images, atol=1e-5)
        np.testing.assert_array_equal(ours[index][1], labels)


@pytest.mark.backend_independent
def test_an_evaluation_batch_of_only_undecodable_files_is_refused_not_empty(tmp_path):
    # An empty batch made Keras' evaluate report a NaN loss (JAX, torch) and a wrong accuracy (JAX) for the whole pass.
    from PIL import Image

    paths = [str(tmp_path / f"{index}.png") for index in range(3)]
    for path in paths:
        Image.fromarray(np.full((20, 24, 3), 128, "uint8")).save(path)
    with open(paths[2], "r+b") as f:  # its header still reads; its pixels do not
        f.truncate(60)
    source = data.Source(None, 3, 2, examples=(paths, np.array([0, 1, 1])))
    batches = array_batches.ArrayBatches(source, (16, 16), 2, training=False)
    assert batches[0][0].shape == (2, 16, 16, 3)
    with pytest.raises(ValueError) as error:
        batches[1]
    assert str(error.value) == f"No image of evaluation batch 1 can be decoded ({paths[2]}); remove them from the set."


@pytest.mark.backend_independent
@pytest.mark.parametrize("layer", ["MixUp", "CutMix"])
def test_mixup_and_cutmix_refuse_integer_labels_on_both_pipelines(digits, monkeypatch, layer):
    # Keras' layers mix one-hot labels; integer ones came out as a (batch, batch) matrix, with no word.
    (x, y), _ = digits
    augmenters = data.make_augmenters(**{"MixUp": {"mixup": 0.4}, "CutMix": {"cutmix": 1.0}}[layer])
    message = (r"^MixUpCutMix mixes one-hot labels, but one_hot=False gives integer labels \(mixed into a \(batch, batch\) "
               r"matrix\): pass one_hot=True, with a categorical loss\.$")
    for numpy_path in (False, True):
        monkeypatch.setattr(data.source, "tensorflow_installed", lambda: not numpy_path)
        source = data.from_arrays(x[:64], y[:64])
        with pytest.raises(ValueError, match=message):
            data.make_dataset(source, 16, 32, training=True, augmenters=augmenters)
        with pytest.raises(ValueError, match=message):
            data.training_stream(source, 16, 32, epochs=1, augmenters=augmenters)
        images, labels = next(iter(data.make_dataset(source, 16, 32, training=True, augmenters=augmenters,
                                                     one_hot=True)))
        assert np.shape(labels) == (32, 10)
