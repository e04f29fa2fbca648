"""SAM's image encoder: timm's `VisionTransformerSAM` folders read exactly (windowed and global blocks with decomposed
relative positions, the neck), at their own size and at another, `save_timm` back to timm's layout, its pretrained
tags as `hf://` handles, every tool, and the refusals.

The fixtures (`tools/make_sam_fixtures.py`) are tiny encoders written by timm's `save_for_hf`, random values in every
tensor: windows that need padding beside a global block with the conv neck and a head; `samvit_base_patch16_224`'s
LayerNorm neck without a position table; and a non-square grid padded on one axis without q/k/v biases.
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
from keras_vit.checkpoints.timm.sam import SAM_ARCHITECTURES
from keras_vit.layers.windows import window_partition, window_unpartition

with np.load(fixture("timm_sam_reference.npz")) as _data:
    REFERENCE = dict(_data)
with open(fixture("timm_sam/cases.json")) as f:
    CASES = json.load(f)
TOLERANCE = 1e-5


def folder(case):
    return fixture(os.path.join("timm_sam", case))


def load(case, **options):
    return keras_vit.from_pretrained(folder(case), classifier_activation=None, **options)


def output(case, key="native"):
    return REFERENCE.get(f"{case}/{key}/logits", REFERENCE.get(f"{case}/{key}/pooled"))


# On every backend: windows with padding, decomposed positions and the conv neck; the others differ by switches
# every backend computes alike.
@pytest.mark.parametrize("case", [pytest.param(case, marks=() if case == "windowed_neck" else
                                               pytest.mark.backend_independent) for case in sorted(CASES)])
def test_loads_timm_sam_with_timms_outputs(case):
    images = REFERENCE[f"{case}/native/images"]
    np.testing.assert_allclose(predict(load(case), images), output(case), atol=TOLERANCE, rtol=0)
    features = predict(keras_vit.from_pretrained(folder(case), include_top=False), images)
    # timm's forward_features, (batch, channels, h, w), channels last: the map, not its h*w tokens (before 2026-12-07)
    np.testing.assert_allclose(features, REFERENCE[f"{case}/native/features"].transpose(0, 2, 3, 1), atol=TOLERANCE,
                               rtol=0)


@pytest.mark.backend_independent
def test_loads_at_another_size_as_timm_runs_it():
    """timm resamples the table (bicubic, anti-aliased) and the global blocks' offsets (linear) on the fly."""
    images = REFERENCE["windowed_neck/other/images"]
    model = load("windowed_neck", image_size=images.shape[1:3])
    np.testing.assert_allclose(predict(model, images), output("windowed_neck", "other"), atol=TOLERANCE, rtol=0)


@pytest.mark.backend_independent
def test_window_partition_pads_to_whole_windows_and_unpartition_crops_back():
    tokens = np.arange(2 * 4 * 6 * 3, dtype="float32").reshape(2, 24, 3)
    windows, padded = window_partition(tokens, (4, 6), 3)
    assert padded == (6, 6) and tuple(windows.shape) == (8, 9, 3)
    grid = tokens.reshape(2, 4, 6, 3)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(windows)[1], grid[0, 0:3, 3:6].reshape(9, 3))
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(windows)[2][3:], 0)  # the padding rows
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(window_unpartition(windows, (4, 6), 3, padded)), tokens)


@pytest.mark.backend_independent
@pytest.mark.parametrize("case", sorted(CASES))
def test_save_timm_writes_timms_own_tensors_back(case, tmp_path):
    check_save_timm_writes_the_file_back(load(case), Path(folder(case)), CASES[case]["architecture"],
                                         REFERENCE[f"{case}/native/images"], tmp_path)


@pytest.mark.backend_independent
def test_hf_handles_of_the_pretrained_tags_read_from_an_offline_cache(tmp_path):
    pytest.importorskip("huggingface_hub")
    registry = json.loads(open(fixture("timm_registry.json")).read())["architectures"]
    tags = [(name, tag) for name, entry in sorted(registry.items()) if entry["class"] == "VisionTransformerSAM"
            for tag in entry["tags"]]
    assert len(tags) == 3
    check_hf_handles(tmp_path, tags, lambda name: folder("windowed_neck"), fixture("timm_sam_reference.npz"),
                     lambda name: "windowed_neck")


@pytest.mark.backend_independent
def test_every_tool_works_on_sam(tmp_path):
    check_every_tool(load("windowed_neck"), REFERENCE["windowed_neck/native/images"], tmp_path, 0, 0.1,
                     windowed=True)


def test_sam_exports_to_onnx(tmp_path):
    if keras.backend.backend() == "jax":
        pytest.skip("ONNX export runs on the TensorFlow and PyTorch backends")
    pytest.importorskip("onnxruntime")
    check_onnx(load("windowed_neck"), REFERENCE["windowed_neck/native/images"], tmp_path)


