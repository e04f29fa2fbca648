"""transformers' layout: a ViTForImageClassification folder written by save_pretrained, read with equal logits."""

import json
import re
import shutil

import keras
import numpy as np
import pytest
from conftest import fixture, predict

import keras_vit
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
    probabilities = np.exp(logits[0] - logits[0].max()) / np.exp(logits[0] - logits[0].max()).sum()
    assert top[0] == (str(best), f"digit {best}", pytest.approx(probabilities[best]))  # logits: their softmax
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
    with pytest.raises(CheckpointError, match=r"neither timm's \(architecture\) nor a transformers ViT, DeiT, "
                       r"DINOv2, DINOv3, CLIP, SigLIP, SigLIP 2, BEiT, SAM vision or Gemma 4 model's \(model_type "
                       r"'vit', 'deit', 'dinov2', 'dinov2_with_registers', 'dinov3_vit', 'clip_vision_model', 'clip', "
                       r"'siglip_vision_model', 'siglip', 'siglip2_vision_model', 'siglip2', 'beit', "
                       r"'sam_vision_model', 'gemma4_vision', 'gemma4'; this one is 'bert'\)"):
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
    # The caller's classifier pools the file's tokens, its class token kept: "gap" is the mean of the patch tokens
    # (after the class token and the 4 registers), for the features and for a new head alike.
    patches = tokens[:, 5 if case.endswith("registers") else 1:]
    mean = keras_vit.from_pretrained(fixture(case), classifier="gap")
    np.testing.assert_allclose(predict(mean, images), patches.mean(axis=1), atol=1e-5, rtol=0)
    architecture = keras_vit.checkpoints.architecture_of(keras_vit.from_pretrained(fixture(case), classifier="gap",
                                                                                   classes=3))
    assert (architecture.class_token, architecture.classifier) == (True, "gap")


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
    with pytest.raises(CheckpointError, match=r"preprocessor_config.json: image_mean is \[0.5, 0.5\]; expected three "
                                              r"per-channel numbers on the \[0, 1\] pixel scale"):
        keras_vit.from_pretrained(str(folder))


@pytest.mark.parametrize("case", ["transformers_dinov2_crop", "transformers_dinov2_registers_crop"])
def test_a_dinov2_folder_runs_at_its_processors_crop_as_transformers_pipeline(case):
    # As published (facebook/dinov2-*: image_size 518, crop 224), shrunk: config.json's image_size is 64 (the
    # table's 8x8 grid), preprocessor_config.json crops 32. transformers' AutoImageProcessor gives 32-pixel images,
    # and Dinov2Model resizes its table to their grid on every call; keras_vit built the model at 64 px.
    with np.load(fixture("transformers_processor_crop_reference.npz")) as data:
        pooled = data[f"{case}/pooler_output"]
    model = keras_vit.from_pretrained(fixture(case))
    assert model.input_shape[1:3] == (32, 32)
    image = keras_vit.eval_transform(model).load(fixture("photos/landscape.jpg"))
    np.testing.assert_allclose(predict(model, image[None]), pooled, atol=1e-5, rtol=0)


@pytest.mark.backend_independent
def test_a_processor_crop_that_a_fixed_size_model_refuses_is_refused(tmp_path):
    # transformers' ViTModel takes its config's image_size alone (without interpolate_pos_encoding).
    folder = tmp_path / "vit"
    shutil.copytree(FOLDER, folder)
    (folder / "preprocessor_config.json").write_text(json.dumps(
        {"image_processor_type": "ViTImageProcessor", "size": {"height": 48, "width": 48}}))
    refused(str(folder), "{folder}/preprocessor_config.json gives 48x48 images, but {folder}/config.json has "
                         "image_size [32, 32], the only size transformers' 'vit' model takes (without "
                         "interpolate_pos_encoding): the folder's processor and model disagree; set one to the other. "
                         "Nothing was loaded.")


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


