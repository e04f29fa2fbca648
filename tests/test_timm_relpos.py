"""timm's VisionTransformerRelPos (`vit_relpos_*`, `vit_srelpos_*`): its folders read exactly, at their own size and at
another (tables resized as timm resizes them at load, MLP biases recomputed on the new grid), `save_timm` back to
timm's layout, its pretrained tags as `hf://` handles, every tool, and the refusals.

The fixtures (`tools/make_relpos_fixtures.py`) are tiny models written by timm's `save_for_hf`, random values in
every tensor: an MLP bias (timm's `cr` log coordinates) per block with average pooling, with a class token on a
non-square grid, shared by every block, in post-norm blocks, and Swin v2's MLP; a table per block with a class
token, and one shared table without a prefix token.
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
from keras_vit import CheckpointError
from keras_vit.checkpoints.timm.relpos import RELPOS_ARCHITECTURES

with np.load(fixture("timm_relpos_reference.npz")) as _data:
    REFERENCE = dict(_data)
with open(fixture("timm_relpos/cases.json")) as f:
    CASES = json.load(f)
TOLERANCE = 1e-5
# On every backend: the MLP's bias (its matmuls, the lookup and the class token's zero padding); the other cases
# differ by switches every backend computes alike, and run once.
ON_EVERY_BACKEND = ("mlp_cls_token_nonsquare",)
# Each pretrained tag's architecture -> the fixture of its switches.
TAGGED = {"vit_relpos_base_patch16_224": "mlp_gap", "vit_relpos_medium_patch16_224": "mlp_gap",
          "vit_relpos_small_patch16_224": "mlp_gap", "vit_relpos_base_patch16_clsgap_224": "table_cls_gap",
          "vit_relpos_medium_patch16_cls_224": "mlp_cls_token_nonsquare",
          "vit_relpos_base_patch32_plus_rpn_256": "res_post_norm", "vit_relpos_medium_patch16_rpn_224": "res_post_norm",
          "vit_srelpos_small_patch16_224": "shared_mlp", "vit_srelpos_medium_patch16_224": "shared_mlp"}


def folder(case):
    return fixture(os.path.join("timm_relpos", case))


def load(case, **options):
    return keras_vit.from_pretrained(folder(case), classifier_activation=None, **options)


def output(case, key="native"):
    return REFERENCE[f"{case}/{key}/logits"] if f"{case}/{key}/logits" in REFERENCE else \
        REFERENCE[f"{case}/{key}/pooled"]


@pytest.mark.parametrize("case", [case if case in ON_EVERY_BACKEND else
                                  pytest.param(case, marks=pytest.mark.backend_independent) for case in sorted(CASES)])
def test_loads_timm_relpos_with_timms_outputs(case):
    images = REFERENCE[f"{case}/native/images"]
    np.testing.assert_allclose(predict(load(case), images), output(case), atol=TOLERANCE, rtol=0)
    tokens = keras_vit.from_pretrained(folder(case), include_top=False)
    np.testing.assert_allclose(predict(tokens, images), REFERENCE[f"{case}/native/tokens"], atol=TOLERANCE, rtol=0)


@pytest.mark.backend_independent
@pytest.mark.parametrize("case", sorted(case for case, entry in CASES.items() if entry["other"]))
def test_loads_at_another_size_as_timm_loads_it(case):
    images = REFERENCE[f"{case}/other/images"]
    model = load(case, image_size=images.shape[1:3])
    np.testing.assert_allclose(predict(model, images), output(case, "other"), atol=TOLERANCE, rtol=0)


@pytest.mark.backend_independent
@pytest.mark.parametrize("case", sorted(CASES))
def test_save_timm_writes_timms_own_tensors_back(case, tmp_path):
    check_save_timm_writes_the_file_back(load(case), Path(folder(case)), CASES[case]["architecture"],
                                         REFERENCE[f"{case}/native/images"], tmp_path)


@pytest.mark.backend_independent
def test_hf_handles_of_the_pretrained_tags_read_from_an_offline_cache(tmp_path):
    pytest.importorskip("huggingface_hub")
    registry = json.loads(open(fixture("timm_registry.json")).read())["architectures"]
    tags = [(name, tag) for name, entry in sorted(registry.items()) if entry["class"] == "VisionTransformerRelPos"
            for tag in entry["tags"]]
    assert len(tags) == 9 and {name for name, _ in tags} == set(TAGGED)

    def fixture_switches(name, args):  # the fixture's switches where the tag's architecture sets others
        own = RELPOS_ARCHITECTURES[CASES[TAGGED[name]]["architecture"]].switches
        for key, value in {**own, "qkv_bias": own.get("qkv_bias", True)}.items():
            if key != "block_fn":
                args.setdefault(key, value)

    check_hf_handles(tmp_path, tags, lambda name: folder(TAGGED[name]), fixture("timm_relpos_reference.npz"),
                     TAGGED.get, fixture_switches)


@pytest.mark.backend_independent
def test_every_tool_works_on_a_relpos_vit(tmp_path):
    # int8 within 10%: at width 16 the rounding of each quantized layer weighs more than at real widths.
    check_every_tool(load("mlp_cls_token_nonsquare"), REFERENCE["mlp_cls_token_nonsquare/native/images"], tmp_path,
                     1, 0.1)


def test_relpos_vit_exports_to_onnx(tmp_path):
    if keras.backend.backend() == "jax":
        pytest.skip("ONNX export runs on the TensorFlow and PyTorch backends")
    pytest.importorskip("onnxruntime")
    check_onnx(load("mlp_cls_token_nonsquare"), REFERENCE["mlp_cls_token_nonsquare/native/images"], tmp_path)


@pytest.mark.backend_independent
def test_mlp_biases_train():
    model = keras_vit.ViT(image_size=16, patch_size=8, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=32,
                          classes=3, classifier="gap", relative_position_bias="mlp",
                          shared_relative_position_bias="mlp_swin", relative_position_mlp_dim=8,
                          position_embedding=False)
    # Each MLP's hidden layer and output kernel: the output bias is the same logit for every key, which softmax is
    # blind to (timm's 'cr' MLP has one all the same).
    check_one_step_moves(model, ("relative_position_mlp_hidden", "relative_position_mlp_output_kernel"), 6)


def edited(case, tmp_path, change):
    target = tmp_path / case
    shutil.copytree(folder(case), target)
    config = json.loads((target / "config.json").read_text())
    change(config)
    (target / "config.json").write_text(json.dumps(config))
    return target


@pytest.mark.backend_independent
@pytest.mark.parametrize("case, change, message", [
    ("mlp_gap", lambda c: c["model_args"].update(rel_pos_dim=24),
     "{path}: blocks.0.attn.rel_pos.mlp.fc1.weight is 16 wide, but the config's rel_pos_dim gives 24. Nothing was "
     "loaded."),
    ("table_cls_gap", lambda c: c["model_args"].update(img_size=[40, 32]),
     "{path}: blocks.0.attn.rel_pos.relative_position_bias_table has shape (52, 2), but timm builds (66, 2) for its "
     "5x4 patch grid and 2 heads (the config's img_size and num_heads). Nothing was loaded."),
    ("mlp_gap", lambda c: c["model_args"].update(global_pool="map"),
     "{config}: global_pool is 'map'; timm's VisionTransformerRelPos pools by 'avg' or 'token'."),
    ("mlp_gap", lambda c: c["model_args"].update(rel_pos_type="bias"),
     "{path} lacks 2 tensors of the model its config.json describes (architecture: \"vit_relpos_medium_patch16_224\", "
     "depth: 2): ['blocks.0.attn.rel_pos.relative_position_bias_table', "
     "'blocks.1.attn.rel_pos.relative_position_bias_table']."),
])
def test_a_relpos_folder_whose_config_says_another_model_is_refused(case, change, message, tmp_path):
    target = edited(case, tmp_path, change)
    with pytest.raises(CheckpointError) as error:
        keras_vit.from_pretrained(str(target))
    assert str(error.value) == message.format(path=target / "model.safetensors", config=target / "config.json")
