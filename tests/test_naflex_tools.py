"""Every tool on NaFlex models: features, attention, LoRA, int8, export, input checks; or a one-line refusal."""

import warnings

import keras
import numpy as np
import pytest
from conftest import predict
from test_naflex import SHAPES, TINY, as_naflex, batch_of, images_of

import keras_vit
from keras_vit.tools import analysis
from keras_vit.tools.features import feature_extractor, naflex_feature_maps

BACKEND = keras.backend.backend()


def randomised(model):
    for weight in model.weights:
        weight.assign(np.random.default_rng(len(weight.path)).normal(0, 0.5, weight.shape).astype("float32"))
    return model


def random_pair(**switches):
    """A dynamic-resolution model with random values in every tensor, and the NaFlex model with its weights."""
    keras.utils.set_random_seed(1)
    dynamic = randomised(keras_vit.ViT(image_size=(None, None), **TINY, classes=3, classifier_activation=None,
                                       **switches))
    return dynamic, as_naflex(dynamic, **TINY, classes=3, classifier_activation=None)


@pytest.mark.backend_independent
def test_naflex_features_are_each_images_own_map_as_the_dynamic_model_gives_it():
    dynamic, naflex = random_pair(register_tokens=1)
    images = images_of(SHAPES)
    batch = batch_of(images, 4, length=30)
    outputs = feature_extractor(naflex, (0, -1), spatial=False, norm=True)(batch)
    assert [tuple(o.shape) for o in outputs] == [(3, 30, 16)] * 2
    maps = [naflex_feature_maps(output, batch["patch_grid"]) for output in outputs]
    alone = feature_extractor(dynamic, (0, -1), norm=True)
    for index, image in enumerate(images):
        for block, expected in enumerate(alone(image[None])):
            np.testing.assert_allclose(maps[block][index], keras.ops.convert_to_numpy(expected)[0], atol=2e-5,
                                       rtol=0, err_msg=f"image {index} block {block}")
    with pytest.raises(ValueError) as error:
        feature_extractor(naflex, (0,))
    assert str(error.value) == (
        "'vit' is a NaFlex model, whose images each have their own grid: pass spatial=False for (batch, patches, "
        "hidden) features, and lay each image's out with keras_vit.naflex_feature_maps(features, "
        "batch['patch_grid']).")


@pytest.mark.backend_independent
def test_few_shot_features_of_naflex_evaluation_batches_are_one_per_image():
    from keras_vit import data
    from keras_vit.data.naflex_batches import NaFlexEvaluationBatches

    _, naflex = random_pair(register_tokens=1)
    rng = np.random.default_rng(10)
    images = rng.integers(0, 256, (7, 24, 40, 3), dtype=np.uint8)
    source = data.from_arrays(images, np.arange(7) % 3)
    options = {"rule": "siglip2", "max_patches": 36, "interpolation": "bilinear"}
    batches = NaFlexEvaluationBatches(source, 4, batch_size=3, preprocessing=options)
    features, labels = analysis.extract_features(naflex, batches)  # batches of 3, 3 and 1 image
    assert features.shape == (7, 16) and labels.tolist() == [0, 1, 2, 0, 1, 2, 0]
    alone = analysis.extract_features(naflex, [(data.naflex_batch([image], 4, **options), np.zeros(1))
                                               for image in images])[0]
    np.testing.assert_allclose(features, alone, atol=1e-5, rtol=0)


@pytest.mark.backend_independent
@pytest.mark.parametrize("switches", [dict(register_tokens=1), dict(rope="axial", classifier="gap",
                                                                    class_token=False, position_embedding=False)])
