"""The switches of keras_vit.Architecture on models you build and train yourself: kept, saved, and refused when wrong."""

import os

import keras
import numpy as np
import pytest

import keras_vit
from conftest import fixture, predict
from keras_vit import Architecture, CheckpointError, checkpoints

SMALL = dict(image_size=32, patch_size=8, hidden_size=24, num_layers=2, num_heads=3, mlp_dim=48, classes=5,
             classifier_activation=None)
DINOV2_REG = dict(register_tokens=4, layer_scale=1e-5, class_token_position_embedding=False, mlp_activation="gelu")
FAMILY = fixture("timm_family")


def randomised(model, seed=0):
    """Random values in every weight, so that no mapping error can hide behind zeros or ones."""
    rng = np.random.default_rng(seed)
    for variable in model.weights:
        variable.assign(rng.normal(size=variable.shape).astype("float32") * 0.3 + ("gamma" in variable.path))
    return model


@pytest.mark.parametrize("switches", [
    DINOV2_REG,
    dict(norm_pre=True, patch_bias=False, mlp_activation="quick_gelu", layer_norm_epsilon=1e-5),
    dict(classifier="map", qkv_bias=False, qk_norm=True),
    dict(classifier="gap", register_tokens=2, fc_norm=True),
    dict(class_token=True, classifier="gap", fc_norm=True, mlp_activation="swiglu"),
    dict(register_tokens=1, final_norm=False),
], ids=["dinov2_reg", "clip", "siglip_qk_norm", "reg_gap", "class_token_gap_swiglu", "radio_no_final_norm"])
def test_switches_survive_keras_file_and_timm_round_trips(switches, tmp_path):
    model = randomised(keras_vit.ViT(**SMALL, **switches))
    images = np.random.default_rng(1).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    expected = predict(model, images)
    path = str(tmp_path / "model.keras")
    model.save(path)
    reloaded = keras_vit.from_pretrained(path)
    assert checkpoints.architecture_of(reloaded) == checkpoints.architecture_of(model)
    np.testing.assert_allclose(predict(reloaded, images), expected, atol=1e-5, rtol=0)
    # An epsilon or SwiGLU that only a timm model function sets is written under that function's name.
    named = {"layer_norm_epsilon": "vit_base_patch16_clip_224", "mlp_activation": "vit_giant_patch14_dinov2"}
    name = next((named[key] for key in named if key in switches and switches[key] in (1e-5, "swiglu")), None)
    checkpoints.save_timm(model, tmp_path / "timm" / "model.safetensors", architecture=name)
    # The folder alone: its config.json has the switches.
    again = keras_vit.from_pretrained(str(tmp_path / "timm"), classifier_activation=None)
    assert checkpoints.architecture_of(again) == checkpoints.architecture_of(model)
    np.testing.assert_allclose(predict(again, images), expected, atol=1e-5, rtol=0)


