"""timm's hybrids load exactly: the ResNet ones (`vit_*_r50_*`, `vit_*_r26_*`, `vit_tiny_r_s16_p8_*`) into keras_vit's
ResNet hybrid, MobileCLIP's (`vit_base_mci_224`) into `keras_vit.layers.conv_stem`, ViTamin's (`vitamin_*`, with its
GeGLU MLPs) into `keras_vit.layers.mbconv`.

The folders in `fixtures/timm_hybrid/` were written by timm's own `save_for_hf` from tiny hybrids with random
values in every tensor and read back by timm (`tools/timm_hybrid_fixtures.py`); the references are timm's.
"""

import dataclasses
import json
import os
import shutil

import keras
import numpy as np
import pytest
from conftest import fixture

import keras_vit
from keras_vit import CheckpointError, checkpoints

pytest.importorskip("safetensors")
from safetensors.numpy import load_file, save_file  # noqa: E402

HYBRID = fixture("timm_hybrid")
CASES = ("resnet", "stem_only", "conv_stem", "mbconv")


@pytest.fixture(scope="module")
def reference():
    with np.load(fixture("timm_hybrid_reference.npz")) as data:
        return {key: data[key] for key in data.files}


def load(folder, **overrides):
    return keras_vit.from_pretrained(str(folder), classifier_activation=None, **overrides)


@pytest.mark.parametrize("case", CASES)
def test_timm_hybrid_folder_gives_timms_logits(case, reference):
    model = load(os.path.join(HYBRID, case))
    logits = keras.ops.convert_to_numpy(model(reference[f"{case}/images"]))
    expected = reference[f"{case}/outputs"]
    np.testing.assert_allclose(logits, expected, atol=1e-4 * np.abs(expected).max())


@pytest.mark.backend_independent
@pytest.mark.parametrize("case", CASES)
def test_timm_hybrid_saves_back_in_timms_names_and_reloads_from_keras(case, reference, tmp_path):
    model = load(os.path.join(HYBRID, case))
    assert checkpoints.architecture_of(model).resnet_epsilons == ("timm" if case in ("resnet", "stem_only") else
                                                                  "flax")
    architecture = json.loads((open(os.path.join(HYBRID, case, "config.json")).read()))["architecture"]
    refused = {  # timm's model functions build these stems wider and take no config.json argument for them
        "conv_stem": r"ConvStem has widths \(8, 8\) before a 24-wide ViT, but timm's 'vit_base_mci_224' builds "
                     r"\(192, 192\) before 768 and takes no",
        "mbconv": r"MbConv stem has widths \(8, 8, 16\) and depths \(1, 2\) before a 24-wide ViT, but timm's "
                  r"'vitamin_small_224' builds \(64, 64, 128\) and \(2, 4\) before 384 and takes no config.json",
    }
    if case in refused:  # timm's names are written whole all the same
        with pytest.raises(CheckpointError, match=refused[case]):
            checkpoints.save_timm(model, tmp_path / "model.safetensors", architecture=architecture)
        written = checkpoints.to_timm(model, architecture)
        original = load_file(os.path.join(HYBRID, case, "model.safetensors"))
        assert sorted(written) == sorted(original)
        for name in original:
            np.testing.assert_allclose(written[name], original[name], atol=1e-6, err_msg=name)
    elif case == "stem_only":  # timm rebuilds it from its name alone; the tiny ResNetV2 is not the name's R50
        checkpoints.save_timm(model, tmp_path / "model.safetensors", architecture=architecture)
        written, original = load_file(tmp_path / "model.safetensors"), load_file(
            os.path.join(HYBRID, case, "model.safetensors"))
        assert sorted(written) == sorted(original)
        for name in original:
            np.testing.assert_allclose(written[name], original[name], atol=1e-6, err_msg=name)
    else:
        with pytest.raises(CheckpointError, match=r"builds \(3, 4, 9\) on a 64-wide stem and takes no argument"):
            checkpoints.save_timm(model, tmp_path / "model.safetensors", architecture=architecture)
    model.save(tmp_path / "hybrid.keras")
    again = keras_vit.from_pretrained(str(tmp_path / "hybrid.keras"))
    images = reference[f"{case}/images"]
    np.testing.assert_allclose(keras.ops.convert_to_numpy(again(images)), keras.ops.convert_to_numpy(model(images)),
                               atol=1e-6)


