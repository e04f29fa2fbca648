import os
import shutil

import keras
import numpy as np
import pytest

import keras_vit
from conftest import SMALL, fixture, predict, reference
from keras_vit import CheckpointError, checkpoints, resize_position_embeddings

LOGITS = dict(classifier_activation=None)


def load(case="vit_token", **kwargs):
    return keras_vit.ViT(**{"image_size": 32, **SMALL, **LOGITS, "weights": fixture(f"{case}.npz"), **kwargs})


def npz_arrays(case="vit_token"):
    with np.load(fixture(f"{case}.npz")) as data:
        return dict(data)


def weights_of(model):
    return {v.path: keras.ops.convert_to_numpy(v).copy() for v in model.weights}


# --- Parity with timm -----------------------------------------------------------


@pytest.mark.parametrize(
    "case,image_size",
    [
        ("vit_token", 32),
        ("vit_token_big_vision", 32),
        ("vit_gap", 32),
        ("vit_nonsquare", (24, 40)),
        ("vit_prelogits", 32),
    ],
)
def test_loads_original_npz_with_exact_logits(case, image_size):
    images, logits = reference(case.replace("_big_vision", ""))
    model = load(case, image_size=image_size)
    np.testing.assert_allclose(predict(model, images), logits, atol=1e-5, rtol=0)


def test_checkpoint_decides_classifier_representation_and_classes():
    gap = load("vit_gap")
    assert "class_token" not in [layer.name for layer in gap.layers]
    pre_logits = load("vit_prelogits")
    assert pre_logits.get_layer("pre_logits").units == 32
    assert pre_logits.output_shape == (None, 10)


def test_big_vision_and_original_layouts_give_the_same_weights():
    original, scanned = load("vit_token"), load("vit_token_big_vision")
    for (path, a), b in zip(weights_of(original).items(), weights_of(scanned).values()):
        np.testing.assert_array_equal(a, b, err_msg=path)


def test_features_without_top_equal_the_classifiers_pooled_tokens():
    images, _ = reference("vit_token")
    full = load("vit_token")
    features = load("vit_token", include_top=False, pooling="token")
    pooled = keras.Model(full.input, full.get_layer("pool").output)
    np.testing.assert_allclose(predict(features, images), predict(pooled, images), atol=1e-6)


# --- Adapting to a new resolution or head ---------------------------------------


@pytest.mark.parametrize("image_size,grid", [(48, (6, 6)), ((48, 64), (6, 8))])
def test_loading_at_new_size_resizes_position_embeddings_and_says_so(image_size, grid, caplog):
    model = load("vit_token", image_size=image_size)
    table = npz_arrays()["Transformer/posembed_input/pos_embedding"]
    expected = resize_position_embeddings(table, grid, (4, 4), interpolation="bicubic")
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(model.get_layer("position_embedding").pos_embedding), expected, atol=1e-6
    )
    assert f"from a 4x4 to a {grid[0]}x{grid[1]} patch grid (bicubic)" in caplog.text
    images = np.random.default_rng(0).uniform(-1, 1, (1, *model.input_shape[1:])).astype("float32")
    assert np.all(np.isfinite(predict(model, images)))


def test_other_class_count_gets_a_fresh_zero_head_and_says_so(caplog):
    images, _ = reference("vit_token")
    model = load("vit_token", classes=5)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(model.get_layer("head").kernel), 0.0)
    assert "head has 10 classes, model has 5" in caplog.text
    same_body = load("vit_token", include_top=False)
    body = keras.Model(model.input, model.get_layer("encoder_norm").output)
    np.testing.assert_allclose(predict(body, images), predict(same_body, images), atol=1e-6)


def test_dropping_pre_logits_drops_the_head_too(caplog):
    model = load("vit_prelogits", representation_size=0)
    assert "pre_logits" not in [layer.name for layer in model.layers]
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(model.get_layer("head").kernel), 0.0)
    assert "model has no pre-logits layer" in caplog.text


# --- Bad checkpoints raise clear errors -----------------------------------------


