"""Gemma 4's vision tower: timm's `Gemma4VitEncoder` and `Gemma4VitClassifier` folders and transformers'
`Gemma4VisionModel` read exactly, `save_timm` back to timm's layout, its pretrained tags as `hf://` handles, every
tool, and the refusals.

The fixtures (`tools/make_gemma4_fixtures.py`) are tiny towers written by timm's `save_for_hf` and transformers'
`save_pretrained`, random values in every tensor: a classifier with clamped projections (the clamps binding), an
encoder's standardised soft tokens on a 6x9 grid with one key/value head, a classifier pooling the soft tokens with no
final norm, and transformers' tower with clamps and standardisation.
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
from keras_vit.checkpoints.timm.gemma4 import GEMMA4_ARCHITECTURES
from keras_vit.layers.dense import Dense
from keras_vit.layers.parts import clamped_projection

with np.load(fixture("gemma4_reference.npz")) as _data:
    REFERENCE = dict(_data)
with open(fixture("timm_gemma4/cases.json")) as f:
    CASES = json.load(f)
TRANSFORMERS = fixture("transformers_gemma4_vision")
# The soft tokens are pooled times sqrt(D) (and standardised): 1e-5 of the outputs' scale.
RELATIVE = 1e-5


def folder(case):
    return fixture(os.path.join("timm_gemma4", case))


def load(case, **options):
    return keras_vit.from_pretrained(folder(case), classifier_activation=None, **options)


def output(case):
    return next(REFERENCE[f"{case}/native/{key}"] for key in ("logits", "pooled", "soft_tokens")
                if f"{case}/native/{key}" in REFERENCE)


def assert_close(found, expected):
    np.testing.assert_allclose(found, expected, atol=RELATIVE * max(1.0, np.abs(expected).max()), rtol=0)


def block_tokens(model, images):
    """The patch tokens after the last block (timm's `forward_features` before any pooling)."""
    last = max(layer.name for layer in model.layers if layer.name.startswith("encoderblock_"))
    return predict(keras.Model(model.input, model.get_layer(last).output), images)


# On every backend: RoPE by axis halves, the clamps and the grouped keys; the other cases differ by switches every
# backend computes alike.
@pytest.mark.parametrize("case", ["encoder_soft_grouped", *(pytest.param(case, marks=pytest.mark.backend_independent)
                                                             for case in ("classifier_clipped",
                                                                          "classifier_soft_no_norm"))])
def test_loads_timm_gemma4_with_timms_outputs(case):
    images = REFERENCE[f"{case}/native/images"]
    model = load(case)
    assert_close(predict(model, images), output(case))
    tokens = REFERENCE[f"{case}/native/tokens"]
    if case.endswith("soft_no_norm"):  # timm's forward_features: the soft tokens the classifier averages
        tokens_model = keras.Model(model.input, model.get_layer("soft_tokens").output)
        assert_close(predict(tokens_model, images), tokens)
    else:
        assert_close(block_tokens(model, images), tokens)


@pytest.mark.backend_independent
def test_the_clamps_bind_in_the_fixture():
    """Without its clamps the clipped classifier gives other logits: the parity above tests them."""
    model = load("classifier_clipped")
    images = REFERENCE["classifier_clipped/native/images"]
    for layer in model.layers:
        for variable in layer.weights:
            if variable.path.endswith("_clip"):
                variable.assign(np.tile(np.array([-np.inf, np.inf, -np.inf, np.inf], "float32"),
                                        (variable.shape[0], 1)))
    assert np.abs(predict(model, images) - output("classifier_clipped")).max() > 1e-2


@pytest.mark.backend_independent
def test_loads_transformers_gemma4_vision_with_transformers_outputs():
    images = REFERENCE["transformers/native/images"]
    model = keras_vit.from_pretrained(TRANSFORMERS, image_size=(48, 72))
    assert model.output_shape == (None, 6, 32)
    assert_close(predict(model, images), REFERENCE["transformers/native/soft_tokens"])


@pytest.mark.backend_independent
def test_a_whole_gemma4_folder_gives_its_vision_tower(tmp_path):
    """A Gemma 4 model's folder (`model_type: gemma4`): the tower under `model.vision_tower.`, the rest left aside."""
    from safetensors.numpy import load_file, save_file

    tensors = {f"model.vision_tower.{name}": value
               for name, value in load_file(os.path.join(TRANSFORMERS, "model.safetensors")).items()}
    tensors["model.language_model.embed_tokens.weight"] = np.zeros((4, 8), "float32")
    save_file(tensors, str(tmp_path / "model.safetensors"))
    vision = json.loads(Path(TRANSFORMERS, "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gemma4", "vision_config": vision,
                                                      "text_config": {"model_type": "gemma4_text"}}))
    model = keras_vit.from_pretrained(str(tmp_path), image_size=(48, 72))
    assert_close(predict(model, REFERENCE["transformers/native/images"]), REFERENCE["transformers/native/soft_tokens"])


