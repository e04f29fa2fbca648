"""feature_extractor: chosen blocks' patch tokens as maps, equal to timm's forward_intermediates."""

import re

import keras
import numpy as np
import pytest

import keras_vit
from conftest import SMALL, SMALL_HYBRID, fixture, predict

SIZES = ("24x40", "48x48", "32x32")


@pytest.fixture(scope="module")
def timm_features():
    with np.load(fixture("vit_token_dynamic_reference.npz")) as data:
        return dict(data)


def model_for(image_size, **kwargs):
    return keras_vit.ViT(image_size=image_size, **SMALL, weights=fixture("vit_token.npz"), **kwargs)


def outputs(extractor, images):
    result = extractor(images, training=False)
    result = result if isinstance(result, (list, tuple)) else [result]  # Keras unwraps a single output
    return [np.asarray(keras.ops.convert_to_numpy(o)) for o in result]


@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("key", SIZES)
def test_dynamic_model_features_equal_timm_forward_intermediates(timm_features, key, norm):
    model = model_for((None, None), position_embedding_antialias=True)
    extractor = keras_vit.feature_extractor(model, (0, 1), norm=norm)
    got = outputs(extractor, timm_features[f"images_{key}"])
    for index, features in enumerate(got):
        expected = timm_features[f"features_{key}_block{index}_norm{int(norm)}"]
        assert features.shape == expected.shape
        np.testing.assert_allclose(features, expected, atol=1e-5, rtol=0, err_msg=f"block {index}")


def test_fixed_size_model_without_top_gives_the_same_maps(timm_features):
    model = model_for(32, include_top=False)
    extractor = keras_vit.feature_extractor(model, [-1, 0], norm=True)
    assert [tuple(o.shape) for o in extractor.outputs] == [(None, 4, 4, 48)] * 2
    last, first = outputs(extractor, timm_features["images_32x32"])
    np.testing.assert_allclose(last, timm_features["features_32x32_block1_norm1"], atol=1e-5, rtol=0)
    np.testing.assert_allclose(first, timm_features["features_32x32_block0_norm1"], atol=1e-5, rtol=0)
    flat = keras_vit.feature_extractor(model, 1, spatial=False, norm=True)
    assert flat.output_shape == (None, 16, 48)
    np.testing.assert_array_equal(predict(flat, timm_features["images_32x32"]), last.reshape(2, 16, 48))


@pytest.mark.parametrize("image_size", [(24, 40), (None, None)])
def test_hybrid_maps_are_its_blocks_patch_tokens_on_the_resnet_grid(image_size):
    model = keras_vit.ViT(image_size=image_size, **SMALL_HYBRID, weights=fixture("hybrid_token.npz"))
    images = np.random.default_rng(0).uniform(-1, 1, (2, 24, 40, 3)).astype("float32")
    (maps,) = outputs(keras_vit.feature_extractor(model, [1]), images)
    tokens = predict(keras.Model(model.inputs[0], model.get_layer("encoderblock_1").output), images)
    assert maps.shape == (2, 3, 5, 48)  # 8 pixels per patch
    np.testing.assert_array_equal(maps, tokens[:, 1:].reshape(2, 3, 5, 48))


def test_extractor_shares_weights_and_round_trips_as_keras(tmp_path, timm_features):
    model = model_for((None, None))
    extractor = keras_vit.feature_extractor(model, (0, 1))
    assert {id(v) for v in extractor.weights} <= {id(v) for v in model.weights}
    extractor.save(tmp_path / "features.keras")
    reloaded = keras.saving.load_model(tmp_path / "features.keras")
    images = timm_features["images_24x40"]
    for a, b in zip(outputs(reloaded, images), outputs(extractor, images)):
        np.testing.assert_array_equal(a, b)


def test_bad_block_indices_name_the_valid_range():
    model = keras_vit.ViT(image_size=32, **SMALL)
    for blocks in ((0, 2), (-3,)):
        with pytest.raises(ValueError, match=r"is out of range for a model with 2 encoder blocks; use 0 to 1 "
                                             r"\(or -2 to -1 from the end\)"):
            keras_vit.feature_extractor(model, blocks)
    for blocks, kind in (((True,), "bool"), (("1",), "str"), ((1.0,), "float")):
        with pytest.raises(ValueError, match=rf"^Block index {blocks[0]!r} is a {kind}, not an int; pass block "
                                             r"indices, e.g. \(3, 5, 7, 11\) or -1 for the last block\.$"):
            keras_vit.feature_extractor(model, blocks)
    for blocks in (None, "12", 2.5):
        with pytest.raises(ValueError, match=rf"^blocks is {re.escape(repr(blocks))}; pass block indices"):
            keras_vit.feature_extractor(model, blocks)
    other = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)], name="mlp")
    with pytest.raises(ValueError, match=r"^'mlp' has no encoder blocks \(encoderblock_0, \.\.\.\); "
                                         "feature_extractor takes a keras_vit model\.$"):
        keras_vit.feature_extractor(other, (0,))
    assert len(keras_vit.feature_extractor(model, np.array([0, 1])).outputs) == 2
    with pytest.raises(ValueError, match="blocks is empty"):
        keras_vit.feature_extractor(model, ())
