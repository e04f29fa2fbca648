"""CaiT: timm's `Cait` folders read exactly (talking-heads blocks, then class attention), `save_timm` back to timm's
layout, its pretrained tags as `hf://` handles, every tool, and the refusals.

The fixtures (`tools/make_cait_fixtures.py`) are tiny models written by timm's `save_for_hf`, random values in
every tensor: class-token pooling after two class-attention blocks with q/k/v biases, and average pooling on a
non-square grid after one class-attention block with a narrower MLP and no q/k/v biases.
"""

import json
import os
import shutil
from pathlib import Path

import keras
import numpy as np
import pytest
from conftest import fixture, predict
from timm_class_checks import (
    check_every_tool,
    check_hf_handles,
    check_one_step_moves,
    check_onnx,
    check_save_timm_writes_the_file_back,
)

import keras_vit
from keras_vit import CheckpointError, checkpoints
from keras_vit.checkpoints.timm.cait import CAIT_ARCHITECTURES

with np.load(fixture("timm_cait_reference.npz")) as _data:
    REFERENCE = dict(_data)
with open(fixture("timm_cait/cases.json")) as f:
    CASES = json.load(f)
TOLERANCE = 1e-5


def folder(case):
    return fixture(os.path.join("timm_cait", case))


def load(case, **options):
    return keras_vit.from_pretrained(folder(case), classifier_activation=None, **options)


def output(case):
    return REFERENCE.get(f"{case}/native/logits", REFERENCE.get(f"{case}/native/pooled"))


# On every backend: talking heads (their einsums) and class attention; the other case differs by switches every
# backend computes alike.
@pytest.mark.parametrize("case", ["token", pytest.param("gap_nonsquare", marks=pytest.mark.backend_independent)])
def test_loads_timm_cait_with_timms_outputs(case):
    images = REFERENCE[f"{case}/native/images"]
    np.testing.assert_allclose(predict(load(case), images), output(case), atol=TOLERANCE, rtol=0)
    tokens = keras_vit.from_pretrained(folder(case), include_top=False)
    np.testing.assert_allclose(predict(tokens, images), REFERENCE[f"{case}/native/tokens"], atol=TOLERANCE, rtol=0)


@pytest.mark.backend_independent
@pytest.mark.parametrize("case", sorted(CASES))
def test_save_timm_writes_timms_own_tensors_back(case, tmp_path):
    check_save_timm_writes_the_file_back(load(case), Path(folder(case)), CASES[case]["architecture"],
                                         REFERENCE[f"{case}/native/images"], tmp_path)


@pytest.mark.backend_independent
def test_hf_handles_of_the_pretrained_tags_read_from_an_offline_cache(tmp_path):
    pytest.importorskip("huggingface_hub")
    registry = json.loads(open(fixture("timm_registry.json")).read())["architectures"]
    tags = [(name, tag) for name, entry in sorted(registry.items()) if entry["class"] == "Cait"
            for tag in entry["tags"]]
    assert len(tags) == 10 and {name for name, _ in tags} == set(CAIT_ARCHITECTURES)
    check_hf_handles(tmp_path, tags, lambda name: folder("token"), fixture("timm_cait_reference.npz"),
                     lambda name: "token")


@pytest.mark.backend_independent
def test_every_tool_works_on_cait(tmp_path):
    # The blocks' tokens are the patches alone (the class token enters after them); int8 within 10% at width 16.
    check_every_tool(load("token"), REFERENCE["token/native/images"], tmp_path, 0, 0.1, mixed_heads=True)


def test_cait_exports_to_onnx(tmp_path):
    if keras.backend.backend() == "jax":
        pytest.skip("ONNX export runs on the TensorFlow and PyTorch backends")
    pytest.importorskip("onnxruntime")
    check_onnx(load("token"), REFERENCE["token/native/images"], tmp_path)