@pytest.mark.backend_independent
def test_timm_and_transformers_flatten_a_patch_in_other_orders():
    """One tower's weights read as timm's (channel, row, column) and as transformers' (row, column, channel)."""
    from keras_vit.checkpoints.timm.gemma4 import patch_kernel, patch_weight

    weight = np.random.default_rng(0).normal(size=(5, 3 * 2 * 2)).astype("float32")
    timm, transformers = patch_kernel(weight, 2, "cpp"), patch_kernel(weight, 2, "ppc")
    patch = np.random.default_rng(1).normal(size=(2, 2, 3)).astype("float32")  # (row, column, channel)
    np.testing.assert_allclose(np.einsum("hwc,hwcd->d", patch, timm), weight @ patch.transpose(2, 0, 1).ravel(),
                               atol=1e-6)
    np.testing.assert_allclose(np.einsum("hwc,hwcd->d", patch, transformers), weight @ patch.ravel(), atol=1e-6)
    for order, kernel in (("cpp", timm), ("ppc", transformers)):
        np.testing.assert_array_equal(patch_weight(kernel, order), weight)


@pytest.mark.backend_independent
@pytest.mark.parametrize("case", sorted(CASES))
def test_save_timm_writes_timms_own_tensors_back(case, tmp_path):
    check_save_timm_writes_the_file_back(load(case), Path(folder(case)), CASES[case]["architecture"],
                                         REFERENCE[f"{case}/native/images"], tmp_path)


@pytest.mark.backend_independent
def test_hf_handles_of_the_pretrained_tags_read_from_an_offline_cache(tmp_path):
    pytest.importorskip("huggingface_hub")
    registry = json.loads(open(fixture("timm_registry.json")).read())["architectures"]
    tags = [(name, tag) for name, entry in sorted(registry.items())
            if entry["class"] in ("Gemma4VitEncoder", "Gemma4VitClassifier") for tag in entry["tags"]]
    assert len(tags) == 4 and {name for name, _ in tags} == set(GEMMA4_ARCHITECTURES)
    cases = {"gemma4_vit_167m": "classifier_clipped", "gemma4_vit_167m_enc": "encoder_soft_grouped",
             "gemma4_vit_570m": "classifier_soft_no_norm", "gemma4_vit_570m_enc": "encoder_soft_grouped"}

    def edit_args(name, model_args):  # the encoder fixture is the 570M's: as the 167M's, its own switches stated
        if name == "gemma4_vit_167m_enc":
            model_args.update(use_clipped_linears=False, standardize=True)

    check_hf_handles(tmp_path, tags, lambda name: folder(cases[name]), fixture("gemma4_reference.npz"),
                     cases.get, edit_args)


@pytest.mark.backend_independent
def test_every_tool_works_on_gemma4(tmp_path):
    # No prefix tokens; int8 within 10% at width 32 (its clamped projections called once per group).
    check_every_tool(load("classifier_clipped"), REFERENCE["classifier_clipped/native/images"], tmp_path, 0, 0.1)


def test_gemma4_exports_to_onnx(tmp_path):
    if keras.backend.backend() == "jax":
        pytest.skip("ONNX export runs on the TensorFlow and PyTorch backends")
    pytest.importorskip("onnxruntime")
    check_onnx(load("classifier_clipped"), REFERENCE["classifier_clipped/native/images"], tmp_path)


GEMMA4_SWITCHES = dict(class_token=False, classifier="gap", position_embedding=False, patch_bias=False,
                       qkv_bias=False, projection_bias=False, normalization="rms_norm", qk_norm=True, value_norm=True,
                       attention_scale=1.0, rope="axial", rope_temperature=100.0, rope_rotate_half=True,
                       rope_axis_halves=True, rope_grid_indexing="xy", sandwich_norm=True, mlp_activation="geglu_tanh",
                       axis_position_table=8)


