"""The ResNet+ViT hybrids: the ResNet layers, the models, and their checkpoints."""

import os

import keras
import numpy as np
import pytest
from conftest import SMALL, SMALL_HYBRID, fixture, predict, reference

import keras_vit
from keras_vit import CheckpointError, checkpoints
from keras_vit.layers.resnet import BottleneckUnit, StandardizedConv2D

LOGITS = dict(classifier_activation=None)


def hybrid(case="hybrid_token", image_size=32, **kwargs):
    return keras_vit.ViT(image_size=image_size, **SMALL_HYBRID, **LOGITS, weights=fixture(f"{case}.npz"), **kwargs)


def npz_arrays(case="hybrid_token"):
    with np.load(fixture(f"{case}.npz")) as data:
        return dict(data)


def write_npz(tmp_path, arrays):
    path = str(tmp_path / "edited.npz")
    np.savez(path, **arrays)
    return path


# --- Layers ---------------------------------------------------------------------


def test_standardized_conv_equals_a_conv_with_the_numpy_standardized_kernel():
    rng = np.random.default_rng(0)
    kernel = rng.normal(0.3, 0.2, size=(3, 3, 4, 5)).astype("float32")
    images = rng.normal(size=(2, 7, 9, 4)).astype("float32")
    centred = kernel.astype("float64") - kernel.mean(axis=(0, 1, 2))
    expected_kernel = centred / (centred.std(axis=(0, 1, 2)) + 1e-5)  # The original: std + 1e-5.
    standardized = StandardizedConv2D(5, 3, strides=2, padding="same", use_bias=False)
    plain = keras.layers.Conv2D(5, 3, strides=2, padding="same", use_bias=False)
    standardized.build(images.shape), plain.build(images.shape)
    standardized.kernel.assign(kernel)
    plain.kernel.assign(expected_kernel.astype("float32"))
    np.testing.assert_allclose(predict(standardized, images), predict(plain, images), atol=1e-5)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(standardized.kernel), kernel)  # Stored as given.


def numpy_group_norm(x, gamma, beta, groups=32, epsilon=1e-6):
    batch, height, width, channels = x.shape
    grouped = x.reshape(batch, height, width, groups, channels // groups)
    mean = grouped.mean(axis=(1, 2, 4), keepdims=True)
    variance = grouped.var(axis=(1, 2, 4), keepdims=True)
    return ((grouped - mean) / np.sqrt(variance + epsilon)).reshape(x.shape) * gamma + beta


def test_group_norm_matches_the_original_groups_and_epsilon():
    unit = BottleneckUnit(32)
    x = np.random.default_rng(1).normal(2.0, 3.0, size=(2, 5, 5, 128)).astype("float32")
    unit.build(x.shape)
    norm = unit.gn1
    gamma, beta = np.linspace(0.5, 1.5, 32).astype("float32"), np.linspace(-1, 1, 32).astype("float32")
    norm.gamma.assign(gamma), norm.beta.assign(beta)
    expected = numpy_group_norm(x[..., :32].astype("float64"), gamma, beta)
    np.testing.assert_allclose(predict(norm, x[..., :32]), expected, atol=1e-4)


@pytest.mark.parametrize(
    "in_channels,strides,input_size,projects,output_shape",
    [(128, 1, 6, False, (1, 6, 6, 128)), (64, 1, 6, True, (1, 6, 6, 128)), (128, 2, 7, True, (1, 4, 4, 128))],
)
def test_bottleneck_projects_the_shortcut_only_when_shape_changes(in_channels, strides, input_size, projects,
                                                                  output_shape):
    unit = BottleneckUnit(32, strides=strides)
    x = np.random.default_rng(2).normal(size=(1, input_size, input_size, in_channels)).astype("float32")
    y = predict(unit, x)
    assert unit.projects == projects and y.shape == output_shape
    assert unit.compute_output_shape(x.shape) == output_shape
    if not projects:  # The last GroupNorm starts at zero: a fresh unit passes its input through ReLU.
        np.testing.assert_allclose(y, np.maximum(x, 0), atol=1e-6)


def test_resnet_layers_config_round_trip():
    for layer in (StandardizedConv2D(8, 3, epsilon=1e-4, name="c"), BottleneckUnit(32, strides=2, name="u")):
        clone = type(layer).from_config(layer.get_config())
        assert clone.get_config() == layer.get_config()


# --- Models ---------------------------------------------------------------------


def test_variant_table_holds_the_hybrids():
    variants = keras_vit.VARIANTS
    assert variants["ViT_R50_B16"] == keras_vit.Variant(1, 768, 12, 12, 3072, resnet_layers=(3, 4, 9))
    assert variants["ViT_R26_B32"] == keras_vit.Variant(1, 768, 12, 12, 3072, resnet_layers=(2, 2, 2, 2))
    assert variants["ViT_R26_S32"] == keras_vit.Variant(1, 384, 12, 6, 1536, resnet_layers=(2, 2, 2, 2))
    assert variants["ViT_R50_L32"] == keras_vit.Variant(1, 1024, 24, 16, 4096, resnet_layers=(3, 4, 6, 3))
    assert [variants[n].pixels_per_patch for n in ("ViT_R50_B16", "ViT_R26_S32", "ViT_B16")] == [16, 32, 16]
    with pytest.raises(ValueError, match="Unknown variant 'R50\\+B/8'"):
        keras_vit.decode_variant("R50+B/8")


def test_hybrid_tokens_are_the_resnet_feature_map():
    model = keras_vit.ViT(image_size=(32, 48), **SMALL_HYBRID, include_top=False)
    assert model.get_layer("block2_unit1").output.shape == (None, 4, 6, 256)
    assert model.output_shape == (None, 1 + 4 * 6, 48)
    assert model.get_layer("position_embedding").grid_size == (4, 6)
    assert [layer.name for layer in model.layers[:6]] == [
        "images", "conv_root", "gn_root", "root_relu", "root_pool", "block1_unit1"]


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(image_size=36), r"image_size \(36, 36\) is not divisible by the hybrid's 8 pixels per patch"),
        (dict(image_size=40, patch_size=2), r"not divisible by the hybrid's 16 pixels per patch"),
        (dict(resnet_width=48), "resnet_width 48 must be a multiple of 32"),
        (dict(resnet_layers=(1, 0)), "at least one unit per stage"),
    ],
)
def test_hybrid_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        keras_vit.ViT(**{"image_size": 32, **SMALL_HYBRID, **kwargs})


