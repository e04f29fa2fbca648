"""NaFlex models: a padded batch of patch sequences, each image on its own grid (`keras_vit.layers.naflex`)."""

import os

import keras
import numpy as np
import pytest
from conftest import SMALL, fixture, predict

import keras_vit

TINY = dict(patch_size=4, hidden_size=16, num_layers=2, num_heads=2, mlp_dim=32)
# Images of three aspect ratios (tall, wide, square-ish), each cut into 4 px patches.
SHAPES = ((12, 20), (28, 8), (16, 16))


def cut(image, patch):
    """A reference patchify in numpy: (rows * cols, patch * patch * 3), row-major, (row, column, channel) order."""
    rows, cols = image.shape[0] // patch, image.shape[1] // patch
    blocks = image[: rows * patch, : cols * patch].reshape(rows, patch, cols, patch, 3).transpose(0, 2, 1, 3, 4)
    return blocks.reshape(rows * cols, patch * patch * 3), (rows, cols)


def batch_of(images, patch, length=None, padding=0.0):
    cuts = [cut(image, patch) for image in images]
    length = length or max(len(patches) for patches, _ in cuts)
    patches = np.full((len(images), length, patch * patch * 3), padding, "float32")
    mask = np.zeros((len(images), length), bool)
    for index, (cut_patches, _) in enumerate(cuts):
        patches[index, : len(cut_patches)] = cut_patches
        mask[index, : len(cut_patches)] = True
    grid = np.array([grid for _, grid in cuts], "int32")
    return {"patches": patches, "patch_grid": grid, "patch_mask": mask}


def images_of(shapes, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.uniform(-1, 1, (*shape, 3)).astype("float32") for shape in shapes]


def as_naflex(model, **kwargs):
    """The NaFlex model with `model`'s weights (a dynamic-resolution model of the same switches)."""
    naflex = keras_vit.ViT(naflex=True, architecture=model.architecture, **kwargs)
    naflex.set_weights(model.get_weights())
    return naflex


CASES = {
    "paper_token": dict(),
    "registers_gap": dict(classifier="gap", register_tokens=2, class_token_position_embedding=False,
                          layer_scale=1e-5, mlp_activation="gelu"),
    "siglip_map": dict(classifier="map", class_token=False, mlp_activation="gelu_tanh",
                       position_embedding_interpolation="bilinear", position_embedding_antialias=True),
    "rope_axial": dict(rope="axial", classifier="gap", class_token=False, position_embedding=False),
}


# Every case's tokens on every backend; pooled, the two whose pooling is masked on a kernel path (MAP's
# attention, GAP's masked mean), and the other two once.
@pytest.mark.parametrize("case, pooling", [(case, None) for case in CASES] + [
    (case, "pooled") if case in ("siglip_map", "registers_gap") else
    pytest.param(case, "pooled", marks=pytest.mark.backend_independent) for case in CASES])
def test_each_image_of_a_padded_batch_equals_the_dynamic_model_on_that_image_alone(case, pooling):
    switches = CASES[case]
    resize = {key: switches[key] for key in ("position_embedding_interpolation", "position_embedding_antialias")
              if key in switches}
    arch = {key: value for key, value in switches.items() if key not in resize}
    keras.utils.set_random_seed(1)
    pool = None if pooling is None else arch.get("classifier", "token")
    dynamic = keras_vit.ViT(image_size=(None, None), **TINY, include_top=False, pooling=pool, **arch, **resize)
    for weight in dynamic.weights:  # random values everywhere, the position table and tokens included
        weight.assign(np.random.default_rng(len(weight.path)).normal(0, 0.5, weight.shape).astype("float32"))
    naflex = as_naflex(dynamic, **TINY, include_top=False, pooling=pool, **resize)
    images = images_of(SHAPES)
    batch = batch_of(images, 4, length=30)
    outputs = predict(naflex, batch)
    prefix = dynamic.architecture.num_prefix_tokens
    for index, image in enumerate(images):
        alone = predict(dynamic, image[None])[0]
        got = outputs[index] if pooling else outputs[index, : len(alone)]
        np.testing.assert_allclose(got, alone, atol=2e-5, rtol=0, err_msg=f"{case} image {index}")
    if pooling is None:
        assert outputs.shape == (3, prefix + 30, 16)


