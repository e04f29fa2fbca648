"""`predict`, `evaluate` and `inspect` on NaFlex models: each photo whole, cut by the model's NaFlex preprocessing."""

import dataclasses
import os

import keras
import numpy as np
import pytest
from PIL import Image

import keras_vit
from conftest import SMALL, fixture
from keras_vit import checkpoints, cli, data
from keras_vit.data import arrays
from keras_vit.data.naflex_batches import NaFlexEvaluationBatches
from keras_vit.tools import inference

TINY = dict(patch_size=4, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=32)
# Photo sizes of three aspect ratios, as a camera writes them.
PHOTOS = ((1500, 2000), (1920, 1080), (700, 700))


def random_weights(model):
    for weight in model.weights:  # the head too, which starts at zero
        weight.assign(np.random.default_rng(len(weight.path)).normal(0, 0.5, weight.shape).astype("float32"))
    return model


@pytest.fixture(scope="module")
def naflex_file(tmp_path_factory):
    """A NaFlex model built from scratch (keras_vit's own NaFlex preprocessing), saved as .keras."""
    path = str(tmp_path_factory.mktemp("naflex") / "naflex.keras")
    random_weights(keras_vit.ViT(naflex=True, **TINY, classes=3, classifier_activation=None)).save(path)
    return path


def write_images(folder, shapes, seed=0, ending="jpg"):
    rng = np.random.default_rng(seed)
    paths = []
    for index, (height, width) in enumerate(shapes):
        path = os.path.join(folder, f"{index}.{ending}")
        Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(path)
        paths.append(path)
    return paths


def softmax(logits):
    logits = np.asarray(logits, "float64")
    exp = np.exp(logits - logits.max())
    return exp / exp.sum()


@pytest.mark.backend_independent
def test_a_naflex_model_keeps_its_preprocessing_through_a_keras_file(naflex_file, tmp_path):
    loaded = keras.saving.load_model(naflex_file)
    assert loaded.naflex_preprocessing == {"rule": "siglip2", "max_patches": 256, "interpolation": "bilinear"}
    loaded.naflex_preprocessing = {"rule": "timm", "max_patches": 576, "interpolation": "bicubic"}
    loaded.save(str(tmp_path / "timm.keras"))
    assert keras.saving.load_model(str(tmp_path / "timm.keras")).naflex_preprocessing == loaded.naflex_preprocessing
    assert keras_vit.ViT(image_size=16, **TINY).naflex_preprocessing is None
    # A checkpoint's reader records its library's preprocessing; the model built from it carries it.
    timm = {"rule": "timm", "max_patches": 576, "interpolation": "bicubic"}
    source = dataclasses.replace(checkpoints.read_weights(fixture("vit_token.npz"), None, (32, 32)), naflex=True,
                                 naflex_preprocessing=timm)
    assert keras_vit.ViT(**SMALL, weights=source).naflex_preprocessing == timm


@pytest.mark.backend_independent
def test_naflex_preprocessing_naflex_batch_would_refuse_is_refused_when_set_or_loaded(naflex_file, tmp_path):
    import json
    import zipfile

    model = keras.saving.load_model(naflex_file)
    with pytest.raises(ValueError) as error:
        model.naflex_preprocessing = {"rule": "timm", "max_patches": 64, "interpolation": "random"}
    assert str(error.value) == ("interpolation must be one of ('nearest', 'lanczos', 'bilinear', 'bicubic', 'box', "
                                "'hamming'), got 'random'.")
    bad = str(tmp_path / "bad.keras")
    with zipfile.ZipFile(naflex_file) as source, zipfile.ZipFile(bad, "w") as target:
        for name in source.namelist():
            content = source.read(name)
            if name == "config.json":
                config = json.loads(content)
                config["config"]["naflex_preprocessing"]["crop"] = 0.9
                content = json.dumps(config)
            target.writestr(name, content)
    expected = ("The model's naflex_preprocessing {'rule': 'siglip2', 'max_patches': 256, 'interpolation': 'bilinear', "
                "'crop': 0.9} is not naflex_batch's keywords: NaFlex preprocessing takes the keys ['interpolation', "
                "'max_patches', 'rule'], got ['crop', 'interpolation', 'max_patches', 'rule'].")
    with pytest.raises(ValueError) as error:
        keras.saving.load_model(bad)
    assert str(error.value) == expected
    with pytest.raises(checkpoints.CheckpointError) as error:
        keras_vit.from_pretrained(bad)
    assert str(error.value) == f"{bad} is not a loadable .keras model: {expected}"


