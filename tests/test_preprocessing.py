"""Each checkpoint's own eval preprocessing (`keras_vit.data.preprocessing`) against the reference libraries' pixels.

The fixtures (tools/make_preprocessing_fixtures.py, in a side venv) hold three real photos at ImageNet's sizes,
the configs timm's and transformers' own writers wrote, and the pixels their eval transforms made of each photo:
timm's `create_transform(**resolve_data_config(...))`, transformers' (Pillow) image processors.
"""

import json
import os

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit import cli
from keras_vit.checkpoints import CheckpointError
from keras_vit.data import arrays, preprocessing
from keras_vit.layers import InputNormalization
from keras_vit.tools.inference import outputs_logits

pytestmark = pytest.mark.backend_independent  # Pillow and numpy; the model runs in float32 the same way everywhere

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")
FOLDERS = os.path.join(FIXTURES, "preprocessing")
PHOTOS = ("landscape", "portrait", "odd")
TIMM_CASES = ("timm_deit", "timm_eva02_448", "timm_siglip", "timm_augreg", "timm_miil")
TRANSFORMERS_CASES = ("hf_dinov2", "hf_clip", "hf_vit", "hf_siglip")


@pytest.fixture(scope="module")
def reference():
    with np.load(os.path.join(FIXTURES, "preprocessing_reference.npz")) as stored:
        return {key: stored[key] for key in stored.files}


def photo(name):
    return os.path.join(FIXTURES, "photos", f"{name}.jpg")


def transform_of(case):
    folder = os.path.join(FOLDERS, case)
    if case.startswith("timm"):
        with open(os.path.join(folder, "config.json")) as f:
            return preprocessing.from_timm_config(json.load(f)["pretrained_cfg"], folder)
    with open(os.path.join(folder, "preprocessor_config.json")) as f:
        return preprocessing.from_preprocessor_config(json.load(f), folder)


@pytest.mark.parametrize("case", TIMM_CASES + TRANSFORMERS_CASES)
def test_eval_transform_gives_the_reference_librarys_pixels_for_real_photos(case, reference):
    transform = transform_of(case)
    for name in PHOTOS:
        image = arrays.open_rgb(photo(name))
        resized, top_left = transform.plan(image.height, image.width)
        assert (resized, top_left) == (tuple(reference[f"{case}/{name}/resized_hw"]),
                                       tuple(reference[f"{case}/{name}/crop_top_left"])), name
        np.testing.assert_array_equal(transform.pixels(image), reference[f"{case}/{name}/pixels"], err_msg=name)
    # The model's input normalisation of the [-1, 1] images gives the reference's final tensor.
    normalize = InputNormalization(reference[f"{case}/mean"], reference[f"{case}/std"], dtype="float32")
    final = keras.ops.convert_to_numpy(normalize(transform.load(photo(PHOTOS[0]))[None]))[0]
    np.testing.assert_allclose(final[:32, :32], reference[f"{case}/{PHOTOS[0]}/window"], atol=2e-5)
    np.testing.assert_allclose(final.sum((0, 1), dtype="float64"), reference[f"{case}/{PHOTOS[0]}/channel_sums"],
                               atol=0.05)


def test_timm_and_transformers_round_an_odd_crop_margin_differently():
    # 457x341 with its shorter side at 256 is 343x256: 119 columns to lose. torchvision's CenterCrop rounds 59.5
    # to 60 (half to even); transformers' center_crop floors it to 59. Both resize to the same size.
    timm = transform_of("timm_miil")
    dinov2 = transform_of("hf_dinov2")
    assert timm.plan(341, 457) == ((256, 343), (16, 60))
    assert dinov2.plan(341, 457) == ((256, 343), (16, 59))