def test_pixel_statistics_turn_the_minus_one_to_one_input_into_the_weights_own(tmp_path, keras_vit_log):
    imagenet = Architecture(input_mean=(0.485, 0.456, 0.406), input_std=(0.229, 0.224, 0.225))
    model = randomised(keras_vit.ViT(**SMALL, architecture=imagenet))
    plain = keras_vit.ViT(**SMALL)
    plain.set_weights(model.get_weights())
    images = np.random.default_rng(1).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    normalised = ((images + 1) / 2 - np.array(imagenet.input_mean)) / np.array(imagenet.input_std)
    np.testing.assert_allclose(predict(model, images), predict(plain, normalised.astype("float32")), atol=1e-5)
    assert model.layers[1].name == "input_normalization" and plain.layers[1].name == "embedding"

    model.save(tmp_path / "model.keras")
    reloaded = keras_vit.from_pretrained(str(tmp_path / "model.keras"))
    assert checkpoints.architecture_of(reloaded) == imagenet
    np.testing.assert_allclose(predict(reloaded, images), predict(model, images), atol=1e-6)
    # save_timm keeps them in the config.json beside its file; the original layout cannot, and save_npz says so.
    checkpoints.save_timm(model, tmp_path / "timm" / "model.safetensors")
    checkpoints.save_npz(model, tmp_path / "model.npz")
    assert [record.getMessage().split(", which")[0] for record in keras_vit_log.records if "pixel" in
            record.getMessage()] == [
        f"{model.name} normalises its [-1, 1] input to pixel mean [0.485, 0.456, 0.406] and std "
        "[0.229, 0.224, 0.225]"]
    from_timm = keras_vit.from_pretrained(str(tmp_path / "timm"), classifier_activation=None)
    assert checkpoints.architecture_of(from_timm) == imagenet
    np.testing.assert_allclose(predict(from_timm, images), predict(model, images), atol=1e-6)

    with pytest.raises(ValueError, match=r"input_std must be three per-channel numbers on the \[0, 1\] pixel scale "
                                         r"\(each > 0\), such as ImageNet's \(0.229, 0.224, 0.225\); got \(0.2, 0, 0.2\)"):
        Architecture(input_std=(0.2, 0, 0.2))
    with pytest.raises(ValueError, match=r"input_mean must be three .* got 'imagenet'"):
        Architecture(input_mean="imagenet")


def test_registers_sit_between_the_class_token_and_the_patches():
    model = keras_vit.ViT(**SMALL, **DINOV2_REG)
    tokens = keras.Model(model.input, model.get_layer("encoderblock_0").input)
    assert tokens.output_shape == (None, 1 + 4 + 16, 24)
    assert model.get_layer("position_embedding").pos_embedding.shape == (1, 16, 24)  # no_embed_class
    assert checkpoints.architecture_of(model).num_prefix_tokens == 5
    assert tuple(keras_vit.feature_extractor(model, blocks=-1).output_shape) == (None, 4, 4, 24)


def test_lora_quantize_and_dtype_work_with_the_switches(tmp_path):
    model = keras_vit.from_pretrained(os.path.join(FAMILY, "dinov2_reg"), classes=3)
    keras_vit.enable_lora(model, rank=2)
    assert any("lora" in variable.path for variable in model.trainable_weights)
    quantized = keras_vit.from_pretrained(os.path.join(FAMILY, "siglip_map"))
    images = np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    expected = predict(quantized, images)
    quantized.quantize("int8")
    path = str(tmp_path / "int8.keras")
    quantized.save(path)
    np.testing.assert_allclose(predict(keras.saving.load_model(path), images), predict(quantized, images), atol=1e-6)
    assert np.max(np.abs(predict(quantized, images) - expected)) < 0.1 * np.max(np.abs(expected))
    full = keras_vit.from_pretrained(os.path.join(FAMILY, "clip_laion"))
    half = keras_vit.from_pretrained(os.path.join(FAMILY, "clip_laion"), dtype="mixed_bfloat16")
    assert half.get_layer("pre_norm").variable_dtype == "float32"
    assert half.get_layer("encoderblock_0").compute_dtype == "bfloat16"
    reference = predict(full, images)
    assert np.max(np.abs(predict(half, images).astype("float32") - reference)) < 0.05 * np.max(np.abs(reference))


