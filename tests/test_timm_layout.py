"""timm's layout: state dicts and Hub folders written by timm itself, read with equal logits, and written back."""

import json
import os
import re
import shutil
import sys

import numpy as np
import pytest
from conftest import fixture, predict

import keras_vit
from keras_vit import CheckpointError, checkpoints

pytest.importorskip("safetensors")

TIMM = dict(image_size=32, patch_size=8, hidden_size=24, num_layers=2, mlp_dim=48, classifier_activation=None)
FOLDER = fixture("timm_hub")
WEIGHTS = os.path.join(FOLDER, "model.safetensors")


@pytest.fixture(scope="module")
def reference():
    with np.load(fixture("timm_hub_reference.npz")) as data:
        return data["images"], data["logits"], json.loads(str(data["state_dict_shapes"]))


def test_timm_hub_folder_loads_with_timms_logits_and_exact_gelu(reference):
    images, logits, _ = reference
    model = keras_vit.ViT(**TIMM, weights=FOLDER)  # heads (3) and classes (5) from the folder's files
    assert model.get_layer("encoderblock_0").num_heads == 3 and model.output_shape == (None, 5)
    assert model.get_layer("encoderblock_0").approximate_gelu is False
    np.testing.assert_allclose(predict(model, images), logits, atol=1e-5, rtol=0)
    # timm's label ids (label_names) in head order, shown by their label_descriptions.
    assert model.class_names == [f"digit {i}" for i in range(5)]


def test_bare_state_dict_needs_the_head_count_and_then_matches(reference):
    images, logits, _ = reference
    with pytest.raises(CheckpointError, match="does not store the number of attention heads.*pass num_heads="):
        keras_vit.ViT(**TIMM, weights=WEIGHTS)
    model = keras_vit.ViT(**TIMM, num_heads=3, weights=WEIGHTS)
    np.testing.assert_allclose(predict(model, images), logits, atol=1e-5, rtol=0)


