"""timm's plain-ViT family (DINOv2, CLIP, SigLIP, DeiT, DeiT-III, register/gap, FlexiViT), read with timm's outputs.

Every folder in `fixtures/timm_family/` was written by timm's own `save_for_hf` from a tiny model with random
values in every tensor and read back by timm (`tools/make_family_fixtures.py`); the references are timm's.
"""

import json
import os
import shutil

import keras
import numpy as np
import pytest
from conftest import fixture, predict
from timm_class_checks import check_timm_takes_the_config

import keras_vit
from keras_vit import CheckpointError, checkpoints

pytest.importorskip("safetensors")

FAMILY = fixture("timm_family")
CASES = sorted(os.listdir(FAMILY))


@pytest.fixture(scope="module")
def reference():
    """timm's outputs, with its input images as keras_vit takes them: in [-1, 1].

    timm was given `(pixel - mean) / std` with each folder's own `pretrained_cfg` statistics (ImageNet's for
    DINOv2 and DeiT, OpenAI's for CLIP); keras_vit's `InputNormalization` must turn these back into exactly that.
    """
    with np.load(fixture("timm_family_reference.npz")) as data:
        found = {key: data[key] for key in data.files}
    for key in [key for key in found if key.endswith("images")]:
        with open(os.path.join(FAMILY, key.split("/")[0], "config.json")) as f:
            statistics = json.load(f)["pretrained_cfg"]
        mean, std = np.array(statistics["mean"]), np.array(statistics["std"])
        found[key] = ((found[key] * std + mean) * 2 - 1).astype("float32")
    return found


def load(folder, **overrides):
    return keras_vit.from_pretrained(str(folder), classifier_activation=None, **overrides)


def test_every_family_case_has_its_reference(reference):
    assert len(CASES) >= 16 and all(f"{case}/outputs" in reference for case in CASES)


# Cases of one setting over a block the other cases run on every backend (differential attention with qk_norm): one
# pass runs them.
SETTING_CASES = {"differential_qk_norm", "parallel_differential_qk_norm"}


@pytest.mark.parametrize("case", [pytest.param(case, marks=pytest.mark.backend_independent) if case in SETTING_CASES
                                  else case for case in CASES])
def test_timm_family_folder_loads_with_timms_outputs_and_saves_back_in_timms_names(case, reference, tmp_path):
    images, outputs = reference[f"{case}/images"], reference[f"{case}/outputs"]
    model = load(os.path.join(FAMILY, case))
    # Logits where the file has a head; timm's pooled features (num_classes=0) where it has none.
    np.testing.assert_allclose(predict(model, images), outputs, atol=1e-5, rtol=0)
    # save_timm writes exactly the names and shapes timm's model of this architecture has (what strict=True
    # checks), and beside them a config.json that states what timm's own does (the name, its model_args, the
    # pixel statistics and eval transform), from which the folder reads back alone as the same model.
    folder = tmp_path / case
    theirs = json.loads(open(os.path.join(FAMILY, case, "config.json")).read())
    checkpoints.save_timm(model, folder / "model.safetensors", architecture=theirs["architecture"])
    from safetensors.numpy import load_file

    written = {name: list(value.shape) for name, value in load_file(folder / "model.safetensors").items()}
    assert written == json.loads(str(reference[f"{case}/state_dict_shapes"]))
    ours = json.loads((folder / "config.json").read_text())
    assert {key: ours.get(key) for key in ("architecture", "num_classes", "num_features", "global_pool")} == \
        {key: theirs.get(key) for key in ("architecture", "num_classes", "num_features", "global_pool")}
    assert {key: ours["model_args"][key] for key in theirs.get("model_args", {}) if key != "in_chans"} == \
        {key: value for key, value in theirs.get("model_args", {}).items() if key != "in_chans"}
    stated = ("mean", "std", "interpolation", "crop_pct", "crop_mode", "num_classes")
    assert {key: ours["pretrained_cfg"][key] for key in stated} == {key: theirs["pretrained_cfg"][key] for key in stated}
    np.testing.assert_allclose(predict(load(folder), images), outputs, atol=1e-5, rtol=0)
    check_timm_takes_the_config(ours)