@pytest.mark.backend_independent
def test_predict_scores_each_whole_photo_as_the_model_scores_its_naflex_batch(naflex_file, tmp_path):
    paths = write_images(str(tmp_path), PHOTOS)
    network = keras.saving.load_model(naflex_file)
    for max_patches in (None, 48):  # the model's own budget (keras_vit's: 256), and another
        results = inference.predict(paths, weights=naflex_file, max_patches=max_patches)
        options = dict(network.naflex_preprocessing, max_patches=max_patches or 256)
        for path, result in zip(paths, results):
            batch = data.naflex_batch([arrays.decode_image(path)], 4, **options)
            assert batch["patches"].shape == (1, options["max_patches"], 48)
            # The compiled step's scores (exactly, but on TensorFlow, whose XLA runs differ by a float32 rounding);
            # the eager call fuses otherwise, within a rounding.
            expected = softmax(network.predict_on_batch(batch)[0])
            assert [name for name, _ in result] == [str(i) for i in np.argsort(expected)[::-1]]
            np.testing.assert_allclose([p for _, p in result], np.sort(expected)[::-1], rtol=0,
                                       atol=1e-6 if keras.backend.backend() == "tensorflow" else 0)
            eager = softmax(keras.ops.convert_to_numpy(network(batch))[0])
            np.testing.assert_allclose(np.sort(eager)[::-1], [p for _, p in result], atol=1e-6, rtol=0)


@pytest.mark.backend_independent
def test_a_buckets_last_naflex_batch_holds_only_its_own_examples(tmp_path, caplog):
    images, labels = np.zeros((5, 40, 60, 3), "uint8"), np.array([0, 1, 1, 0, 2])
    batches = NaFlexEvaluationBatches(data.from_arrays(images, labels), 4, batch_size=3)
    x, y = batches[1]
    assert x["patch_grid"].tolist() == [[13, 19], [13, 19]] and x["patches"].shape == (2, 256, 48)
    assert y.tolist() == [0, 2]
    one_hot = NaFlexEvaluationBatches(data.from_arrays(images, labels), 4, batch_size=3, one_hot=True)[1][1]
    assert one_hot.tolist() == [[1, 0, 0], [0, 0, 1]]
    data.check_naflex_batch(x, 4)
    # A file whose header reads but whose pixels do not decode is left out of its batch, with a note.
    paths = write_images(str(tmp_path), [(40, 60), (40, 60)], ending="png")
    with open(paths[1], "r+b") as f:
        f.truncate(100)
    source = data.Source(None, 2, 3, examples=(paths, np.array([1, 2])))
    x, y = NaFlexEvaluationBatches(source, 4, batch_size=2)[0]
    assert x["patch_grid"].tolist() == [[13, 19]] and y.tolist() == [1]
    assert "1.png, which cannot be decoded as an image" in caplog.text
    with pytest.raises(ValueError) as error:  # no batch of no rows, which Keras' mean of the loss makes NaN
        NaFlexEvaluationBatches(source, 4, batch_size=1)[1]
    assert str(error.value) == (f"No image of NaFlex evaluation batch 1 can be decoded ({paths[1]}); remove them "
                                "from the set.")


@pytest.mark.backend_independent
def test_evaluate_scores_each_image_of_a_folder_once_when_a_bucket_ends_in_a_partial_batch(naflex_file, tmp_path):
    shapes = ((40, 60), (90, 30), (33, 33), (20, 100), (64, 48))
    for label in ("0", "1", "2"):
        os.makedirs(tmp_path / label)
        write_images(str(tmp_path / label), shapes[int(label):] + shapes[:label == "0"], seed=int(label))
    network = keras.saving.load_model(naflex_file)
    source = data.load_source(str(tmp_path), "test", holdout_fraction=None)
    options = dict(network.naflex_preprocessing, max_patches=64)
    # 13 images in one sequence length: batches of 4, 4, 4 and 1
    assert NaFlexEvaluationBatches(source, 4, 4, options).bucket_counts == {64: 4}
    logits = np.stack([network.predict_on_batch(data.naflex_batch([arrays.decode_image(path)], 4, **options))[0]
                       for path in source.examples[0]]).astype("float64")
    labels = source.examples[1]
    top1 = np.mean(logits.argmax(1) == labels)
    log_probabilities = logits - logits.max(1, keepdims=True)
    log_probabilities -= np.log(np.exp(log_probabilities).sum(1, keepdims=True))
    loss = -log_probabilities[np.arange(13), labels].mean()
    assert 0 < top1 < 1
    results = inference.evaluate(naflex_file, dataset=str(tmp_path), eval_batch_size=4, verbose=0, max_patches=64)
    np.testing.assert_allclose([results["top1"], results["loss"]], [top1, loss], atol=1e-5)
    # Keras' own evaluate with plain metrics and loss, as guide 11 runs it.
    network.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    results = network.evaluate(NaFlexEvaluationBatches(source, 4, 4, options), verbose=0, return_dict=True)
    np.testing.assert_allclose([results["accuracy"], results["loss"]], [top1, loss], atol=1e-5)


