"""Keras' own int8 quantization on keras_vit models: saved and reloaded with identical outputs."""

import warnings

import keras
import numpy as np

import keras_vit
from conftest import SMALL, predict

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


def test_int8_model_reloads_from_keras_with_identical_outputs_twice(tmp_path):
    model = quantized_model()
    images = np.random.default_rng(1).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    expected = predict(model, images)
    model.save(tmp_path / "int8.keras")
    reloaded = keras.saving.load_model(tmp_path / "int8.keras")
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