def changed_folder(tmp_path, case, drop=(), add=None, change=None):
    """A copy of fixture `case` without the tensors `drop` names (a name, or a prefix ending in '.'), with `add`
    and with `change(config)` applied; returns its path as a string."""
    from safetensors.numpy import load_file, save_file

    folder = tmp_path / case
    shutil.copytree(fixture(case), folder)
    tensors = {name: value for name, value in load_file(folder / "model.safetensors").items()
               if not any(name == d or (d.endswith(".") and name.startswith(d)) for d in drop)}
    save_file({**tensors, **(add or {})}, folder / "model.safetensors")
    config = json.loads((folder / "config.json").read_text())
    if change:
        change(config)
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def refused(folder, message):
    """from_pretrained(folder) raises a CheckpointError of exactly `message` ({folder} filled in)."""
    with pytest.raises(CheckpointError, match=f"^{re.escape(message.format(folder=folder))}$"):
        keras_vit.from_pretrained(folder)


def vision(**fields):
    return lambda config: config["vision_config"].update(fields)


@pytest.mark.backend_independent
@pytest.mark.parametrize("case, change, where", [
    ("transformers_vit", lambda config: config.update(image_size=40), "config.json"),
    ("transformers_dinov2", lambda config: config.update(image_size=40), "config.json"),
    ("transformers_siglip", vision(image_size=40), "config.json (vision_config)")])
def test_a_table_that_does_not_fit_the_configs_image_size_is_refused(case, change, where, tmp_path):
    # transformers refuses these too (a size mismatch of the position embeddings); keras_vit would read 32 px.
    folder = changed_folder(tmp_path, case, change=change)
    rows = 16 if case == "transformers_siglip" else 17
    refused(folder, f"{{folder}}/{where}: image_size is [40, 40], a 5x5 grid of 8-pixel patches, but the file's "
                    f"position table has {rows} rows, 16 of them for patches (a 4x4 grid: 32 px); set it to the size "
                    "the table was trained at. Nothing was loaded.")


SIGLIP_HEAD = ("['head.attention.in_proj_bias', 'head.attention.in_proj_weight', 'head.attention.out_proj.bias', "
               "'head.attention.out_proj.weight', 'head.layernorm.bias', '...'] (names after 'vision_model.').")


@pytest.mark.backend_independent
@pytest.mark.parametrize("change", [None, lambda config: config["vision_config"].pop("vision_use_head")],
                         ids=["vision_use_head_true", "vision_use_head_absent_defaults_to_true"])
def test_siglip_without_its_head_tensors_is_refused_where_its_config_has_a_head(change, tmp_path):
    folder = changed_folder(tmp_path, "transformers_siglip", drop=["vision_model.head."], change=change)
    refused(folder, "{folder}/model.safetensors lacks 11 tensors of the model its config.json describes "
                    '(model_type: "siglip", num_hidden_layers: 2, vision_use_head: true): ' + SIGLIP_HEAD)


def test_siglip_with_vision_use_head_false_loads_as_transformers_last_hidden_state(tmp_path):
    # A SiglipVisionModel saved with vision_use_head=False (PaliGemma's towers): transformers gives no pooler_output,
    # only last_hidden_state (the post_layernorm'd tokens), and so does from_pretrained, unless the caller pools.
    case = "transformers_siglip_no_head"
    with np.load(fixture("transformers_vision_towers_reference.npz")) as data:
        images, tokens = data[f"{case}/images"], data[f"{case}/last_hidden_state"]
    model = keras_vit.from_pretrained(fixture(case))
    assert model.output_shape == (None, 16, 24)
    np.testing.assert_allclose(predict(model, images), tokens, atol=1e-5, rtol=0)
    for chosen in (dict(classifier="gap"), dict(pooling="gap")):
        np.testing.assert_allclose(predict(keras_vit.from_pretrained(fixture(case), **chosen), images),
                                   tokens.mean(axis=1), atol=1e-5, rtol=0)
    # ... and head tensors beside vision_use_head: false are refused, as transformers would leave them unused.
    folder = changed_folder(tmp_path, "transformers_siglip", change=vision(vision_use_head=False))
    refused(folder, "{folder}/model.safetensors has 11 tensors that the model its config.json describes "
                    '(model_type: "siglip", num_hidden_layers: 2, vision_use_head: false) has not: ' + SIGLIP_HEAD)