def write_npz(tmp_path, arrays, name="bad.npz"):
    path = str(tmp_path / name)
    np.savez(path, **arrays)
    return path


def test_rejects_checkpoint_with_wrong_patch_size(caplog):
    with pytest.raises(CheckpointError, match=r"'embedding/kernel' has shape \(8, 8, 3, 48\) but the model expects \(4, 4, 3, 48\)"):
        load("vit_token", patch_size=4)
    assert "Resized" not in caplog.text  # nothing is reported as done when the load fails


def test_rejects_checkpoint_with_wrong_depth():
    with pytest.raises(CheckpointError, match="has 2 encoder blocks but the model has 3"):
        load("vit_token", num_layers=3)


def test_rejects_checkpoint_with_wrong_width():
    with pytest.raises(CheckpointError, match=r"pos_embedding' has shape \(1, 17, 48\) but the model expects \(1, 17, 24\)"):
        load("vit_token", hidden_size=24, num_heads=3, mlp_dim=96)


def test_rejects_checkpoint_with_missing_key(tmp_path):
    arrays = npz_arrays()
    del arrays["Transformer/encoder_norm/scale"]
    with pytest.raises(CheckpointError, match="is missing 'Transformer/encoder_norm/scale'"):
        keras_vit.ViT(image_size=32, **SMALL, weights=write_npz(tmp_path, arrays))


def test_rejects_checkpoint_with_extra_keys(tmp_path):
    arrays = npz_arrays()
    arrays["Transformer/adapter/kernel"] = np.zeros((48, 8), "float32")
    with pytest.raises(CheckpointError,
                       match=r"has 1 entries this ViT does not use, for example \['Transformer/adapter/kernel'\]"):
        keras_vit.ViT(image_size=32, **SMALL, weights=write_npz(tmp_path, arrays))


def test_rejects_checkpoint_with_a_gap_in_its_blocks(tmp_path):
    arrays = {k: v for k, v in npz_arrays().items() if "encoderblock_0/" not in k}
    with pytest.raises(CheckpointError, match=r"missing encoderblock_\[0\]"):
        keras_vit.ViT(image_size=32, **SMALL, weights=write_npz(tmp_path, arrays))


def test_rejects_checkpoint_of_another_architecture(tmp_path):
    path = write_npz(tmp_path, {"conv1/kernel": np.zeros((3, 3, 3, 8), "float32")})
    with pytest.raises(CheckpointError, match="is not a ViT checkpoint: no 'embedding/kernel'"):
        keras_vit.ViT(image_size=32, **SMALL, weights=path)


def test_rejects_classifier_that_does_not_match_checkpoint():
    with pytest.raises(CheckpointError, match="has a class token but the model's classifier is gap; pass classifier='token'"):
        load("vit_token", classifier="gap")
    with pytest.raises(CheckpointError, match="has no class token but the model's classifier is token; pass classifier='gap'"):
        load("vit_gap", classifier="token")


def test_rejects_corrupt_and_truncated_files(tmp_path):
    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(os.urandom(1000))
    with pytest.raises(CheckpointError, match="garbage.npz is not a readable .npz checkpoint"):
        keras_vit.ViT(image_size=32, **SMALL, weights=str(garbage))
    truncated = tmp_path / "truncated.npz"
    data = open(fixture("vit_token.npz"), "rb").read()
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated.npz is not a readable .npz checkpoint"):
        keras_vit.ViT(image_size=32, **SMALL, weights=str(truncated))


def test_rejects_checkpoint_with_non_finite_values(tmp_path):
    arrays = npz_arrays()
    arrays["Transformer/encoder_norm/bias"][0] = np.nan
    with pytest.raises(CheckpointError, match="'encoder_norm/beta' holds NaN or infinite values"):
        keras_vit.ViT(image_size=32, **SMALL, weights=write_npz(tmp_path, arrays))