def test_pytorch_pickle_is_read_through_torch_weights_only(reference, tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file

    path = tmp_path / "pytorch_model.bin"
    torch.save({"state_dict": load_file(WEIGHTS)}, path)
    images, logits, _ = reference
    model = keras_vit.ViT(**TIMM, num_heads=3, weights=str(path))
    np.testing.assert_allclose(predict(model, images), logits, atol=1e-5, rtol=0)


@pytest.mark.backend_independent
def test_pytorch_pickle_without_torch_says_how_to_read_it(tmp_path, monkeypatch):
    path = tmp_path / "pytorch_model.bin"
    path.write_bytes(b"not read")
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch now fails, as where it is not installed
    with pytest.raises(CheckpointError, match=r"pytorch_model.bin is a PyTorch pickle \(.bin/.pth\), which keras_vit "
                                              r"reads only with torch installed .*pip install torch, or convert it"):
        keras_vit.ViT(**TIMM, num_heads=3, weights=str(path))


def test_save_timm_writes_exactly_timms_names_and_shapes_and_reads_back(reference, tmp_path, keras_vit_log):
    images, logits, timm_shapes = reference
    model = keras_vit.ViT(**TIMM, weights=FOLDER)
    path = tmp_path / "vit.safetensors"  # timm's local-dir reads a folder's one weights file of any name
    checkpoints.save_timm(model, path)
    assert not keras_vit_log.records  # exact GELU as timm's; statistics and eval transform kept in config.json
    from safetensors.numpy import load_file

    written = load_file(path)
    assert {name: list(value.shape) for name, value in written.items()} == timm_shapes  # what strict=True needs
    original = load_file(WEIGHTS)
    for name, value in written.items():
        np.testing.assert_array_equal(value, original[name], err_msg=name)
    again = keras_vit.ViT(**TIMM, num_heads=3, weights=str(path))
    np.testing.assert_allclose(predict(again, images), logits, atol=1e-5, rtol=0)
    # The folder alone is the model: its heads, class names and timm's eval transform (bicubic, crop_pct) too.
    folder = keras_vit.from_pretrained(str(path.parent), classifier_activation=None)
    np.testing.assert_allclose(predict(folder, images), logits, atol=1e-5, rtol=0)
    assert folder.class_names == model.class_names == [f"digit {i}" for i in range(5)]
    assert folder.eval_transform == model.eval_transform and model.eval_transform.convention == "timm"


# Switches over timm's defaults (exact GELU) that a bare state dict does not show: only its config.json keeps them.
FOLDER_SWITCHES = {"class_token_gap": dict(classifier="gap"),
                   "pool_include_prefix": dict(classifier="gap", pool_include_prefix=True),
                   "quick_gelu": dict(mlp_activation="quick_gelu"), "gelu_tanh": dict(mlp_activation="gelu_tanh"),
                   "imagenet_statistics": dict(input_mean=(0.485, 0.456, 0.406), input_std=(0.229, 0.224, 0.225))}


@pytest.mark.backend_independent
@pytest.mark.parametrize("switch", sorted(FOLDER_SWITCHES))
def test_save_timm_folder_reloads_the_switch_a_bare_state_dict_loses(switch, tmp_path):
    architecture = keras_vit.Architecture(**dict(dict(mlp_activation="gelu"), **FOLDER_SWITCHES[switch]))
    model = keras_vit.ViT(image_size=32, patch_size=8, hidden_size=24, num_layers=1, num_heads=3, mlp_dim=48,
                          classes=5, classifier_activation=None, architecture=architecture)
    rng = np.random.default_rng(0)
    for variable in model.weights:  # large random values, so that every switch moves the logits
        variable.assign(rng.normal(0, 0.5, variable.shape).astype("float32"))
    checkpoints.save_timm(model, tmp_path / "model.safetensors")
    config = json.loads((tmp_path / "config.json").read_text())
    assert (config["pretrained_cfg"]["mean"], config["pretrained_cfg"]["std"]) == (list(architecture.input_mean),
                                                                                   list(architecture.input_std))
    again = keras_vit.from_pretrained(str(tmp_path), classifier_activation=None)
    assert checkpoints.architecture_of(again) == architecture
    images = rng.uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    np.testing.assert_allclose(predict(again, images), predict(model, images), atol=1e-6, rtol=0)


@pytest.mark.backend_independent
def test_save_timm_writes_no_layer_scale_as_zero_where_the_name_sets_one_and_reads_null_as_the_names_own(tmp_path):
    """timm's create_model drops a None keyword, so the name's own layer scale (DINOv2 giant's 1e-5) would stand: a
    model without one is written with init_values 0 (no LayerScale in timm), and a null is read as timm reads it."""
    model = keras_vit.ViT(image_size=32, patch_size=8, hidden_size=24, num_layers=1, num_heads=3, mlp_dim=48,
                          classes=5, classifier="gap", class_token=True, fc_norm=True, mlp_activation="swiglu")
    checkpoints.save_timm(model, tmp_path / "model.safetensors", architecture="vit_giant_patch14_dinov2")
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_args"]["init_values"] == 0.0
    assert checkpoints.architecture_of(keras_vit.from_pretrained(str(tmp_path))).layer_scale is None
    config["model_args"]["init_values"] = None
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError) as error:  # as timm's strict load refuses it
        keras_vit.from_pretrained(str(tmp_path))
    assert str(error.value) == (f"{tmp_path / 'model.safetensors'} does not hold timm's 'vit_giant_patch14_dinov2' as "
                                "its config.json sets it: it lacks blocks.0.ls1.gamma (init_values set). Nothing was "
                                "loaded.")


@pytest.mark.backend_independent
def test_save_timm_writes_the_nearest_eval_transform_timm_states_and_says_so(tmp_path, keras_vit_log):
    model = keras_vit.ViT(image_size=32, patch_size=8, hidden_size=24, num_layers=1, num_heads=3, mlp_dim=48)
    checkpoints.save_timm(model, tmp_path / "model.safetensors")
    assert [record.getMessage() for record in keras_vit_log.records] == [
        "vit evaluates photos by keras_vit's rule (tf.image.resize's bilinear, not antialiased), which timm's "
        "pretrained_cfg cannot state: config.json keeps the nearest, interpolation 'bilinear', crop_pct 1, crop_mode "
        "'squash', which timm and keras_vit.from_pretrained compute with Pillow (antialiased) and timm's rounding."]
    again = keras_vit.from_pretrained(str(tmp_path))
    assert again.eval_transform == keras_vit.eval_transform(model).replace(convention="timm", antialias=True)


