"""transformers' layout: a ViTForImageClassification folder written by save_pretrained, read with equal logits."""

import json
import shutil

import keras
import numpy as np
import pytest

import keras_vit
from conftest import fixture, predict
from keras_vit import CheckpointError, cli

pytest.importorskip("safetensors")

FOLDER = fixture("transformers_vit")
SIZES = dict(image_size=32, patch_size=8, hidden_size=24, num_layers=2, mlp_dim=48, classifier_activation=None)


@pytest.fixture(scope="module")
def reference():
    with np.load(fixture("transformers_vit_reference.npz")) as data:
        return data["images"], data["logits"]


def test_folder_loads_with_transformers_logits_epsilon_gelu_and_labels(reference):
    images, logits = reference
    model = keras_vit.ViT(**SIZES, weights=FOLDER)
    block = model.get_layer("encoderblock_0")
    assert (block.num_heads, block.layer_norm_epsilon, block.approximate_gelu) == (3, 1e-12, False)
    assert model.get_layer("encoder_norm").epsilon == 1e-12
    np.testing.assert_allclose(predict(model, images), logits, atol=1e-5, rtol=0)
    source = keras_vit.checkpoints.read_weights(FOLDER, None, (32, 32))
    assert source.class_names == [f"digit {i}" for i in range(5)]


def test_from_pretrained_reads_every_size_and_takes_a_new_head(reference):
    images, logits = reference
    model = keras_vit.from_pretrained(FOLDER, classifier_activation=None)
    np.testing.assert_allclose(predict(model, images), logits, atol=1e-5, rtol=0)
    assert keras_vit.from_pretrained(FOLDER, classes=37).output_shape == (None, 37)


def test_model_carries_the_files_labels_to_decode_predictions_and_a_keras_file(reference, tmp_path):
    images, _ = reference
    model = keras_vit.from_pretrained(FOLDER, classifier_activation=None)
    assert model.class_names == [f"digit {i}" for i in range(5)]
    logits = predict(model, images)
    best = int(logits[0].argmax())
    top = keras_vit.decode_predictions(logits, top=2, class_names=model.class_names)[0]
    assert top[0] == (str(best), f"digit {best}", float(logits[0, best]))
    model.save(tmp_path / "labelled.keras")
    assert keras.saving.load_model(tmp_path / "labelled.keras").class_names == model.class_names
    # ... and a model built from that file keeps them; a new head has no names.
    assert keras_vit.from_pretrained(str(tmp_path / "labelled.keras")).class_names == model.class_names
    assert keras_vit.from_pretrained(FOLDER, classes=37).class_names is None
    with pytest.raises(ValueError, match=r"predictions of shape \(2, 5\) for 3 class names; expected \(batch, 3\)"):
        keras_vit.decode_predictions(logits, class_names=["a", "b", "c"])


def test_cli_predict_names_classes_by_the_checkpoints_labels(tmp_path, capsys):
    keras_vit.from_pretrained(FOLDER).save(tmp_path / "labelled.keras")
    image = (np.random.default_rng(0).uniform(size=(32, 32, 3)) * 255).astype("uint8")
    keras.utils.save_img(tmp_path / "x.png", image)
    (top,) = cli.main(["predict", "--weights", str(tmp_path / "labelled.keras"), str(tmp_path / "x.png")])
    assert {name for name, _ in top} == {f"digit {i}" for i in range(5)}


def test_vit_model_folder_gives_its_pooler_as_pre_logits(tmp_path):
    from safetensors.numpy import load_file, save_file

    folder = tmp_path / "vit_model"
    folder.mkdir()
    tensors = {name.removeprefix("vit."): value for name, value in load_file(f"{FOLDER}/model.safetensors").items()
               if not name.startswith("classifier.")}
    rng = np.random.default_rng(0)
    tensors["pooler.dense.weight"] = rng.normal(size=(24, 24)).astype("float32")
    tensors["pooler.dense.bias"] = rng.normal(size=(24,)).astype("float32")
    save_file(tensors, folder / "model.safetensors")
    config = json.load(open(f"{FOLDER}/config.json"))
    (folder / "config.json").write_text(json.dumps(dict(config, architectures=["ViTModel"])))
    model = keras_vit.from_pretrained(str(folder), include_top=False, pooling="token")
    assert model.output_shape == (None, 24)
    with_head = keras_vit.from_pretrained(str(folder), classes=3)
    np.testing.assert_array_equal(with_head.get_layer("pre_logits").get_weights()[0], tensors["pooler.dense.weight"].T)


def edited(tmp_path, change):
    folder = tmp_path / "edited"
    shutil.copytree(FOLDER, folder)
    config = json.loads((folder / "config.json").read_text())
    change(config)
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def test_configs_keras_vit_cannot_compute_are_refused_by_name(tmp_path):
    relu = edited(tmp_path, lambda c: c.update(hidden_act="relu"))
    with pytest.raises(CheckpointError, match="hidden_act 'relu' is not a GELU"):
        keras_vit.ViT(**SIZES, weights=relu)
    shutil.rmtree(relu)
    bert = edited(tmp_path, lambda c: c.update(model_type="bert"))
    with pytest.raises(CheckpointError, match=r"neither timm's \(architecture\) nor a transformers ViT, DINOv2, CLIP "
                                              r"or SigLIP model's \(model_type 'vit', 'dinov2', 'dinov2_with_registers', "
                                              r"'clip_vision_model', 'clip', 'siglip_vision_model', 'siglip'; "
                                              r"this one is 'bert'\)"):
        keras_vit.ViT(**SIZES, weights=bert)
    with pytest.raises(CheckpointError, match="is a folder without a readable config.json"):
        keras_vit.ViT(**SIZES, weights=str(tmp_path))


