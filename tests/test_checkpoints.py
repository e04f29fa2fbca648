import io
import os
import re
import shutil
import zipfile

import keras
import numpy as np
import pytest
from conftest import SMALL, fixture, predict, reference

import keras_vit
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


@pytest.mark.parametrize("image_size,grid", [(48, (6, 6)), ((48, 64), (6, 8)), ((16, 64), (2, 8))])
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


def test_loading_at_another_patch_size_pi_resizes_the_kernel_and_the_grid(caplog):
    arrays = npz_arrays()
    model = load("vit_token", patch_size=4)  # 8-pixel patches in the file: an 8x8 grid instead of 4x4
    kernel = keras_vit.resize_patch_embedding(arrays["embedding/kernel"], (4, 4))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(model.get_layer("embedding").kernel), kernel, atol=1e-6)
    table = resize_position_embeddings(arrays["Transformer/posembed_input/pos_embedding"], (8, 8), (4, 4))
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(model.get_layer("position_embedding").pos_embedding), table, atol=1e-6
    )
    assert "Resized the patch embedding of" in caplog.text
    assert "from 8x8 to 4x4 pixel patches (FlexiViT pseudo-inverse, bicubic)" in caplog.text
    assert "from a 4x4 to a 8x8 patch grid" in caplog.text


def test_patch_size_that_does_not_divide_the_image_is_refused_before_loading():
    with pytest.raises(ValueError, match=r"image_size \(32, 32\) is not divisible by patch_size 5"):
        load("vit_token", patch_size=5)


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


def test_failed_load_at_another_patch_size_reports_no_resize(caplog):
    with pytest.raises(CheckpointError, match=r"'Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel' has shape \(48, 96\) "
                                              r"but the model expects \(48, 64\)"):
        load("vit_token", patch_size=4, mlp_dim=64)
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
    # The hint keeps what the caller asked for: a class-token file (DINOv2 too) pooled by average is class_token=True.
    with pytest.raises(CheckpointError, match=r"has a class token but the model has none \(a classifier of 'gap' or "
                                              r"'map' given alone builds none\); pass class_token=True to keep it \(with "
                                              r"classifier='gap' for average pooling\), or leave classifier unset for "
                                              r"the file's 'token'.$"):
        load("vit_token", classifier="gap")
    with pytest.raises(CheckpointError, match=r"has no class token but the model has one; pass classifier='gap' \(the "
                                              r"file's pooling\), or class_token=False.$"):
        load("vit_gap", classifier="token")
    assert checkpoints.architecture_of(load("vit_token", classifier="gap", class_token=True)).classifier == "gap"


@pytest.mark.backend_independent
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


@pytest.mark.backend_independent
def test_rejects_files_that_are_not_npz_archives_before_reading_arrays(tmp_path):
    single = tmp_path / "single.npz"
    with open(single, "wb") as f:
        np.save(f, np.zeros(3, "float32"))
    with pytest.raises(CheckpointError, match="single.npz is not a readable .npz checkpoint: it is a single .npy array"):
        keras_vit.ViT(image_size=32, **SMALL, weights=str(single))
    arrays = npz_arrays()
    arrays["Transformer/encoder_norm/bias"] = np.array(["a", "b"])
    with pytest.raises(CheckpointError, match="'Transformer/encoder_norm/bias' holds <U1 values, not numbers"):
        keras_vit.ViT(image_size=32, **SMALL, weights=write_npz(tmp_path, arrays))
    # A header that declares 10^12 elements is refused from the header, not by numpy running out of memory.
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": (10**6, 10**6)})
    huge = tmp_path / "huge.npz"
    with zipfile.ZipFile(huge, "w") as archive:
        archive.writestr("embedding/kernel.npy", header.getvalue() + bytes(16))
    with pytest.raises(CheckpointError, match=r"'embedding/kernel' declares shape \(1000000, 1000000\) of float32 "
                       r"\(4,000,000,000,000 bytes\) but stores 16 bytes"):
        keras_vit.ViT(image_size=32, **SMALL, weights=str(huge))