@pytest.mark.backend_independent
def test_naflex_flags_on_the_wrong_model_are_refused_in_one_line(naflex_file, tmp_path, capsys):
    image = write_images(str(tmp_path), [(64, 48)], ending="png")[0]
    fixed = str(tmp_path / "fixed.keras")
    keras_vit.ViT(image_size=16, **TINY, classes=3).save(fixed)
    cases = {
        ("predict", image, "--weights", fixed, "--max-patches", "64"):
            f"--max-patches 64 sets a NaFlex model's patch budget; {fixed} takes 16x16 px images: leave it out, or "
            "set their size with --image-size.",
        ("predict", image, "--weights", naflex_file, "--crop-fraction", "0.9"):
            f"--crop-fraction 0.9 crops the images of fixed-size models; {naflex_file} is a NaFlex model, which sees "
            "the whole image: leave it out, or set its patch budget with --max-patches.",
        ("predict", image, "--weights", naflex_file, "--image-size", "128"):
            f"--image-size 128 sizes the images of fixed-size models; {naflex_file} is a NaFlex model, which sees "
            "each image whole at its own grid: leave it out, or set its patch budget with --max-patches.",
        ("predict", image, "--weights", naflex_file, "--max-patches", "0"):
            "max_patches must be a positive integer, got 0.",
    }
    for argv, message in cases.items():
        assert cli.console_main(list(argv)) == 2
        assert capsys.readouterr().err == f"keras-vit: error: {message}\n", argv


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="counts JAX's traces and XLA compiles")
def test_photos_of_many_shapes_compile_once_per_bucket(naflex_file, tmp_path, xla_compiles):
    rng = np.random.default_rng(1)
    shapes = [(int(h), int(w)) for h, w in rng.integers(12, 400, (16, 2))]
    for label in ("0", "1", "2"):
        os.makedirs(tmp_path / label)
        write_images(str(tmp_path / label), shapes[int(label)::3], seed=int(label), ending="png")
    paths = sorted(str(path) for path in tmp_path.glob("*/*.png"))
    network = keras.saving.load_model(naflex_file)
    # Keras' JAX steps are jitted: a layer's `call` runs in Python only while a step is traced for a new shape.
    traces, embedding = [], network.get_layer("embedding")
    traced = embedding.call
    embedding.call = lambda x, *args, **kwargs: traces.append(tuple(x.shape[:2])) or traced(x, *args, **kwargs)
    lengths, compiles = set(), {}
    # Each budget is one bucket here (the default buckets start at 128); each image pads to its budget.
    for budget in (16, 32, 64, 16):
        before = len(xla_compiles)
        for path in paths:
            batch = data.naflex_batch([arrays.decode_image(path)], 4, **dict(network.naflex_preprocessing,
                                                                             max_patches=budget))
            lengths.add((budget, int(batch["patch_mask"].sum())))
            network.predict_on_batch(batch)
        compiles[budget] = compiles.get(budget, 0) + len(xla_compiles) - before
    assert len(lengths) > 6  # that many compiles, were each image padded to its own length
    assert traces == [(1, 16), (1, 32), (1, 64)]
    assert compiles == {16: 1, 32: 1, 64: 1}  # one predict step per bucket, none for a bucket seen before
    network.compile(loss=keras.losses.CategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    source = data.load_source(str(tmp_path), "test", holdout_fraction=None)
    traces.clear()
    for budget in (16, 32, 64, 32):
        before = len(xla_compiles)
        network.evaluate(NaFlexEvaluationBatches(source, 4, 5, dict(network.naflex_preprocessing, max_patches=budget),
                                                 one_hot=True),
                         verbose=0)
        compiles[budget] += len(xla_compiles) - before
    # The first evaluation also traces once to build the metrics (Keras' symbolic build, jax.eval_shape), and
    # compiles the metrics' small programs; after it, each new bucket compiles two evaluation steps: its full
    # batches' and its last batch's (16 images: 5 + 5 + 5 + 1), none for a bucket seen before.
    assert traces == [(5, 16), (5, 16), (1, 16), (5, 32), (1, 32), (5, 64), (1, 64)]
    assert compiles[32] == compiles[64] == 3


@pytest.mark.backend_independent
def test_naflex_batches_examples_run():
    import doctest

    from keras_vit.data import naflex_batches

    assert doctest.testmod(naflex_batches).failed == 0