@pytest.mark.backend_independent
def test_bad_switches_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match=r"register_tokens must be a whole number >= 0, got -1"):
        keras_vit.ViT(**SMALL, register_tokens=-1)
    with pytest.raises(ValueError, match=r"classifier='token' pools the class token, but class_token=False has none"):
        keras_vit.ViT(**SMALL, class_token=False, classifier="token")
    with pytest.raises(ValueError, match=r"Unknown mlp_activation 'relu'; expected one of \('gelu_tanh', 'gelu', "
                                         r"'quick_gelu', 'swiglu', 'geglu', 'geglu_tanh'\)"):
        keras_vit.ViT(**SMALL, mlp_activation="relu")
    with pytest.raises(ValueError, match=r"layer_scale is the initial value of the learned scales, a number >= 0"):
        keras_vit.ViT(**SMALL, layer_scale=-1e-5)
    with pytest.raises(ValueError, match=r"rope_temperature must be a finite number > 0, got nan"):
        Architecture(rope="axial", rope_temperature=float("nan"))
    with pytest.raises(ValueError, match=r"rope_reference_grid must be \(rows, columns\), two positive whole numbers"):
        Architecture(rope="axial", rope_reference_grid=(16,))
    with pytest.raises(ValueError, match="architecture must be a keras_vit.Architecture, got dict"):
        keras_vit.ViT(**SMALL, architecture={"register_tokens": 4})
    with pytest.raises(ValueError, match="A SwiGLU MLP halves its mlp_dim, which must be even; got 47"):
        keras_vit.ViT(**dict(SMALL, mlp_dim=47), mlp_activation="swiglu")
    with pytest.raises(ValueError, match="fc_norm=True places the final LayerNorm after pooling, but final_norm=False"):
        keras_vit.ViT(**SMALL, classifier="gap", fc_norm=True, final_norm=False)
    with pytest.raises(ValueError, match=r"^num_kv_heads 2 \(block 1\) does not divide num_heads 3: each key/value "
                                         r"head serves num_heads / num_kv_heads query heads.$"):
        keras_vit.ViT(**SMALL, num_kv_heads=(3, 2))
    with pytest.raises(ValueError, match=r"^num_kv_heads \(3,\) is for 1 blocks, but the model has 2: give one count "
                                         r"per block, or one number for every block.$"):
        keras_vit.ViT(**SMALL, num_kv_heads=(3,))
    with pytest.raises(ValueError, match=r"num_kv_heads must be a whole number > 0, a tuple of them \(one per block\) "
                                         r"or None; got 0."):
        Architecture(num_kv_heads=0)
    with pytest.raises(ValueError, match="attention_only_layer_scale=True is not supported with parallel=True"):
        Architecture(layer_scale=0.1, parallel=True, attention_only_layer_scale=True)
    with pytest.raises(ValueError, match=r"Grouped-query attention \(num_kv_heads\) is not supported with "
                                         "differential attention"):
        keras_vit.ViT(**SMALL, num_kv_heads=1, differential_attention=True)
    with pytest.raises(CheckpointError, match=r"^vit has num_kv_heads=\(1, 1\), which the original \.npz layout cannot "
                                              r"hold \(a file of it reads back as num_kv_heads=None\): save it with "
                                              r"model.save, or checkpoints.save_timm. Nothing was written.$"):
        checkpoints.save_npz(keras_vit.ViT(**SMALL, num_kv_heads=1), tmp_path / "grouped.npz")
    assert not os.listdir(tmp_path)
    assert Architecture(class_token=False, classifier="gap").num_prefix_tokens == 0


@pytest.mark.backend_independent
def test_a_classifier_given_alone_decides_the_class_token_as_before():
    assert "class_token" not in [layer.name for layer in keras_vit.ViT(**SMALL, classifier="gap").layers]
    names = [layer.name for layer in keras_vit.ViT(**SMALL, classifier="gap", class_token=True).layers]
    assert "class_token" in names and "pool" in names


@pytest.mark.backend_independent
def test_a_typo_in_named_weights_suggests_the_closest_names():
    with pytest.raises(CheckpointError, match=r"Unknown weights 'imagenet22k' for ViT_B16; valid names: .* "
                                              r"Did you mean 'imagenet21k'"):
        keras_vit.ViT_B16(weights="imagenet22k")
    with pytest.raises(CheckpointError, match=r"this model's sizes match none of them. Did you mean 'imagenet21k'"):
        keras_vit.ViT(**SMALL, weights="imagenet22k")