def test_valid_tokens_never_depend_on_what_the_padding_holds():
    keras.utils.set_random_seed(2)
    model = keras_vit.ViT(naflex=True, **TINY, include_top=False, classifier="map", class_token=False,
                          register_tokens=1, class_token_position_embedding=False)
    images = images_of(SHAPES, seed=3)
    zeros, noise = batch_of(images, 4, length=32), batch_of(images, 4, length=32, padding=0.0)
    noise["patches"][~noise["patch_mask"]] = np.random.default_rng(4).normal(
        0, 100, noise["patches"][~noise["patch_mask"]].shape)
    tokens = (predict(model, zeros), predict(model, noise))
    valid = np.concatenate([np.ones((3, 1), bool), zeros["patch_mask"]], axis=1)
    np.testing.assert_array_equal(tokens[0][valid], tokens[1][valid])
    pooled = keras_vit.ViT(naflex=True, **TINY, include_top=False, pooling="map", classifier="map",
                           class_token=False, register_tokens=1, class_token_position_embedding=False)
    pooled.set_weights(model.get_weights() + pooled.get_weights()[len(model.get_weights()):])
    np.testing.assert_array_equal(predict(pooled, zeros), predict(pooled, noise))


def test_a_naflex_model_takes_plain_images_and_transformers_processor_output_in_predict_evaluate_and_fit():
    # Keras' JAX trainer calls the model's `call`, the other trainers its `__call__`: the trainers' entry points on
    # every backend (`model(...)` itself, the same code everywhere, in the timm and transformers fixture tests). The
    # model normalises its input by ImageNet's statistics, as the processor normalised pixel_values.
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    model = keras_vit.ViT(naflex=True, **dict(TINY, num_layers=1), classes=3, input_mean=mean, input_std=std)
    for weight in model.weights:  # the head too, which starts at zero
        weight.assign(np.random.default_rng(len(weight.path)).normal(0, 0.5, weight.shape).astype("float32"))
    images = np.stack(images_of([(12, 20)] * 2, seed=11))
    own = batch_of(list(images), 4, length=20)  # 15 patches each, then padding
    pixels = ((own["patches"].reshape(2, 20, 16, 3) + 1) / 2 - mean) / std
    processor = {"pixel_values": np.where(own["patch_mask"][..., None], pixels.reshape(2, 20, 48), 0).astype("float32"),
                 "spatial_shapes": own["patch_grid"].astype("int64"),
                 "pixel_attention_mask": own["patch_mask"].astype("int32")}  # as Siglip2ImageProcessor gives them
    expected, labels = model.predict(own, verbose=0), np.array([0, 2])
    loss = -np.log(expected[[0, 1], labels]).mean()
    np.testing.assert_allclose(model.predict(images, verbose=0), expected, atol=1e-5, rtol=0)
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    np.testing.assert_allclose(model.evaluate(processor, labels, verbose=0), loss, atol=1e-5, rtol=0)
    history = model.fit(images, labels, batch_size=2, verbose=0).history  # its loss is before the step's update
    np.testing.assert_allclose(history["loss"][0], loss, atol=1e-5, rtol=0)


@pytest.mark.backend_independent
def test_a_naflex_model_refuses_images_it_cannot_cut_in_one_line():
    model = keras_vit.ViT(naflex=True, **TINY, classes=3)
    for shape, message in [
        ((1, 13, 16, 3),
         "Image height 13 is not divisible by the patch size 4 (input shape (1, 13, 16, 3)); a NaFlex model cuts an "
         "image batch into whole patches, as timm's NaFlexVit does: resize or crop the images to multiples of 4 "
         "pixels, or cut each photo at its own size with keras_vit.data.naflex_batch."),
        ((1, 3, 16, 16),
         "Images of shape (1, 3, 16, 16) are not RGB channels-last (None, None, None, 3); they look channels-first "
         "(batch, 3, height, width): transpose them with np.transpose(x, (0, 2, 3, 1))."),
        ((16, 16, 3),
         "Got one image of shape (16, 16, 3); the model takes a batch (None, None, None, 3): add a batch axis, e.g. "
         "images[None]."),
    ]:
        images = np.zeros(shape, "float32")
        for run in (lambda: model(images), lambda: model.predict(images, verbose=0)):
            with pytest.raises(ValueError) as error:
                run()
            assert str(error.value) == message


@pytest.mark.backend_independent
def test_a_pretrained_fixed_size_model_runs_in_naflex_mode_on_its_own_grid():
    fixed = keras_vit.ViT(image_size=32, **SMALL, classifier_activation=None, weights=fixture("vit_token.npz"))
    naflex = keras_vit.ViT(naflex=True, **SMALL, classifier_activation=None, weights=fixture("vit_token.npz"))
    assert {input.name for input in naflex.inputs} == {"patches", "patch_grid", "patch_mask"}
    image = images_of([(32, 32)], seed=5)[0]
    np.testing.assert_allclose(predict(naflex, batch_of([image], 8, length=20)), predict(fixed, image[None]),
                               atol=1e-5, rtol=0)


