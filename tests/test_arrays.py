"""keras_vit.arrays: the TF-free image path (Pillow decoding, tf.image.resize's bilinear in numpy, the digits),
against TensorFlow and scikit-learn as references, and `predict` run where TensorFlow cannot be imported."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from keras_vit import arrays

pytestmark = pytest.mark.backend_independent  # numpy and Pillow only; the subprocess below picks its backend


@pytest.mark.parametrize("size", [(20, 30), (64, 48), (16, 16), (5, 5)])
def test_resize_computes_tensorflows_bilinear_resize_bit_for_bit(size):
    tf = pytest.importorskip("tensorflow")

    image = np.random.default_rng(0).uniform(0, 255, (37, 53, 3)).astype("float32")
    np.testing.assert_array_equal(arrays.resize(image, size), tf.image.resize(image, size).numpy())
    batch = np.stack([image, image[::-1]])
    np.testing.assert_array_equal(arrays.resize(batch, size)[1], tf.image.resize(image[::-1], size).numpy())


def test_resize_of_a_twelve_megapixel_photo_is_separable_and_equals_tensorflows(monkeypatch):
    # The old resize was one three-operand einsum, which numpy runs as a loop over all five indices: hours for
    # this photo. Each axis is now two gathers and a weighted sum; no einsum and no dense matrix product.
    def refuse(*args, **kwargs):
        raise AssertionError("resize must not use a dense einsum or matrix product")

    photo = np.random.default_rng(1).integers(0, 256, (3000, 4000, 3), dtype="uint8")
    monkeypatch.setattr(np, "einsum", refuse)
    monkeypatch.setattr(np, "matmul", refuse)
    resized = arrays.resize(photo, (224, 224))
    monkeypatch.undo()
    assert resized.shape == (224, 224, 3) and resized.dtype == np.float32
    tf = pytest.importorskip("tensorflow")
    np.testing.assert_array_equal(resized, tf.image.resize(photo, (224, 224)).numpy())


def test_the_shipped_digits_are_scikit_learns_and_split_per_class_by_seed():
    sklearn_datasets = pytest.importorskip("sklearn.datasets")
    reference = sklearn_datasets.load_digits()
    with np.load(arrays.DIGITS_FILE) as stored:
        np.testing.assert_array_equal(stored["images"], reference.images)
        np.testing.assert_array_equal(stored["labels"], reference.target)
    (x, y), (x_test, y_test) = arrays.digits(image_size=8)
    np.testing.assert_array_equal(np.sort(np.concatenate([y, y_test])), np.sort(reference.target))
    # At 8 px the images are the originals scaled to 0..255: every one appears once, in train or test.
    scaled = np.round(reference.images * (255.0 / 16.0)).astype("uint8")
    found = {image.tobytes() for image in np.concatenate([x, x_test])[..., 0]}
    assert found == {image.tobytes() for image in scaled}
    assert (len(y), len(y_test)) == (1437, 360)
    assert set(np.bincount(y_test)) <= {35, 36, 37}  # 20% of each class, rounded
    (_, again), (_, other) = arrays.digits(image_size=8)[1], arrays.digits(image_size=8, seed=1)[1]
    np.testing.assert_array_equal(again, y_test)
    assert not np.array_equal(other, y_test)
    with pytest.raises(ValueError, match=r"^test_fraction must be between 0 and 1, got 1\.5\.$"):
        arrays.digits(test_fraction=1.5)


@pytest.mark.parametrize("mode, suffix", [("RGB", ".png"), ("L", ".png"), ("RGBA", ".png"), ("P", ".gif"),
                                          ("RGB", ".bmp")])
def test_decode_image_gives_what_tensorflow_decodes(mode, suffix, tmp_path):
    tf = pytest.importorskip("tensorflow")
    from PIL import Image

    pixels = np.random.default_rng(1).integers(0, 256, (9, 7, 4), dtype="uint8")
    image = Image.fromarray(pixels, "RGBA").convert(mode)
    path = str(tmp_path / f"image{suffix}")
    image.save(path)
    expected = tf.io.decode_image(tf.io.read_file(path), channels=3, expand_animations=False).numpy()
    decoded = arrays.decode_image(path)
    assert decoded.dtype == np.uint8 and decoded.shape == (9, 7, 3)
    np.testing.assert_array_equal(decoded, expected)


def test_the_digits_job_and_predict_run_where_tensorflow_and_scikit_learn_cannot_be_imported(tmp_path):
    """The JAX user's install: one epoch of the digits job (a tiny model), then `predict` on an image file."""
    from PIL import Image

    Image.fromarray(np.random.default_rng(2).integers(0, 256, (40, 40, 3), dtype="uint8")).save(tmp_path / "x.png")
    script = textwrap.dedent(f"""
        import sys
        sys.modules["tensorflow"] = None  # any import of it now fails
        sys.modules["sklearn"] = None
        from keras_vit import cli, inference
        top1 = cli.main(["pretrain", "--epochs", "1", "--output-dir", {str(tmp_path / "run")!r}, "--image-size", "16",
                         "--patch-size", "4", "--hidden-size", "16", "--num-layers", "1", "--num-heads", "2",
                         "--mlp-dim", "32", "--verbose", "0"])
        top = inference.predict([{str(tmp_path / "x.png")!r}], weights={str(tmp_path / "run" / "model.keras")!r})
        assert 0.0 <= top1 <= 1.0 and len(top[0]) == 5
        print("OK")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "KERAS_BACKEND": "jax"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("OK")
    assert "note: TensorBoard logs skipped: the optional package 'tensorflow' is not installed (pip install " \
           "'keras-vision-transformer[tensorflow]')" in done.stdout