def test_predict_on_a_timm_folder_gives_the_reference_pipelines_top5(reference, capsys):
    folder = os.path.join(FOLDERS, "timm_predict")
    results = keras_vit.cli.main(["predict", "--weights", folder, photo("landscape")])
    with open(os.path.join(folder, "config.json")) as f:
        names = json.load(f)["label_names"]
    expected = reference["timm_predict/top5_indices"]
    assert [name for name, _ in results[0]] == [names[i] for i in expected]
    np.testing.assert_allclose([p for _, p in results[0]], reference["timm_predict/top5_probabilities"], atol=1e-5)
    model = keras_vit.from_pretrained(folder)
    np.testing.assert_array_equal(keras_vit.eval_transform(model).pixels(arrays.open_rgb(photo("landscape"))),
                                  reference["timm_predict/pixels"])


def test_a_keras_file_keeps_its_checkpoints_eval_transform(tmp_path):
    model = keras_vit.from_pretrained(os.path.join(FOLDERS, "timm_predict"))
    assert model.eval_transform == preprocessing.EvalTransform((32, 32), 0.875, None, "center", "bicubic", True, "timm")
    path = str(tmp_path / "model.keras")
    model.save(path)
    assert keras.saving.load_model(path).eval_transform == model.eval_transform
    assert keras_vit.from_pretrained(path).eval_transform == model.eval_transform
    # At another size the checkpoint's crop fraction and filter are kept, for the new size.
    larger = keras_vit.from_pretrained(os.path.join(FOLDERS, "timm_predict"), image_size=48)
    assert larger.eval_transform == model.eval_transform.replace(image_size=(48, 48))


def test_each_source_gets_its_librarys_rule_and_keras_vit_models_their_own():
    npz = keras_vit.from_pretrained(os.path.join(FIXTURES, "vit_token.npz"))
    assert keras_vit.eval_transform(npz) == preprocessing.EvalTransform(npz.input_shape[1:3], convention="vit_jax")
    assert not keras_vit.eval_transform(npz).antialias
    clip = keras_vit.from_pretrained(os.path.join(FIXTURES, "transformers_clip_vision"))
    assert clip.eval_transform == preprocessing.EvalTransform((32, 32), 1.0, 32, "center", "bicubic", True,
                                                              "transformers")
    built = keras_vit.ViT(image_size=32, patch_size=8, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=32,
                          classes=3)
    assert keras_vit.eval_transform(built) == preprocessing.EvalTransform((32, 32))  # keras_vit's own resize


def test_each_field_can_be_overridden():
    transform = transform_of("hf_dinov2")  # shortest edge 256, crop 224
    assert transform.replace(crop_fraction=1.0).plan(375, 500) == ((224, 298), (0, 37))
    assert transform.replace(interpolation="bilinear").interpolation == "bilinear"
    # A model of another size keeps the config's share of the resize: 224 of 256 is 0.875.
    assert transform.fitted_to((112, 112)) == transform.replace(image_size=(112, 112), crop_fraction=0.875,
                                                                resize_size=None)
    with pytest.raises(TypeError, match=r"^EvalTransform has no field 'crop_pct'; its fields are \['image_size'"):
        transform.replace(crop_pct=0.9)
    with pytest.raises(ValueError, match=r"^crop_fraction must be in \(0, 1\], got 1\.2"):
        transform.replace(crop_fraction=1.2)


def test_predict_and_evaluate_take_overrides_and_refuse_a_wrong_filter(capsys):
    folder = os.path.join(FOLDERS, "timm_predict")
    squashed = cli.main(["predict", "--weights", folder, "--crop-fraction", "1", "--interpolation", "bilinear",
                         photo("landscape")])
    model = keras_vit.from_pretrained(folder)
    image = keras_vit.eval_transform(model, crop_fraction=1.0, interpolation="bilinear").load(photo("landscape"))
    scores = keras.ops.convert_to_numpy(model(image[None]))[0]
    probabilities = np.exp(scores - scores.max()) / np.exp(scores - scores.max()).sum() if outputs_logits(model) \
        else scores
    np.testing.assert_allclose([p for _, p in squashed[0]], np.sort(probabilities)[::-1][:5], atol=1e-5)
    with pytest.raises(SystemExit):
        cli.main(["predict", "--weights", folder, "--interpolation", "cubic", photo("landscape")])
    assert "invalid choice: 'cubic' (choose from 'nearest', 'lanczos', 'bilinear', 'bicubic', 'box', 'hamming')" in \
        capsys.readouterr().err


