"""timm's words over keras_vit: `list_models`, `create_model(name, pretrained=..., num_classes=..., global_pool=...,
features_only=...)` and `pretrained_cfg` give timm's model, names, features and shapes, per family.

The fixtures are timm's own folders (`tools/make_*_fixtures.py`) with timm's outputs: the logits of the model with
its head, and `forward_features` (the tokens, SAM's neck map channels first).
"""

import json

import keras
import numpy as np
import pytest
from conftest import fixture
from timm_class_checks import write_timm_hub_cache

import keras_vit
from keras_vit import CheckpointError

pytestmark = pytest.mark.backend_independent

# family -> (its timm folder, the reference file, its case there)
FAMILIES = {
    "Beit": ("timm_beit/beit_v1", "timm_beit_reference", "beit_v1"),
    "VisionTransformerRelPos": ("timm_relpos/table_cls_gap", "timm_relpos_reference", "table_cls_gap"),
    "Cait": ("timm_cait/token", "timm_cait_reference", "token"),
    "VisionTransformerSAM": ("timm_sam/windowed_neck", "timm_sam_reference", "windowed_neck"),
    "Gemma4VitClassifier": ("timm_gemma4/classifier_clipped", "gemma4_reference", "classifier_clipped"),
    "Eva": ("timm_eva/eva02_axial", "timm_eva_reference", "eva02_axial"),
}


def numpy(tensor):
    return np.asarray(keras.ops.convert_to_numpy(tensor))


def within(found, expected, share=1e-5):
    """Equal to 1e-5 of the outputs' scale, of 1 where they are smaller (Gemma 4's tokens run to tens)."""
    np.testing.assert_allclose(found, expected, atol=share * max(1.0, np.abs(expected).max()), rtol=0)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_create_model_gives_timms_model_features_and_shapes(family):
    folder, reference, case = FAMILIES[family]
    name = json.loads(open(fixture(f"{folder}/config.json")).read())["architecture"]
    with np.load(fixture(f"{reference}.npz")) as data:
        images, logits = data[f"{case}/native/images"], data[f"{case}/native/logits"]
        features, tokens = data.get(f"{case}/native/features"), data.get(f"{case}/native/tokens")
        tokens = tokens if features is None else features.transpose(0, 2, 3, 1)  # Eva's fixture keeps the logits
    model = keras_vit.create_model(name, pretrained=fixture(folder), classifier_activation=None)
    assert model.name == name  # timm's, not keras_vit's "vit" (before 2026-12-07)
    within(numpy(model(images)), logits)
    if tokens is not None:  # global_pool="": timm's forward_features, its shape too (SAM's neck map channels last)
        within(numpy(keras_vit.create_model(name, pretrained=fixture(folder), num_classes=0, global_pool="")(images)),
               tokens, 1e-4 if family.startswith("Gemma4") else 1e-5)
    # num_classes=0: timm's pooled features, fc_norm included: the head maps them to the logits
    pooled = numpy(keras_vit.create_model(name, pretrained=fixture(folder), num_classes=0)(images))
    head = model.get_layer("head")
    within(pooled @ numpy(head.kernel) + numpy(head.bias), logits)
    new_head = keras_vit.create_model(name, pretrained=fixture(folder), num_classes=3)
    assert new_head.output_shape == (None, 3) and new_head.get_layer("predictions").activation.__name__ == "linear"


def test_features_only_gives_the_blocks_maps_and_pretrained_cfg_the_checkpoints_preprocessing():
    folder = fixture("timm_beit/beitv2_nonsquare")  # timm's: 32x48 px, bicubic, crop 0.9, ImageNet's statistics
    maps = keras_vit.create_model("beitv2_base_patch16_224", pretrained=folder, features_only=True, out_indices=(0,))
    model = keras_vit.create_model("beitv2_base_patch16_224", pretrained=folder)
    assert maps.output_shape == (None, 4, 6, 32)
    assert model.pretrained_cfg == {"input_size": (3, 32, 48), "interpolation": "bicubic", "crop_pct": 0.9,
                                    "crop_mode": "center", "mean": (0.485, 0.456, 0.406),
                                    "std": (0.229, 0.224, 0.225)}
    images = np.random.default_rng(0).uniform(-1, 1, (1, 32, 48, 3)).astype("float32")
    block = keras.Model(model.input, model.get_layer("encoderblock_0").output)
    np.testing.assert_array_equal(numpy(maps(images)), numpy(block(images))[:, 1:].reshape(1, 4, 6, 32))


