import json
import os

import keras
import numpy as np
import pytest
from conftest import SMALL, SMALL_HYBRID, fixture, predict
from test_layers import numpy_block

import keras_vit
from keras_vit.tools import analysis


def small_model(**kwargs):
    return keras_vit.ViT(**{"image_size": 32, **SMALL, "weights": fixture("vit_token.npz"), **kwargs})


def test_attention_weights_are_the_blocks_own():
    model = small_model()
    images = np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    attentions = analysis.attention_weights(model, images)
    assert [a.shape for a in attentions] == [(2, 3, 17, 17)] * 2
    tokens = keras.Model(model.input, model.get_layer("position_embedding").output)(images)
    _, expected = numpy_block(model.get_layer("encoderblock_0"), keras.ops.convert_to_numpy(tokens).astype("float64"))
    np.testing.assert_allclose(attentions[0], expected, atol=1e-5)
    np.testing.assert_allclose(attentions[1].sum(-1), 1.0, atol=1e-5)


def test_attention_weights_of_a_gap_model_have_no_prefix():
    model = small_model(weights=fixture("vit_gap.npz"))
    attentions = analysis.attention_weights(model, np.zeros((1, 32, 32, 3), "float32"))
    assert attentions[0].shape == (1, 3, 16, 16)


def test_rollout_of_identity_attention_is_identity():
    identity = [np.broadcast_to(np.eye(5), (2, 3, 5, 5))] * 4
    np.testing.assert_allclose(analysis.attention_rollout(identity), np.broadcast_to(np.eye(5), (2, 5, 5)))


def test_rollout_multiplies_residual_augmented_layers_in_order():
    rng = np.random.default_rng(1)
    layers = [rng.dirichlet(np.ones(4), size=(1, 2, 4)) for _ in range(3)]
    expected = np.eye(4)
    for layer in layers:
        fused = 0.5 * layer.mean(1)[0] + 0.5 * np.eye(4)
        expected = (fused / fused.sum(-1, keepdims=True)) @ expected
    np.testing.assert_allclose(analysis.attention_rollout(layers)[0], expected, atol=1e-12)
    np.testing.assert_allclose(analysis.attention_rollout(layers, head_fusion="max").sum(-1), 1.0)
    with pytest.raises(ValueError, match="Unknown head_fusion 'median'"):
        analysis.attention_rollout(layers, head_fusion="median")


def test_rollout_map_and_overlay():
    rollout = np.zeros((1, 5, 5))
    rollout[0, 0, 1:] = [0.1, 0.2, 0.3, 0.4]
    heat = analysis.rollout_map(rollout, (2, 2))
    np.testing.assert_allclose(heat[0], [[0, 1 / 3], [2 / 3, 1]])
    image = np.full((4, 4, 3), 200, np.uint8)
    blended = analysis.overlay(image, heat[0], strength=1.0)
    assert blended[0, 0, 0] == 0 and blended[3, 3, 0] == 200 and blended.dtype == np.uint8


def test_uniform_attention_gives_the_mean_pairwise_distance():
    grid, patch = (3, 4), 16
    uniform = [np.full((2, 2, 13, 13), 1 / 13)] * 3
    centres = np.array([(r, c) for r in range(3) for c in range(4)], float) * patch
    expected = np.mean([np.hypot(*(a - b)) for a in centres for b in centres])
    distances = analysis.mean_attention_distance(uniform, grid, patch)
    assert distances.shape == (3, 2)
    np.testing.assert_allclose(distances, expected)


def test_one_hot_attention_on_a_known_offset_gives_that_offset():
    grid, patch = (4, 4), 8
    attention = np.zeros((1, 1, 16, 16))
    for query in range(16):
        row, col = divmod(query, 4)
        key = ((row + 2) % 4) * 4 + col  # two patches down, wrapping
        attention[0, 0, query, key] = 1.0
    distances = analysis.mean_attention_distance([attention], grid, patch, num_prefix_tokens=0)
    np.testing.assert_allclose(distances, [[2 * patch]])
    with pytest.raises(ValueError, match="does not match 1 prefix tokens plus a"):
        analysis.mean_attention_distance([attention], grid, patch, num_prefix_tokens=1)