LAYER = "encoder.layer.{}.attention.attention.{}.bias"
DINO = 'model_type: "dinov2", num_hidden_layers: 2, qkv_bias: true, use_swiglu_ffn: false'


@pytest.mark.backend_independent
@pytest.mark.parametrize("case, drop, add, message", [
    ("transformers_clip_vision", ["pre_layrnorm."], None,
     "lacks 2 tensors of the model its config.json describes (model_type: \"clip_vision_model\", "
     "num_hidden_layers: 2): ['pre_layrnorm.bias', 'pre_layrnorm.weight']."),
    ("transformers_clip_vision", [], {"embeddings.patch_embedding.bias": np.zeros(24, "float32")},
     "has 1 tensors that the model its config.json describes (model_type: \"clip_vision_model\", "
     "num_hidden_layers: 2) has not: ['embeddings.patch_embedding.bias']."),
    ("transformers_siglip", ["vision_model.encoder.layers.1.mlp.fc2.bias"], None,
     "lacks 1 tensors of the model its config.json describes (model_type: \"siglip\", num_hidden_layers: 2, "
     "vision_use_head: true): ['encoder.layers.1.mlp.fc2.bias'] (names after 'vision_model.')."),
    ("transformers_vit", ["vit.layernorm.weight"], None,
     "lacks 1 tensors of the model its config.json describes (num_hidden_layers: 2, qkv_bias: true): "
     "['layernorm.weight'] (names after 'vit.')."),
    ("transformers_vit", ["vit." + LAYER.format(1, "key")], None,
     "lacks 1 tensors of the model its config.json describes (num_hidden_layers: 2, qkv_bias: true): "
     "['encoder.layer.1.attention.attention.key.bias'] (names after 'vit.')."),
    ("transformers_dinov2", ["encoder.layer.1.layer_scale2.lambda1", "embeddings.patch_embeddings.projection.bias"],
     None, f"lacks 2 tensors of the model its config.json describes ({DINO}): "
           "['embeddings.patch_embeddings.projection.bias', 'encoder.layer.1.layer_scale2.lambda1']."),
    ("transformers_dinov2_registers", ["embeddings.register_tokens"], None,
     "lacks 1 tensors of the model its config.json describes (model_type: \"dinov2_with_registers\", "
     "num_hidden_layers: 2, qkv_bias: true, use_swiglu_ffn: false): ['embeddings.register_tokens']."),
], ids=["clip_pre_layrnorm", "clip_patch_bias", "siglip_block", "vit_final_norm", "vit_one_bias", "dinov2",
        "dinov2_registers"])
def test_each_reader_names_the_tensors_its_configured_model_lacks_or_has_not(case, drop, add, message, tmp_path):
    refused(changed_folder(tmp_path, case, drop=drop, add=add), "{folder}/model.safetensors " + message)


def key_wider_value_narrower(case, key, value, head_dim, biases=("key", "value")):
    """Tensors of fixture `case` whose block-0 key projection (`key`, before `.weight`) is one head wider and value
    projection (`value`) one head narrower: their sum is still the model's."""
    from safetensors.numpy import load_file

    tensors = load_file(fixture(f"{case}/model.safetensors"))
    rng = np.random.default_rng(0)
    changed = {}
    for name, kind, field in [(key, "key", "weight"), (key, "key", "bias"), (value, "value", "weight"),
                              (value, "value", "bias")]:
        if field == "bias" and kind not in biases:
            continue
        array = tensors[f"{name}.{field}"]
        extra = rng.normal(0, 0.2, (head_dim, *array.shape[1:])).astype("float32")
        changed[f"{name}.{field}"] = np.concatenate([array, extra]) if kind == "key" else array[:-head_dim].copy()
    return changed