def test_hybrid_keras_file_round_trip_and_mixed_precision(tmp_path):
    model = hybrid()
    path = str(tmp_path / "hybrid.keras")
    model.save(path)
    images, logits = reference("hybrid_token")
    np.testing.assert_allclose(predict(keras.saving.load_model(path), images), logits, atol=1e-5)
    keras.config.set_dtype_policy("mixed_bfloat16")
    mixed = keras_vit.ViT(image_size=32, **SMALL_HYBRID)
    assert all(v.dtype == "float32" for v in mixed.weights)
    assert keras.backend.standardize_dtype(mixed.get_layer("block2_unit2").output.dtype) == "bfloat16"
    assert keras.backend.standardize_dtype(mixed(images).dtype) == "float32"


def test_hybrid_trains_with_fit():
    model = keras_vit.ViT(image_size=32, **SMALL_HYBRID, classes=4)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy")
    rng = np.random.default_rng(3)
    images, labels = rng.uniform(-1, 1, (8, 32, 32, 3)).astype("float32"), rng.integers(0, 4, 8)
    before = keras.ops.convert_to_numpy(model.get_layer("conv_root").kernel).copy()
    history = model.fit(images, labels, batch_size=4, epochs=3, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]
    assert not np.allclose(keras.ops.convert_to_numpy(model.get_layer("conv_root").kernel), before)


# --- Checkpoints ----------------------------------------------------------------


@pytest.mark.parametrize("case,image_size", [("hybrid_token", 32), ("hybrid_nonsquare", (24, 40))])
def test_loads_original_hybrid_npz_with_exact_logits(case, image_size):
    images, logits = reference(case)
    np.testing.assert_allclose(predict(hybrid(case, image_size), images), logits, atol=1e-5, rtol=0)


def test_hybrid_sizes_and_resolution_are_read_from_the_checkpoint():
    source = checkpoints.read_npz(fixture("hybrid_token.npz"))
    assert source.sizes == keras_vit.Variant(**SMALL_HYBRID)
    assert source.image_size == (32, 32)
    assert checkpoints.read_npz(fixture("vit_token.npz")).resnet_layers is None