def test_naflex_attention_leaves_the_padding_out_and_is_each_images_own(switches):
    dynamic, naflex = random_pair(**switches)
    images = images_of(SHAPES, seed=2)
    batch = batch_of(images, 4, length=30)
    attentions = analysis.attention_weights(naflex, batch)
    prefix = naflex.architecture.num_prefix_tokens
    valid = np.concatenate([np.ones((3, prefix), bool), batch["patch_mask"]], axis=1)
    for layer in attentions:
        assert layer.shape == (3, 2, prefix + 30, prefix + 30)
        assert not layer.transpose(0, 3, 1, 2)[~valid].any()  # no query attends to a padding key
    for index, (image, own) in enumerate(zip(images, analysis.naflex_attentions(attentions, batch["patch_grid"],
                                                                                 prefix))):
        expected = analysis.attention_weights(dynamic, image[None])
        for layer, (got, want) in enumerate(zip(own, expected)):
            np.testing.assert_allclose(got, want, atol=2e-6, rtol=0, err_msg=f"image {index} layer {layer}")
        if prefix and naflex.architecture.class_token:  # rollout at the image's own grid
            grid = tuple(batch["patch_grid"][index])
            np.testing.assert_allclose(
                analysis.rollout_map(analysis.attention_rollout(own, discard_ratio=0.5), grid, prefix),
                analysis.rollout_map(analysis.attention_rollout(expected, discard_ratio=0.5), grid, prefix),
                atol=1e-5, rtol=0)


@pytest.mark.backend_independent
def test_naflex_inspect_writes_every_figure_on_the_images_own_grid(tmp_path):
    naflex = keras_vit.ViT(naflex=True, image_size=16, **TINY, include_top=False)  # a 4 x 4 position table
    written = analysis.inspect(naflex, np.zeros((12, 20, 3), "uint8"), str(tmp_path))
    assert sorted(written) == ["attention_rollout", "embedding_filters", "mean_attention_distance",
                               "position_embedding_similarity"]


@pytest.mark.backend_independent
def test_lora_on_a_naflex_model_trains_one_step_and_survives_a_keras_file(tmp_path):
    _, naflex = random_pair()
    keras_vit.enable_lora(naflex, rank=2)
    batch = batch_of(images_of(SHAPES, seed=3), 4, length=30)
    before = predict(naflex, batch)
    adapters = {w.path: keras.ops.convert_to_numpy(w) for w in naflex.trainable_weights if "lora_kernel_b" in w.path}
    naflex.compile(optimizer=keras.optimizers.SGD(0.1), loss=keras.losses.SparseCategoricalCrossentropy(True))
    naflex.fit(batch, np.array([0, 1, 2]), epochs=1, verbose=0)
    trained = {w.path: keras.ops.convert_to_numpy(w) for w in naflex.trainable_weights if w.path in adapters}
    assert all(np.abs(trained[path] - adapters[path]).max() > 0 for path in adapters)
    after = predict(naflex, batch)
    assert np.abs(after - before).max() > 0
    naflex.save(str(tmp_path / "lora.keras"))
    loaded = keras.saving.load_model(str(tmp_path / "lora.keras"))
    np.testing.assert_allclose(predict(loaded, batch), after, atol=1e-5, rtol=0)
    np.testing.assert_allclose(predict(keras_vit.merge_lora(naflex), batch), after, atol=1e-5, rtol=0)