@pytest.mark.backend_independent
def test_save_timm_refuses_a_folder_of_another_model_and_writes_nothing(tmp_path):
    model = keras_vit.ViT(image_size=32, patch_size=8, hidden_size=24, num_layers=1, num_heads=3, mlp_dim=48)
    (tmp_path / "other.safetensors").write_bytes(b"another model's weights")
    path = tmp_path / "vit.safetensors"
    with pytest.raises(CheckpointError, match=f"^{re.escape(str(path))}: its folder already holds other.safetensors, "
                                              r"and timm and keras_vit read a folder as one model \(its config.json "
                                              r"beside its one weights file\): save into a folder of its own. Nothing "
                                              r"was written.$"):
        checkpoints.save_timm(model, path)
    transformers = tmp_path / "transformers"
    transformers.mkdir()
    (transformers / "config.json").write_text('{"model_type": "vit"}')
    with pytest.raises(CheckpointError, match=f"^{re.escape(str(transformers / 'config.json'))} is not timm's "
                                              r"config.json \(an object naming an architecture\), and save_timm would "
                                              r"replace it with the one model.safetensors needs: save into a folder "
                                              r"of its own. Nothing was written.$"):
        checkpoints.save_timm(model, transformers / "model.safetensors")
    assert sorted(os.listdir(tmp_path)) == ["other.safetensors", "transformers"]
    assert os.listdir(transformers) == ["config.json"]
    # Its own folder again: the config.json it wrote there is timm's, and is replaced with the file.
    checkpoints.save_timm(model, tmp_path / "vit" / "model.safetensors")
    checkpoints.save_timm(keras_vit.ViT(image_size=32, patch_size=8, hidden_size=24, num_layers=1, num_heads=3,
                                        mlp_dim=48, classifier="gap"), tmp_path / "vit" / "model.safetensors")
    assert json.loads((tmp_path / "vit" / "config.json").read_text())["global_pool"] == "avg"


@pytest.mark.backend_independent
def test_save_timm_writes_both_files_or_neither(tmp_path, monkeypatch):
    from keras_vit.checkpoints.timm import writer

    model = keras_vit.ViT(image_size=32, patch_size=8, hidden_size=24, num_layers=1, num_heads=3, mlp_dim=48)
    checkpoints.save_timm(model, tmp_path / "model.safetensors")
    before = {name: (tmp_path / name).read_bytes() for name in os.listdir(tmp_path)}

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(writer.json, "dump", full_disk)  # the config.json fails after the weights were written
    with pytest.raises(OSError, match="No space left on device"):
        checkpoints.save_timm(keras_vit.ViT(image_size=32, patch_size=8, hidden_size=24, num_layers=1, num_heads=3,
                                            mlp_dim=48, classes=7), tmp_path / "model.safetensors")
    assert {name: (tmp_path / name).read_bytes() for name in os.listdir(tmp_path)} == before
    with pytest.raises(OSError, match="No space left on device"):
        checkpoints.save_timm(model, tmp_path / "new" / "model.safetensors")
    assert not (tmp_path / "new").exists()


