"""image_size=(None, None): one model for any image size, its position embeddings resized on every call."""

import keras
import numpy as np
import pytest
from conftest import SMALL, SMALL_HYBRID, fixture, predict

import keras_vit

LOGITS = dict(classifier_activation=None)
SIZES = ("24x40", "48x48", "32x32")


@pytest.fixture(scope="module")
def timm_dynamic():
    with np.load(fixture("vit_token_dynamic_reference.npz")) as data:
        return dict(data)


def dynamic(case="vit_token", sizes=SMALL, **kwargs):
    return keras_vit.ViT(image_size=(None, None), **sizes, **LOGITS, weights=fixture(f"{case}.npz"), **kwargs)


def size_of(key):
    return tuple(int(side) for side in key.split("x"))


def test_input_takes_any_size_and_the_table_keeps_the_checkpoints_grid():
    model = dynamic()
    assert model.input_shape == (None, None, None, 3)
    layer = model.get_layer("position_embedding")
    assert layer.grid_size == (4, 4)  # the fixture's 32 px / 8 px patches
    scratch = keras_vit.ViT(image_size=(None, None), **SMALL, classes=3)
    assert scratch.get_layer("position_embedding").grid_size == (28, 28)  # 224 px worth of 8 px patches


@pytest.mark.parametrize("key", SIZES)
def test_logits_equal_a_model_built_for_that_size(timm_dynamic, key):
    images = timm_dynamic[f"images_{key}"]
    fixed = keras_vit.ViT(image_size=size_of(key), **SMALL, **LOGITS, weights=fixture("vit_token.npz"))
    np.testing.assert_allclose(predict(dynamic(), images), predict(fixed, images), atol=1e-5, rtol=0)


@pytest.mark.parametrize("key", SIZES)
def test_bicubic_antialiased_resize_equals_timm_dynamic_img_size(timm_dynamic, key):
    model = dynamic(position_embedding_antialias=True)
    images, logits = timm_dynamic[f"images_{key}"], timm_dynamic[f"logits_{key}"]
    np.testing.assert_allclose(predict(model, images), logits, atol=1e-5, rtol=0)
    np.testing.assert_allclose(model.predict(images, verbose=0), logits, atol=1e-5, rtol=0)


def test_predict_mixes_sizes_from_call_to_call_including_graphs_of_unknown_size(timm_dynamic):
    """TensorFlow retraces with unknown spatial sizes after a few shapes; every later size still comes out right."""
    model = dynamic(position_embedding_antialias=True)
    for key in (*SIZES, "24x40", "48x48"):
        np.testing.assert_allclose(model.predict(timm_dynamic[f"images_{key}"], verbose=0),
                                   timm_dynamic[f"logits_{key}"], atol=1e-5, rtol=0, err_msg=key)
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        traced = tf.function(model, input_signature=[tf.TensorSpec((None, None, None, 3), "float32")])
        for key in SIZES:
            np.testing.assert_allclose(traced(timm_dynamic[f"images_{key}"]).numpy(), timm_dynamic[f"logits_{key}"],
                                       atol=1e-5, rtol=0, err_msg=key)


def test_fit_and_evaluate_on_batches_of_mixed_sizes(timm_dynamic):
    model = dynamic()
    model.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    labels = np.array([1, 2])

    def batches():
        while True:
            for key in SIZES:
                yield timm_dynamic[f"images_{key}"], labels

    before = keras.ops.convert_to_numpy(model.get_layer("position_embedding").pos_embedding).copy()
    history = model.fit(batches(), steps_per_epoch=3, epochs=2, verbose=0, shuffle=False)
    after = keras.ops.convert_to_numpy(model.get_layer("position_embedding").pos_embedding)
    assert history.history["loss"][1] < history.history["loss"][0]
    assert not np.allclose(before, after)  # the table learns through the resize
    assert np.isfinite(model.evaluate(batches(), steps=3, verbose=0))


def test_keras_round_trip_keeps_the_resize_and_the_outputs(timm_dynamic, tmp_path):
    model = dynamic(position_embedding_interpolation="bilinear", position_embedding_antialias=True)
    path = tmp_path / "dynamic.keras"
    model.save(path)
    for reloaded in (keras.saving.load_model(path), keras_vit.from_pretrained(str(path))):
        layer = reloaded.get_layer("position_embedding")
        assert (layer.interpolation, layer.antialias, layer.grid_size) == ("bilinear", True, (4, 4))
        assert reloaded.input_shape == (None, None, None, 3)
        for key in SIZES:
            images = timm_dynamic[f"images_{key}"]
            np.testing.assert_array_equal(predict(reloaded, images), predict(model, images))


@pytest.mark.parametrize("image_size", [(32, 32), (24, 40)])
def test_hybrid_dynamic_equals_a_hybrid_built_for_that_size(image_size):
    images = np.random.default_rng(0).uniform(-1, 1, (2, *image_size, 3)).astype("float32")
    fixed = keras_vit.ViT(image_size=image_size, **SMALL_HYBRID, **LOGITS, weights=fixture("hybrid_token.npz"))
    model = dynamic("hybrid_token", SMALL_HYBRID)
    np.testing.assert_allclose(predict(model, images), predict(fixed, images), atol=1e-5, rtol=0)


def test_size_that_does_not_divide_into_patches_is_refused_on_every_path():
    model = dynamic()
    images = np.zeros((1, 33, 40, 3), "float32")
    for run in (model, lambda x: model.predict(x, verbose=0)):
        with pytest.raises(ValueError, match=r"Image height 33 is not divisible by the patch size 8"):
            run(images)
    hybrid = dynamic("hybrid_token", SMALL_HYBRID)
    with pytest.raises(ValueError, match=r"Image width 36 is not divisible by the 8 pixels one patch spans"):
        hybrid.predict(np.zeros((1, 32, 36, 3), "float32"), verbose=0)


def test_drop_remainder_crops_any_size_as_a_model_built_for_that_size():
    images = np.random.default_rng(5).uniform(-1, 1, (2, 36, 44, 3)).astype("float32")
    fixed = keras_vit.ViT(image_size=(36, 44), **SMALL, **LOGITS, weights=fixture("vit_token.npz"), drop_remainder=True)
    model = dynamic(drop_remainder=True)
    np.testing.assert_allclose(predict(model, images), predict(fixed, images), atol=1e-5, rtol=0)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(model(images)), predict(fixed, images), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match=r"Image height 4 is smaller than the patch size 8"):
        model.predict(np.zeros((1, 4, 40, 3), "float32"), verbose=0)


def test_bad_dynamic_options_are_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"image_size \(None, 224\) fixes one side only; pass \(None, None\)"):
        keras_vit.ViT(image_size=(None, 224), **SMALL)
    with pytest.raises(ValueError, match="Unknown position_embedding_interpolation 'nearest'"):
        keras_vit.ViT(image_size=(None, None), **SMALL, position_embedding_interpolation="nearest")


def test_tools_that_need_one_size_use_the_size_the_table_was_trained_at(tmp_path):
    from keras_vit.model.vision_transformer import native_image_size
    from keras_vit.tools import inference

    model = dynamic()
    assert native_image_size(model) == (32, 32)
    assert native_image_size(keras_vit.ViT(image_size=(None, None), **SMALL_HYBRID)) == (224, 224)
    model.save(tmp_path / "dynamic.keras")
    image = tmp_path / "digit.png"
    keras.utils.save_img(image, np.random.default_rng(0).integers(0, 255, (48, 40, 3)).astype("uint8"))
    (top5,) = inference.predict([str(image)], weights=str(tmp_path / "dynamic.keras"))
    assert len(top5) == 5
