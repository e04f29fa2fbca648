"""keras_vit.data.arrays: the TF-free image path (Pillow decoding, tf.image.resize's bilinear in numpy, the digits),
against Pillow, TensorFlow and scikit-learn as references, and `predict` run where TensorFlow cannot be imported."""

import functools
import io
import os
import struct
import subprocess
import sys
import textwrap
import warnings
import zlib

import numpy as np
import pytest

from keras_vit.data import arrays

pytestmark = pytest.mark.backend_independent  # numpy and Pillow only; the subprocess below picks its backend


@pytest.mark.parametrize("size", [(20, 30), (64, 48), (16, 16), (5, 5)])
def test_resize_computes_tensorflows_bilinear_resize_bit_for_bit(size):
    tf = pytest.importorskip("tensorflow")

    image = np.random.default_rng(0).uniform(0, 255, (37, 53, 3)).astype("float32")
    np.testing.assert_array_equal(arrays.resize(image, size), tf.image.resize(image, size).numpy())
    batch = np.stack([image, image[::-1]])
    np.testing.assert_array_equal(arrays.resize(batch, size)[1], tf.image.resize(image[::-1], size).numpy())
    # The training crops: a uint8 window of a decoded image, converted to float32 only after the gathers.
    crop = np.round(image).astype("uint8")[3:30, 5:44]
    np.testing.assert_array_equal(arrays.resize(crop, size), tf.image.resize(crop, size).numpy())
    mirrored = arrays.resize(crop, size, mirror=True)
    assert mirrored.flags.c_contiguous
    np.testing.assert_array_equal(mirrored, tf.image.flip_left_right(tf.image.resize(crop, size)).numpy())


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


def png(samples, colour_type, bits, extra=b""):
    """A PNG of `samples` (height, width, channels) at `bits` per sample, written chunk by chunk: Pillow writes no
    16-bit colour, and no 2- or 4-bit grey."""
    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    height, width = samples.shape[:2]
    if bits < 8:
        rows = [np.packbits(np.unpackbits(row.astype("uint8")[:, None], axis=1)[:, 8 - bits:]) for row in samples[..., 0]]
    else:
        rows = [row.astype(">u2" if bits == 16 else "uint8") for row in samples]
    header = struct.pack(">IIBBBBB", width, height, bits, colour_type, 0, 0, 0)
    pixels = zlib.compress(b"".join(b"\x00" + row.tobytes() for row in rows))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + extra + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")


def pillow_file(mode, format, **options):
    """A 9x7 image in `mode` saved as `format`; a JPEG's is 2x3 flat 8x8 blocks, which every JPEG decoder decodes
    exactly (16x24: a turn shows in the shape)."""
    from PIL import Image

    rng = np.random.default_rng(1)
    if format == "JPEG":
        blocks = rng.integers(0, 256, (2, 3, len(mode)), dtype="uint8")
        image = Image.fromarray(np.repeat(np.repeat(blocks, 8, axis=0), 8, axis=1), mode)
    else:
        image = Image.fromarray(rng.integers(0, 256, (9, 7, 4), dtype="uint8"), "RGBA").convert(mode)
    encoded = io.BytesIO()
    image.save(encoded, format, **options)
    return encoded.getvalue()


def oriented(format, orientation, **options):
    """An RGB file tagged with an EXIF orientation."""
    from PIL import Image

    exif = Image.Exif()
    exif[0x0112] = orientation
    return pillow_file("RGB", format, exif=exif.tobytes(), **options)


def sixteen_bits(channels):
    return np.random.default_rng(channels).integers(0, 65536, (20, 30, channels), dtype="uint16")


DECODED_FILES = {  # name: the file's bytes, each a mode Pillow opens
    "rgb.png": lambda: pillow_file("RGB", "PNG"),
    "grey.png": lambda: pillow_file("L", "PNG"),
    "grey_transparent.png": lambda: pillow_file("L", "PNG", transparency=7),
    "rgba.png": lambda: pillow_file("RGBA", "PNG"),
    "grey_alpha.png": lambda: pillow_file("LA", "PNG"),
    "bilevel.png": lambda: pillow_file("1", "PNG"),
    "palette_transparent.png": lambda: pillow_file("P", "PNG", transparency=3),
    "palette_4bit.png": lambda: pillow_file("P", "PNG", bits=4),
    "grey_2bit.png": lambda: png(sixteen_bits(1) >> 14, 0, 2),
    "grey_16bit.png": lambda: png(sixteen_bits(1), 0, 16),
    "grey_16bit_transparent.png": lambda: png(sixteen_bits(1), 0, 16,
                                              b"\x00\x00\x00\x02tRNS\x12\x34" + struct.pack(">I", zlib.crc32(b"tRNS\x12\x34"))),
    "grey_alpha_16bit.png": lambda: png(sixteen_bits(2), 4, 16),
    "rgb_16bit.png": lambda: png(sixteen_bits(3), 2, 16),
    "rgba_16bit.png": lambda: png(sixteen_bits(4), 6, 16),
    "orientation_6.png": lambda: oriented("PNG", 6),
    "palette.gif": lambda: pillow_file("P", "GIF"),
    "palette_transparent.gif": lambda: pillow_file("P", "GIF", transparency=3),
    "rgb.bmp": lambda: pillow_file("RGB", "BMP"),
    "rgba.bmp": lambda: pillow_file("RGBA", "BMP"),
    "palette.bmp": lambda: pillow_file("P", "BMP"),
    "grey.bmp": lambda: pillow_file("L", "BMP"),
    "bilevel.bmp": lambda: pillow_file("1", "BMP"),
    "cmyk.jpg": lambda: pillow_file("CMYK", "JPEG", quality=100, subsampling=0),
    **{f"orientation_{turn}.jpg": functools.partial(oriented, "JPEG", turn, quality=100, subsampling=0)
       for turn in range(1, 9)},
}