@pytest.mark.backend_independent
def test_decomposed_positions_and_the_neck_train():
    model = keras_vit.ViT(image_size=16, patch_size=4, hidden_size=16, num_layers=2, num_heads=2, mlp_dim=32,
                          classes=3, classifier="gap", decomposed_relative_position=True, window_size=3,
                          global_attention_blocks=(1,), neck_channels=8, final_norm=False)
    check_one_step_moves(model, ("rel_pos_h", "rel_pos_w", "neck/reduce/kernel", "neck/mix/kernel"), 6)


@pytest.mark.backend_independent
@pytest.mark.parametrize("arguments, message", [
    (dict(window_size=2), "window_size and neck_channels (SAM's) take the patch grid alone: they need "
                          "class_token=False and no register or distillation tokens."),
    (dict(window_size=2, classifier="gap", image_size=(None, None)),
     "A relative position bias, SAM's windows or its neck are built for one patch grid (as timm's Beit, "
     "VisionTransformerRelPos and VisionTransformerSAM take one input size at a time): build the model at a fixed "
     "image_size; loading a checkpoint at another size resizes its tables, as timm does."),
    (dict(decomposed_relative_position=True, rope="axial", classifier="gap"),
     "decomposed_relative_position is not supported with rope, differential attention or relative_position_bias "
     "(SAM's encoder has none of them beside it)."),
])
def test_sam_switches_refuse_what_they_cannot_be_in_one_line(arguments, message):
    arguments = {"image_size": 16, **arguments}
    with pytest.raises(ValueError) as error:
        keras_vit.ViT(patch_size=4, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=32, **arguments)
    assert str(error.value) == message


@pytest.mark.backend_independent
@pytest.mark.parametrize("change, message", [
    (dict(use_rope=True), "{config}: model_args.use_rope is not a VisionTransformerSAM argument keras_vit computes; "
                          "nothing was loaded."),
    (dict(img_size=[56, 56]), "{path}: pos_embed is a 6x6 grid, but model_args.img_size [56, 56] makes 7x7. Nothing "
                              "was loaded."),
])
def test_a_sam_folder_whose_config_says_another_model_is_refused(change, message, tmp_path):
    target = tmp_path / "sam"
    shutil.copytree(folder("windowed_neck"), target)
    config = json.loads((target / "config.json").read_text())
    config["model_args"].update(change)
    (target / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError) as error:
        keras_vit.from_pretrained(str(target))
    assert str(error.value) == message.format(path=target / "model.safetensors", config=target / "config.json")


@pytest.mark.backend_independent
def test_loads_transformers_sam_vision_model_with_its_last_hidden_state():
    """transformers' SamVisionModel (`tools/make_sam_fixtures.py`): its neck's grid, channels last here."""
    images = REFERENCE["transformers_sam_vision/native/images"]
    model = keras_vit.from_pretrained(fixture("transformers_sam_vision"))
    features = predict(model, images)
    np.testing.assert_allclose(features, REFERENCE["transformers_sam_vision/native/features"].transpose(0, 2, 3, 1),
                               atol=TOLERANCE, rtol=0)


@pytest.mark.backend_independent
def test_a_transformers_sam_folder_whose_table_is_not_its_image_size_is_refused(tmp_path):
    target = tmp_path / "sam"
    shutil.copytree(fixture("transformers_sam_vision"), target)
    config = json.loads((target / "config.json").read_text())
    config["image_size"] = 56
    (target / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError) as error:
        keras_vit.from_pretrained(str(target))
    assert str(error.value) == (f"{target / 'model.safetensors'}: vision_encoder.pos_embed is a 6x6 grid, but "
                                "image_size 56 and patch_size 8 make 7x7. Nothing was loaded.")


@pytest.mark.backend_independent
def test_a_windowed_blocks_attention_is_laid_on_the_grid_and_inspect_draws_its_figures(tmp_path):
    """Each token attends within its window: the weights outside are zero, those inside the window's own (the
    padding's left out), and the figures that read them are drawn."""
    from keras_vit.tools import analysis

    model = load("windowed_neck")
    images = REFERENCE["windowed_neck/native/images"]
    windowed = analysis.attention_weights(model, images)[0]  # block 0: 4x4 windows of a 6x6 grid
    window_of = np.array([(row // 4) * 2 + col // 4 for row in range(6) for col in range(6)])
    np.testing.assert_array_equal(windowed[..., window_of[:, None] != window_of[None, :]], 0)
    assert 0 < windowed[0, 0, 35].sum() < 0.99  # the corner window is 12 padding tokens of 16
    np.testing.assert_allclose(windowed[0, 0, 0].sum(), 1.0, atol=1e-5)  # the first window has none
    written = analysis.inspect(model, np.zeros((48, 48, 3), "uint8"), str(tmp_path))
    assert sorted(written) == ["embedding_filters", "mean_attention_distance", "position_embedding_similarity"]