@pytest.mark.backend_independent
def test_a_state_dict_with_a_switch_keras_vit_lacks_names_it(tmp_path):
    from safetensors.numpy import load_file, save_file

    tensors = load_file(os.path.join(FAMILY, "deit", "model.safetensors"))
    tensors["attn_pool.q_norm.weight"] = np.ones(8, "float32")
    save_file(tensors, tmp_path / "scaled.safetensors")
    with pytest.raises(CheckpointError, match=r"is a timm ViT with query/key normalisation in attention pooling"):
        keras_vit.ViT(**SMALL, weights=str(tmp_path / "scaled.safetensors"))
    del tensors["attn_pool.q_norm.weight"]
    tensors["patch_embed.backbone.stem.conv.weight"] = np.ones((8, 3, 3, 3), "float32")
    save_file(tensors, tmp_path / "stem.safetensors")
    with pytest.raises(CheckpointError, match=r"is a timm ViT with a convolutional stem before the patches \(a hybrid's "
                                              r"ResNet, .* nor MobileCLIP's ConvStem or ViTamin's MbConvStages: another backbone\) "
                                              r"\(\['patch_embed.backbone.stem.conv.weight'\]\)"):
        keras_vit.ViT(**SMALL, weights=str(tmp_path / "stem.safetensors"))


@pytest.mark.backend_independent  # the config is plain data, the layers' attributes too
def test_a_model_carries_the_description_its_layers_give_and_a_keras_file_keeps_it(tmp_path):
    import dataclasses

    from keras_vit.model import description

    zoo = [dict(SMALL), dict(SMALL, image_size=(None, None)), dict(SMALL, include_top=False, pooling="gap"),
           dict(SMALL, patch_size=1, resnet_layers=(), resnet_width=32),
           dict(SMALL, architecture=Architecture(rope="axial", mlp_activation="swiglu", qk_norm=True,
                                                 layer_scale=0.1, class_token=False, classifier="gap")),
           *(dict(SMALL, **switches) for switches in (DINOV2_REG, dict(classifier="map", qkv_bias=False),
                                                     dict(normalization="rms_norm", projection_bias=False),
                                                     dict(num_kv_heads=(3, 1), layer_scale=0.1,
                                                          attention_only_layer_scale=True)))]
    for options in zoo:
        model = keras_vit.ViT(**options)
        carried = (model.architecture, model.sizes, model.native_grid)
        for attribute in ("architecture", "sizes", "native_grid"):
            setattr(model, attribute, None)  # what a .keras file saved before December 2026 gives: read the layers
        read = (description.architecture_of(model), description.sizes_of(model), description.native_grid(model))
        assert carried == read, options
        model.architecture, model.sizes, model.native_grid = carried
        path = str(tmp_path / "model.keras")
        model.save(path)
        config = keras.saving.load_model(path).get_config()
        assert config["architecture"] == description.describe(*carried)["architecture"]
        assert description.read_description(dict(config)) == carried
    future = dict(description.describe(*carried), native_grid=[4, 4])
    future["architecture"] = dict(future["architecture"], wormhole_attention=True)
    with pytest.raises(ValueError, match=r"^The model's saved Architecture has fields \['wormhole_attention'\] that "
                                         r"this keras_vit does not know: it was saved by a newer keras_vit; upgrade "
                                         r"keras_vit to load it.$"):
        description.read_description(future)
    assert dataclasses.asdict(carried[0]) == dataclasses.asdict(description.read_description(
        description.describe(*carried))[0])


@pytest.mark.backend_independent
def test_every_architecture_field_is_a_vit_keyword_and_a_typo_gets_the_closest():
    model = keras_vit.ViT(**SMALL, rope="axial", class_token=False, classifier="gap", register_tokens=1)
    assert (model.architecture.rope, model.architecture.register_tokens) == ("axial", 1)
    with pytest.raises(TypeError, match=r"^ViT\(\) got an unexpected keyword argument 'layer_scal'; did you mean "
                                        r"'layer_scale'\?$"):
        keras_vit.ViT(**SMALL, layer_scal=1e-5)
    with pytest.raises(TypeError, match=r"^ViT\(\) got an unexpected keyword argument 'wormhole' \(nor is it a field "
                                        r"of keras_vit.Architecture\).$"):
        keras_vit.ViT_Ti16(wormhole=True)