@pytest.mark.backend_independent
def test_convert_and_the_tools_build_a_file_at_its_own_size_that_its_patches_do_not_divide(tmp_path):
    # timm's so400m/14 at 384 px (here 46 px on 14-pixel patches) drops the last pixels, as from_pretrained does;
    # convert refused the file's own size without --drop-remainder.
    from keras_vit.tools import inference

    folder = os.path.join(FAMILY, "siglip_remainder")
    expected = load(folder)
    converted = inference.convert(folder, str(tmp_path / "remainder.keras"))
    inspected = inference.load_for_inference(folder, needs_head=False)
    for model in (converted, inspected):
        assert model.input_shape[1:3] == expected.input_shape[1:3] == (46, 46)
        assert model.get_layer("embedding").drop_remainder


# What the token sequence leaves out of the file, with the file's pooling: timm's forward_head applies it.
UNLOADED_POOLING = {"reg_gap": ("fc_norm", 2, "gap"), "siglip_map": ("attention_pool", 13, "map")}


@pytest.mark.parametrize("case", ["dinov2_reg", "clip_laion", "reg_gap", "siglip_map", "deit3"])
def test_token_sequence_equals_timms_forward_features_and_says_which_pooling_weights_it_leaves(
        case, reference, keras_vit_log):
    model = load(os.path.join(FAMILY, case), include_top=False, pooling=None)
    features = predict(model, reference[f"{case}/images"])
    np.testing.assert_allclose(features, reference[f"{case}/features"], atol=1e-5, rtol=0)
    notes = [record.getMessage() for record in keras_vit_log.records if "is not loaded" in record.getMessage()]
    if case not in UNLOADED_POOLING:
        assert notes == []
        return
    part, count, pooling = UNLOADED_POOLING[case]
    assert notes == [f"{FAMILY}/{case}/model.safetensors: {part} ({count} weights) is not loaded: it belongs to the "
                     f"checkpoint's {pooling!r} pooling (timm's forward_head), which the model does not apply; "
                     f"include_top=False with pooling={pooling!r} keeps it."]


def test_architecture_is_read_from_the_tensors_and_the_family_name():
    def architecture(case):
        return checkpoints.architecture_of(load(os.path.join(FAMILY, case)))

    dinov2_reg = architecture("dinov2_reg")
    assert (dinov2_reg.register_tokens, dinov2_reg.class_token_position_embedding, dinov2_reg.mlp_activation) == \
        (4, False, "gelu") and dinov2_reg.layer_scale is not None
    clip = architecture("clip_openai_quickgelu")
    assert (clip.norm_pre, clip.patch_bias, clip.mlp_activation, clip.layer_norm_epsilon) == \
        (True, False, "quick_gelu", 1e-5)
    siglip = architecture("siglip_map")
    assert (siglip.class_token, siglip.classifier) == (False, "map")
    reg_gap = architecture("reg_gap")
    assert (reg_gap.class_token, reg_gap.register_tokens, reg_gap.classifier, reg_gap.fc_norm) == (False, 4, "gap", True)
    assert architecture("class_token_gap").class_token and architecture("class_token_gap").classifier == "gap"
    assert architecture("dinov2_giant_swiglu").mlp_activation == "swiglu"
    assert not architecture("no_qkv_bias").qkv_bias and architecture("qk_norm").qk_norm
    # The pixel statistics come from pretrained_cfg: ImageNet's for DINOv2, OpenAI's for CLIP, none for SigLIP.
    assert (dinov2_reg.input_mean, dinov2_reg.input_std) == ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    assert clip.input_mean == (0.48145466, 0.4578275, 0.40821073) and not siglip.normalizes_input


def test_bad_pixel_statistics_in_the_config_name_the_file_and_the_field(tmp_path):
    folder = tmp_path / "deit"
    shutil.copytree(os.path.join(FAMILY, "deit"), folder)
    config = json.loads((folder / "config.json").read_text())
    config["pretrained_cfg"]["std"] = [0.229, 0.0, 0.225]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"deit/config.json: pretrained_cfg.std is \[0.229, 0.0, 0.225\]; a std "
                                              r"on the \[0, 1\] pixel scale is > 0.$"):
        load(folder)


