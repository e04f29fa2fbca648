import math

import keras
import numpy as np
import pytest

from conftest import predict
from keras_vit import resize_position_embeddings
from keras_vit.layers import (
    AddPositionEmbedding,
    ClassToken,
    LayerNorm,
    PatchEmbedding,
    TokenPooling,
    TransformerBlock,
)


def numpy_layer_norm(x, gamma, beta, epsilon=1e-6):
    mean = x.mean(-1, keepdims=True)
    variance = x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(variance + epsilon) * gamma + beta


def numpy_gelu(x, approximate):
    if approximate:
        return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
    from scipy.special import erf

    return 0.5 * x * (1 + erf(x / np.sqrt(2)))


def numpy_block(block, x, approximate=True):
    """Eq. 2-3 of the paper, written out in float64 numpy with the block's weights."""
    w = {v.path.split("/", 1)[1]: keras.ops.convert_to_numpy(v).astype(np.float64) for v in block.weights}
    batch, tokens, hidden = x.shape
    heads = block.num_heads
    y = numpy_layer_norm(x, w["attention_norm/gamma"], w["attention_norm/beta"])
    qkv = (y @ w["qkv/kernel"] + w["qkv/bias"]).reshape(batch, tokens, 3, heads, hidden // heads)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    logits = np.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(hidden // heads)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    context = np.einsum("bhqk,bkhd->bqhd", probs, v).reshape(batch, tokens, hidden)
    x = x + context @ w["attention_output/kernel"] + w["attention_output/bias"]
    y = numpy_layer_norm(x, w["mlp_norm/gamma"], w["mlp_norm/beta"])
    y = numpy_gelu(y @ w["mlp_hidden/kernel"] + w["mlp_hidden/bias"], approximate)
    return x + y @ w["mlp_output/kernel"] + w["mlp_output/bias"], probs


def randomise(layer, seed=0):
    rng = np.random.default_rng(seed)
    for variable in layer.weights:
        variable.assign(rng.normal(scale=0.3, size=variable.shape).astype("float32"))


# --- PatchEmbedding -----------------------------------------------------------


def test_patch_embedding_projects_each_patch_in_row_major_order():
    layer = PatchEmbedding(patch_size=4, hidden_size=5)
    images = np.random.default_rng(0).normal(size=(2, 8, 12, 3)).astype("float32")
    out = predict(layer, images)
    kernel, bias = (keras.ops.convert_to_numpy(v) for v in (layer.kernel, layer.bias))
    patches = images.reshape(2, 2, 4, 3, 4, 3).transpose(0, 1, 3, 2, 4, 5).reshape(2, 6, 48)
    expected = patches @ kernel.reshape(48, 5) + bias
    np.testing.assert_allclose(out, expected, atol=1e-5)


def test_patch_embedding_rejects_size_not_divisible_by_patch():
    with pytest.raises(ValueError, match="width 30 is not divisible by the patch size 8"):
        PatchEmbedding(patch_size=8, hidden_size=4)(np.zeros((1, 32, 30, 3), "float32"))


# --- ClassToken and AddPositionEmbedding --------------------------------------


def test_class_token_is_prepended_to_every_sample():
    layer = ClassToken()
    tokens = np.ones((3, 4, 6), "float32")
    layer.build(tokens.shape)
    layer.cls.assign(np.arange(6, dtype="float32").reshape(1, 1, 6))
    out = predict(layer, tokens)
    assert out.shape == (3, 5, 6)
    np.testing.assert_array_equal(out[:, 0], np.tile(np.arange(6), (3, 1)))
    np.testing.assert_array_equal(out[:, 1:], tokens)


def test_position_embedding_is_added_at_the_built_grid():
    layer = AddPositionEmbedding(grid_size=(2, 3))
    tokens = np.random.default_rng(1).normal(size=(2, 7, 4)).astype("float32")
    out = predict(layer, tokens)
    table = keras.ops.convert_to_numpy(layer.pos_embedding)
    np.testing.assert_allclose(out, tokens + table, atol=1e-6)


def test_position_embedding_resizes_on_the_fly_for_another_grid():
    layer = AddPositionEmbedding(grid_size=(2, 3), interpolation="bilinear")
    layer.build((None, 7, 4))
    table = keras.ops.convert_to_numpy(layer.pos_embedding)
    tokens = np.zeros((1, 1 + 4 * 5, 4), "float32")
    out = keras.ops.convert_to_numpy(layer(tokens, grid_size=(4, 5)))
    expected = resize_position_embeddings(table, (4, 5), (2, 3), interpolation="bilinear")
    np.testing.assert_allclose(out, expected, atol=1e-6)
    square = keras.ops.convert_to_numpy(layer(np.zeros((1, 1 + 16, 4), "float32")))
    np.testing.assert_allclose(square, resize_position_embeddings(table, 4, (2, 3), interpolation="bilinear"), atol=1e-6)


def test_position_embedding_rejects_tokens_that_form_no_grid():
    layer = AddPositionEmbedding(grid_size=(2, 3))
    with pytest.raises(ValueError, match="11 tokens do not form 1 prefix tokens"):
        layer(np.zeros((1, 11, 4), "float32"))


# --- TransformerBlock ---------------------------------------------------------


@pytest.mark.parametrize("approximate", [True, False])
def test_transformer_block_matches_numpy_equations(approximate):
    block = TransformerBlock(num_heads=4, mlp_dim=24, approximate_gelu=approximate)
    x = np.random.default_rng(2).normal(size=(2, 9, 16)).astype("float32")
    block.build(x.shape)
    randomise(block)
    expected, expected_probs = numpy_block(block, x.astype(np.float64), approximate)
    fused = predict(block, x)
    out, probs = block(x, return_attention_weights=True)
    np.testing.assert_allclose(fused, expected, atol=2e-5)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(out), expected, atol=2e-5)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(probs), expected_probs, atol=2e-6)