def test_evaluation_batches_of_a_folder_are_the_transforms_output_decoded_by_pillow(tmp_path):
    from keras_vit import data

    for index, name in enumerate(("landscape", "odd")):
        os.makedirs(tmp_path / f"class_{index}")
        with open(photo(name), "rb") as source, open(tmp_path / f"class_{index}" / f"{name}.jpg", "wb") as copy:
            copy.write(source.read())
    transform = transform_of("timm_deit").replace(image_size=(64, 64))
    # TensorFlow's JPEG decoder differs from Pillow's by a few levels, so folders are read by Pillow here too.
    batches = data.make_dataset(data.from_folder(str(tmp_path)), (64, 64), 2, training=False, eval_transform=transform)
    images, labels = batches[0]
    expected = np.stack([transform.load(photo(name)) for name in ("landscape", "odd")])
    np.testing.assert_allclose(images, expected, atol=1e-6)
    np.testing.assert_array_equal(labels, [0, 1])


@pytest.mark.parametrize("case", ["timm_deit", "hf_vit", "keras_vit"])
def test_load_and_predict_see_a_photo_turned_upright_by_its_exif_orientation(case, tmp_path):
    # `load` (which `keras-vit predict` calls) read a phone's portrait photo lying on its side.
    from PIL import Image, ImageOps

    with Image.open(photo("portrait")) as image:
        upright = image.convert("RGB")
    exif = Image.Exif()
    exif[0x0112] = 6  # stored turned: a viewer turns it back 90 degrees clockwise
    upright.transpose(Image.Transpose.ROTATE_90).save(tmp_path / "turned.png", exif=exif.tobytes())
    with Image.open(tmp_path / "turned.png") as turned:
        assert np.array_equal(np.asarray(ImageOps.exif_transpose(turned)), np.asarray(upright))
    transform = preprocessing.EvalTransform((32, 32)) if case == "keras_vit" else transform_of(case)
    transform = transform.replace(image_size=(32, 32))
    np.testing.assert_array_equal(transform.load(str(tmp_path / "turned.png")), transform(np.asarray(upright)))


def test_evaluation_batches_of_a_tf_data_source_are_the_transforms_output():
    tf = pytest.importorskip("tensorflow")
    from keras_vit import data

    decoded = [arrays.decode_image(photo("portrait")), arrays.decode_image(photo("landscape"))]
    dataset = tf.data.Dataset.from_generator(lambda: iter(zip(decoded, [0, 1])), output_signature=(
        tf.TensorSpec((None, None, 3), tf.uint8), tf.TensorSpec((), tf.int64)))
    source = data.Source(dataset, 2, 2)  # as a tensorflow-datasets split: images only as tensors
    transform = transform_of("hf_clip").replace(image_size=(48, 48))
    images, _ = next(iter(data.make_dataset(source, (48, 48), 2, training=False, eval_transform=transform)))
    np.testing.assert_allclose(images.numpy(), np.stack([transform(image) for image in decoded]), atol=1e-6)


