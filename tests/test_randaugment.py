"""keras_vit.data.randaugment: each op is timm's Pillow call, the policy's arguments are timm's, and the numpy and
tf.data pipelines augment an example alike for the same (seed, epoch, example). Nothing here depends on the Keras
backend."""

import math
import os

import numpy as np
import pytest
from PIL import Image, ImageEnhance, ImageOps

from keras_vit import data
from keras_vit.data import randaugment
from keras_vit.data.randaugment import RandAugment

pytestmark = pytest.mark.backend_independent
PHOTO = os.path.join(os.path.dirname(__file__), "fixtures", "photos", "landscape.jpg")
FILL = 128


@pytest.fixture(scope="module")
def image():
    """A 32x48 low-contrast photo (levels 40-193), so that AutoContrast and Equalize have work to do."""
    with Image.open(PHOTO) as photo:
        small = np.asarray(photo.convert("RGB").resize((48, 32), Image.Resampling.BILINEAR), "float64")
    return (40 + small * 0.6).astype("uint8")


def _affine(picture, matrix):
    return picture.transform(picture.size, Image.Transform.AFFINE, matrix, resample=Image.Resampling.BILINEAR,
                             fillcolor=(FILL,) * 3)


# The independent definitions: timm's ops (timm/data/auto_augment.py, timm 1.0.31) as Pillow calls.
PILLOW = {
    "AutoContrast": lambda p, v: ImageOps.autocontrast(p),
    "Equalize": lambda p, v: ImageOps.equalize(p),
    "Invert": lambda p, v: ImageOps.invert(p),
    "Rotate": lambda p, v: p.rotate(v, resample=Image.Resampling.BILINEAR, fillcolor=(FILL,) * 3),
    "PosterizeIncreasing": lambda p, v: ImageOps.posterize(p, int(v)),
    "SolarizeIncreasing": lambda p, v: ImageOps.solarize(p, int(v)),
    "SolarizeAdd": lambda p, v: p.point([min(255, i + int(v)) if i < 128 else i for i in range(256)] * 3),
    "ColorIncreasing": lambda p, v: ImageEnhance.Color(p).enhance(v),
    "ContrastIncreasing": lambda p, v: ImageEnhance.Contrast(p).enhance(v),
    "BrightnessIncreasing": lambda p, v: ImageEnhance.Brightness(p).enhance(v),
    "SharpnessIncreasing": lambda p, v: ImageEnhance.Sharpness(p).enhance(v),
    "ShearX": lambda p, v: _affine(p, (1, v, 0, 0, 1, 0)),
    "ShearY": lambda p, v: _affine(p, (1, 0, 0, v, 1, 0)),
    "TranslateXRel": lambda p, v: _affine(p, (1, 0, v * p.size[0], 0, 1, 0)),
    "TranslateYRel": lambda p, v: _affine(p, (1, 0, 0, 0, 1, v * p.size[1])),
}
# Each op at its magnitude-9 arguments (both signs where it has one), and at the ends of its range.
CASES = [("AutoContrast", None), ("Equalize", None), ("Invert", None), ("Rotate", 27.0), ("Rotate", -27.0),
         ("Rotate", 13.7), ("PosterizeIncreasing", 1.0), ("PosterizeIncreasing", 4.0), ("SolarizeIncreasing", 26.0),
         ("SolarizeIncreasing", 256.0), ("SolarizeAdd", 99.0), ("SolarizeAdd", 110.0),
         *[(name, value) for name in ("ColorIncreasing", "ContrastIncreasing", "BrightnessIncreasing",
                                      "SharpnessIncreasing") for value in (1.81, 0.19)],
         *[(name, value) for name in ("ShearX", "ShearY") for value in (0.27, -0.27)],
         *[(name, value) for name in ("TranslateXRel", "TranslateYRel") for value in (0.405, -0.405)]]


@pytest.mark.parametrize("name, value", CASES)
def test_each_op_is_timms_pillow_call(image, name, value):
    expected = np.asarray(PILLOW[name](Image.fromarray(image), value))
    pillow = randaugment.pillow_op(Image.fromarray(image), name, value, FILL)
    np.testing.assert_array_equal(np.asarray(pillow), expected)
    assert name == "SolarizeIncreasing" and value == 256 or not np.array_equal(expected, image)  # the op did something


def test_posterize_to_zero_bits_is_black(image):
    # timm keeps 4 - int(4 m / 10) bits: 0 at m = 10. Pillow 13 refuses 0 bits; older Pillow's mask made it black.
    assert not np.asarray(randaugment.pillow_op(Image.fromarray(image), "PosterizeIncreasing", 0.0)).any()


