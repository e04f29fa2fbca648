"""Keras' own int8 quantization on keras_vit models: saved and reloaded with identical outputs."""

import re
import warnings

import keras
import numpy as np
import pytest

import keras_vit
from conftest import SMALL, predict
from keras_vit import CheckpointError

DENSE_IN_BLOCKS = ("qkv", "attention_output", "mlp_hidden", "mlp_output")


def quantized_model():
    model = keras_vit.ViT(image_size=32, **SMALL, classes=5, classifier_activation=None)
    rng = np.random.default_rng(0)
    for variable in model.weights:  # random heads and biases too, so nothing hides behind zeros
        variable.assign(rng.normal(scale=0.1, size=variable.shape).astype(variable.dtype))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Keras names each layer without weights to quantize
        model.quantize("int8")
    return model


@pytest.fixture(scope="module")
def int8_file(tmp_path_factory):
    """A quantized model saved as `.keras`, some images and its outputs on them: `(path, images, outputs)`."""
    model = quantized_model()
    images = np.random.default_rng(1).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    path = str(tmp_path_factory.mktemp("int8") / "int8.keras")
    model.save(path)
    return path, images, predict(model, images)


def test_int8_model_reloads_from_keras_with_identical_outputs_twice(int8_file, tmp_path):
    path, images, expected = int8_file
    reloaded = keras.saving.load_model(path)
    for index in range(SMALL["num_layers"]):
        block = reloaded.get_layer(f"encoderblock_{index}")
        assert [getattr(block, name).quantization_mode for name in DENSE_IN_BLOCKS] == ["int8"] * 4
        assert block.attention_norm.quantization_mode is None
    assert reloaded.get_layer("head").quantization_mode == "int8"
    np.testing.assert_array_equal(predict(reloaded, images), expected)
    reloaded.save(tmp_path / "again.keras")  # a reloaded model saves again (its blocks hold a DTypePolicyMap)
    np.testing.assert_array_equal(predict(keras.saving.load_model(tmp_path / "again.keras"), images), expected)


def test_float_model_config_is_unchanged_by_quantization_support():
    config = keras_vit.ViT(image_size=32, **SMALL, classes=5).get_layer("encoderblock_0").get_config()
    assert config["dtype"]["class_name"] == "DTypePolicy"


@pytest.mark.backend_independent
def test_from_pretrained_returns_an_int8_keras_file_as_saved_and_refuses_a_rebuild(int8_file):
    path, images, expected = int8_file
    for loaded in (keras_vit.from_pretrained(path),  # what it already is asks for no rebuild
                   keras_vit.from_pretrained(path, num_heads=3, classes=5, classifier_activation=None, image_size=32)):
        assert loaded.get_layer("head").quantization_mode == "int8"
        np.testing.assert_array_equal(predict(loaded, images), expected)
    with pytest.raises(CheckpointError, match=rf"^{re.escape(path)} holds a model quantized by Keras \(model.quantize\), "
                       r"which from_pretrained returns as saved: classes=10, dtype='bfloat16' would need it rebuilt, "
                       r"and its 8-bit kernels load into no other model\. Pass them to from_pretrained of the float "
                       r"model, then quantize that \(model.quantize\('int8'\)\)\.$"):
        keras_vit.from_pretrained(path, classes=10, dtype="bfloat16")
    with pytest.raises(CheckpointError, match=rf"^{re.escape(path)} holds a model quantized by Keras \(model.quantize\): "
                       r"its 8-bit kernels are no weights to load into another model\. Load it as saved, with "
                       r"keras_vit.from_pretrained or keras.saving.load_model\.$"):
        keras_vit.ViT(image_size=32, **SMALL, classes=5, weights=path)