@pytest.mark.backend_independent
@pytest.mark.parametrize("case, key, value, head_dim, biases, width", [
    ("transformers_vit", "vit.encoder.layer.0.attention.attention.key", "vit.encoder.layer.0.attention.attention.value",
     8, ("key", "value"), 24),
    ("transformers_dinov2", "encoder.layer.0.attention.attention.key", "encoder.layer.0.attention.attention.value", 8,
     ("key", "value"), 24),
    ("transformers_clip_vision", "encoder.layers.0.self_attn.k_proj", "encoder.layers.0.self_attn.v_proj", 8,
     ("key", "value"), 24),
    ("transformers_siglip", "vision_model.encoder.layers.0.self_attn.k_proj",
     "vision_model.encoder.layers.0.self_attn.v_proj", 8, ("key", "value"), 24),
    ("transformers_dinov3", "layer.0.attention.k_proj", "layer.0.attention.v_proj", 16, ("value",), 32),
], ids=["vit", "dinov2", "clip", "siglip", "dinov3_value_bias_alone"])
def test_a_key_one_head_wider_and_a_value_one_head_narrower_are_refused_each_by_name(case, key, value, head_dim,
                                                                                   biases, width, tmp_path):
    # transformers builds each projection at its own width and refuses such a file; their sum alone is the model's.
    changed = key_wider_value_narrower(case, key, value, head_dim, biases)
    refused(changed_folder(tmp_path / "both", case, add=changed),
            f"{{folder}}/model.safetensors: '{key}.weight' has shape ({width + head_dim}, {width}), but a model "
            f"{width} wide expects ({width}, {width}). Nothing was loaded.")
    # ... and each on its own: the value's weight, then its bias (DINOv3's, whose keys have none, a rule's).
    value_only = {name: array for name, array in changed.items() if name.startswith(value)}
    refused(changed_folder(tmp_path / "value", case, add=value_only),
            f"{{folder}}/model.safetensors: '{value}.weight' has shape ({width - head_dim}, {width}), but a model "
            f"{width} wide expects ({width}, {width}). Nothing was loaded.")
    refused(changed_folder(tmp_path / "bias", case, add={f"{value}.bias": changed[f"{value}.bias"]}),
            f"{{folder}}/model.safetensors: '{value}.bias' has shape ({width - head_dim},), but a model {width} wide "
            f"expects ({width},). Nothing was loaded.")


def without_qkv_biases(prefix=""):
    return [prefix + LAYER.format(block, kind) for block in range(2) for kind in ("query", "key", "value")]