def test_list_models_lists_what_keras_vit_computes_with_timms_wildcards():
    registry = json.loads(open(fixture("timm_registry.json")).read())["architectures"]
    names = keras_vit.list_models()
    assert len(names) == 315 and set(names) <= set(registry)
    assert keras_vit.list_models("cait_*") == sorted(name for name, entry in registry.items()
                                                     if entry["class"] == "Cait")


@pytest.mark.parametrize("call, message", [
    (dict(model_name="beitv2_base_patch16_224"),
     "create_model('beitv2_base_patch16_224') builds a timm architecture from its checkpoint: pass pretrained=True "
     "(timm's Hub repository) or a folder, file or hf:// handle; keras_vit.ViT(...) builds a model of any sizes with "
     "random weights."),
    (dict(model_name="beitv2_base_patch16_224", pretrained=True),
     "create_model('beitv2_base_patch16_224', pretrained=True): name its pretrained tag, "
     "'beitv2_base_patch16_224.<tag>' (timm.list_pretrained('beitv2_base_patch16_224.*') lists them): keras_vit "
     "reads timm's Hub repository of that tag."),
    (dict(model_name="convnext_tiny", pretrained=True),
     "keras_vit computes no timm architecture 'convnext_tiny' (keras_vit.list_models(filter) lists them)."),
    (dict(model_name="vit_base_patch16_224", pretrained=fixture("timm_beit/beit_v1")),
     f"{fixture('timm_beit/beit_v1')} holds timm's 'beit_base_patch16_224', not 'vit_base_patch16_224': name the "
     "architecture it holds, create_model('beit_base_patch16_224', pretrained=...)."),
])
def test_create_model_refuses_in_one_line(call, message):
    with pytest.raises(CheckpointError) as error:
        keras_vit.create_model(**call)
    assert str(error.value) == message


def test_pretrained_true_reads_timms_hub_repository_of_the_tag(tmp_path):
    pytest.importorskip("huggingface_hub")
    from test_pretrained import run_offline

    tag = ("beit_base_patch16_224", "in22k_ft_in22k_in1k")
    write_timm_hub_cache(tmp_path / "hub", [tag], lambda name: fixture("timm_beit/beit_v1"))
    done = run_offline(tmp_path / "hub", (
        "import numpy as np, keras, keras_vit\n"
        f"data = np.load({fixture('timm_beit_reference.npz')!r})\n"
        "model = keras_vit.create_model('beit_base_patch16_224.in22k_ft_in22k_in1k', pretrained=True,\n"
        "                               classifier_activation=None)\n"
        "print(model.name, np.abs(keras.ops.convert_to_numpy(model(data['beit_v1/native/images']))\n"
        "                         - data['beit_v1/native/logits']).max())\n"))
    assert done.returncode == 0, done.stderr[-3000:]
    name, gap = done.stdout.split()[-2:]
    assert name == "beit_base_patch16_224" and float(gap) < 1e-5


def test_the_name_and_preprocessing_survive_convert_a_rebuild_and_a_lora_merge(tmp_path):
    """Every step after loading keeps what the checkpoint set: its name and eval transform (a rebuilt `.keras` and
    `keras-vit convert` named the model "vit", before 2026-12-07)."""
    from keras_vit import cli

    folder = fixture("timm_beit/beitv2_nonsquare")
    model = keras_vit.from_pretrained(folder, classes=3, class_names=["a", "b", "c"])
    model.save(tmp_path / "m.keras")
    rebuilt = keras_vit.from_pretrained(str(tmp_path / "m.keras"), classes=5)
    cli.main(["convert", folder, str(tmp_path / "c.keras")])
    converted = keras.saving.load_model(tmp_path / "c.keras")
    keras_vit.enable_lora(model, rank=2)
    merged = keras_vit.merge_lora(model)
    for found in (rebuilt, converted, merged):
        assert (found.name, found.eval_transform) == ("beitv2_base_patch16_224", model.eval_transform)
    assert merged.class_names == ["a", "b", "c"]