def broken(tmp_path, change, case="resnet"):
    folder = tmp_path / case
    shutil.copytree(os.path.join(HYBRID, case), folder)
    tensors = load_file(folder / "model.safetensors")
    change(tensors)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def drop(prefix):
    def change(tensors):
        for name in [name for name in tensors if name.startswith(prefix)]:
            del tensors[name]
    return change


def narrow_norm(tensors):
    for field in ("weight", "bias"):
        tensors[f"patch_embed.backbone.stages.0.blocks.0.norm1.{field}"] = np.ones(48, "float32")


NOT_WHOLE = "the file is not whole: load the complete checkpoint (timm's save_for_hf writes every tensor). Nothing was " \
            "loaded."


@pytest.mark.backend_independent
@pytest.mark.parametrize("case, change, message", [
    ("resnet", drop("patch_embed.backbone.stages.1."),
     "patch_embed.proj.weight takes 256 channels, but the hybrid's ResNet ends in its last stage "
     "(patch_embed.backbone.stages.0) with 128: a stage is missing or the tensors are of two models. "
     "Nothing was loaded."),
    ("resnet", drop("patch_embed.backbone.stages.0.blocks.0.downsample.conv."),
     "the hybrid's ResNet lacks ['patch_embed.backbone.stages.0.blocks.0.downsample.conv.weight'] (timm's "
     "ResNetStage projects the shortcut in the first block of every stage). Nothing was loaded."),
    ("resnet", narrow_norm,
     "patch_embed.backbone.stages.0.blocks.0.norm1.weight has 48 channels, which GroupNorm's 32 groups (timm's "
     "GroupNormAct in every hybrid) do not divide. Nothing was loaded."),
    ("resnet", drop("patch_embed.backbone.stem.norm."),
     "the hybrid's ResNet stem lacks ['patch_embed.backbone.stem.norm.weight', 'patch_embed.backbone.stem.norm.bias']. "
     "Nothing was loaded."),
    ("mbconv", drop("patch_embed.backbone.stages.1."),
     "ViTamin's MbConv stem lacks stage 1 (no patch_embed.backbone.stages.1.* tensors; timm's MbConvStages has 2); "
     + NOT_WHOLE),
    ("mbconv", drop("patch_embed.backbone.stages.1.0."),
     "ViTamin's MbConv stem lacks stage 1's block 0 (patch_embed.backbone.stages.1.0.*) before its block 1; "
     + NOT_WHOLE),
    ("mbconv", drop("patch_embed.backbone.stages.1.0.shortcut.expand.weight"),
     "ViTamin's MbConv stem lacks ['patch_embed.backbone.stages.1.0.shortcut.expand.weight']; " + NOT_WHOLE),
], ids=["last_stage_missing", "downsample_missing", "group_count", "stem_norm_missing", "mbconv_stage_missing",
        "mbconv_block_missing", "mbconv_shortcut_missing"])
def test_a_hybrid_that_is_not_whole_is_refused_naming_its_tensors(tmp_path, case, change, message):
    folder = broken(tmp_path, change, case)
    with pytest.raises(CheckpointError) as error:
        load(folder)
    assert str(error.value) == f"{folder}/model.safetensors: {message}"


@pytest.mark.backend_independent
def test_timms_vitamin_stem_missing_a_stages_last_block_is_refused(tmp_path, monkeypatch):
    """A stem of timm's widths for its name must have timm's block counts: without its last block a stage would
    load shallower, the outputs wrong. (The fixture's stem is small; the name's entry is made to match it.)"""
    from keras_vit.checkpoints.timm import families
    from keras_vit.model.description import mbconv_of

    model = load(os.path.join(HYBRID, "mbconv"))
    widths, depths = mbconv_of({v.path: v for v in model.weights})
    assert depths == (1, 2)
    entry = families.ARCHITECTURES["vitamin_small_224"]
    monkeypatch.setitem(families.ARCHITECTURES, "vitamin_small_224",
                        dataclasses.replace(entry, mbconv=(widths, depths)))
    load(os.path.join(HYBRID, "mbconv"))  # whole: loads
    folder = broken(tmp_path, drop("patch_embed.backbone.stages.1.1."), "mbconv")
    with pytest.raises(CheckpointError) as error:
        load(folder)
    assert str(error.value) == (
        f"{folder}/model.safetensors: ViTamin's MbConv stem has [1, 1] blocks in its stages "
        "(patch_embed.backbone.stages.<stage>.<block>.*), but timm's 'vitamin_small_224' builds [1, 2]; the file is "
        "not whole: load the complete checkpoint. Nothing was loaded.")


