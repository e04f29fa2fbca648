"""`dtype=` on ViT and from_pretrained: a float32 checkpoint run in bfloat16, kept through predict and .keras."""

import keras
import numpy as np
import pytest
from conftest import SMALL, fixture, predict, reference

import keras_vit

# bfloat16 keeps 8 bits of mantissa: logits move by a few hundredths, the classes do not.
TOLERANCE = 0.05


@pytest.mark.parametrize("dtype", ["bfloat16", "mixed_bfloat16"])
def test_float32_checkpoint_runs_in_bfloat16_close_to_the_reference(dtype):
    images, logits = reference("vit_token")  # timm's logits for the same file
    model = keras_vit.from_pretrained(fixture("vit_token.npz"), dtype=dtype, classifier_activation=None)
    block = model.get_layer("encoderblock_0")
    assert block.qkv.compute_dtype == "bfloat16"
    assert block.qkv.kernel.dtype == ("bfloat16" if dtype == "bfloat16" else "float32")
    assert model.get_layer("predictions").compute_dtype == "float32"
    for output in (predict(model, images), np.asarray(model.predict(images, verbose=0))):
        assert output.dtype == np.float32
        assert np.abs(output - logits).max() < TOLERANCE * np.abs(logits).max()
        assert (output.argmax(-1) == logits.argmax(-1)).all()


def test_layer_norm_and_attention_softmax_compute_in_float32():
    model = keras_vit.ViT(image_size=32, **SMALL, classes=3, dtype="bfloat16")
    block = model.get_layer("encoderblock_0")
    x = keras.ops.convert_to_tensor(np.random.default_rng(0).normal(size=(1, 17, 48)), "bfloat16")
    assert keras.backend.standardize_dtype(block.attention_norm(x).dtype) == "bfloat16"  # handed on in bfloat16
    _, weights = block(x, return_attention_weights=True)
    assert keras.backend.standardize_dtype(weights.dtype) == "float32"


@pytest.mark.parametrize("dtype", ["bfloat16", "mixed_bfloat16", keras.DTypePolicy("mixed_bfloat16")])
def test_dtype_survives_a_keras_round_trip(dtype, tmp_path):
    model = keras_vit.ViT(image_size=32, **SMALL, classes=3, dtype=dtype)
    images = np.random.default_rng(1).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    model.save(tmp_path / "vit.keras")
    reloaded = keras.saving.load_model(tmp_path / "vit.keras")
    name = dtype if isinstance(dtype, str) else dtype.name
    assert {layer.dtype_policy.name for layer in reloaded.layers if layer.name.startswith("encoderblock")} == {name}
    np.testing.assert_array_equal(predict(reloaded, images), predict(model, images))


def test_the_global_policy_is_left_as_it_was():
    keras.config.set_dtype_policy("float32")
    keras_vit.ViT(image_size=32, **SMALL, classes=3, dtype="bfloat16")
    assert keras.config.dtype_policy().name == "float32"
    keras_vit.from_pretrained(fixture("vit_gap.npz"), dtype="mixed_bfloat16")
    assert keras.config.dtype_policy().name == "float32"
    assert keras_vit.ViT(image_size=32, **SMALL, classes=3).get_layer("head").dtype_policy.name == "float32"