def test_hybrid_checkpoint_resizes_position_embeddings_at_a_new_size(caplog):
    model = hybrid(image_size=48)
    assert model.get_layer("position_embedding").pos_embedding.shape == (1, 1 + 36, 48)
    assert "from a 4x4 to a 6x6 patch grid" in caplog.text


def test_rejects_hybrid_checkpoint_for_a_plain_vit_and_back():
    with pytest.raises(CheckpointError, match=r"is a hybrid with ResNet stages \(1, 2\) but the model is a plain ViT"):
        keras_vit.ViT(image_size=32, **SMALL, weights=fixture("hybrid_token.npz"))
    with pytest.raises(CheckpointError, match=r"is a plain ViT but the model is a hybrid with ResNet stages \(1, 2\)"):
        keras_vit.ViT(image_size=32, **SMALL_HYBRID, weights=fixture("vit_token.npz"))
    with pytest.raises(CheckpointError, match=r"stages \(1, 2\) but the model is a hybrid with ResNet stages \(1, 1\)"):
        keras_vit.ViT(image_size=32, **{**SMALL_HYBRID, "resnet_layers": (1, 1)}, weights=fixture("hybrid_token.npz"))


def test_rejects_hybrid_checkpoint_missing_a_resnet_weight(tmp_path):
    arrays = npz_arrays()
    del arrays["block2/unit2/gn3/scale"]
    with pytest.raises(CheckpointError, match="missing 'block2/unit2/gn3/scale'"):
        keras_vit.ViT(image_size=32, **SMALL_HYBRID, weights=write_npz(tmp_path, arrays))


def test_rejects_hybrid_checkpoint_with_another_resnet_width(tmp_path):
    with pytest.raises(CheckpointError, match="'conv_root/kernel' has shape"):
        keras_vit.ViT(image_size=32, **{**SMALL_HYBRID, "resnet_width": 64}, weights=fixture("hybrid_token.npz"))


def test_save_npz_writes_the_hybrid_layout_back_exactly(tmp_path):
    path = str(tmp_path / "exported.npz")
    checkpoints.save_npz(hybrid(), path)
    original, exported = npz_arrays(), dict(np.load(path))
    assert sorted(exported) == sorted(original)
    for key, value in original.items():
        np.testing.assert_array_equal(exported[key], value, err_msg=key)


def test_loads_hybrid_weights_h5_file(tmp_path):
    images, logits = reference("hybrid_token")
    path = str(tmp_path / "hybrid.weights.h5")
    hybrid().save_weights(path)
    layout = checkpoints.read_weights_h5(path).layout
    assert layout["sizes"].resnet_layers == (1, 2) and layout["image_size"] == (32, 32)
    source = keras_vit.checkpoints.read_weights(path)
    assert source.resnet_layers == (1, 2) and source.image_size == (32, 32)
    loaded = keras_vit.ViT(image_size=32, **SMALL_HYBRID, **LOGITS, weights=path)
    np.testing.assert_allclose(predict(loaded, images), logits, atol=1e-5)


def test_named_hybrid_weights_are_registered():
    assert keras_vit.available_weights("ViT_R50_B16") == {"imagenet21k": [224], "imagenet21k+imagenet2012": [384]}
    assert keras_vit.available_weights("ViT_R26_S32")["augreg-imagenet21k+imagenet2012"] == [224, 384]
    checkpoint = checkpoints.find_checkpoint("ViT_R50_B16", "imagenet21k", (224, 224))
    assert checkpoint.url.endswith("/imagenet21k/R50+ViT-B_16.npz") and checkpoint.classes == 21843


def test_convert_command_reads_the_hybrid_sizes_from_the_file(tmp_path):
    from keras_vit import cli

    output = str(tmp_path / "converted.keras")
    model = cli.main(["convert", fixture("hybrid_token.npz"), output])
    assert model.input_shape == (None, 32, 32, 3) and os.path.exists(output)
    images, logits = reference("hybrid_token")
    probabilities = predict(keras.saving.load_model(output), images)
    np.testing.assert_allclose(probabilities, keras.ops.convert_to_numpy(keras.ops.softmax(logits)), atol=1e-5)