@pytest.mark.backend_independent
def test_hybrid_tensors_under_a_plain_vits_name_are_refused(tmp_path):
    folder = tmp_path / "resnet"
    shutil.copytree(os.path.join(HYBRID, "resnet"), folder)
    config = json.loads((folder / "config.json").read_text())
    config["architecture"] = "vit_base_patch16_224"
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError) as error:
        load(folder)
    assert str(error.value) == (
        f"{folder}/model.safetensors holds a hybrid on a ResNetV2 (patch_embed.backbone.stem.*, stages.*), but timm's "
        "'vit_base_patch16_224' is a plain ViT (no patch_embed.backbone.*). Nothing was loaded.")


@pytest.mark.skipif(keras.backend.backend() == "tensorflow", reason="exported on tensorflow (below)")
def test_onnx_export_of_a_hybrid_off_tensorflow_is_refused_naming_the_backend_that_exports_it(tmp_path):
    model = load(os.path.join(HYBRID, "resnet"))
    with pytest.raises(ValueError, match=rf"is a hybrid, whose ResNet the {keras.backend.backend()} backend does not "
                                         r"export to ONNX correctly: export it on the tensorflow backend"):
        model.export(str(tmp_path / "hybrid.onnx"), format="onnx")
    assert not os.listdir(tmp_path)


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="the backend that exports a hybrid to ONNX")
@pytest.mark.parametrize("case", ["resnet", "conv_stem"])
def test_onnx_export_of_a_timm_hybrid_gives_timms_logits(case, reference, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("tf2onnx")
    path = str(tmp_path / "hybrid.onnx")
    load(os.path.join(HYBRID, case)).export(path, format="onnx", verbose=False)
    session = ort.InferenceSession(path)
    found = session.run(None, {session.get_inputs()[0].name: reference[f"{case}/images"]})[0]
    expected = reference[f"{case}/outputs"]
    np.testing.assert_allclose(found, expected, atol=1e-4 * np.abs(expected).max())


@pytest.mark.backend_independent
def test_a_conv_stem_that_is_not_whole_or_not_the_names_is_refused(tmp_path):
    folder = tmp_path / "conv_stem"
    shutil.copytree(os.path.join(HYBRID, "conv_stem"), folder)
    tensors = load_file(folder / "model.safetensors")
    del tensors["patch_embed.backbone.1.bn.running_var"]
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError) as error:
        load(folder)
    assert str(error.value) == (f"{folder}/model.safetensors: MobileCLIP's ConvStem lacks "
                                "['patch_embed.backbone.1.bn.running_var']. Nothing was loaded.")
    shutil.copy(os.path.join(HYBRID, "conv_stem", "model.safetensors"), folder / "model.safetensors")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(dict(config, architecture="vit_base_patch16_224")))
    with pytest.raises(CheckpointError) as error:
        load(folder)
    assert str(error.value) == (
        f"{folder}/model.safetensors holds a hybrid on MobileCLIP's ConvStem (patch_embed.backbone.0.conv, 1.conv, "
        "2.conv), but timm's 'vit_base_patch16_224' is a plain ViT (no patch_embed.backbone.*). Nothing was loaded.")


@pytest.mark.backend_independent
def test_the_stems_convolutions_span_the_stride_the_sizes_table_counts():
    import math

    from keras_vit.layers import conv_stem
    from keras_vit.model import variants

    assert math.prod(conv_stem.KERNELS) == variants.CONV_STEM_STRIDE


@pytest.mark.backend_independent
@pytest.mark.parametrize("case, name, found, expected", [
    ("resnet", "patch_embed.backbone.stages.0.blocks.0.norm1.bias", 34, 32),
    ("stem_only", "patch_embed.backbone.norm.bias", 66, 64),
    ("conv_stem", "patch_embed.backbone.0.bn.bias", 10, 8),
    ("mbconv", "patch_embed.backbone.stem.norm1.bias", 10, 8),
])
def test_a_stem_tensor_of_another_shape_is_refused_in_the_files_own_name(case, name, found, expected, tmp_path):
    folder = tmp_path / case
    shutil.copytree(os.path.join(HYBRID, case), folder)
    tensors = load_file(folder / "model.safetensors")
    tensors[name] = np.concatenate([tensors[name], tensors[name][:found - expected]])
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(CheckpointError, match=rf"^{folder}/model.safetensors: '{name}' has shape \({found},\) but the "
                                              rf"model expects \({expected},\); the file has hidden size \d+\. Nothing "
                                              r"was loaded\.$"):
        keras_vit.from_pretrained(str(folder))