@pytest.mark.backend_independent
def test_gemma4_parts_train_and_the_clamps_do_not():
    clipped = keras_vit.ViT(image_size=16, patch_size=8, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=32,
                            classes=3, clipped_linears=True, **GEMMA4_SWITCHES)
    clamps = [v for v in clipped.weights if v.path.endswith("_clip")]
    assert len(clamps) == 4 and not [v for v in clipped.trainable_weights if v.path.endswith("_clip")]
    # check_one_step_moves draws every weight at random, bounds too: the parts train without clamps.
    model = keras_vit.ViT(image_size=16, patch_size=8, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=32,
                          classes=3, fc_norm=True, final_norm_scale=False, **GEMMA4_SWITCHES)
    check_one_step_moves(model, ("axis_position_embedding", "query_norm", "key_norm", "attention_branch_norm",
                                 "mlp_branch_norm", "mlp_hidden"), 6)


@pytest.mark.backend_independent
def test_a_gemma4_tower_takes_any_image_size_with_dynamic_resolution():
    case = "encoder_soft_grouped"
    model = load(case, image_size=(None, None))
    assert_close(predict(model, REFERENCE[f"{case}/native/images"]), output(case))
    assert predict(model, np.zeros((1, 24, 48, 3), "float32")).shape == (1, 2, 32)
    with pytest.raises(ValueError, match=r"Gemma 4's soft tokens pool 3x3 cells of patches, but the patch grid is 2x4"):
        load(case, image_size=(16, 32))


@pytest.mark.backend_independent
def test_clamped_projection_clamps_each_group_by_its_own_bounds_with_lora_and_int8():
    rng = np.random.default_rng(0)
    layer = Dense(6, use_bias=True, kernel_initializer="glorot_uniform", bias_initializer="ones")
    x = rng.normal(0, 2, (3, 4)).astype("float32")
    layer.build((None, 4))
    layer.enable_lora(2)
    layer.lora_kernel_b.assign(rng.normal(0, 0.5, (2, 6)).astype("float32"))
    bounds = np.array([[-1.0, 0.5, -0.3, 0.7], [-0.2, 2.0, -9.0, 9.0], [-9.0, 9.0, -1.0, 0.1]], "float32")
    kernel, bias = keras.ops.convert_to_numpy(layer.kernel), keras.ops.convert_to_numpy(layer.bias)
    expected = np.concatenate([np.clip(np.clip(x, lo, hi) @ kernel[:, 2 * g:2 * g + 2] + bias[2 * g:2 * g + 2],
                                       out_lo, out_hi) for g, (lo, hi, out_lo, out_hi) in enumerate(bounds)], -1)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(clamped_projection(layer, x, bounds)), expected, atol=1e-6)
    quantized = Dense(6, kernel_initializer="glorot_uniform")
    quantized.build((None, 4))
    plain = keras.ops.convert_to_numpy(clamped_projection(quantized, x, bounds))
    quantized.quantize("int8")
    assert np.abs(keras.ops.convert_to_numpy(clamped_projection(quantized, x, bounds)) - plain).max() < 0.05


def tiny(**changes):
    return keras_vit.ViT(**{**dict(image_size=48, patch_size=8, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=32),
                            **GEMMA4_SWITCHES, **changes})