@pytest.mark.backend_independent
@pytest.mark.parametrize("case, change, drop, message", [
    ("transformers_dinov2_registers", dict(num_register_tokens=2), [],
     "{folder}/config.json: num_register_tokens is 2, but the file holds 4 register tokens "
     "(embeddings.register_tokens)."),
    ("transformers_vit", dict(hidden_size=32), [],
     "{folder}/config.json: hidden_size is 32, but the file's patch embedding is 24 wide."),
    ("transformers_vit", dict(intermediate_size=64), [],
     "{folder}/config.json: intermediate_size is 64 (an MLP of width 64), but the file's MLP is 48 wide."),
    ("transformers_vit", dict(num_channels=1), [],
     "{folder}/config.json: num_channels is 1, but the file's patch embedding takes 3 channels."),
    ("transformers_vit", dict(id2label={"0": "a", "1": "b"}), [],
     "{folder}/config.json: id2label names 2 classes, but the file's classifier has 5 outputs."),
    ("transformers_dinov2", dict(mlp_ratio=4), [],
     "{folder}/config.json: mlp_ratio is 4 (an MLP of width 96), but the file's MLP is 48 wide."),
    ("transformers_siglip", "vision:patch_size=16", [],
     "{folder}/config.json (vision_config): patch_size is 16, but the file's patch embedding kernel is 8x8."),
    ("transformers_clip_vision", dict(num_hidden_layers=3), [],
     "{folder}/model.safetensors lacks 16 tensors of the model its config.json describes (model_type: "
     "\"clip_vision_model\", num_hidden_layers: 3): ['encoder.layers.2.layer_norm1.bias', "
     "'encoder.layers.2.layer_norm1.weight', 'encoder.layers.2.layer_norm2.bias', "
     "'encoder.layers.2.layer_norm2.weight', 'encoder.layers.2.mlp.fc1.bias', '...']."),
    ("transformers_dinov2", dict(num_hidden_layers=1), [],
     "{folder}/model.safetensors has 18 tensors that the model its config.json describes (model_type: \"dinov2\", "
     "num_hidden_layers: 1, qkv_bias: true, use_swiglu_ffn: false) has not: ["
     + ", ".join(repr(LAYER.format(1, kind).replace(".bias", f".{field}"))
                 for kind, field in (("key", "bias"), ("key", "weight"), ("query", "bias"), ("query", "weight"),
                                     ("value", "bias"))) + ", '...']."),
    ("transformers_vit", dict(qkv_bias=False), [],
     "{folder}/model.safetensors has 6 tensors that the model its config.json describes (num_hidden_layers: 2, "
     "qkv_bias: false) has not: ['encoder.layer.0.attention.attention.key.bias', "
     "'encoder.layer.0.attention.attention.query.bias', 'encoder.layer.0.attention.attention.value.bias', "
     "'encoder.layer.1.attention.attention.key.bias', 'encoder.layer.1.attention.attention.query.bias', '...'] "
     "(names after 'vit.')."),
    ("transformers_dinov2", {}, without_qkv_biases(),
     f"{{folder}}/model.safetensors lacks 6 tensors of the model its config.json describes ({DINO}): "
     "['encoder.layer.0.attention.attention.key.bias', 'encoder.layer.0.attention.attention.query.bias', "
     "'encoder.layer.0.attention.attention.value.bias', 'encoder.layer.1.attention.attention.key.bias', "
     "'encoder.layer.1.attention.attention.query.bias', '...']."),
    ("transformers_dinov2", dict(use_swiglu_ffn=True), [],
     "{folder}/model.safetensors lacks 8 tensors of the model its config.json describes (model_type: \"dinov2\", "
     "num_hidden_layers: 2, qkv_bias: true, use_swiglu_ffn: true): ['encoder.layer.0.mlp.weights_in.bias', "
     "'encoder.layer.0.mlp.weights_in.weight', 'encoder.layer.0.mlp.weights_out.bias', "
     "'encoder.layer.0.mlp.weights_out.weight', 'encoder.layer.1.mlp.weights_in.bias', '...']."),
    ("transformers_dinov2_registers", dict(model_type="dinov2"), [],
     f"{{folder}}/model.safetensors has 1 tensors that the model its config.json describes ({DINO}) has not: "
     "['embeddings.register_tokens']."),
], ids=["num_register_tokens", "hidden_size", "intermediate_size", "num_channels", "id2label", "mlp_ratio",
        "patch_size", "more_layers", "fewer_layers", "qkv_bias_false", "qkv_bias_true", "use_swiglu_ffn",
        "registers_in_plain_dinov2"])
def test_config_fields_that_contradict_the_tensors_are_refused_naming_field_and_tensors(case, change, drop, message,
                                                                                      tmp_path):
    if isinstance(change, str):  # "vision:key=value": a field of a whole model's vision_config
        key, value = change.removeprefix("vision:").split("=")
        edit = vision(**{key: int(value)})
    else:
        edit = lambda config: config.update(change)  # noqa: E731
    refused(changed_folder(tmp_path, case, drop=drop, change=edit), message)


@pytest.mark.backend_independent
def test_dinov2_without_qkv_biases_loads_where_its_config_says_qkv_bias_false(tmp_path):
    folder = changed_folder(tmp_path, "transformers_dinov2", drop=without_qkv_biases(),
                            change=lambda config: config.update(qkv_bias=False))
    assert not keras_vit.checkpoints.read_weights(folder, None, (32, 32)).architecture.qkv_bias