# timm's level functions (timm/data/auto_augment.py: _rotate_level_to_arg, _posterize_increasing_level_to_arg,
# _solarize_increasing_level_to_arg, _solarize_add_level_to_arg, _enhance_increasing_level_to_arg,
# _shear_level_to_arg, _translate_rel_level_to_arg) at magnitudes 9 and 10, positive sign then negative.
TIMM_ARGUMENTS = {
    9: {"Rotate": (27.0, -27.0), "PosterizeIncreasing": (1, 1), "SolarizeIncreasing": (26, 26),
        "SolarizeAdd": (99, 99), "ColorIncreasing": (1.81, 0.19), "ContrastIncreasing": (1.81, 0.19),
        "BrightnessIncreasing": (1.81, 0.19), "SharpnessIncreasing": (1.81, 0.19), "ShearX": (0.27, -0.27),
        "ShearY": (0.27, -0.27), "TranslateXRel": (0.405, -0.405), "TranslateYRel": (0.405, -0.405)},
    10: {"Rotate": (30.0, -30.0), "PosterizeIncreasing": (0, 0), "SolarizeIncreasing": (0, 0),
         "SolarizeAdd": (110, 110), "ColorIncreasing": (1.9, 0.1), "ShearX": (0.3, -0.3),
         "TranslateXRel": (0.45, -0.45)},
}


@pytest.mark.parametrize("magnitude", [9, 10])
def test_arguments_are_timms_level_functions(magnitude):
    for name, expected in TIMM_ARGUMENTS[magnitude].items():
        for negate, value in zip((False, True), expected):
            assert float(randaugment.argument(name, float(magnitude), negate)) == pytest.approx(value, abs=1e-12), name
    assert [randaugment.argument(name, 9.0, False) for name in ("AutoContrast", "Equalize", "Invert")] == [None] * 3
    assert len(randaugment.OPS) == 15 and set(randaugment.ARGUMENTS) <= set(randaugment.OPS)


KEYS = [(0, 0, 0), (3, 1, 12345), (-7, 99, 2**40), (1, 2, 3), (1, 3, 2)]


def test_both_pipelines_augment_each_example_of_a_pass_alike(tmp_path, monkeypatch):
    # Four copies of one photo, full-area crops, no flip: whatever order each pipeline shuffles the files into, the
    # example at position p of a pass is the same crop on both, so RandAugment keyed by (seed, epoch, p) must give
    # the same pixels on both, every epoch.
    pytest.importorskip("tensorflow")
    with Image.open(PHOTO) as photo:
        for index in range(4):
            (tmp_path / f"c{index % 2}").mkdir(exist_ok=True)
            photo.convert("RGB").resize((48, 36)).save(tmp_path / f"c{index % 2}" / f"{index}.png")
    augmenters = data.make_augmenters(randaugment=(3, 9))

    def stream():
        source = data.from_folder(str(tmp_path))
        return [np.asarray(images) for images, _ in data.training_stream(
            source, 16, 2, 2, seed=5, augmenters=augmenters, min_crop_area=1.0, flip=False, workers=0)]

    tf_data = stream()
    monkeypatch.setattr(data.source, "tensorflow_installed", lambda: False)
    numpy_path = stream()
    assert len(tf_data) == len(numpy_path) == 4
    for ours, theirs in zip(tf_data, numpy_path):
        np.testing.assert_array_equal(ours, theirs)
    assert not np.array_equal(tf_data[0], tf_data[2])  # the epochs are augmented differently


def test_draws_are_fixed_by_the_key_and_follow_the_policy():
    policy = RandAugment()
    assert policy.rounds(1, 2, 3) == policy.rounds(1, 2, 3)
    assert len({tuple(policy.rounds(*key)) for key in KEYS}) == len(KEYS)  # seed, epoch and position all count
    draws = [draw for position in range(3000) for draw in policy.rounds(0, 0, position)]
    counts = np.bincount([d.op for d in draws], minlength=15)
    magnitudes = np.array([d.magnitude for d in draws])
    # 6000 draws: each op 400 ± 20 (binomial), half applied, half negated, magnitudes N(9, 0.5) clipped to [0, 10].
    assert counts.min() > 400 - 5 * 20 and counts.max() < 400 + 5 * 20
    assert abs(np.mean([d.applied for d in draws]) - 0.5) < 0.03
    assert abs(np.mean([d.negate for d in draws]) - 0.5) < 0.03
    assert abs(magnitudes.mean() - 9.0) < 0.03 and abs(magnitudes.std() - 0.5) < 0.03 and magnitudes.max() <= 10.0