def test_save_timm_refuses_what_timm_cannot_rebuild_and_writes_nothing(tmp_path):
    sizes = dict(image_size=32, patch_size=8, hidden_size=24, num_layers=1, num_heads=3, mlp_dim=48, classes=5)
    checkpoints.save_timm(keras_vit.ViT(**sizes), tmp_path / "tanh" / "model.safetensors")  # act_layer='gelu_tanh' in timm
    assert checkpoints.timm_arguments(keras_vit.ViT(**sizes))["act_layer"] == "gelu_tanh"
    with pytest.raises(CheckpointError, match="timm's VisionTransformer has no pre-logits layer"):
        checkpoints.save_timm(keras_vit.ViT(**sizes, representation_size=8), tmp_path / "p.safetensors")
    with pytest.raises(CheckpointError, match=r"^vit's ResNet computes the original Flax epsilons, timm's hybrids "
                                              r"others: timm would compute other outputs; save it with "
                                              r"checkpoints.save_npz instead.$"):
        checkpoints.save_timm(keras_vit.ViT(**dict(sizes, patch_size=1), resnet_layers=(), resnet_width=32),
                              tmp_path / "h.safetensors")
    with pytest.raises(CheckpointError, match="save_timm writes a .safetensors file; got"):
        checkpoints.save_timm(keras_vit.ViT(**sizes), tmp_path / "vit.pth")
    with pytest.raises(CheckpointError, match=r"^vit has no patch bias but no norm_pre; timm's VisionTransformer has "
                                              r"a patch bias exactly when it has no pre_norm, so it cannot build this "
                                              r"model.$"):
        checkpoints.save_timm(keras_vit.ViT(**sizes, patch_bias=False), tmp_path / "b.safetensors")
    with pytest.raises(CheckpointError, match=r"^vit has a SwiGLU MLP, which timm's VisionTransformer takes only "
                                              r"from a model function: pass architecture= a timm name that sets the "
                                              r"same, such as vit_giant_patch14_dinov2 \(a packed SwiGLU MLP\).$"):
        checkpoints.save_timm(keras_vit.ViT(**sizes, mlp_activation="swiglu"), tmp_path / "s.safetensors")
    with pytest.raises(CheckpointError, match=r"^vit has LayerNorm epsilon 1e-05, which timm's VisionTransformer "
                                              r"takes only from a model function: pass architecture= a timm name "
                                              r"that sets the same, such as vit_base_patch16_clip_224"):
        checkpoints.save_timm(keras_vit.ViT(**sizes, layer_norm_epsilon=1e-5), tmp_path / "e.safetensors")
    # What the name rebuilds is what keras_vit's timm reader makes of it with timm_arguments as model_args.
    with pytest.raises(CheckpointError, match=f"^{re.escape(str(tmp_path / 'e.safetensors'))}: timm's "
                                              r"'vit_small_patch16_224' builds layer_norm_epsilon=1e-06 where vit has "
                                              r"layer_norm_epsilon=1e-05; pass architecture= a timm name that builds "
                                              r"the same model. Nothing was written.$"):
        checkpoints.save_timm(keras_vit.ViT(**sizes, layer_norm_epsilon=1e-5), tmp_path / "e.safetensors",
                              architecture="vit_small_patch16_224")
    checkpoints.save_timm(keras_vit.ViT(**sizes, layer_norm_epsilon=1e-5), tmp_path / "clip" / "model.safetensors",
                          architecture="vit_base_patch16_clip_224")
    lora = keras_vit.ViT(**sizes)
    keras_vit.enable_lora(lora, rank=2)
    with pytest.raises(CheckpointError, match=r"^vit has LoRA adapters, which timm's VisionTransformer does not "
                                              r"have: call keras_vit.merge_lora\(model\) first, then save_timm.$"):
        checkpoints.save_timm(lora, tmp_path / "lora.safetensors")
    assert sorted(os.listdir(tmp_path)) == ["clip", "tanh"]


def test_timm_arguments_are_keywords_timm_builds_the_same_model_from(tmp_path):
    timm = pytest.importorskip("timm")  # Skipped where timm is not installed (CI); run in the side venv.
    import torch

    sizes = dict(image_size=32, patch_size=8, hidden_size=24, num_layers=2, num_heads=3, mlp_dim=48, classes=5)
    cases = {"vit_base_patch16_224": dict(register_tokens=2, class_token_position_embedding=False, layer_scale=1e-5,
                                          qk_norm=True, mlp_activation="gelu"),
             "vit_base_patch16_clip_224": dict(norm_pre=True, patch_bias=False, layer_norm_epsilon=1e-5,
                                               mlp_activation="quick_gelu"),
             "vit_giant_patch14_dinov2": dict(mlp_activation="swiglu", layer_scale=1e-5)}
    images = np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    for architecture, switches in cases.items():
        model = keras_vit.ViT(**sizes, **switches, classifier_activation=None)
        path = tmp_path / architecture / "model.safetensors"
        checkpoints.save_timm(model, path, architecture=architecture)
        name = None if architecture == "vit_base_patch16_224" else architecture
        built = timm.create_model(architecture, pretrained=False, **checkpoints.timm_arguments(model, name)).eval()
        timm.models.load_checkpoint(built, str(path), strict=True)
        with torch.no_grad():
            expected = built(torch.from_numpy(images).permute(0, 3, 1, 2)).numpy()
        np.testing.assert_allclose(predict(model, images), expected, atol=1e-5, rtol=0, err_msg=architecture)


def rewrite(tmp_path, change):
    from safetensors.numpy import load_file, save_file

    tensors = load_file(WEIGHTS)
    change(tensors)
    path = tmp_path / "changed.safetensors"
    save_file(tensors, path)
    return str(path)