def test_hub_folder_without_model_args_takes_its_settings_from_the_family_table(reference):
    model = load(os.path.join(FAMILY, "hub_no_model_args"))  # timm's test_vit2, as the Hub writes it
    architecture = checkpoints.architecture_of(model)
    assert model.get_layer("encoderblock_0").num_heads == 2 and len(model.get_layer("encoderblock_0").weights)
    assert (architecture.class_token, architecture.register_tokens, architecture.classifier, architecture.fc_norm) == \
        (False, 1, "gap", True)
    assert model.output_shape == (None, 64)  # no head: the pooled features


def test_headless_file_builds_the_feature_model_unless_classes_are_asked_for():
    folder = os.path.join(FAMILY, "siglip_map")
    assert load(folder).output_shape == (None, 24)
    assert "head" not in [layer.name for layer in load(folder).layers]
    assert load(folder, classes=5).output_shape == (None, 5)


def test_dynamic_resolution_with_registers_equals_timms_dynamic_img_size(reference):
    model = load(os.path.join(FAMILY, "dinov2_reg"), image_size=(None, None), position_embedding_antialias=True)
    outputs = predict(model, reference["dinov2_reg/dynamic_images"])
    np.testing.assert_allclose(outputs, reference["dinov2_reg/dynamic_outputs"], atol=1e-5, rtol=0)


def test_feature_extractor_equals_timms_forward_intermediates_on_a_register_model(reference):
    model = load(os.path.join(FAMILY, "dinov2_reg"), include_top=False, pooling=None)
    images = reference["dinov2_reg/images"]
    for norm, key in ((False, "intermediates"), (True, "intermediates_norm")):
        maps = keras_vit.feature_extractor(model, blocks=(0, 1), norm=norm)(images, training=False)
        expected = reference[f"dinov2_reg/{key}"].transpose(0, 1, 3, 4, 2)  # NCHW -> NHWC
        for found, want in zip(maps, expected):
            np.testing.assert_allclose(keras.ops.convert_to_numpy(found), want, atol=1e-5, rtol=0)


def test_attention_maps_and_inspect_read_the_model_with_registers(reference, tmp_path):
    model = load(os.path.join(FAMILY, "dinov2_reg"))
    attentions = keras_vit.tools.analysis.attention_weights(model, reference["dinov2_reg/images"])
    assert [a.shape for a in attentions] == [(2, 3, 21, 21)] * 2  # class token, 4 registers, 4x4 patches
    np.testing.assert_allclose(attentions[0].sum(-1), 1.0, atol=1e-5)
    pixels = ((reference["dinov2_reg/images"][0] + 1) * 127.5).astype("uint8")
    written = keras_vit.tools.analysis.inspect(model, pixels, str(tmp_path))
    assert {"attention_rollout", "mean_attention_distance", "position_embedding_similarity"} <= set(written)