@pytest.mark.parametrize("field, value, message", [
    ("crop_mode", "border", "pretrained_cfg.crop_mode 'border' is not one keras_vit computes (center, squash)."),
    ("interpolation", "random", "pretrained_cfg.interpolation 'random' is not one keras_vit computes"),
    ("resize_mode", "shortest", "pretrained_cfg field 'resize_mode' is not one keras_vit computes"),
])
def test_a_timm_config_field_keras_vit_does_not_compute_is_refused_by_name(field, value, message, tmp_path):
    folder = tmp_path / "timm"
    folder.mkdir()
    source = os.path.join(FOLDERS, "timm_predict")
    with open(os.path.join(source, "config.json")) as f:
        config = json.load(f)
    config["pretrained_cfg"][field] = value
    (folder / "config.json").write_text(json.dumps(config))
    with open(os.path.join(source, "model.safetensors"), "rb") as f:
        (folder / "model.safetensors").write_bytes(f.read())
    with pytest.raises(CheckpointError) as caught:
        keras_vit.from_pretrained(str(folder))
    assert str(caught.value).startswith(f"{folder}/config.json: {message}")


@pytest.mark.parametrize("field, value, message", [
    ("do_pad", True, "field 'do_pad' is not one keras_vit computes"),
    ("rescale_factor", 1 / 127.5, "rescale_factor 0.00784313725490196 is not 1/255"),
    ("size", {"longest_edge": 224}, "size {'longest_edge': 224} is not one keras_vit computes"),
    ("do_normalize", False, "do_normalize False is not one keras_vit computes"),
    ("resample", 7, "resample 7 is not a Pillow filter keras_vit computes"),
])
def test_a_preprocessor_config_field_keras_vit_does_not_compute_is_refused_by_name(field, value, message, tmp_path):
    folder = tmp_path / "clip"
    folder.mkdir()
    source = os.path.join(FIXTURES, "transformers_clip_vision")
    for name in os.listdir(source):
        with open(os.path.join(source, name), "rb") as f:
            (folder / name).write_bytes(f.read())
    config = json.loads((folder / "preprocessor_config.json").read_text())
    config[field] = value
    (folder / "preprocessor_config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError) as caught:
        keras_vit.from_pretrained(str(folder))
    assert str(caught.value).startswith(f"{folder}/preprocessor_config.json: {message}")


def test_a_transform_of_a_twelve_megapixel_photo_resizes_once_with_pillow(monkeypatch):
    from PIL import Image

    big = Image.fromarray(np.random.default_rng(0).integers(0, 256, (3000, 4000, 3), dtype="uint8"))
    calls = []
    original = Image.Image.resize
    monkeypatch.setattr(Image.Image, "resize", lambda self, size, **k: calls.append((size, k)) or original(self, size, **k))
    pixels = transform_of("timm_deit").pixels(big)
    assert pixels.shape == (224, 224, 3) and pixels.dtype == np.uint8
    assert calls == [((330, 248), {"resample": Image.Resampling.BICUBIC})]  # shorter side to floor(224 / 0.9)


def test_save_run_keeps_the_transform_the_run_evaluated_with(tmp_path, monkeypatch):
    """A model fine-tuned from a timm checkpoint keeps timm's transform, which its held-out split was evaluated with
    (`training.evaluation_transform`); it got keras_vit's squash resize, which no evaluation had used (before
    2026-12-07). A model of no checkpoint keeps keras_vit's own."""
    from keras_vit import training

    monkeypatch.setattr(training.run_outputs, "plot_learning_curve", lambda *paths: None)  # no log.csv: no training ran here
    model = keras_vit.from_pretrained(os.path.join(FOLDERS, "timm_predict"))
    assert model.eval_transform.convention == "timm"
    (tmp_path / "timm").mkdir()
    (tmp_path / "scratch").mkdir()
    training.save_run(model, str(tmp_path / "timm"))
    assert keras.saving.load_model(str(tmp_path / "timm" / "model.keras")).eval_transform == model.eval_transform
    scratch = keras_vit.ViT(image_size=32, patch_size=8, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=32)
    training.save_run(scratch, str(tmp_path / "scratch"))
    saved = keras.saving.load_model(str(tmp_path / "scratch" / "model.keras"))
    assert saved.eval_transform == preprocessing.keras_vit() and keras_vit.eval_transform(saved).image_size == (32, 32)