def test_layouts_that_are_not_timm_vits_are_refused_by_name(tmp_path):
    scaled = rewrite(tmp_path, lambda t: t.update({"blocks.0.mlp.fc1_g.weight": np.ones((48, 24), "float32")}))
    with pytest.raises(CheckpointError, match=r"holds \['blocks.0.mlp.fc1_g.weight'\] but not its other part "
                                              r"blocks.0.mlp.fc1_x.weight: the pieces of one weight come together"):
        keras_vit.ViT(**TIMM, num_heads=3, weights=scaled)
    other = rewrite(tmp_path, lambda t: t.update({"encoder.layer.0.weight": np.ones(3, "float32")}))
    with pytest.raises(CheckpointError, match=r"has 1 tensors that are not in timm's VisionTransformer layout: "
                                              r"\['encoder.layer.0.weight'\]"):
        keras_vit.ViT(**TIMM, num_heads=3, weights=other)


def test_wrong_size_state_dict_names_the_weight_and_both_shapes():
    with pytest.raises(CheckpointError, match=r"model.safetensors: 'pos_embed' has shape "
                                              r"\(1, 17, 24\) but the model expects \(1, 17, 48\)"):
        keras_vit.ViT(**dict(TIMM, hidden_size=48), num_heads=3, weights=WEIGHTS)


@pytest.mark.backend_independent
def test_truncated_or_oversized_safetensors_are_refused_before_reading(tmp_path):
    data = open(WEIGHTS, "rb").read()
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"cut.safetensors is not a readable .safetensors file: Error while "
                                              r"deserializing header: "):
        keras_vit.ViT(**TIMM, num_heads=3, weights=str(cut))
    budget = checkpoints.source.WeightBudget(1000, "a tiny model")
    with pytest.raises(CheckpointError, match="out of proportion to a tiny model"):
        checkpoints.read_timm(WEIGHTS, budget)


def test_folder_that_is_not_a_timm_vit_says_what_it_holds(tmp_path):
    folder = tmp_path / "resnet"
    shutil.copytree(FOLDER, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(dict(config, architecture="resnet50")))
    with pytest.raises(CheckpointError, match=r"timm's 'resnet50' is not one of the \d+ timm ViT architectures keras_vit "
                                              r"computes \(keras_vit.checkpoints.timm.families.ARCHITECTURES"):
        keras_vit.ViT(**TIMM, weights=str(folder))


@pytest.mark.backend_independent
def test_save_timm_of_a_model_that_gives_its_tokens_says_what_timm_builds(tmp_path, keras_vit_log):
    """A headless model that gives its tokens (a SigLIP tower without its head, as transformers' last_hidden_state)
    is timm's headless model, whose forward pools and whose forward_features are the tokens: the folder said it
    pooled without a word (before 2026-12-07). A Gemma 4 classifier's name has nowhere for soft tokens: refused."""
    model = keras_vit.from_pretrained(fixture("transformers_siglip_no_head"))
    checkpoints.save_timm(model, tmp_path / "siglip" / "model.safetensors", architecture="vit_base_patch16_siglip_224")
    assert (f"{model.name} gives its token sequence (include_top=False, pooling=None): the folder holds timm's "
            "'vit_base_patch16_siglip_224' without a head, whose forward gives the pooled features (num_classes=0) "
            "and whose forward_features gives these tokens; keras_vit.from_pretrained(folder, include_top=False, "
            "pooling=None) gives them back.") in keras_vit_log.text
    again = keras_vit.from_pretrained(str(tmp_path / "siglip"), include_top=False, pooling=None)
    images = np.random.default_rng(0).uniform(-1, 1, (1, *model.input_shape[1:3], 3)).astype("float32")
    np.testing.assert_array_equal(predict(again, images), predict(model, images))
    tower = keras_vit.from_pretrained(fixture("transformers_gemma4_vision"))
    with pytest.raises(CheckpointError) as error:
        checkpoints.save_timm(tower, tmp_path / "gemma" / "model.safetensors", architecture="gemma4_vit_167m")
    assert str(error.value) == (
        f"{tower.name} gives its token sequence (no head and no pooling), which timm's classifier 'gemma4_vit_167m' "
        "does not: save it under the encoder's name (gemma4_vit_167m_enc), whose global_pool gives them, or with its "
        "head.")
    assert not (tmp_path / "gemma").exists()