@pytest.mark.backend_independent
@pytest.mark.parametrize("changes, message", [
    (dict(rope_rotate_half=False),
     "rope_axis_halves (Gemma 4's RoPE) turns each axis' half of the head by its halves: it needs rope (axial) and "
     "rope_rotate_half=True."),
    (dict(sandwich_norm=True, post_norm=True),
     "sandwich_norm=True adds a norm after each branch of a pre-norm block: it is not supported with post_norm or "
     "parallel."),
    (dict(class_token=True, classifier="token"),
     "axis_position_table and soft_token_pool (Gemma 4's) take the patch grid alone: they need class_token=False, no "
     "register or distillation tokens, and position_embedding=False."),
    (dict(soft_token_standardize=True),
     "soft_token_standardize standardises Gemma 4's soft tokens: it needs soft_token_pool."),
    (dict(final_norm_scale=False, normalization="layer_norm"),
     "final_norm_scale=False (Gemma 4's classifier norm) is an RMSNorm without a gain: it needs "
     "normalization='rms_norm'."),
    (dict(attention_scale=0.0),
     "attention_scale must be a finite number > 0, or None for 1 / sqrt(head_dim); got 0.0."),
    (dict(value_norm=False, differential_attention=True, rope=None, rope_axis_halves=False),
     "value_norm, clipped_linears and attention_scale (Gemma 4's) are not supported with differential attention, "
     "talking heads or parallel blocks (no timm architecture combines them)."),
    (dict(naflex=True),
     "Gemma 4's position tables and soft tokens (axis_position_table, soft_token_pool) take whole images here, at any "
     "size: build the model without naflex=True."),
    (dict(image_size=32, soft_token_pool=3),
     "Gemma 4's soft tokens pool 3x3 cells of patches, but the patch grid is 4x4: give an image whose sides are "
     "multiples of the patch size times 3."),
])
def test_gemma4_switches_refuse_what_they_cannot_be_in_one_line(changes, message):
    with pytest.raises(ValueError) as error:
        tiny(**changes)
    assert message in str(error.value)


@pytest.mark.backend_independent
@pytest.mark.parametrize("case, change, message", [
    ("classifier_clipped", dict(global_pool="token"),
     "{config}: global_pool is 'token'; keras_vit computes timm's Gemma4VitClassifier with 'avg' (a classifier's "
     "head on every token, unpooled, is not computed)."),
    ("classifier_clipped", dict(head_dim=8),
     "{config}: head_dim 8 times num_heads 2 is not embed_dim 32; keras_vit's heads split the width evenly, as every "
     "Gemma 4 tower's do."),
    ("classifier_clipped", dict(use_clipped_linears=False),
     "{path} has 56 tensors that the model its config.json describes (architecture: \"gemma4_vit_167m\", depth: 2, "
     "use_clipped_linears: false, standardize: false) has not: ['blocks.0.attn.k_proj.input_max', "),
    ("encoder_soft_grouped", dict(position_embedding_size=64),
     "{path}: 'patch_embed.position_embedding_table' has shape (2, 32, 32), but the config's embed_dim 32, "
     "intermediate_size 24 and position_embedding_size 64 expects (2, 64, 32). Nothing was loaded."),
    ("encoder_soft_grouped", dict(num_kv_heads=[1, 1]),  # what save_timm wrote before 2026-12-07
     "{config}: model_args.num_kv_heads is [1, 1]; timm's Gemma4VitEncoder takes one positive int, every block's (or "
     "null: as many as num_heads)."),
    ("encoder_soft_grouped", dict(pooling_kernel_size=4),
     "{config}: model_args.pooling_kernel_size 4 does not divide the 6x9 patch grid of its image size [48, 72]: "
     "Gemma 4's soft tokens pool 4x4 cells of patches. Nothing was loaded."),
    ("encoder_soft_grouped", dict(intermediate_size=12),
     "{path}: 'blocks.0.mlp.gate_proj.linear.weight' has shape (48, 32), but the config's embed_dim 32, "
     "intermediate_size 12 expects (24, 32). Nothing was loaded."),
])
def test_a_gemma4_folder_whose_config_says_another_model_is_refused(case, change, message, tmp_path):
    target = tmp_path / "gemma4"
    shutil.copytree(folder(case), target)
    config = json.loads((target / "config.json").read_text())
    config["model_args"].update(change)
    (target / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError) as error:
        keras_vit.from_pretrained(str(target))
    assert str(error.value).startswith(message.format(path=target / "model.safetensors",
                                                      config=target / "config.json"))


@pytest.mark.backend_independent
def test_save_timm_of_a_gemma4_tower_needs_its_name(tmp_path):
    model = load("classifier_clipped")
    with pytest.raises(CheckpointError) as error:
        checkpoints.save_timm(model, str(tmp_path / "model.safetensors"))
    assert str(error.value) == (f"{model.name} has Gemma 4's position tables or sandwich norms, as timm's Gemma4Vit "
                                "classes: pass architecture= the name it is (gemma4_vit_167m, gemma4_vit_167m_enc, "
                                "gemma4_vit_570m, gemma4_vit_570m_enc).")
    assert not os.listdir(tmp_path)