def test_rejects_missing_file_and_unknown_kinds(tmp_path):
    with pytest.raises(CheckpointError, match="Weights file not found: .*nowhere.npz"):
        keras_vit.ViT(image_size=32, **SMALL, weights=str(tmp_path / "nowhere.npz"))
    other = tmp_path / "weights.bin"
    other.write_bytes(b"x")
    with pytest.raises(CheckpointError, match="Unrecognised weights file .*weights.bin"):
        keras_vit.ViT(image_size=32, **SMALL, weights=str(other))


def test_rejects_unknown_checkpoint_name():
    with pytest.raises(CheckpointError, match=r"Unknown weights 'imagenet' for ViT_B16; valid names: \['augreg-imagenet2012'"):
        keras_vit.ViT_B16(weights="imagenet")
    with pytest.raises(CheckpointError, match="exist only for the named variants"):
        keras_vit.ViT(image_size=32, **SMALL, weights="imagenet21k")


def test_failed_load_leaves_the_model_untouched():
    model = keras_vit.ViT(image_size=32, **SMALL, **LOGITS, classes=10)
    before = weights_of(model)
    source = checkpoints.read_npz(fixture("vit_token.npz"))
    source.state["encoder_norm/gamma"] = np.ones((47,), "float32")  # checked after the embeddings
    with pytest.raises(CheckpointError, match="'encoder_norm/gamma' has shape"):
        checkpoints.load_into(model, source)
    for path, value in weights_of(model).items():
        np.testing.assert_array_equal(value, before[path], err_msg=path)


# --- .keras and .weights.h5 sources ---------------------------------------------


def test_loads_keras_file_at_same_and_new_size(tmp_path, caplog):
    images, logits = reference("vit_nonsquare")
    path = str(tmp_path / "nonsquare.keras")
    load("vit_nonsquare", image_size=(24, 40)).save(path)
    same = keras_vit.ViT(image_size=(24, 40), **SMALL, **LOGITS, weights=path)
    np.testing.assert_allclose(predict(same, images), logits, atol=1e-5)
    bigger = keras_vit.ViT(image_size=(48, 40), **SMALL, weights=path, classes=3)
    assert "from a 3x5 to a 6x5 patch grid" in caplog.text
    assert bigger.output_shape == (None, 3)


@pytest.mark.parametrize("case", ["vit_token", "vit_prelogits", "vit_gap"])
def test_loads_weights_h5_file(tmp_path, case, caplog):
    images, logits = reference(case)
    path = str(tmp_path / "vit.weights.h5")
    load(case).save_weights(path)
    same = keras_vit.ViT(image_size=32, **SMALL, **LOGITS, weights=path)
    np.testing.assert_allclose(predict(same, images), logits, atol=1e-5)
    bigger = keras_vit.ViT(image_size=40, **SMALL, weights=path)
    assert "from a 4x4 to a 5x5 patch grid" in caplog.text
    assert bigger.output_shape == (None, 10)


def test_rejects_corrupt_keras_and_h5_files(tmp_path):
    for name in ("broken.keras", "broken.weights.h5"):
        broken = tmp_path / name
        broken.write_bytes(os.urandom(300))
        with pytest.raises(CheckpointError, match=name):
            keras_vit.ViT(image_size=32, **SMALL, weights=str(broken))


def test_loading_never_modifies_the_users_file(tmp_path):
    path = str(tmp_path / "vit_token.npz")
    shutil.copy(fixture("vit_token.npz"), path)
    before = open(path, "rb").read()
    load("vit_token", image_size=48, classes=3)
    keras_vit.ViT(image_size=32, **SMALL, weights=path, classes=3)
    assert open(path, "rb").read() == before


@pytest.mark.parametrize("case", ["vit_token", "vit_gap", "vit_prelogits"])
def test_save_npz_writes_the_original_layout_back_exactly(tmp_path, case):
    path = str(tmp_path / "exported.npz")
    checkpoints.save_npz(load(case), path)
    original, exported = npz_arrays(case), dict(np.load(path))
    assert sorted(exported) == sorted(original)
    for key, value in original.items():
        np.testing.assert_array_equal(exported[key], value, err_msg=key)