def test_position_embedding_similarity_of_a_known_pattern():
    model = small_model()
    layer = model.get_layer("position_embedding")
    table = np.zeros((1, 17, 48), "float32")
    table[0, 0] = 5.0  # the class token's slot is ignored
    for index in range(16):
        row, col = divmod(index, 4)
        table[0, 1 + index, row] = 1.0  # same row -> identical direction
        table[0, 1 + index, 4 + col] = 1.0
    layer.pos_embedding.assign(table)
    similarity = analysis.position_embedding_similarity(model)
    assert similarity.shape == (4, 4, 4, 4)
    assert similarity[1, 2, 1, 2] == pytest.approx(1.0)
    assert similarity[1, 2, 1, 3] == pytest.approx(0.5) and similarity[1, 2, 3, 2] == pytest.approx(0.5)
    assert similarity[1, 2, 0, 0] == pytest.approx(0.0)


def test_embedding_filters_are_principal_components():
    model = small_model()
    filters = analysis.embedding_filters(model, n=5)
    assert filters.shape == (5, 8, 8, 3) and filters.min() == 0.0 and filters.max() == 1.0
    kernel = keras.ops.convert_to_numpy(model.get_layer("embedding").kernel).reshape(-1, 48).T
    from sklearn.decomposition import PCA

    first = PCA(n_components=1).fit(kernel).components_[0]
    ours = filters[0].ravel() - filters[0].mean()
    cosine = abs(ours @ (first - first.mean())) / np.linalg.norm(ours) / np.linalg.norm(first - first.mean())
    assert cosine == pytest.approx(1.0, abs=1e-6)


def test_few_shot_matches_an_independent_least_squares_solution():
    rng = np.random.default_rng(2)
    x_train, y_train = rng.normal(size=(40, 6)), rng.integers(0, 3, 40)
    x_test, y_test = rng.normal(size=(30, 6)), rng.integers(0, 3, 30)
    from sklearn.linear_model import Ridge

    targets = np.where(np.eye(3)[y_train] > 0, 1.0, -1.0)
    design = np.hstack([x_train, np.ones((40, 1))])
    ridge = Ridge(alpha=0.5, fit_intercept=False, solver="cholesky").fit(design, targets)
    predicted = ridge.predict(np.hstack([x_test, np.ones((30, 1))])).argmax(-1)
    expected = float(np.mean(predicted == y_test))
    assert analysis.few_shot_linear_eval(x_train, y_train, x_test, y_test, l2_reg=0.5) == pytest.approx(expected)


def test_few_shot_is_perfect_on_linearly_separable_data():
    rng = np.random.default_rng(3)
    centres = rng.normal(scale=10, size=(5, 8))
    labels = np.repeat(np.arange(5), 4)
    features = centres[labels] + rng.normal(scale=0.1, size=(20, 8))
    test = centres[labels] + rng.normal(scale=0.1, size=(20, 8))
    assert analysis.few_shot_linear_eval(features, labels, test, labels, l2_reg=1e-2) == 1.0


def test_extract_features_uses_pre_logits_and_feeds_few_shot():
    tf = pytest.importorskip("tensorflow")
    model = small_model(weights=fixture("vit_prelogits.npz"))
    images = np.random.default_rng(4).uniform(-1, 1, (10, 32, 32, 3)).astype("float32")
    labels = np.arange(10) % 2
    dataset = tf.data.Dataset.from_tensor_slices((images, labels)).batch(4)
    features, extracted_labels = analysis.extract_features(model, dataset)
    assert features.shape == (10, 32)
    np.testing.assert_array_equal(extracted_labels, labels)
    expected = keras.Model(model.input, model.get_layer("pre_logits").output)(images)
    np.testing.assert_allclose(features, keras.ops.convert_to_numpy(expected), atol=1e-5)
    assert 0.0 <= analysis.few_shot_linear_eval(features, labels, features, labels) <= 1.0


@pytest.mark.backend_independent
def test_features_are_what_the_head_reads_fc_norm_included_with_timms_logits():
    # timm's vit_medium_patch16_reg4_gap_256: registers, the patch mean, then fc_norm before the head.
    folder = fixture(os.path.join("timm_family", "reg_gap"))
    model = keras_vit.from_pretrained(folder, classifier_activation=None)
    with open(os.path.join(folder, "config.json")) as f:
        statistics = json.load(f)["pretrained_cfg"]
    with np.load(fixture("timm_family_reference.npz")) as data:
        images, timm_logits = data["reg_gap/images"], data["reg_gap/outputs"]
    images = ((images * np.array(statistics["std"]) + np.array(statistics["mean"])) * 2 - 1).astype("float32")
    features = predict(analysis.feature_model(model), images)
    head = model.get_layer("head")
    np.testing.assert_allclose(features, predict(keras.Model(model.input, head.input), images), atol=1e-6, rtol=0)
    logits = features @ keras.ops.convert_to_numpy(head.kernel) + keras.ops.convert_to_numpy(head.bias)
    np.testing.assert_allclose(logits, predict(model, images), atol=1e-5, rtol=0)
    np.testing.assert_allclose(logits, timm_logits, atol=1e-5, rtol=0)