@pytest.mark.backend_independent
def test_int8_naflex_model_is_close_to_float_and_survives_a_keras_file(tmp_path):
    _, naflex = random_pair()
    batch = batch_of(images_of(SHAPES, seed=4), 4, length=30)
    expected = predict(naflex, batch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        naflex.quantize("int8")
    quantized = predict(naflex, batch)
    assert 0 < np.abs(quantized - expected).max() < 0.05 * np.abs(expected).max()
    naflex.save(str(tmp_path / "int8.keras"))
    np.testing.assert_array_equal(predict(keras.saving.load_model(str(tmp_path / "int8.keras")), batch), quantized)


def factorized_model():
    """A NaFlex model with factorized position tables (timm's parfac) on a non-square grid, every tensor random."""
    keras.utils.set_random_seed(2)
    return randomised(keras_vit.ViT(naflex=True, image_size=(16, 24), **TINY, classes=3, classifier_activation=None,
                                    register_tokens=1, classifier="gap", class_token_position_embedding=False,
                                    position_embedding_factorized=True, position_embedding_aspect_preserving=True))


@pytest.mark.backend_independent
def test_every_tool_runs_on_factorized_position_tables_or_keeps_them(tmp_path):
    from keras_vit.layers.naflex import NaFlexFactorizedPositionEmbedding

    model = factorized_model()
    position = model.get_layer("position_embedding")
    assert isinstance(position, NaFlexFactorizedPositionEmbedding) and position.grid_size == (4, 6)
    assert [tuple(w.shape) for w in position.weights] == [(1, 4, 16), (1, 6, 16)]
    batch = batch_of(images_of(SHAPES, seed=6), 4, length=30)
    expected = predict(model, batch)
    # The .keras file, as saved and as from_pretrained rebuilds it (its aspect-preserving factorized tables kept).
    model.save(str(tmp_path / "factorized.keras"))
    np.testing.assert_array_equal(predict(keras.saving.load_model(str(tmp_path / "factorized.keras")), batch), expected)
    rebuilt = keras_vit.from_pretrained(str(tmp_path / "factorized.keras"))
    assert isinstance(rebuilt.get_layer("position_embedding"), NaFlexFactorizedPositionEmbedding)
    assert rebuilt.get_layer("position_embedding").aspect_preserving
    np.testing.assert_allclose(predict(rebuilt, batch), expected, atol=1e-6, rtol=0)
    # The similarity figure: what the two tables add on their own 4 x 6 grid. Aspect-preserving, both are resized
    # to the longer side, 6 (torch's linear interpolate, half-pixel centres), and the first 4 rows taken.
    rows, cols = (keras.ops.convert_to_numpy(w)[0].astype("float64") for w in position.weights)

    def linear(table, length):
        source = np.clip((np.arange(length) + 0.5) * len(table) / length - 0.5, 0, len(table) - 1)
        return np.stack([np.interp(source, np.arange(len(table)), column) for column in table.T], axis=1)

    table = (linear(rows, 6)[:4, None] + linear(cols, 6)[None]).reshape(24, 16)
    unit = table / np.linalg.norm(table, axis=-1, keepdims=True)
    np.testing.assert_allclose(analysis.position_embedding_similarity(model), (unit @ unit.T).reshape(4, 6, 4, 6),
                               atol=1e-5)
    written = analysis.inspect(model, np.zeros((12, 20, 3), "uint8"), str(tmp_path / "figures"))
    assert "position_embedding_similarity" in written
    # LoRA and int8 leave the tables alone.
    keras_vit.enable_lora(model, rank=2)
    np.testing.assert_allclose(predict(model, batch), expected, atol=1e-6, rtol=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = keras_vit.merge_lora(model)
        model.quantize("int8")
    assert 0 < np.abs(predict(model, batch) - expected).max() < 0.05 * np.abs(expected).max()


@pytest.mark.backend_independent
@pytest.mark.parametrize("arguments, message", [
    (dict(position_embedding_factorized=True), "Factorized position tables apply to NaFlex models only, as timm's "
                                               "NaFlexVit builds them; pass naflex=True."),
    (dict(naflex=True, position_embedding_factorized=True, position_embedding_align_corners=True),
     "Factorized position tables resize without aligned corners, as timm's NaFlexVit does; leave "
     "position_embedding_align_corners unset."),
    (dict(naflex=True, position_embedding_factorized=True, register_tokens=1),
     "Factorized position tables hold the patches' positions alone, as timm's NaFlexVit's; pass "
     "class_token_position_embedding=False."),
])
def test_factorized_tables_refuse_what_they_cannot_be_in_one_line(arguments, message):
    with pytest.raises(ValueError) as error:
        keras_vit.ViT(image_size=16, **TINY, **arguments)
    assert str(error.value) == message


def test_naflex_onnx_export_keeps_batch_and_sequence_length_open(tmp_path):
    pytest.importorskip("onnxruntime")
    # TensorFlow's exporter on the one-product resize (tf2onnx mis-sized its batched matmul); PyTorch's on a table of
    # more than 4096 positions (RADIO's 128 x 128), whose resize gathers each token's taps, and whose batch and
    # length torch.export once fixed to the traced sample's (take_along_axis).
    naflex = randomised(keras_vit.ViT(naflex=True, image_size=260, **TINY, classes=3, classifier_activation=None,
                                      register_tokens=1)) if BACKEND == "torch" else random_pair(register_tokens=1)[1]
    path = str(tmp_path / "naflex.onnx")
    if BACKEND == "jax":
        with pytest.raises(ValueError) as error:
            naflex.export(path, format="onnx")
        assert str(error.value) == ("vit is a NaFlex model, whose open sequence length the jax backend does not "
                                    "export to onnx: export it on the tensorflow backend (KERAS_BACKEND=tensorflow).")
        return
    import onnxruntime

    naflex.export(path, format="onnx", verbose=False)
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    assert {feed.name for feed in session.get_inputs()} == {"patches", "patch_grid", "patch_mask"}
    for batch in (batch_of(images_of(SHAPES, seed=5), 4, length=30), batch_of(images_of(SHAPES[:1]), 4, length=44),
                  batch_of(images_of(((4, 4),) * 4), 4)):
        (served,) = session.run(None, batch)
        np.testing.assert_allclose(served, predict(naflex, batch), atol=1e-4, rtol=0)
    factorized = factorized_model()  # its own position layer, of two tables
    factorized.export(str(tmp_path / "factorized.onnx"), format="onnx", verbose=False)
    session = onnxruntime.InferenceSession(str(tmp_path / "factorized.onnx"), providers=["CPUExecutionProvider"])
    for batch in (batch_of(images_of(SHAPES, seed=5), 4, length=30), batch_of(images_of(SHAPES[:1]), 4, length=44)):
        (served,) = session.run(None, batch)
        np.testing.assert_allclose(served, predict(factorized, batch), atol=1e-4, rtol=0)


@pytest.mark.backend_independent
def test_an_onnx_program_whose_open_axes_torch_fixed_is_refused():
    from types import SimpleNamespace

    from keras_vit.model import deployment

    # What torch.onnx.export returns where torch.export fixed a size: the traced sample's shapes, with a log line.
    inputs = [SimpleNamespace(name="patches", shape=(2, "length", 48)),
              SimpleNamespace(name="patch_grid", shape=(2, 2))]
    program = SimpleNamespace(model=SimpleNamespace(graph=SimpleNamespace(inputs=inputs)))
    axes = {"patches": {0: "batch", 1: "length"}, "patch_grid": {0: "batch"}}
    with pytest.raises(ValueError) as error:
        deployment._check_open_axes(SimpleNamespace(name="vit"), program, axes)
    assert str(error.value) == (
        "PyTorch's ONNX exporter fixed the open axes of vit to the traced sample's (patches[2, length, 48], "
        "patch_grid[2, 2]), so the file would refuse every other shape: export it on the tensorflow backend "
        "(KERAS_BACKEND=tensorflow).")
    inputs[0].shape, inputs[1].shape = ("batch", "length", 48), ("batch", 2)
    deployment._check_open_axes(SimpleNamespace(name="vit"), program, axes)


@pytest.mark.skipif(BACKEND != "tensorflow", reason="a SavedModel is read back by TensorFlow in this process")
def test_naflex_saved_model_keeps_batch_and_sequence_length_open(tmp_path):
    import tensorflow as tf

    _, naflex = random_pair()
    naflex.export(str(tmp_path / "saved"), format="tf_saved_model", verbose=False)
    served = tf.saved_model.load(str(tmp_path / "saved"))
    for batch in (batch_of(images_of(SHAPES, seed=6), 4, length=30), batch_of(images_of(SHAPES[:1]), 4, length=44)):
        np.testing.assert_allclose(served.serve(batch).numpy(), predict(naflex, batch), atol=1e-5, rtol=0)


@pytest.mark.skipif(BACKEND != "tensorflow", reason="LiteRT is exported through TensorFlow")
def test_naflex_litert_export_is_refused_in_one_line(tmp_path):
    with pytest.raises(ValueError) as error:
        random_pair()[1].export(str(tmp_path / "naflex.tflite"), format="litert")
    assert str(error.value) == ("vit is a NaFlex model, whose open sequence length LiteRT runs only with TensorFlow's "
                                "Flex ops: export it to onnx or tf_saved_model.")
    assert not list(tmp_path.iterdir())


def changed(**changes):
    batch = batch_of(images_of(SHAPES, seed=7), 4, length=30)
    for key, change in changes.items():
        batch[key] = change(batch[key])
    return {key: value for key, value in batch.items() if value is not None}


def one_more_valid(mask):
    mask = mask.copy()
    mask[0, 20] = True
    return mask


def one_fewer_valid(mask):
    mask = mask.copy()
    mask[1, 0] = False
    return mask


@pytest.mark.backend_independent
def test_a_mask_that_disagrees_with_its_grid_in_backend_tensors_changes_no_output():
    _, naflex = random_pair(register_tokens=1, classifier="map")
    batch = changed()
    expected = predict(naflex, batch)
    for change in (one_more_valid, one_fewer_valid):
        # Tensors, as a tf.data or DataLoader pipeline passes them: their values are not checked, and the grid says
        # which patches are the image's.
        tensors = {key: keras.ops.convert_to_tensor(value) for key, value in changed(patch_mask=change).items()}
        np.testing.assert_allclose(keras.ops.convert_to_numpy(naflex(tensors)), expected, atol=1e-5, rtol=0)
        np.testing.assert_allclose(naflex.predict_on_batch(tensors), expected, atol=1e-5, rtol=0)


@pytest.mark.backend_independent
@pytest.mark.parametrize("batch, message", [
    (changed(patch_mask=one_more_valid),
     "patch_mask of image 0 marks 16 valid patches but its patch_grid (3, 5) has 15; the first rows*cols positions "
     "must be True and the rest False."),
    (changed(patches=lambda p: p[..., :27]),
     "patches hold 27 values each (patches of 3 pixels) but patch_size 4 takes 48 (4x4 pixels x 3 channels); cut "
     "the images with patch_size=4 or use a model of the patch size they were cut with."),
    (changed(patch_grid=lambda g: None),
     "The NaFlex batch has no 'patch_grid' (its keys: ['patch_mask', 'patches']); pass keras_vit's ['patches', "
     "'patch_grid', 'patch_mask'] (as keras_vit.data.naflex_batch makes them) or transformers' "
     "Siglip2ImageProcessor's ['pixel_values', 'spatial_shapes', 'pixel_attention_mask'], the three keys of one "
     "layout."),
])
@pytest.mark.parametrize("entry", ["call", "predict", "fit", "eager tensors"])
def test_naflex_model_refuses_a_bad_batch_with_its_one_line_message_before_any_compute(batch, message, entry):
    model = keras_vit.ViT(naflex=True, **TINY, classes=3)
    weights = [keras.ops.convert_to_numpy(w) for w in model.weights]
    if entry == "eager tensors" and "marks" in message:
        pytest.skip("the values of eager tensors are not read: only their shapes")
    run = {"call": lambda: model(batch), "predict": lambda: model.predict(batch, verbose=0),
           "eager tensors": lambda: model({k: keras.ops.convert_to_tensor(v) for k, v in batch.items()}),
           "fit": lambda: (model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy"),
                           model.fit(batch, np.zeros(3), verbose=0))}[entry]
    with pytest.raises(ValueError) as error:
        run()
    assert str(error.value) == message
    assert all(np.array_equal(keras.ops.convert_to_numpy(w), v) for w, v in zip(model.weights, weights))


@pytest.mark.backend_independent
def test_masked_patch_pretraining_refuses_a_naflex_encoder_and_names_the_image_model():
    with pytest.raises(ValueError) as error:
        keras_vit.MaskedPatchPretrainer(keras_vit.ViT(naflex=True, **TINY, include_top=False))
    assert str(error.value) == (
        "'vit' is a NaFlex model, whose patches come cut, and masked-patch prediction corrupts the patches of whole "
        "images: pretrain the image model of the same sizes (keras_vit.ViT without naflex=True), whose weights a "
        "NaFlex model runs unchanged.")