@pytest.mark.backend_independent
def test_naflex_model_round_trips_through_a_keras_file(tmp_path):
    model = keras_vit.ViT(naflex=True, **TINY, classes=3, classifier="gap", class_token=False,
                          position_embedding_interpolation="bilinear", position_embedding_antialias=True,
                          position_embedding_aspect_preserving=True)
    path = str(tmp_path / "naflex.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    batch = batch_of(images_of(SHAPES, seed=6), 4)
    np.testing.assert_array_equal(predict(loaded, batch), predict(model, batch))
    images = np.stack(images_of([(12, 20)] * 2, seed=6))  # a plain image batch, as before saving
    np.testing.assert_array_equal(predict(loaded, images), predict(model, images))
    layer = loaded.get_layer("position_embedding")
    assert (layer.interpolation, layer.antialias, layer.aspect_preserving) == ("bilinear", True, True)


@pytest.mark.backend_independent
def test_a_naflex_keras_file_saved_before_the_mask_came_from_the_grid_loads_with_its_outputs():
    # Written by tools/make_legacy_naflex_fixture.py at commit 8af4eef: its token mask reads the patch mask alone.
    saved = dict(np.load(fixture(os.path.join("legacy_keras", "naflex_outputs.npz"))))
    expected = saved.pop("output")
    path = fixture(os.path.join("legacy_keras", "naflex.keras"))
    for model in (keras.saving.load_model(path), keras_vit.from_pretrained(path)):
        np.testing.assert_allclose(predict(model, saved), expected, atol=1e-5, rtol=0)


@pytest.mark.backend_independent
def test_from_pretrained_rebuilds_a_naflex_keras_file_as_a_naflex_model(tmp_path):
    model = keras_vit.ViT(naflex=True, **TINY, classes=3, classifier_activation=None, naflex_patch_sizes=(8,),
                          position_embedding_aspect_preserving=True, position_embedding_align_corners=True,
                          position_embedding_interpolation="bilinear")
    for weight in model.weights:  # the head too, which starts at zero
        weight.assign(np.random.default_rng(len(weight.path)).normal(0, 0.5, weight.shape).astype("float32"))
    model.naflex_preprocessing = {"rule": "timm", "max_patches": 64, "interpolation": "bicubic"}
    model.save(str(tmp_path / "naflex.keras"))
    keras_vit.enable_lora(model, rank=2)
    model.save(str(tmp_path / "lora.keras"))
    batch = batch_of(images_of(SHAPES, seed=8), 4)
    expected = predict(model, batch)
    for name, overrides in (("naflex", dict(classes=5)), ("naflex", dict(dtype="bfloat16")),
                            ("naflex", dict(include_top=False)), ("lora", {})):
        rebuilt = keras_vit.from_pretrained(str(tmp_path / f"{name}.keras"), **overrides)
        assert rebuilt.naflex_preprocessing == model.naflex_preprocessing, overrides
        assert rebuilt.get_layer("embedding").patch_sizes == (4, 8)
        layer = rebuilt.get_layer("position_embedding")
        assert (layer.interpolation, layer.aspect_preserving, layer.align_corners) == ("bilinear", True, True)
        output = predict(rebuilt, batch)  # the next NaFlex batch runs
        if not overrides:
            np.testing.assert_allclose(output, expected, atol=1e-5, rtol=0)


@pytest.mark.backend_independent
@pytest.mark.parametrize("kwargs, message", [
    (dict(naflex=True, resnet_layers=(1,), patch_size=1),
     "A hybrid ViT's convolutional stem needs whole images, and NaFlex cuts the patches before the model: build it "
     "without naflex=True."),
    (dict(naflex_patch_sizes=(8,)), "naflex_patch_sizes applies to NaFlex models only; pass naflex=True."),
    (dict(position_embedding_aspect_preserving=True),
     "position_embedding_aspect_preserving and position_embedding_align_corners apply to NaFlex models only; pass "
     "naflex=True."),
])
def test_refusals(kwargs, message):
    sizes = dict(TINY, **{key: kwargs.pop(key) for key in ("patch_size",) if key in kwargs})
    with pytest.raises(ValueError) as error:
        keras_vit.ViT(**sizes, **kwargs)
    assert str(error.value) == message


@pytest.mark.backend_independent
def test_patches_of_another_size_meet_the_kernel_resampled_as_flexivit_does():
    from keras_vit.layers.position_embedding import resize_patch_embedding

    keras.utils.set_random_seed(7)
    # Both tables 28x28: 112 px of 4 px patches, and the dynamic model's default 224 px of 8 px ones.
    naflex = keras_vit.ViT(naflex=True, image_size=112, **TINY, include_top=False, classifier="gap",
                           class_token=False, naflex_patch_sizes=(8,))
    coarse = keras_vit.ViT(image_size=(None, None), **dict(TINY, patch_size=8), include_top=False,
                           classifier="gap", class_token=False)
    weights = naflex.get_weights()
    weights[0] = resize_patch_embedding(weights[0], 8)
    coarse.set_weights(weights)
    images = images_of([(16, 24), (32, 8)], seed=8)
    got = predict(naflex, batch_of(images, 8, length=8))
    for index, image in enumerate(images):
        alone = predict(coarse, image[None])[0]
        np.testing.assert_allclose(got[index, : len(alone)], alone, atol=2e-5, rtol=0)


@pytest.mark.backend_independent
def test_patches_of_a_size_the_model_was_not_built_for_are_refused_not_resampled():
    model = keras_vit.ViT(naflex=True, **TINY, classes=3)  # 4-pixel patches only
    batch = batch_of(images_of([(16, 24)], seed=9), 8)
    with pytest.raises(ValueError) as error:
        model(batch)
    assert str(error.value) == ("patches hold 192 values each (patches of 8 pixels) but patch_size 4 takes 48 (4x4 "
                                "pixels x 3 channels); cut the images with patch_size=4 or use a model of the patch "
                                "size they were cut with.")
    flexible = keras_vit.ViT(naflex=True, **TINY, classes=3, naflex_patch_sizes=(8, 16))
    assert flexible.get_layer("embedding").patch_sizes == (4, 8, 16)
    with pytest.raises(ValueError, match=r"but the model takes patches of 4, 8, 16 pixels"):
        flexible(batch_of(images_of([(12, 24)], seed=9), 6))
    assert predict(flexible, batch).shape == (1, 3)


@pytest.mark.backend_independent
def test_eval_transform_of_a_naflex_model_points_to_naflex_batch():
    model = keras_vit.ViT(naflex=True, **TINY, classes=3, name="flex")
    with pytest.raises(ValueError) as error:
        keras_vit.eval_transform(model)
    assert str(error.value) == (
        "flex is a NaFlex model: it takes each photo whole, cut into its own grid of patches, not an image of one "
        "size; make its batches with keras_vit.data.naflex_batch(photos, model.sizes.patch_size, "
        "**model.naflex_preprocessing).")


@pytest.mark.parametrize("interpolation, aspect_preserving, align_corners", [
    ("bilinear", True, True), ("bicubic", False, False)])
def test_a_table_too_large_for_one_product_gathers_each_tokens_taps_as_the_host_resize_computes(
        interpolation, aspect_preserving, align_corners):
    from keras_vit.layers.naflex import NaFlexPositionEmbedding
    from keras_vit.layers.position_embedding import resize_position_embeddings

    grid, width = (65, 66), 3  # 4290 positions: past the dense product, as RADIO's 128x128 table
    table = np.random.default_rng(10).normal(size=(1, grid[0] * grid[1], width)).astype("float32")
    layer = NaFlexPositionEmbedding(grid, interpolation=interpolation, aspect_preserving=aspect_preserving,
                                    align_corners=align_corners)
    layer.build((None, None, width))
    layer.pos_embedding.assign(table)
    grids = np.array([[3, 7], [9, 2], [1, 1]], "int32")
    positions = np.asarray(keras.ops.convert_to_numpy(layer(np.zeros((3, 21, width), "float32"), grids)))
    for index, (rows, cols) in enumerate(grids):
        size = (max(rows, cols),) * 2 if aspect_preserving else (rows, cols)
        expected = resize_position_embeddings(table.astype("float64"), size, grid, num_prefix_tokens=0,
                                              interpolation=interpolation, align_corners=align_corners)
        expected = expected.reshape(*size, width)[:rows, :cols].reshape(-1, width)
        # float32 source coordinates near row 64 are off by ~6e-6 of a row; neighbouring rows of a random table
        # differ by up to ~3, so the float64 host resize is within 5e-5, not 1e-5.
        np.testing.assert_allclose(positions[index, : rows * cols], expected, atol=5e-5, rtol=0)