def pillows_upright_rgb(path):
    """The reference: transformers' `load_image` (EXIF orientation applied, then `convert("RGB")`)."""
    from PIL import Image, ImageOps

    with warnings.catch_warnings(), Image.open(path) as image:
        warnings.simplefilter("ignore")  # Pillow's advice to convert a palette with transparency through RGBA
        return np.asarray(ImageOps.exif_transpose(image).convert("RGB"))


@pytest.mark.parametrize("name", DECODED_FILES)
def test_both_paths_decode_a_file_as_pillows_upright_rgb(name, tmp_path):
    # tf.data read a palette BMP's indices as grey (253 levels off) and refused 1-bit ones, blacked out a GIF's
    # transparent pixels (242), kept a 16-bit grey PNG's high byte where Pillow clips (249), and rounded CMYK the other
    # way (1); neither path applied an EXIF orientation.
    tf = pytest.importorskip("tensorflow")
    from keras_vit.data import tf_data_steps

    path = tmp_path / name
    path.write_bytes(DECODED_FILES[name]())
    expected = pillows_upright_rgb(path)
    decoded = arrays.decode_image(str(path))
    assert decoded.dtype == np.uint8 and decoded.shape == expected.shape
    np.testing.assert_array_equal(decoded, expected)
    np.testing.assert_array_equal(np.asarray(arrays.open_rgb(str(path))), expected)
    by_tf_data = tf_data_steps.decode(tf.io.read_file(str(path))).numpy()
    assert by_tf_data.dtype == np.uint8 and by_tf_data.shape == expected.shape
    # JPEG decoders may differ by a few levels; a wrong turn of these blocks is off by far more.
    tolerance = 4 if name.endswith(".jpg") else 0
    np.testing.assert_allclose(by_tf_data.astype("int32"), expected.astype("int32"), rtol=0, atol=tolerance)


def test_16_bit_pgm_samples_and_float_and_broken_files(tmp_path):
    from PIL import Image

    samples = sixteen_bits(1)[..., 0]
    (tmp_path / "grey.pgm").write_bytes(b"P5 30 20 65535\n" + samples.astype(">u2").tobytes())
    (tmp_path / "grey_16bit.png").write_bytes(png(samples[..., None], 0, 16))
    assert Image.open(tmp_path / "grey.pgm").mode == "I"
    np.testing.assert_array_equal(arrays.decode_image(str(tmp_path / "grey.pgm")),
                                  arrays.decode_image(str(tmp_path / "grey_16bit.png")))
    Image.fromarray(samples.astype("float32")).save(tmp_path / "float.tif")
    np.testing.assert_array_equal(arrays.decode_image(str(tmp_path / "float.tif")),
                                  pillows_upright_rgb(tmp_path / "float.tif"))  # clipped, as Pillow converts it
    whole = png(samples[..., None], 0, 16)
    idat = whole.index(b"IDAT") + 4
    (tmp_path / "broken.png").write_bytes(whole[:idat + 10] + b"\xff" * 8 + whole[idat + 18:])
    with pytest.raises(ValueError, match=r"^\S+broken\.png cannot be decoded as an image \(.+\); remove or replace "
                                         r"the file\.$"):
        arrays.decode_image(str(tmp_path / "broken.png"))


def test_the_digits_job_and_predict_run_where_tensorflow_and_scikit_learn_cannot_be_imported(tmp_path):
    """The JAX user's install: one epoch of the digits job (a tiny model), then `predict` on an image file."""
    from PIL import Image

    Image.fromarray(np.random.default_rng(2).integers(0, 256, (40, 40, 3), dtype="uint8")).save(tmp_path / "x.png")
    script = textwrap.dedent(f"""
        import sys
        sys.modules["tensorflow"] = None  # any import of it now fails
        sys.modules["sklearn"] = None
        from keras_vit import cli
        from keras_vit.tools import inference
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
    assert "TensorBoard" not in done.stdout  # a [jax] install is not told to install TensorFlow for it