def test_rejects_a_truncated_keras_file_saying_so(tmp_path):
    path = tmp_path / "vit.keras"
    load("vit_token").save(path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="vit.keras is not a .keras archive \\(a zip file\\), or it is truncated"):
        keras_vit.ViT(image_size=32, **SMALL, weights=str(path))


@pytest.mark.parametrize("kind", ["npz", "keras"])
@pytest.mark.parametrize("num_heads", [1, 6])
def test_rejects_checkpoint_with_another_head_count(tmp_path, kind, num_heads):
    path = fixture("vit_token.npz")  # 3 heads of 16
    if kind == "keras":
        path = str(tmp_path / "vit.keras")
        load("vit_token").save(path)
    sizes = dict(SMALL, num_heads=num_heads)
    with pytest.raises(CheckpointError, match=f"has 3 attention heads per block but the model has {num_heads}; "
                       "the file has hidden size 48; pass num_heads=3"):
        keras_vit.ViT(image_size=32, **sizes, weights=path)


def test_head_count_comes_from_the_file_or_must_be_given_for_weights_h5(tmp_path):
    images, logits = reference("vit_token")
    sizes = {k: v for k, v in SMALL.items() if k != "num_heads"}
    from_npz = keras_vit.ViT(image_size=32, **sizes, **LOGITS, weights=fixture("vit_token.npz"))
    assert from_npz.get_layer("encoderblock_0").num_heads == 3
    np.testing.assert_allclose(predict(from_npz, images), logits, atol=1e-5)
    path = str(tmp_path / "vit.weights.h5")
    from_npz.save_weights(path)
    with pytest.raises(CheckpointError, match="vit.weights.h5 does not store the number of attention heads, and the "
                       "sizes match no named variant; pass num_heads="):
        keras_vit.ViT(image_size=32, **sizes, weights=path)
    # A named variant knows its own head count.
    ti = keras_vit.ViT_Ti16(image_size=32, classes=10)
    ti_path = str(tmp_path / "ti.weights.h5")
    ti.save_weights(ti_path)
    assert keras_vit.ViT(image_size=32, patch_size=16, hidden_size=192, mlp_dim=768, num_heads=3,
                         classes=10, weights=ti_path).get_layer("encoderblock_0").num_heads == 3


def test_shape_mismatch_names_the_files_apparent_size(tmp_path):
    ti = keras_vit.ViT_Ti16(image_size=32, classes=10)
    path = str(tmp_path / "ti.keras")
    ti.save(path)
    with pytest.raises(CheckpointError, match=r"the file has hidden size 192 \(a Ti checkpoint\?\)"):
        keras_vit.ViT_S16(image_size=32, weights=path)


def test_rejects_values_that_overflow_the_models_dtype(tmp_path):
    arrays = npz_arrays()
    arrays = {k: v.astype("float64") for k, v in arrays.items()}
    arrays["Transformer/encoder_norm/bias"][0] = 1e39  # finite in float64, inf in float32
    with pytest.raises(CheckpointError, match="'Transformer/encoder_norm/bias' holds values up to 1e\\+39, beyond the range of "
                       "the model's float32 variables"):
        keras_vit.ViT(image_size=32, **SMALL, weights=write_npz(tmp_path, arrays))
    keras.config.set_dtype_policy("float16")
    arrays = npz_arrays()
    arrays["Transformer/encoder_norm/bias"][0] = 1e5
    with pytest.raises(CheckpointError, match="up to 1e\\+05, beyond the range of the model's float16 variables"):
        keras_vit.ViT(image_size=32, **SMALL, weights=write_npz(tmp_path, arrays))


def test_check_finite_names_the_broken_weights():
    model = load("vit_token")
    checkpoints.check_finite(model, "model.keras")
    model.get_layer("encoder_norm").beta.assign(np.full((48,), np.nan, "float32"))
    with pytest.raises(CheckpointError, match=r"model.keras holds NaN or infinite weights in 1 variables: \['encoder_norm/beta'\]"):
        checkpoints.check_finite(model, "model.keras")


def test_rejects_checkpoint_with_non_finite_values(tmp_path):
    arrays = npz_arrays()
    arrays["Transformer/encoder_norm/bias"][0] = np.nan
    with pytest.raises(CheckpointError, match="'Transformer/encoder_norm/bias' holds NaN or infinite values"):
        keras_vit.ViT(image_size=32, **SMALL, weights=write_npz(tmp_path, arrays))


