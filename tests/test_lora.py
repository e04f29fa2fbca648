"""LoRA through Keras' Dense.enable_lora: only the adapters and the head train; saved, reloaded and merged."""

import keras
import numpy as np
import pytest

import keras_vit
from conftest import SMALL, predict

IMAGES = np.random.default_rng(0).uniform(-1, 1, (8, 32, 32, 3)).astype("float32")
LABELS = np.arange(8) % 3


def adapted(targets=("qkv", "mlp_hidden"), architecture=None):
    model = keras_vit.ViT(image_size=32, **SMALL, classes=3, classifier_activation=None, architecture=architecture)
    rng = np.random.default_rng(1)
    for variable in model.weights:  # a non-zero head, so the adapters get gradients
        variable.assign(rng.normal(scale=0.1, size=variable.shape).astype("float32"))
    return keras_vit.enable_lora(model, rank=2, targets=targets)


def values(model):
    return {v.path: keras.ops.convert_to_numpy(v).copy() for v in model.weights}


@pytest.mark.backend_independent
@pytest.mark.parametrize("architecture", [
    keras_vit.Architecture(layer_scale=0.1),  # DeiT-III, DINOv2, Eva: the block's own gammas
    keras_vit.Architecture(layer_scale=0.1, attention_only_layer_scale=True, num_kv_heads=(3, 1)),  # Sapiens2
    keras_vit.Architecture(differential_attention=True, rope="axial", class_token=False, classifier="gap"),
], ids=["layer_scale", "sapiens2", "differential"])
def test_the_blocks_own_variables_are_frozen_with_their_sublayers(architecture):
    model = adapted(architecture=architecture)
    adapters = [f"encoderblock_{i}/{name}/lora_kernel_{ab}" for i in range(2) for name in ("mlp_hidden", "qkv")
                for ab in "ab"]
    assert sorted(v.path for v in model.trainable_weights) == sorted(adapters + ["head/bias", "head/kernel"])


def test_only_the_adapters_and_the_head_train():
    model = adapted()
    trainable = sorted(v.path for v in model.trainable_weights)
    adapters = [f"encoderblock_{i}/{name}/lora_kernel_{ab}" for i in range(2) for name in ("mlp_hidden", "qkv")
                for ab in "ab"]
    assert trainable == sorted(adapters + ["head/bias", "head/kernel"])
    before = values(model)
    model.compile(optimizer=keras.optimizers.SGD(0.5),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(IMAGES, LABELS, epochs=2, batch_size=4, verbose=0)
    after = values(model)
    changed = sorted(path for path in before if not np.array_equal(before[path], after[path]))
    assert set(changed) <= set(trainable) and {"head/kernel", "head/bias"} <= set(changed)
    assert "encoderblock_0/qkv/kernel" not in changed and "encoderblock_0/qkv/bias" not in changed
    assert any(path.endswith("lora_kernel_b") for path in changed)  # the adapters did learn
    parameters = sum(int(np.prod(v.shape)) for v in model.trainable_weights)
    assert parameters < model.count_params() // 5


def test_saved_model_reloads_with_equal_outputs_and_its_adapters(tmp_path):
    model = adapted()
    for block in ("encoderblock_0", "encoderblock_1"):  # trained-looking adapters
        model.get_layer(block).qkv.lora_kernel_b.assign(np.full(model.get_layer(block).qkv.lora_kernel_b.shape, 0.05))
    model.save(tmp_path / "lora.keras")
    reloaded = keras.saving.load_model(tmp_path / "lora.keras")
    np.testing.assert_allclose(predict(reloaded, IMAGES), predict(model, IMAGES), atol=1e-5, rtol=0)
    block = reloaded.get_layer("encoderblock_0")
    assert block.qkv.lora_enabled and block.mlp_hidden.lora_enabled and not block.mlp_output.lora_enabled
    assert sorted(v.path for v in reloaded.trainable_weights) == sorted(v.path for v in model.trainable_weights)


def test_merge_gives_a_plain_model_with_equal_outputs(tmp_path):
    model = adapted(("qkv", "attention_output", "mlp_hidden", "mlp_output"))
    rng = np.random.default_rng(2)
    for variable in model.weights:
        if "lora_kernel" in variable.path:
            variable.assign(rng.normal(scale=0.05, size=variable.shape).astype("float32"))
    plain = keras_vit.merge_lora(model)
    assert not any("lora" in v.path for v in plain.weights)
    assert plain.get_layer("encoderblock_0").get_config().get("lora_rank") is None
    np.testing.assert_allclose(predict(plain, IMAGES), predict(model, IMAGES), atol=1e-5, rtol=0)


def test_merged_model_of_a_trained_model_and_the_model_both_keep_running():
    # On JAX the merged model shared the trained model's arrays, and running one deleted the other's.
    model = adapted()
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=keras.losses.SparseCategoricalCrossentropy(True))
    model.fit(IMAGES, LABELS, epochs=1, batch_size=4, verbose=0)
    plain = keras_vit.merge_lora(model)
    expected = model.predict(IMAGES, verbose=0)
    np.testing.assert_allclose(plain.predict(IMAGES, verbose=0), expected, atol=1e-5, rtol=0)
    model.fit(IMAGES, LABELS, epochs=1, batch_size=4, verbose=0)
    np.testing.assert_allclose(plain.predict(IMAGES, verbose=0), expected, atol=1e-5, rtol=0)
    assert model.predict(IMAGES, verbose=0).shape == (8, 3)