def test_tanh_and_exact_gelu_differ():
    x = np.random.default_rng(3).normal(size=(1, 5, 8)).astype("float32")
    approx, exact = TransformerBlock(2, 16, approximate_gelu=True), TransformerBlock(2, 16, approximate_gelu=False)
    approx.build(x.shape), exact.build(x.shape)
    randomise(approx), randomise(exact)
    assert np.abs(predict(approx, x) - predict(exact, x)).max() > 1e-5


def test_dropout_and_stochastic_depth_act_only_in_training():
    block = TransformerBlock(2, 16, dropout_rate=0.3, attention_dropout_rate=0.3, stochastic_depth_rate=0.5, seed=1)
    x = np.random.default_rng(4).normal(size=(8, 5, 8)).astype("float32")
    block.build(x.shape)
    randomise(block)
    inference = keras.ops.convert_to_numpy(block(x, training=False))
    reference, _ = numpy_block(block, x.astype(np.float64))
    np.testing.assert_allclose(inference, reference, atol=2e-5)
    trained = keras.ops.convert_to_numpy(block(x, training=True))
    assert np.abs(trained - inference).max() > 1e-3


def test_dropout_alone_acts_in_training_and_rate_zero_trains_as_inference():
    x = np.random.default_rng(4).normal(size=(8, 5, 8)).astype("float32")
    for rates, changes in (({"dropout_rate": 0.3}, True), ({"attention_dropout_rate": 0.3}, True), ({}, False)):
        block = TransformerBlock(2, 16, seed=1, **rates)
        block.build(x.shape)
        randomise(block)
        inference = keras.ops.convert_to_numpy(block(x, training=False))
        trained = keras.ops.convert_to_numpy(block(x, training=True))
        assert (np.abs(trained - inference).max() > 1e-3) == changes, rates


def test_stochastic_depth_drops_whole_samples():
    block = TransformerBlock(2, 16, stochastic_depth_rate=0.9, seed=3)
    x = np.random.default_rng(5).normal(size=(64, 5, 8)).astype("float32")
    block.build(x.shape)
    randomise(block)
    out = keras.ops.convert_to_numpy(block(x, training=True))
    unchanged = np.all(np.isclose(out, x, atol=1e-6), axis=(1, 2))
    # With p = 0.9 both branches are dropped for about 81% of the samples.
    assert 0.5 < unchanged.mean() < 0.98


def test_attention_weights_are_bidirectional_probabilities():
    block = TransformerBlock(num_heads=2, mlp_dim=8)
    x = np.random.default_rng(6).normal(size=(1, 6, 8)).astype("float32")
    _, probs = block(x, return_attention_weights=True)
    probs = keras.ops.convert_to_numpy(probs)
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-6)
    assert np.all(probs[0, 0][np.triu_indices(6, k=1)] > 0), "tokens must attend to later ones"


def test_transformer_block_rejects_width_not_divisible_by_heads():
    with pytest.raises(ValueError, match="hidden_size 10 is not divisible by num_heads 3"):
        TransformerBlock(num_heads=3, mlp_dim=8)(np.zeros((1, 4, 10), "float32"))


# --- Pooling ------------------------------------------------------------------


def test_token_pooling_methods():
    tokens = np.arange(2 * 3 * 2, dtype="float32").reshape(2, 3, 2)
    np.testing.assert_array_equal(predict(TokenPooling("token"), tokens), tokens[:, 0])
    np.testing.assert_allclose(predict(TokenPooling("gap", 1), tokens), tokens[:, 1:].mean(1))
    with pytest.raises(ValueError, match="Unknown pooling 'max'"):
        TokenPooling("max")


# --- Serialization and precision ----------------------------------------------