@pytest.mark.backend_independent
def test_rejects_missing_file_and_unknown_kinds(tmp_path):
    with pytest.raises(CheckpointError, match="Weights file not found: .*nowhere.npz"):
        keras_vit.ViT(image_size=32, **SMALL, weights=str(tmp_path / "nowhere.npz"))
    other = tmp_path / "weights.ckpt"
    other.write_bytes(b"x")
    with pytest.raises(CheckpointError, match=r"Unknown weights file type '\.ckpt': .*weights.ckpt. keras_vit reads"):
        keras_vit.ViT(image_size=32, **SMALL, weights=str(other))
    # A misspelt extension is a file type, not the name of published weights.
    with pytest.raises(CheckpointError, match=r"^Weights file not found: tiny.nzp \('\.nzp' is no weights file type "
                                              r"either: keras_vit reads an original \.npz"):
        keras_vit.ViT(image_size=32, **SMALL, weights="tiny.nzp")
    with pytest.raises(CheckpointError, match=r"^Weights file not found: model.ckpt \('\.ckpt' is no"):
        keras_vit.ViT_B16(weights="model.ckpt")
    # A path without an extension that is not there is not found (it was "a file type without an extension").
    with pytest.raises(CheckpointError, match=r"^Weights file not found: runs/x/model$"):
        keras_vit.ViT(image_size=32, **SMALL, weights="runs/x/model")


@pytest.mark.backend_independent
def test_rejects_unknown_checkpoint_name():
    with pytest.raises(CheckpointError, match=r"Unknown weights 'imagenet' for ViT_B16; valid names: \['augreg-imagenet2012'"):
        keras_vit.ViT_B16(weights="imagenet")
    with pytest.raises(CheckpointError, match="exist only for the named variants"):
        keras_vit.ViT(image_size=32, **SMALL, weights="imagenet21k")


def test_original_npz_key_one_head_wider_and_value_one_head_narrower_is_refused_by_name(tmp_path):
    # Their sum is the model's, which alone was checked: the file loaded 0.3 off. Each is checked apart now.
    arrays = npz_arrays()
    attention = "Transformer/encoderblock_0/MultiHeadDotProductAttention_1/"
    rng = np.random.default_rng(0)
    for field, axis in (("kernel", 1), ("bias", 0)):
        key, value = arrays[f"{attention}key/{field}"], arrays[f"{attention}value/{field}"]
        extra = rng.normal(0, 0.2, np.take(key, [0], axis=axis).shape).astype("float32")
        arrays[f"{attention}key/{field}"] = np.concatenate([key, extra], axis=axis)
        arrays[f"{attention}value/{field}"] = np.take(value, [0, 1], axis=axis)
    path = write_npz(tmp_path, arrays)
    with pytest.raises(CheckpointError, match=f"^{re.escape(path)}: '{attention}key/kernel' has shape \\(48, 4, 16\\), but "
                                              r"a model 48 wide expects \(48, 3, 16\)\. Nothing was loaded\.$"):
        keras_vit.from_pretrained(path)


def test_failed_load_leaves_the_model_untouched():
    model = keras_vit.ViT(image_size=32, **SMALL, **LOGITS, classes=10)
    before = weights_of(model)
    source = checkpoints.read_npz(fixture("vit_token.npz"))
    source.state["encoder_norm/gamma"] = np.ones((47,), "float32")  # checked after the embeddings
    with pytest.raises(CheckpointError, match="'Transformer/encoder_norm/scale' has shape"):
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