@pytest.mark.backend_independent
def test_models_built_at_once_in_two_threads_keep_their_own_precision_and_never_switch_the_global_one(monkeypatch):
    """Each layer gets the model's dtype=; the global policy, seen from inside a build, stays as it was."""
    import threading

    import keras_vit.model.graph

    seen, together, real = [], threading.Barrier(2, timeout=60), keras_vit.model.graph.PatchEmbedding

    def patch_embedding_when_both_are_building(*args, **kwargs):
        together.wait()  # Both builds are under way here.
        seen.append(keras.config.dtype_policy().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(keras_vit.model.graph, "PatchEmbedding", patch_embedding_when_both_are_building)
    models = {}

    def build(dtype):
        models[dtype] = keras_vit.ViT(image_size=32, **SMALL, classes=3, dtype=dtype, name=f"vit_{dtype}")

    threads = [threading.Thread(target=build, args=(dtype,)) for dtype in ("bfloat16", "mixed_float16")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert seen == ["float32", "float32"]
    for dtype, model in models.items():
        assert {layer.dtype_policy.name for layer in model.layers if layer.name != "predictions"
                and layer.weights} == {dtype}
        assert {v.dtype for v in model.weights} == {"bfloat16" if dtype == "bfloat16" else "float32"}
        assert model.get_layer("encoderblock_0").qkv.compute_dtype == dtype.replace("mixed_", "")


def test_unknown_dtype_names_the_choices():
    with pytest.raises(ValueError, match=r"^Unknown dtype 'bf16'; choose among \['float32', 'bfloat16', "
                                         r"'mixed_bfloat16', 'float16', 'mixed_float16'\] or pass a keras.DTypePolicy\.$"):
        keras_vit.ViT(image_size=32, **SMALL, classes=3, dtype="bf16")


@pytest.mark.skipif(keras.backend.backend() == "torch", reason="a SavedModel is written on tensorflow and jax")
def test_saved_model_keeps_bfloat16(tmp_path):
    pytest.importorskip("onnxruntime")  # the export extra
    from test_export import run_saved_model

    model = keras_vit.ViT(image_size=32, **SMALL, classes=3, dtype="bfloat16", classifier_activation=None)
    images = np.random.default_rng(1).uniform(-1, 1, (3, 32, 32, 3)).astype("float32")
    model.export(str(tmp_path / "served"), format="tf_saved_model", verbose=False)
    (served,) = run_saved_model(str(tmp_path / "served"), [images])
    np.testing.assert_allclose(served, predict(model, images), atol=1e-6, rtol=0)


def test_onnx_of_a_bfloat16_model_is_refused_with_the_way_out(tmp_path):
    model = keras_vit.ViT(image_size=32, **SMALL, classes=3, dtype="mixed_bfloat16")
    with pytest.raises(ValueError, match=r"computes in bfloat16, which ONNX Runtime cannot run on CPUs .* "
                                         r"dtype='float32'"):
        model.export(str(tmp_path / "vit.onnx"), format="onnx")


def test_a_bfloat16_keras_file_keeps_its_precision_through_from_pretrained(tmp_path):
    model = keras_vit.ViT(image_size=32, **SMALL, classes=10, dtype="bfloat16", classifier_activation=None)
    rng = np.random.default_rng(0)
    for variable in model.weights:  # a non-zero head, so that the outputs tell the precisions apart
        variable.assign(rng.normal(scale=0.2, size=variable.shape).astype(variable.dtype))
    path = str(tmp_path / "b.keras")
    model.save(path)
    images, _ = reference("vit_token")
    loaded = keras_vit.from_pretrained(path)
    assert loaded.get_layer("encoderblock_0").qkv.kernel.dtype == "bfloat16"
    np.testing.assert_allclose(predict(loaded, images), predict(model, images), atol=1e-6)
    widened = keras_vit.from_pretrained(path, dtype="float32")
    assert widened.get_layer("encoderblock_0").qkv.kernel.dtype == "float32"
    assert np.abs(predict(widened, images) - predict(model, images)).max() > 1e-4  # float32 computes otherwise


@pytest.mark.parametrize("policy", ["int8", "int8_from_float32"])
def test_a_non_float_dtype_policy_is_refused_with_the_way_to_int8(policy):
    dtype = keras.DTypePolicy(policy) if policy == "int8" else keras.dtype_policies.get(policy)
    with pytest.raises(ValueError, match=rf"^dtype policy '{policy}' is not a floating-point precision; build the "
                                         r"model in one of \['float32', .*\], then call model.quantize\('int8'\)"):
        keras_vit.ViT(image_size=32, **SMALL, dtype=dtype)


# RoPE families in reduced precision, on every backend: TensorFlow refused to multiply the positions, cast to
# bfloat16 by Keras, by the float32 frequencies, so no RoPE model built there (before 2026-12-07).
@pytest.mark.parametrize("case, reference_file, dtype", [
    ("timm_eva/eva02_axial", "timm_eva_reference.npz", "mixed_bfloat16"),  # EVA-02: positions rescaled, fractional
    ("timm_gemma4/encoder_soft_grouped", "gemma4_reference.npz", "bfloat16"),  # Gemma 4: per-axis halves, clamps
])
def test_rope_models_build_and_run_in_bfloat16_close_to_the_reference(case, reference_file, dtype):
    with np.load(fixture(reference_file)) as data:
        name = case.split("/")[1]
        images = data[f"{name}/native/images"]
        expected = next(data[f"{name}/native/{key}"] for key in ("logits", "soft_tokens") if f"{name}/native/{key}"
                        in data)
    model = keras_vit.from_pretrained(fixture(case), dtype=dtype, classifier_activation=None)
    output = np.asarray(keras.ops.convert_to_numpy(keras.ops.cast(model(images), "float32")))
    assert np.abs(output - expected).max() < TOLERANCE * np.abs(expected).max()


@pytest.mark.backend_independent
def test_rope_positions_reach_the_rotation_in_float32_in_a_bfloat16_model(monkeypatch):
    """Keras casts a layer's floating arguments to its compute dtype: the blocks take the positions as they are, so
    EVA-02's fractional coordinates (a 14x14 grid rescaled to 16x16 here) are not rounded to bfloat16."""
    from keras_vit.layers import attention, rope

    seen, rotate = [], rope.rotate_queries_and_keys

    def recording(query, key, positions, *args):
        seen.append(np.asarray(keras.ops.convert_to_numpy(positions)))
        return rotate(query, key, positions, *args)

    monkeypatch.setattr(attention.rope_module, "rotate_queries_and_keys", recording)
    model = keras_vit.ViT(image_size=112, patch_size=8, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=32,
                          dtype="mixed_bfloat16", architecture=keras_vit.Architecture(
                              class_token=False, classifier="gap", position_embedding=False, rope="axial",
                              rope_reference_grid=(16, 16)))
    model(np.zeros((1, 112, 112, 3), "float32"))
    expected = np.asarray(keras.ops.convert_to_numpy(rope.grid_coordinates(14, 14, reference_grid=(16, 16))))
    assert seen and seen[-1].dtype == np.float32
    np.testing.assert_array_equal(seen[-1], expected)
    assert not np.array_equal(expected.astype(keras.ops.convert_to_numpy(keras.ops.zeros((), "bfloat16")).dtype)
                              .astype("float32"), expected)  # bfloat16 would have rounded them


# Every family's parts through a .keras file in bfloat16: ExactGELU (the MbConv and convolutional stems') had no
# config Keras could write beside a dtype policy, so a bfloat16 hybrid could not be saved (before 2026-12-07).
@pytest.mark.backend_independent
@pytest.mark.parametrize("case", ["timm_hybrid/mbconv", "timm_hybrid/conv_stem", "hybrid_token.npz",
                                  "timm_sam/windowed_neck", "timm_cait/token", "timm_beit/shared_abs_token",
                                  "timm_relpos/mlp_gap", "timm_gemma4/classifier_clipped", "timm_eva/naver_mixed_ape",
                                  "timm_family/differential", "timm_naflex/parfac"])
def test_every_family_saves_and_reloads_in_bfloat16_with_the_same_outputs(case, tmp_path):
    model = keras_vit.from_pretrained(fixture(case), dtype="bfloat16")
    shape = [side or 24 for side in model.input_shape[1:3]] if not isinstance(model.input, dict) else [24, 40]
    images = np.random.default_rng(0).uniform(-1, 1, (2, *shape, 3)).astype("float32")
    model.save(tmp_path / "model.keras")
    reloaded = keras.saving.load_model(tmp_path / "model.keras")
    assert reloaded.get_layer("encoderblock_0").weights[0].dtype == "bfloat16"
    np.testing.assert_array_equal(predict(reloaded, images), predict(model, images))