@pytest.mark.backend_independent
def test_timms_pixel_statistics_are_the_models_own_scaling_after_them():
    """timm's mean 0 and std 1, then the model's 2 * (x - 0.5): keras_vit's [-1, 1] input, no normalisation layer."""
    model = load("classifier_clipped")
    assert "input_normalization" not in [layer.name for layer in model.layers]
    transform = keras_vit.eval_transform(model)
    assert (transform.interpolation, transform.crop_fraction, transform.crop_mode) == ("bicubic", 1.0, "center")


@pytest.mark.backend_independent
def test_the_patch_budget_is_transformers_size_rule():
    from keras_vit.data.preprocessing import patch_budget_size

    with open(fixture("gemma4_patch_budget_sizes.json")) as f:
        rules = json.load(f)
    found = [[*rule[:5], list(patch_budget_size(*rule[:5]))] for rule in rules]
    assert found == rules


@pytest.mark.backend_independent
@pytest.mark.parametrize("index", [0, 1])
def test_gemma4s_processor_resizes_a_photo_whole_to_its_patch_budget(index):
    """transformers' Gemma4ImageProcessor (its Pillow backend), 4-pixel patches, 70 soft tokens: one photo enlarged,
    one shrunk."""
    from keras_vit.data import preprocessing

    transform, normalisation = preprocessing.gemma4_from_preprocessor_config({
        "image_processor_type": "Gemma4ImageProcessorPil", "patch_size": 4, "max_soft_tokens": 70,
        "pooling_kernel_size": 3, "do_normalize": False, "image_mean": [0, 0, 0], "image_std": [1, 1, 1],
        "resample": 3, "do_rescale": True, "rescale_factor": 1 / 255, "do_resize": True, "do_convert_rgb": True},
        "preprocessor_config.json", 4)
    assert normalisation is None and transform.patch_budget == (630, 4, 3)
    pixels = transform.pixels(REFERENCE[f"processor/photo_{index}"])
    np.testing.assert_array_equal(pixels, REFERENCE[f"processor/pixels_{index}"])