def test_bad_lora_arguments_are_refused_with_the_choices():
    model = keras_vit.ViT(image_size=32, **SMALL, classes=3)
    with pytest.raises(ValueError, match=r"Unknown LoRA targets \['query'\]; choose among \['qkv', "):
        keras_vit.enable_lora(model, 4, targets=("query",))
    with pytest.raises(ValueError, match="rank must be a positive int, got 0"):
        keras_vit.enable_lora(model, 0)
    keras_vit.enable_lora(model, 4)
    with pytest.raises(ValueError, match=r"already has LoRA adapters \(encoderblock_0/qkv, encoderblock_1/qkv\); "
                                         "call merge_lora first"):
        keras_vit.enable_lora(model, 4)
    with pytest.raises(ValueError, match="has no TransformerBlock layers to adapt"):
        keras_vit.enable_lora(keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]), 4)


def test_a_refused_call_leaves_the_model_as_it_was_and_the_retry_works():
    model = keras_vit.ViT(image_size=32, **SMALL, classes=3)
    before = {layer.name: layer.trainable for layer in model.layers}
    with pytest.raises(ValueError, match=r"^LoRA targets \['qkv', 'qkv'\] name \['qkv'\] more than once; name each "
                                         r"dense layer once\.$"):
        keras_vit.enable_lora(model, 4, targets=("qkv", "qkv"))
    with pytest.raises(ValueError, match=r"^alpha must be a positive number \(or None for rank\), got -1\.$"):
        keras_vit.enable_lora(model, 4, alpha=-1)
    assert {layer.name: layer.trainable for layer in model.layers} == before
    assert not any("lora" in v.path for v in model.weights)
    keras_vit.enable_lora(model, np.int64(4))  # numpy integers are ints too
    assert model.get_layer("encoderblock_1").qkv.lora_rank == 4


def test_a_lora_keras_file_loads_through_keras_vit_with_its_adapters_merged(tmp_path, keras_vit_log):
    model = adapted()
    model.compile(optimizer=keras.optimizers.SGD(0.5),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(IMAGES, LABELS, epochs=1, batch_size=4, verbose=0)  # adapters away from zero
    assert np.abs(keras.ops.convert_to_numpy(model.get_layer("encoderblock_0").qkv.lora_kernel_b)).max() > 0
    path = str(tmp_path / "lora.keras")
    model.save(path)
    expected = predict(model, IMAGES)
    for loaded in (keras_vit.from_pretrained(path), keras_vit.ViT(image_size=32, **SMALL, classes=3, weights=path,
                                                                   classifier_activation=None)):
        assert not any("lora" in v.path for v in loaded.weights)
        np.testing.assert_allclose(predict(loaded, IMAGES), expected, atol=1e-5)
    assert f"{path} holds LoRA adapters on 4 dense layers; they were merged into the kernels" in keras_vit_log.text
