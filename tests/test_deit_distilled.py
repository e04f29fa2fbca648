"""Distilled DeiT (a distillation token and a second head): timm's and transformers' folders, and every tool.

The fixtures are written by `tools/make_deit_fixtures.py` with timm's `save_for_hf` and transformers'
`save_pretrained` (random values in every tensor); the references are those libraries' own outputs.
"""

import json
import os
import shutil

import keras
import numpy as np
import pytest
from conftest import fixture
from timm_class_checks import check_timm_takes_the_config

import keras_vit
from keras_vit import CheckpointError
from keras_vit.model.description import architecture_of
from keras_vit.model.graph import distillation_heads

REFERENCE = np.load(fixture("deit_distilled_reference.npz"))
TIMM = fixture("timm_deit_distilled")
TRANSFORMERS = fixture("transformers_deit_distilled")
IMAGES = REFERENCE["images"]
HEADS = {"timm": ("class_logits", "distillation_logits"), "transformers": ("cls_logits", "distillation_logits")}


def outputs(model, images=IMAGES):
    result = model(images)
    return [keras.ops.convert_to_numpy(x) for x in result] if isinstance(result, list) else \
        keras.ops.convert_to_numpy(result)


@pytest.mark.parametrize("library, folder", [("timm", TIMM), ("transformers", TRANSFORMERS)])
def test_loads_distilled_deit_with_both_heads_and_their_average_exact(library, folder):
    model = keras_vit.from_pretrained(folder, classifier_activation=None)
    np.testing.assert_allclose(outputs(model), REFERENCE[f"{library}/logits"], atol=1e-5)
    for found, name in zip(outputs(distillation_heads(model)), HEADS[library]):
        np.testing.assert_allclose(found, REFERENCE[f"{library}/{name}"], atol=1e-5)


@pytest.mark.backend_independent
def test_token_pooling_of_a_distilled_deit_is_timms_pre_logits():
    model = keras_vit.from_pretrained(TIMM, include_top=False, pooling="token")
    np.testing.assert_allclose(outputs(model), REFERENCE["timm/pre_logits"], atol=1e-5)


def _without_head_dist(tmp_path, names):
    from safetensors.numpy import load_file, save_file

    folder = tmp_path / "deit"
    shutil.copytree(TIMM, folder)
    path = str(folder / "model.safetensors")
    save_file({key: value for key, value in load_file(path).items() if key not in names}, path,
              metadata={"format": "pt"})
    return folder, path


@pytest.mark.backend_independent
def test_refuses_distilled_file_without_head_dist(tmp_path):
    folder, path = _without_head_dist(tmp_path, ("head_dist.weight", "head_dist.bias"))
    with pytest.raises(CheckpointError) as error:
        keras_vit.from_pretrained(str(folder))
    assert str(error.value) == (f"{path} is a distilled DeiT (dist_token) that lacks head_dist.weight and "
                                "head_dist.bias: its class and distillation heads come together (both, or neither "
                                "for a model without its top). Nothing was loaded.")


@pytest.mark.backend_independent
def test_refuses_distilled_name_whose_file_has_no_dist_token(tmp_path):
    folder, path = _without_head_dist(tmp_path, ("dist_token", "head_dist.weight", "head_dist.bias"))
    with pytest.raises(CheckpointError, match=r"does not hold timm's 'deit_tiny_distilled_patch16_224' as its "
                                              r"config.json sets it: it lacks dist_token \(a distilled DeiT: True\)"):
        keras_vit.from_pretrained(str(folder))


def tiny(**options):
    return keras_vit.ViT(image_size=32, patch_size=8, hidden_size=24, num_layers=1, num_heads=3, mlp_dim=48,
                         classes=5, distillation_token=True, classifier_activation=None, **options)


def _randomised(model):
    rng = np.random.default_rng(0)
    for variable in model.weights:
        variable.assign(rng.normal(0, 0.2, variable.shape).astype("float32"))
    return model


@pytest.mark.backend_independent
def test_distillation_token_is_a_prefix_token_every_tool_drops():
    from keras_vit.tools.analysis import attention_rollout, attention_weights, rollout_map
    from keras_vit.tools.features import feature_extractor

    model = _randomised(tiny())
    assert architecture_of(model).num_prefix_tokens == 2
    assert tuple(model.get_layer("position_embedding").pos_embedding.shape) == (1, 2 + 16, 24)
    features = feature_extractor(model, blocks=[0])(IMAGES)
    assert tuple(keras.ops.shape(features[0] if isinstance(features, (list, tuple)) else features)) == (2, 4, 4, 24)
    attentions = attention_weights(model, IMAGES[:1])
    assert rollout_map(attention_rollout(attentions), (4, 4), 2).shape == (1, 4, 4)


@pytest.mark.backend_independent
def test_refuses_distillation_token_without_class_token_pooling():
    with pytest.raises(ValueError, match="distillation_token=True reads the class and distillation tokens"):
        tiny(classifier="gap")


@pytest.mark.backend_independent
def test_lora_keeps_both_heads_trainable():
    from keras_vit.model.lora import enable_lora

    model = enable_lora(tiny(), rank=2)
    trainable = {variable.path for variable in model.trainable_weights}
    assert {"head/kernel", "head_dist/kernel"} <= trainable


@pytest.mark.backend_independent
def test_distilled_deit_round_trips_through_keras_file_and_int8(tmp_path):
    model = _randomised(tiny())
    expected = outputs(model)
    path = str(tmp_path / "deit.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_allclose(outputs(loaded), expected, atol=1e-6)
    assert architecture_of(loaded).distillation_token
    np.testing.assert_allclose(outputs(distillation_heads(loaded))[1], outputs(distillation_heads(model))[1],
                               atol=1e-6)
    loaded.quantize("int8")
    np.testing.assert_allclose(outputs(loaded), expected, atol=0.05 * np.abs(expected).max())


@pytest.mark.backend_independent
def test_save_timm_of_a_distilled_deit_reads_back_exactly(tmp_path):
    model = keras_vit.from_pretrained(TIMM, classifier_activation=None)
    path = str(tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match="has a distillation token and head, which timm's VisionTransformer "
                                              "takes only from a model function"):
        keras_vit.checkpoints.save_timm(model, path)
    keras_vit.checkpoints.save_timm(model, path, architecture="deit_tiny_distilled_patch16_224")  # and config.json
    check_timm_takes_the_config(json.loads((tmp_path / "config.json").read_text()))
    np.testing.assert_allclose(outputs(keras_vit.from_pretrained(str(tmp_path), classifier_activation=None)),
                               REFERENCE["timm/logits"], atol=1e-5)


@pytest.mark.backend_independent
def test_distilled_deit_exports_to_onnx(tmp_path):
    onnxruntime = pytest.importorskip("onnxruntime")
    model = keras_vit.from_pretrained(TIMM, classifier_activation=None)
    path = str(tmp_path / "deit.onnx")
    model.export(path, format="onnx", verbose=False)
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    found = session.run(None, {session.get_inputs()[0].name: IMAGES})[0]
    np.testing.assert_allclose(found, REFERENCE["timm/logits"], atol=1e-5)