@pytest.mark.backend_independent
def test_a_gemma4_folder_runs_at_the_size_of_each_photo(tmp_path):
    """The folder's processor gives each photo its size within the budget; the model takes them all."""
    assert keras_vit.eval_transform(keras_vit.from_pretrained(TRANSFORMERS)).patch_budget == (2520, 8, 3)  # defaults
    target = tmp_path / "gemma4"
    shutil.copytree(TRANSFORMERS, target)
    (target / "preprocessor_config.json").write_text(json.dumps({"max_soft_tokens": 70}))
    model = keras_vit.from_pretrained(str(target))
    transform = keras_vit.eval_transform(model)
    assert not model.architecture.normalizes_input
    for shape, size in (((300, 400, 3), (168, 216)), ((90, 60, 3), (240, 144))):  # transformers' sizes
        image = transform(np.zeros(shape, "uint8"))
        assert image.shape == (*size, 3)
        assert predict(model, image[None]).shape == (1, (size[0] // 24) * (size[1] // 24), 32)


@pytest.mark.backend_independent
@pytest.mark.parametrize("change, message", [
    (dict(do_resize=False), "do_resize False: keras_vit resizes every image to Gemma 4's patch budget "
                            "(max_soft_tokens)."),
    (dict(patch_size=16), "patch_size is 16, but the model's patches are 8 pixels: set it to the model's."),
    (dict(max_soft_tokens=0), "max_soft_tokens is 0; expected a positive int."),
    (dict(size={"height": 224, "width": 224}), "field 'size' is not one keras_vit computes"),
])
def test_a_gemma4_processor_keras_vit_does_not_compute_is_refused(change, message, tmp_path):
    target = tmp_path / "gemma4"
    shutil.copytree(TRANSFORMERS, target)
    (target / "preprocessor_config.json").write_text(json.dumps(change))
    with pytest.raises(CheckpointError) as error:
        keras_vit.from_pretrained(str(target))
    assert str(error.value).startswith(f"{target / 'preprocessor_config.json'}: {message}")


@pytest.mark.backend_independent
def test_infinite_clamp_bounds_load_as_no_clamp_and_nan_is_refused(tmp_path):
    """timm's and transformers' bounds before a checkpoint sets them are infinite: they load and save; NaN does not."""
    from safetensors.numpy import load_file, save_file

    target = tmp_path / "gemma4"
    shutil.copytree(folder("classifier_clipped"), target)
    tensors = load_file(str(target / "model.safetensors"))
    for name in tensors:
        if name.endswith(("_min", "_max")):
            tensors[name] = np.array(np.inf if name.endswith("_max") else -np.inf, "float32")
    save_file(tensors, str(target / "model.safetensors"))
    model = keras_vit.from_pretrained(str(target), classifier_activation=None)
    model.save(str(tmp_path / "model.keras"))
    again = keras_vit.from_pretrained(str(tmp_path / "model.keras"))
    images = REFERENCE["classifier_clipped/native/images"]
    np.testing.assert_array_equal(predict(again, images), predict(model, images))
    tensors["encoder.blocks.0.attn.q_proj.input_min"] = np.array(np.nan, "float32")
    save_file(tensors, str(target / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"'encoderblock_0/qkv_clip' \(the file's .*\) holds NaN or infinite "
                                              r"values\. Nothing was loaded\."):
        keras_vit.from_pretrained(str(target))


@pytest.mark.backend_independent
def test_a_gemma4_file_under_a_plain_vit_name_and_a_plain_vit_under_a_gemma4_name_are_refused(tmp_path):
    target = tmp_path / "renamed"
    shutil.copytree(folder("classifier_clipped"), target)
    config = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps(dict(config, architecture="vit_base_patch16_224", model_args={})))
    with pytest.raises(CheckpointError) as error:
        keras_vit.from_pretrained(str(target))
    assert "tensors that are not in timm's VisionTransformer layout" in str(error.value)
    plain = keras_vit.ViT(image_size=48, patch_size=8, hidden_size=32, num_layers=2, num_heads=2, mlp_dim=48, classes=5)
    vit = tmp_path / "vit"
    checkpoints.save_timm(plain, str(vit / "model.safetensors"))
    config = json.loads((vit / "config.json").read_text())
    (vit / "config.json").write_text(json.dumps(dict(config, architecture="gemma4_vit_167m",
                                                     model_args=CASES["classifier_clipped"]["model_args"])))
    with pytest.raises(CheckpointError) as error:
        keras_vit.from_pretrained(str(vit))
    assert str(error.value).startswith(f"{vit / 'model.safetensors'} lacks timm's patch projection or first block "
                                       "(patch_embed.input_proj.weight, blocks.0.mlp.down_proj.linear.weight). Nothing "
                                       "was loaded.")


@pytest.mark.backend_independent
def test_position_similarity_of_a_gemma4_tower_is_of_its_two_tables_sum():
    from keras_vit.tools import analysis

    model = load("classifier_clipped")
    table = keras.ops.convert_to_numpy(model.get_layer("axis_position_embedding").table).astype("float64")
    grid = (table[0][None, :6] + table[1][:6, None]).reshape(36, -1)  # column's row plus row's row, row-major
    unit = grid / np.linalg.norm(grid, axis=-1, keepdims=True)
    np.testing.assert_allclose(analysis.position_embedding_similarity(model), (unit @ unit.T).reshape(6, 6, 6, 6),
                               atol=1e-6)


@pytest.mark.backend_independent
def test_masked_patch_pretraining_refuses_soft_tokens_and_names_the_tower_without_them():
    tower = keras_vit.ViT(image_size=48, patch_size=8, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=32,
                          include_top=False, soft_token_pool=3, **GEMMA4_SWITCHES)
    with pytest.raises(ValueError) as error:
        keras_vit.MaskedPatchPretrainer(tower)
    assert str(error.value) == (f"{tower.name!r} gives Gemma 4's soft tokens, pooled from the patches, and "
                                "masked-patch prediction reads each patch's token: pretrain the tower without its "
                                "pooling (soft_token_pool=0), whose weights are the same, then build it with the "
                                "pooling.")
    keras_vit.MaskedPatchPretrainer(keras_vit.ViT(image_size=48, patch_size=8, hidden_size=16, num_layers=1,
                                                  num_heads=2, mlp_dim=32, include_top=False, **GEMMA4_SWITCHES))