def test_apply_rounds_a_float_crop_to_uint8_then_runs_the_applied_draws_in_order(image):
    policy = RandAugment(num_ops=2)
    crop = image.astype("float32") + np.float32(0.4)  # rounds back to `image`
    keys = [(0, 0, position) for position in range(40)]
    skipped = [key for key in keys if not any(draw.applied for draw in policy.rounds(*key))]
    both = [key for key in keys if all(draw.applied for draw in policy.rounds(*key))]
    assert skipped and both
    for key in skipped[:2] + both[:4]:
        expected = Image.fromarray(image)
        for draw in policy.rounds(*key):
            if draw.applied:
                value = randaugment.argument(draw.name, draw.magnitude, draw.negate)
                expected = PILLOW[draw.name](expected, None if value is None else float(value))
        augmented = policy.apply(crop, *key)
        assert augmented.dtype == np.uint8 and augmented.shape == image.shape
        np.testing.assert_array_equal(augmented, np.asarray(expected))


@pytest.mark.parametrize("arguments, message", [
    (dict(num_ops=0), "RandAugment num_ops must be a whole number of at least 1, got 0."),
    (dict(num_ops=2.5), "RandAugment num_ops must be a whole number of at least 1, got 2.5."),
    (dict(magnitude=0.5), "RandAugment magnitude is timm's M, a whole number from 0 to 10 (rand-m9: 9), got 0.5; "
                          "keras.layers.RandAugment's factor in [0, 1] is not this scale."),
    (dict(magnitude=11), "RandAugment magnitude is timm's M, a whole number from 0 to 10 (rand-m9: 9), got 11; "
                         "keras.layers.RandAugment's factor in [0, 1] is not this scale."),
    (dict(magnitude_std=math.inf), "RandAugment magnitude_std must be a finite number of at least 0, got inf."),
    (dict(probability=1.5), "RandAugment probability must be in [0, 1], got 1.5."),
    (dict(fill=256), "RandAugment fill must be a gray level from 0 to 255, got 256."),
])
def test_refuses_a_policy_outside_timms_ranges(arguments, message):
    with pytest.raises(ValueError) as error:
        RandAugment(**arguments)
    assert str(error.value) == message


def test_make_augmenters_and_the_training_flags_refuse_kerass_old_factor():
    from keras_vit import flags, training

    assert data.make_augmenters(randaugment=(2, 9)) == [RandAugment(num_ops=2, magnitude=9)]
    assert flags.parse_config(training.PretrainConfig, ["--randaugment", "2", "9"]).randaugment == (2, 9)
    with pytest.raises(ValueError, match=r"got 0\.5; keras\.layers\.RandAugment's factor"):
        data.make_augmenters(randaugment=(2, 0.5))
    with pytest.raises(ValueError, match=r"got 0\.5; keras\.layers\.RandAugment's factor"):
        flags.parse_config(training.PretrainConfig, ["--randaugment", "2", "0.5"])
    with pytest.raises(ValueError, match="num_ops must be a whole number of at least 1, got 2.5"):
        flags.parse_config(training.PretrainConfig, ["--randaugment", "2.5", "9"])


def test_workers_and_a_resumed_stream_augment_each_example_as_one_process(tmp_path, monkeypatch):
    monkeypatch.setattr(data.source, "tensorflow_installed", lambda: False)
    with Image.open(PHOTO) as photo:
        for index in range(4):
            (tmp_path / f"c{index % 2}").mkdir(exist_ok=True)
            photo.convert("RGB").resize((40 + 4 * index, 30)).save(tmp_path / f"c{index % 2}" / f"{index}.jpg")
    source = data.from_folder(str(tmp_path))
    augmenters = data.make_augmenters(randaugment=(2, 9))

    def stream(workers, initial_epoch=0, augmenters=augmenters):
        return [images for images, _ in data.training_stream(source, 16, 2, 2, initial_epoch, seed=3,
                                                               augmenters=augmenters, workers=workers)]

    alone, parallel, resumed, plain = stream(0), stream(2), stream(0, initial_epoch=1), stream(0, augmenters=())
    for ours, theirs in zip(alone, parallel, strict=True):
        np.testing.assert_array_equal(ours, theirs)
    for ours, theirs in zip(alone[2:], resumed, strict=True):
        np.testing.assert_array_equal(ours, theirs)
    assert any(not np.array_equal(ours, theirs) for ours, theirs in zip(alone, plain))