LAYERS = [
    lambda: PatchEmbedding(patch_size=(4, 2), hidden_size=6, name="p"),
    lambda: ClassToken(name="c"),
    lambda: AddPositionEmbedding(grid_size=(3, 4), num_prefix_tokens=0, interpolation="bilinear", antialias=True),
    lambda: TransformerBlock(num_heads=2, mlp_dim=12, dropout_rate=0.1, attention_dropout_rate=0.2,
                             stochastic_depth_rate=0.3, approximate_gelu=False, seed=7),
    lambda: TokenPooling("gap", num_prefix_tokens=2),
    lambda: LayerNorm(epsilon=1e-6, name="n"),
]


@pytest.mark.parametrize("make", LAYERS)
def test_layer_config_round_trip(make):
    layer = make()
    config = layer.get_config()
    clone = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert type(clone) is type(layer)
    assert clone.get_config() == config


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_block_keeps_its_own_policy_under_another_global_policy(policy):
    block = TransformerBlock(2, 16, dropout_rate=0.1, stochastic_depth_rate=0.1, dtype=policy)
    x = keras.ops.cast(np.ones((2, 5, 8), "float32"), block.compute_dtype)
    for training in (False, True):
        assert keras.backend.standardize_dtype(block(x, training=training).dtype) == block.compute_dtype


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_layers_run_in_mixed_precision_with_float32_weights(policy):
    keras.config.set_dtype_policy(policy)
    images = np.random.default_rng(7).uniform(-1, 1, size=(2, 8, 8, 3)).astype("float32")
    x = PatchEmbedding(4, 8)(images)
    x = ClassToken()(x)
    x = AddPositionEmbedding((2, 2))(x)
    block = TransformerBlock(2, 16)
    out, probs = block(x, return_attention_weights=True)
    assert keras.backend.standardize_dtype(out.dtype) == keras.config.dtype_policy().compute_dtype
    assert keras.backend.standardize_dtype(probs.dtype) == "float32"
    assert all(v.dtype == "float32" for v in block.weights)
    assert np.all(np.isfinite(keras.ops.convert_to_numpy(keras.ops.cast(out, "float32"))))


def layer_norm_pair(x, **kwargs):
    ours, reference = LayerNorm(epsilon=1e-6, **kwargs), keras.layers.LayerNormalization(epsilon=1e-6, **kwargs)
    rng = np.random.default_rng(7)
    for layer in (ours, reference):
        layer.build(x.shape)
    gamma, beta = rng.normal(1.0, 0.3, x.shape[-1]), rng.normal(0.0, 0.3, x.shape[-1])
    for layer in (ours, reference):
        for variable, value in ((layer.gamma, gamma), (layer.beta, beta)):
            if variable is not None:
                variable.assign(value.astype("float32"))
    return ours, reference


def test_layer_norm_equals_keras_layer_normalization_and_numpy():
    x = np.random.default_rng(8).normal(3.0, 2.0, size=(2, 5, 48)).astype("float32")
    ours, reference = layer_norm_pair(x)
    expected = numpy_layer_norm(x.astype("float64"), keras.ops.convert_to_numpy(ours.gamma),
                                keras.ops.convert_to_numpy(ours.beta))
    np.testing.assert_allclose(predict(ours, x), expected, atol=2e-5)
    np.testing.assert_allclose(predict(ours, x), predict(reference, x), atol=2e-5)


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_layer_norm_computes_in_float32_under_mixed_precision(policy):
    # 256 or 258: exact in float16 and bfloat16, but their mean (~257) is not representable in
    # bfloat16 and their sum (~65,800) overflows float16, so half-precision statistics would fail.
    x = (256 + 2 * np.random.default_rng(11).integers(0, 2, size=(2, 4, 256))).astype("float32")
    ours = LayerNorm(epsilon=1e-6, dtype=policy)
    out = ours(keras.ops.cast(x, ours.compute_dtype))
    assert keras.backend.standardize_dtype(out.dtype) == ours.compute_dtype
    expected = numpy_layer_norm(keras.ops.convert_to_numpy(keras.ops.cast(keras.ops.cast(x, ours.compute_dtype),
                                                                            "float32")).astype("float64"), 1.0, 0.0)
    # Statistics in float32: only the output's own rounding (8 or 11 bits) remains.
    np.testing.assert_allclose(keras.ops.convert_to_numpy(keras.ops.cast(out, "float32")), expected, atol=0.03)


def test_patch_embedding_refuses_a_size_it_would_crop():
    layer = PatchEmbedding(patch_size=8, hidden_size=4)
    layer(np.zeros((1, 32, 32, 3), "float32"))
    with pytest.raises(ValueError, match=r"Image height 36 is not divisible by the patch size 8 \(input shape \(1, 36, 32, 3\)\)"):
        layer(np.zeros((1, 36, 32, 3), "float32"))