@pytest.mark.backend_independent
def test_talking_heads_and_class_attention_train():
    model = keras_vit.ViT(image_size=16, patch_size=8, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=32,
                          classes=3, talking_heads=True, class_attention_blocks=1,
                          class_token_position_embedding=False, layer_scale=0.5)
    # Not the key bias nor the logits' mixing bias, each the same logit for every key: softmax is blind to them.
    check_one_step_moves(model, ("talking_heads_logit_kernel", "talking_heads_weight", "class_attention_0/query",
                                 "class_attention_0/key/kernel"), 6)


@pytest.mark.backend_independent
def test_a_cait_takes_any_image_size_with_dynamic_resolution():
    model = keras_vit.ViT(image_size=(None, None), patch_size=8, hidden_size=16, num_layers=1, num_heads=2,
                          mlp_dim=32, classes=3, talking_heads=True, class_attention_blocks=2,
                          class_token_position_embedding=False, layer_scale=0.5)
    for size in ((32, 32), (24, 40)):
        assert predict(model, np.zeros((1, *size, 3), "float32")).shape == (1, 3)


@pytest.mark.backend_independent
@pytest.mark.parametrize("arguments, message", [
    (dict(class_attention_blocks=2),
     "class_attention_blocks (CaiT's) bring the class token in after the blocks: they need class_token=True without a "
     "position embedding (class_token_position_embedding=False), no register or distillation tokens, and "
     "classifier='token' or 'gap'."),
    (dict(class_attention_blocks=1, class_token_position_embedding=False, register_tokens=1),
     "class_attention_blocks (CaiT's) bring the class token in after the blocks: they need class_token=True without a "
     "position embedding (class_token_position_embedding=False), no register or distillation tokens, and "
     "classifier='token' or 'gap'."),
    (dict(class_attention_blocks=-1), "class_attention_blocks must be a whole number >= 0, got -1."),
    (dict(talking_heads=True, differential_attention=True),
     "talking_heads=True is not supported with differential_attention=True (no timm architecture combines them)."),
])
def test_cait_switches_refuse_what_they_cannot_be_in_one_line(arguments, message):
    with pytest.raises(ValueError) as error:
        keras_vit.ViT(image_size=16, patch_size=8, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=32, **arguments)
    assert str(error.value) == message


@pytest.mark.backend_independent
@pytest.mark.parametrize("change, message", [
    (dict(mlp_ratio_token_only=2.0),
     "{path}: blocks_token_only.0.mlp.fc1.weight is 64 wide, but the config's mlp_ratio_token_only gives 32. Nothing "
     "was loaded."),
    (dict(depth_token_only=1),
     "{path} has 18 tensors that are not in timm's Cait layout: ['blocks_token_only.1.attn.k.bias', "
     "'blocks_token_only.1.attn.k.weight', 'blocks_token_only.1.attn.proj.bias', 'blocks_token_only.1.attn.proj.weight', "
     "'blocks_token_only.1.attn.q.bias', '...']; keras_vit reads timm Cait state dicts (blocks.N.attn.proj_l.weight, "
     "blocks_token_only.N.attn.q.weight, ...)."),
    (dict(global_pool="map"), "{config}: global_pool is 'map'; timm's Cait pools by 'token' or 'avg'."),
])
def test_a_cait_folder_whose_config_says_another_model_is_refused(change, message, tmp_path):
    target = tmp_path / "cait"
    shutil.copytree(folder("token"), target)
    config = json.loads((target / "config.json").read_text())
    config["model_args"].update(change)
    (target / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError) as error:
        keras_vit.from_pretrained(str(target))
    assert str(error.value).startswith(message.format(path=target / "model.safetensors",
                                                      config=target / "config.json"))


@pytest.mark.backend_independent
def test_save_timm_of_a_cait_needs_a_cait_name(tmp_path):
    model = load("token")
    with pytest.raises(CheckpointError) as error:
        checkpoints.save_timm(model, str(tmp_path / "model.safetensors"))
    assert str(error.value) == (f"{model.name} has CaiT's talking heads or class attention, as timm's Cait class: "
                                "pass architecture= the Cait name it is (cait_s24_224, cait_xxs24_384, ...).")
    assert not os.listdir(tmp_path)