@pytest.mark.backend_independent
def test_reading_a_keras_file_reads_its_weights_about_as_often_as_kerass_loader(tmp_path, monkeypatch):
    # h5py seeks in the weights; a seek back in a zip entry re-reads and re-checksums it from its start, so the
    # integer check on the entry as a stream read ViT-L's 1.2 GB hundreds of times (119 s against 6-12 s).
    path = str(tmp_path / "vit.keras")
    load("vit_token").save(path)
    with zipfile.ZipFile(path) as archive:
        size = archive.getinfo("model.weights.h5").file_size
    counted = {"bytes": 0}
    read = zipfile.ZipExtFile.read

    def counting(entry, n=-1):
        data = read(entry, n)
        if entry.name == "model.weights.h5":
            counted["bytes"] += len(data)
        return data

    monkeypatch.setattr(zipfile.ZipExtFile, "read", counting)
    keras.saving.load_model(path, compile=False)
    kerass, counted["bytes"] = counted["bytes"], 0
    keras_vit.from_pretrained(path)
    assert counted["bytes"] <= kerass + 3 * size, (counted["bytes"] / size, kerass / size)


def test_a_keras_file_is_returned_as_keras_loads_it_unless_asked_for_another_model(tmp_path, monkeypatch):
    # Building the model again and copying the weights in doubled the time of keras.saving.load_model (ViT-L).
    from keras_vit.applications import pretrained

    images, logits = reference("vit_token")
    path = str(tmp_path / "vit.keras")
    load("vit_token").save(path)
    build = pretrained.ViT
    built = []
    monkeypatch.setattr(pretrained, "ViT", lambda **options: built.append(options) or build(**options))
    same = keras_vit.from_pretrained(path, classes=10, image_size=32)
    assert not built
    np.testing.assert_allclose(predict(same, images), logits, atol=1e-5)
    assert keras_vit.from_pretrained(path, classes=3).output_shape == (None, 3) and len(built) == 1


@pytest.mark.backend_independent
def test_a_full_temporary_disk_is_named_not_blamed_on_the_keras_file(tmp_path, monkeypatch):
    import errno
    import tempfile

    stored = str(tmp_path / "stored.keras")
    load("vit_token").save(stored)
    path = str(tmp_path / "vit.keras")  # compressed, as a zip tool may rewrite it: its weights are copied out
    with zipfile.ZipFile(stored) as source, zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as target:
        for name in source.namelist():
            target.writestr(name, source.read(name))
    assert keras_vit.from_pretrained(path).count_params() == keras_vit.from_pretrained(stored).count_params()

    class FullDisk(io.BytesIO):
        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tempfile, "TemporaryFile", FullDisk)
    with pytest.raises(CheckpointError) as error:
        keras_vit.from_pretrained(path)
    assert str(error.value) == (f"{path}: its weights could not be copied to a temporary file in "
                                f"{tempfile.gettempdir()} to be checked ([Errno 28] No space left on device); free "
                                "space there, or set TMPDIR.")


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


@pytest.mark.parametrize("case", ["vit_token", "vit_gap", "vit_prelogits", "vit_map_big_vision"])
def test_save_npz_writes_the_original_layout_back_exactly(tmp_path, case):
    path = str(tmp_path / "exported.npz")
    checkpoints.save_npz(keras_vit.from_pretrained(fixture(f"{case}.npz")), path)
    original, exported = npz_arrays(case), dict(np.load(path))
    assert sorted(exported) == sorted(original)
    for key, value in original.items():
        np.testing.assert_array_equal(exported[key], value, err_msg=key)


def test_loads_big_vision_map_head_npz_with_timms_logits():
    # big_vision's pool_type="map" (MAPHead_0), as timm's own .npz loader reads it into global_pool="map".
    images, logits = reference("vit_map_big_vision")
    model = keras_vit.from_pretrained(fixture("vit_map_big_vision.npz"), classifier_activation=None)
    assert checkpoints.architecture_of(model).classifier == "map" and "class_token" not in model.layers[1].name
    np.testing.assert_allclose(predict(model, images), logits, atol=1e-5, rtol=0)


# Each switch the original layout holds: the file save_npz writes reads back as the same model, with equal outputs.
HELD_SWITCHES = {
    "class_token": {},
    "gap": dict(classifier="gap"),
    "map": dict(classifier="map"),
    "map_of_its_own_heads_and_mlp": dict(classifier="map", attention_pool_heads=1, attention_pool_mlp_ratio=1.5),
    "pre_logits": dict(representation_size=16),
}