@pytest.mark.backend_independent
@pytest.mark.parametrize("case, edit, where", [
    ("transformers_vit", lambda c: c.update(num_attention_heads=5), "config.json"),
    ("transformers_dinov2", lambda c: c.update(num_attention_heads=5), "config.json"),
    ("transformers_clip_vision", lambda c: c.update(num_attention_heads=5), "config.json"),
    ("transformers_siglip", vision(num_attention_heads=5), "config.json (vision_config)"),
], ids=["vit", "dinov2", "clip", "siglip"])
def test_a_head_count_that_does_not_divide_the_width_names_config_json_and_the_field(case, edit, where, tmp_path):
    refused(changed_folder(tmp_path, case, change=edit),
            f"{{folder}}/{where}: num_attention_heads is 5, which does not divide hidden_size 24.")


@pytest.mark.backend_independent
def test_every_transformers_config_field_is_computed_checked_or_irrelevant_at_inference():
    # tools/make_family_fixtures.py --only fields records each config class's fields and defaults from
    # transformers' own source; a field the readers neither read nor list as irrelevant is a decision not made.
    from keras_vit.checkpoints.transformers import clip as clip_layout
    from keras_vit.checkpoints.transformers import dinov2 as dinov2_layout
    from keras_vit.checkpoints.transformers import vit as transformers_layout

    with open(fixture("transformers_config_fields.json")) as f:
        recorded = json.load(f)
    read = {**transformers_layout.CONFIG_DEFAULTS, **dinov2_layout.CONFIG_DEFAULTS, **clip_layout.CONFIG_DEFAULTS}
    irrelevant = transformers_layout.INFERENCE_IRRELEVANT
    assert not set().union(*read.values()) & set(irrelevant)
    assert set(recorded["PreTrainedConfig"]) - {"id2label"} <= set(irrelevant)
    assert "id2label" in read["vit"]
    for model_type in ("vit", "dinov2", "dinov2_with_registers", "clip_vision_model", "clip", "siglip_vision_model",
                       "siglip"):
        fields = recorded[model_type]
        assert set(fields) <= set(read[model_type]) | set(irrelevant), model_type
        assert {key: fields.get(key) for key in read[model_type]} == \
            {key: value for key, value in read[model_type].items()}, model_type


@pytest.mark.backend_independent
def test_an_older_clip_config_builds_the_tower_from_vision_config_dict(tmp_path):
    # CLIPConfig.__post_init__: a vision_config_dict replaces every field of vision_config.
    from safetensors.numpy import load_file, save_file

    folder = tmp_path / "clip"
    shutil.copytree(fixture("transformers_clip_vision"), folder)
    tensors = load_file(folder / "model.safetensors")
    save_file({f"vision_model.{name}": value for name, value in tensors.items()}, folder / "model.safetensors")
    tower = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({"model_type": "clip", "vision_config": dict(tower, hidden_size=99),
                                                    "vision_config_dict": tower}))
    assert keras_vit.checkpoints.read_weights(str(folder), None, (32, 32)).sizes.hidden_size == 24
    (folder / "config.json").write_text(json.dumps({"model_type": "clip", "vision_config": tower,
                                                    "vision_config_dict": dict(tower, hidden_size=99)}))
    refused(str(folder), "{folder}/config.json (vision_config_dict): hidden_size is 99, but the file's patch "
                         "embedding is 24 wide.")


@pytest.mark.parametrize("case", ["transformers_vit", "transformers_dinov2", "transformers_dinov2_registers",
                                  "transformers_clip_vision", "transformers_siglip"])
def test_resize_at_load_matches_transformers_interpolate_pos_encoding(case):
    # tools/make_family_fixtures.py --only resize: transformers' outputs at other sizes than the folder's 32,
    # interpolating the 4x4 position grid itself (bicubic; with antialias for Dinov2WithRegisters only).
    with np.load(fixture("transformers_resize_reference.npz")) as data:
        for size in ("64x64", "24x24", "48x24", "16x64"):  # 2x8: as many patches as the 4x4 file, resized too
            height, width = map(int, size.split("x"))
            model = keras_vit.from_pretrained(fixture(case), image_size=(height, width), classifier_activation=None)
            np.testing.assert_allclose(predict(model, data[f"images/{size}"]), data[f"{case}/{size}"], atol=1e-5,
                                       rtol=0, err_msg=f"{case} at {size}")