@pytest.mark.parametrize("case", ["siglip_map", "dinov2_reg", "aimv2"])
def test_onnx_export_of_family_models_keeps_timms_outputs(case, reference, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("tf2onnx" if keras.backend.backend() in ("tensorflow", "jax") else "onnx")
    path = str(tmp_path / f"{case}.onnx")
    load(os.path.join(FAMILY, case)).export(path, format="onnx", verbose=False)
    session = ort.InferenceSession(path)
    images = reference[f"{case}/images"]
    found = session.run(None, {session.get_inputs()[0].name: images})[0]
    np.testing.assert_allclose(found, reference[f"{case}/outputs"], atol=1e-5, rtol=0)


@pytest.mark.backend_independent
def test_family_table_gives_what_the_tensors_cannot(tmp_path):
    from keras_vit.checkpoints.timm.families import timm_architecture, timm_switches_to_architecture

    assert timm_architecture("vit_giant_patch14_reg4_dinov2").num_heads == 24
    assert timm_architecture("vit_giant_patch14_reg1_tipsv2").num_heads == 24
    assert timm_architecture("vit_giant_patch16_radio_v3").num_heads == 24
    clip = timm_switches_to_architecture(timm_architecture("vit_giant_patch14_clip_224").switches)
    assert (clip["mlp_activation"], clip["layer_norm_epsilon"], clip["norm_pre"]) == ("gelu", 1e-5, True)

    def activation(name):
        return timm_switches_to_architecture(timm_architecture(name).switches)["mlp_activation"]

    assert activation("vit_so400m_patch16_siglip_256") == "gelu_tanh"  # SigLIP 2
    assert activation("vit_so400m_patch14_siglip_224") == "gelu"
    # Same tensor names, other blocks: a pre-norm DeiT named as the post-norm rpn is refused, not loaded wrong.
    folder = tmp_path / "rpn"
    shutil.copytree(os.path.join(FAMILY, "deit"), folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(dict(config, architecture="vit_base_patch16_rpn_224")))
    with pytest.raises(CheckpointError, match=r"config.json: timm's 'vit_base_patch16_rpn_224' with these model_args "
                                              r"is no model keras_vit can build: classifier='token' pools the class "
                                              r"token, but class_token=False has none"):
        keras_vit.from_pretrained(str(folder))
    config["model_args"].pop("global_pool")
    (folder / "config.json").write_text(json.dumps(dict(config, architecture="vit_base_patch16_rpn_224",
                                                        global_pool="avg")))
    with pytest.raises(CheckpointError, match=r"does not hold timm's 'vit_base_patch16_rpn_224' as its config.json "
                                              r"sets it: it has cls_token \(class_token=False\)"):
        keras_vit.from_pretrained(str(folder))


@pytest.mark.backend_independent
@pytest.mark.parametrize("case, switch, attention_shapes", [
    ("post_norm", "post_norm", [(2, 3, 16, 16)] * 2),
    ("inner_norms", "mlp_hidden_norm", [(2, 3, 17, 17)]),
    ("aimv2", "patch_norm", [(2, 3, 4, 4)]),
    ("differential", "differential_attention", [(2, 2, 17, 17)] * 2),
    ("parallel", "parallel", [(2, 2, 17, 17)] * 2),
])
def test_new_block_options_work_with_attention_maps_lora_int8_and_keras_files(case, switch, attention_shapes,
                                                                              reference, tmp_path):
    model = load(os.path.join(FAMILY, case))
    images, expected = reference[f"{case}/images"], reference[f"{case}/outputs"]
    assert getattr(checkpoints.architecture_of(model), switch)
    attentions = keras_vit.tools.analysis.attention_weights(model, images)
    assert [a.shape for a in attentions] == attention_shapes
    total = 1.0  # a softmax map's rows sum to 1; differential attention's to 1 - lambda (its second map's weight)
    if switch == "differential_attention":
        block = {name: keras.ops.convert_to_numpy(getattr(model.get_layer("encoderblock_0"), name))
                 for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")}
        total = 1.0 - (np.exp(np.sum(block["lambda_q1"] * block["lambda_k1"]))
                       - np.exp(np.sum(block["lambda_q2"] * block["lambda_k2"])) + 0.2)  # lambda_init at depth 0
    np.testing.assert_allclose(attentions[0].sum(-1), total, atol=1e-5)
    model.save(tmp_path / "model.keras")
    np.testing.assert_allclose(predict(keras_vit.from_pretrained(str(tmp_path / "model.keras"),
                                                                 classifier_activation=None), images), expected,
                               atol=1e-5, rtol=0)
    keras_vit.enable_lora(model, rank=2)
    np.testing.assert_allclose(predict(keras_vit.merge_lora(model), images), expected, atol=1e-5, rtol=0)
    quantized = load(os.path.join(FAMILY, case))
    quantized.quantize("int8")
    assert np.max(np.abs(predict(quantized, images) - expected)) < 0.1 * np.max(np.abs(expected))
