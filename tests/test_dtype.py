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