def test_inspect_writes_every_figure(tmp_path):
    model = small_model()
    image = np.random.default_rng(5).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    written = analysis.inspect(model, image, str(tmp_path))
    assert sorted(written) == ["attention_rollout", "embedding_filters", "mean_attention_distance",
                               "position_embedding_similarity"]
    for path in written.values():
        assert open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_inspect_of_a_dynamic_model_maps_the_images_own_grid(tmp_path, monkeypatch):
    # A 16x64 image is a 2x8 grid of 8-pixel patches; the table's native grid is 4x4 (as many patches).
    model = small_model(image_size=(None, None))
    image = np.random.default_rng(7).uniform(-1, 1, (16, 64, 3)).astype("float32")
    drawn = {}
    monkeypatch.setattr(analysis, "plot_attention_overlay", lambda image, heat, path: drawn.update(heat=heat))
    monkeypatch.setattr(analysis, "plot_mean_attention_distance", lambda distances, path: drawn.update(d=distances))
    analysis.inspect(model, image, str(tmp_path))
    attentions = analysis.attention_weights(model, image[None])
    np.testing.assert_allclose(drawn["heat"], analysis.rollout_map(analysis.attention_rollout(attentions), (2, 8))[0])
    np.testing.assert_allclose(drawn["d"], analysis.mean_attention_distance(attentions, (2, 8), 8))
    with pytest.raises(ValueError, match=r"A rollout over 16 patch tokens is no \(3, 3\) grid"):
        analysis.rollout_map(analysis.attention_rollout(attentions), (3, 3))


@pytest.mark.parametrize("folder", ["transformers_dinov3", "timm_eva/sbb_registers"])
def test_inspect_of_a_rope_model_without_a_position_table_says_it_skips_that_figure(folder, tmp_path, caplog):
    model = keras_vit.from_pretrained(fixture(folder))
    size = model.input_shape[1:3] if None not in model.input_shape[1:3] else (48, 48)
    image = np.random.default_rng(8).integers(0, 256, (*size, 3), dtype=np.uint8)
    written = analysis.inspect(model, image, str(tmp_path))
    rollout = ["attention_rollout"] if folder == "transformers_dinov3" else []  # SBB's pools without a class token
    assert sorted(written) == rollout + ["embedding_filters", "mean_attention_distance"]
    assert "No position-embedding similarity figure: the model's positions are rotary (RoPE), with no learned " \
           "table to compare." in caplog.text
    with pytest.raises(ValueError, match="has no learned position table"):
        analysis.position_embedding_similarity(model)


def test_hybrid_attention_weights_and_figures_start_from_its_resnet(tmp_path):
    model = keras_vit.ViT(image_size=32, **SMALL_HYBRID, weights=fixture("hybrid_token.npz"))
    images = np.random.default_rng(6).uniform(-1, 1, (1, 32, 32, 3)).astype("float32")
    attentions = analysis.attention_weights(model, images)
    tokens = keras.Model(model.input, model.get_layer("position_embedding").output)(images)
    _, expected = numpy_block(model.get_layer("encoderblock_0"), keras.ops.convert_to_numpy(tokens).astype("float64"))
    np.testing.assert_allclose(attentions[0], expected, atol=1e-5)
    with pytest.raises(ValueError, match="hybrid's patch embedding filters see ResNet features"):
        analysis.embedding_filters(model)
    written = analysis.inspect(model, ((images[0] + 1) * 127.5).astype(np.uint8), str(tmp_path))
    assert sorted(written) == ["attention_rollout", "mean_attention_distance", "position_embedding_similarity"]


def test_inspect_command(tmp_path, capsys):
    tf = pytest.importorskip("tensorflow")
    from keras_vit import cli

    model_path = tmp_path / "model.keras"
    small_model().save(model_path)
    image_path = tmp_path / "image.png"
    tf.io.write_file(str(image_path), tf.io.encode_png(np.zeros((40, 40, 3), np.uint8)))
    cli.main(["inspect", "--weights", str(model_path), str(image_path), "--output-dir", str(tmp_path / "figs")])
    assert len(list((tmp_path / "figs").glob("*.png"))) == 4
    assert "wrote" in capsys.readouterr().out