@pytest.mark.parametrize("switches", HELD_SWITCHES.values(), ids=HELD_SWITCHES)
def test_save_npz_reads_back_as_the_same_model_for_each_switch_it_holds(switches, tmp_path):
    from test_architecture import randomised

    model = randomised(keras_vit.ViT(image_size=32, **SMALL, classes=5, **LOGITS, **switches))
    path = checkpoints.save_npz(model, str(tmp_path / "model.npz"))
    again = keras_vit.from_pretrained(path, **LOGITS)
    assert checkpoints.architecture_of(again) == checkpoints.architecture_of(model)
    images = np.random.default_rng(1).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    np.testing.assert_allclose(predict(again, images), predict(model, images), atol=1e-6, rtol=0)


# Each switch it cannot hold -> what the model has, and what a file of it would read back as. The file reloaded
# 1 to 8 off before (and four crashed with a KeyError).
UNHELD_SWITCHES = {
    "layer_scale": (dict(layer_scale=0.1), "layer_scale=0.1", "layer_scale=None"),
    "qk_norm": (dict(qk_norm=True), "qk_norm=True", "qk_norm=False"),
    "rope": (dict(rope="axial"), "rope='axial'", "rope=None"),
    "post_norm": (dict(post_norm=True), "post_norm=True", "post_norm=False"),
    "norm_pre": (dict(norm_pre=True), "norm_pre=True", "norm_pre=False"),
    "registers": (dict(register_tokens=2), "register_tokens=2", "register_tokens=0"),
    "distillation_token": (dict(distillation_token=True), "distillation_token=True", "distillation_token=False"),
    "fc_norm": (dict(classifier="gap", fc_norm=True), "fc_norm=True", "fc_norm=False"),
    "class_token_gap": (dict(classifier="gap", class_token=True), "classifier='gap'", "classifier='token'"),
    "no_qkv_bias": (dict(qkv_bias=False), "qkv_bias=False", "qkv_bias=True"),
    "rms_norm": (dict(normalization="rms_norm"), "normalization='rms_norm'", "normalization='layer_norm'"),
    "exact_gelu": (dict(mlp_activation="gelu"), "mlp_activation='gelu'", "mlp_activation='gelu_tanh'"),
    "epsilon": (dict(layer_norm_epsilon=1e-5), "layer_norm_epsilon=1e-05", "layer_norm_epsilon=1e-06"),
    "no_patch_bias": (dict(patch_bias=False), "patch_bias=False", "patch_bias=True"),
}


@pytest.mark.backend_independent
@pytest.mark.parametrize("switches, has, read_back", UNHELD_SWITCHES.values(), ids=UNHELD_SWITCHES)
def test_save_npz_refuses_each_switch_the_layout_cannot_hold_by_name_writing_nothing(switches, has, read_back,
                                                                                    tmp_path):
    model = keras_vit.ViT(image_size=32, **SMALL, classes=5, **switches)
    with pytest.raises(CheckpointError, match=f"^{re.escape(f'vit has {has}, which the original .npz layout cannot hold (a file of it reads back as {read_back}): save it with model.save, or checkpoints.save_timm. Nothing was written.')}$"):
        checkpoints.save_npz(model, str(tmp_path / "model.npz"))
    assert not os.listdir(tmp_path)


@pytest.mark.backend_independent
def test_save_npz_refuses_a_grid_and_adapters_the_layout_cannot_hold(tmp_path):
    with pytest.raises(CheckpointError, match=r"^vit has a 2x8 patch grid, which the original \.npz layout cannot state: "
                                              r"its readers take the square grid of the table's 16 rows \(4x4\)\. "
                                              r"Save it with model.save, or checkpoints.save_timm\. Nothing was "
                                              r"written\.$"):
        checkpoints.save_npz(keras_vit.ViT(image_size=(16, 64), **SMALL), str(tmp_path / "wide.npz"))
    adapted = keras_vit.enable_lora(keras_vit.ViT(image_size=32, **SMALL), rank=2)
    with pytest.raises(CheckpointError, match=r"has LoRA adapters, which the original \.npz layout has not: call "
                                              r"keras_vit.merge_lora\(model\) first, then save_npz"):
        checkpoints.save_npz(adapted, str(tmp_path / "adapted.npz"))
    assert not os.listdir(tmp_path)