@pytest.mark.parametrize("case", ["transformers_dinov2", "transformers_dinov2_registers"])
def test_dinov2_folders_load_with_transformers_pooled_output_and_tokens(case):
    with np.load(fixture("transformers_dinov2_reference.npz")) as data:
        images, pooled, tokens = (data[f"{case}/{key}"] for key in ("images", "pooler_output", "last_hidden_state"))
    model = keras_vit.from_pretrained(fixture(case))  # headless: the normed class token, as pooler_output
    np.testing.assert_allclose(predict(model, images), pooled, atol=1e-5, rtol=0)
    sequence = keras_vit.from_pretrained(fixture(case), include_top=False, pooling=None)
    np.testing.assert_allclose(predict(sequence, images), tokens, atol=1e-5, rtol=0)


def test_a_folders_preprocessor_statistics_are_applied_to_the_minus_one_to_one_input(tmp_path):
    # transformers keeps the normalisation beside config.json; DINOv2's is ImageNet's. keras_vit takes
    # preprocess_input's [-1, 1] images and must hand the encoder exactly (pixel - mean) / std.
    with np.load(fixture("transformers_dinov2_reference.npz")) as data:
        normalised, pooled = data["transformers_dinov2/images"], data["transformers_dinov2/pooler_output"]
    folder = tmp_path / "dinov2"
    shutil.copytree(fixture("transformers_dinov2"), folder)
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    (folder / "preprocessor_config.json").write_text(json.dumps(
        {"image_processor_type": "BitImageProcessor", "image_mean": mean, "image_std": std}))
    model = keras_vit.from_pretrained(str(folder))
    images = ((normalised * np.array(std) + np.array(mean)) * 2 - 1).astype("float32")
    np.testing.assert_allclose(predict(model, images), pooled, atol=1e-5, rtol=0)
    assert keras_vit.checkpoints.architecture_of(model).input_std == tuple(std)

    (folder / "preprocessor_config.json").write_text(json.dumps({"image_mean": [0.5, 0.5], "image_std": std}))
    with pytest.raises(CheckpointError, match=r"preprocessor_config.json \(image_mean and image_std\): input_mean "
                                              r"must be three per-channel numbers on the \[0, 1\] pixel scale"):
        keras_vit.from_pretrained(str(folder))


@pytest.mark.parametrize("case", ["transformers_clip_vision", "transformers_siglip"])
def test_clip_and_siglip_vision_towers_load_with_transformers_pooled_output_and_tokens(case):
    # CLIPVisionModel: class token, pre_layrnorm, no patch bias, QuickGELU, OpenAI's pixel statistics. A whole
    # SiglipModel (its text tower left aside): no class token, attention pooling, tanh GELU. The images are in
    # [-1, 1]; transformers got them normalised by each folder's own preprocessor_config.json.
    with np.load(fixture("transformers_vision_towers_reference.npz")) as data:
        images, pooled, tokens = (data[f"{case}/{key}"] for key in ("images", "pooler_output", "last_hidden_state"))
    model = keras_vit.from_pretrained(fixture(case))
    np.testing.assert_allclose(predict(model, images), pooled, atol=1e-5, rtol=0)
    architecture = keras_vit.checkpoints.architecture_of(model)
    if case == "transformers_clip_vision":
        assert (architecture.norm_pre, architecture.patch_bias, architecture.mlp_activation) == (True, False, "quick_gelu")
        assert architecture.layer_norm_epsilon == 1e-5 and architecture.normalizes_input
        # CLIP's last_hidden_state is the blocks' output, before post_layernorm (which only the pooled token gets).
        sequence = keras_vit.from_pretrained(fixture(case), include_top=False, pooling=None)
        block_output = keras.Model(sequence.input, sequence.get_layer("encoder_norm").input)
        np.testing.assert_allclose(predict(block_output, images), tokens, atol=1e-5, rtol=0)
    else:
        assert (architecture.class_token, architecture.classifier, architecture.mlp_activation) == \
            (False, "map", "gelu_tanh") and not architecture.normalizes_input
        sequence = keras_vit.from_pretrained(fixture(case), include_top=False, pooling=None)
        np.testing.assert_allclose(predict(sequence, images), tokens, atol=1e-5, rtol=0)  # post_layernorm'd


def test_a_vision_tower_folder_with_tensors_of_another_layout_names_them(tmp_path):
    from safetensors.numpy import load_file, save_file

    folder = tmp_path / "clip"
    shutil.copytree(fixture("transformers_clip_vision"), folder)
    tensors = load_file(folder / "model.safetensors")
    tensors["encoder.layers.0.self_attn.q_norm.weight"] = np.ones(8, "float32")
    tensors["encoder.layers.0.self_attn.q_proj.lora_A.weight"] = np.ones((2, 24), "float32")  # a PEFT adapter
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"has 2 tensors that are not in transformers' CLIP or SigLIP vision "
                                              r"layout: \['encoder.layers.0.self_attn.q_norm.weight', "
                                              r"'encoder.layers.0.self_attn.q_proj.lora_A.weight'\]"):
        keras_vit.from_pretrained(str(folder))
