"""Masked patch prediction: the corruption, the colour targets, the pretrainer and its CLI."""

import csv

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit import MaskedPatchPretrainer, PatchCorruption, cli, mean_colour_bins
from keras_vit.layers import (
    AddPositionEmbedding,
    ClassToken,
    PatchEmbedding,
    TransformerBlock,
)

TINY = {"image_size": 16, "patch_size": 4, "hidden_size": 16, "num_layers": 1, "num_heads": 2, "mlp_dim": 32}


def numpy(x):
    return np.asarray(keras.ops.convert_to_numpy(x))


def corrupt(layer, tokens, mask_value=-1.0):
    """Run `layer` on `tokens` after setting its mask embedding to `mask_value`."""
    if not layer.built:
        layer.build(tokens.shape)
    layer.mask_embedding.assign(np.full(tokens.shape[-1], mask_value, "float32"))
    out, selected = layer(tokens)
    return numpy(out), numpy(selected)


def patch_ids(batch, num_patches, hidden_size=4):
    """Tokens whose every entry is the patch's flat index in the batch."""
    ids = np.arange(batch * num_patches, dtype="float32").reshape(batch, num_patches, 1)
    return np.repeat(ids, hidden_size, axis=-1)


def test_corruption_selects_half_and_splits_80_10_10():
    batch, num_patches = 64, 64
    tokens = patch_ids(batch, num_patches)
    out, selected = corrupt(PatchCorruption(seed=1), tokens)
    assert selected.shape == (batch, num_patches) and selected.dtype == np.float32
    np.testing.assert_array_equal(selected.sum(axis=1), np.full(batch, num_patches // 2))
    assert np.all(out == out[..., :1])  # whole embeddings are replaced, never parts

    value, own = out[..., 0], tokens[..., 0]
    chosen = selected == 1
    np.testing.assert_array_equal(value[~chosen], own[~chosen])
    masked = chosen & (value == -1.0)
    kept = chosen & (value == own)
    replaced = chosen & ~masked & ~kept
    assert np.all(np.isin(value[replaced], own))  # some other patch of the batch
    assert np.any(value[replaced] // num_patches != own[replaced] // num_patches)  # from other images too
    total = chosen.sum()
    for count, rate in ((masked.sum(), 0.8), (replaced.sum(), 0.1), (kept.sum(), 0.1)):
        assert abs(count - rate * total) <= 4 * np.sqrt(total * rate * (1 - rate)), (count, rate, total)


def test_random_replacement_is_never_the_patch_itself():
    layer = PatchCorruption(corruption_rate=1.0, mask_rate=0.0, random_rate=1.0, seed=2)
    tokens = patch_ids(2, 2, hidden_size=1)
    own = tokens[..., 0]
    drawn = np.stack([corrupt(layer, tokens)[0][..., 0] for _ in range(40)])
    assert not np.any(drawn == own)
    for index in np.ndindex(own.shape):  # every other patch is reachable
        assert set(drawn[(slice(None), *index)]) == set(range(4)) - {own[index]}


def test_calls_differ_and_equal_seeds_repeat():
    tokens = patch_ids(4, 32)
    layer = PatchCorruption(seed=3)
    first, first_selected = corrupt(layer, tokens)
    _, second_selected = corrupt(layer, tokens)
    assert not np.array_equal(first_selected, second_selected)
    again, again_selected = corrupt(PatchCorruption(seed=3), tokens)
    np.testing.assert_array_equal(first_selected, again_selected)
    np.testing.assert_array_equal(first, again)


def test_corruption_rate_rounds_to_a_fixed_count_per_image():
    _, selected = corrupt(PatchCorruption(corruption_rate=0.3, seed=0), patch_ids(3, 10))
    np.testing.assert_array_equal(selected.sum(axis=1), [3, 3, 3])
    _, selected = corrupt(PatchCorruption(corruption_rate=0.01, seed=0), patch_ids(3, 10))
    np.testing.assert_array_equal(selected.sum(axis=1), [1, 1, 1])


def test_corruption_config_round_trips():
    layer = PatchCorruption(corruption_rate=0.4, mask_rate=0.7, random_rate=0.2, seed=5, name="corrupt")
    clone = PatchCorruption.from_config(layer.get_config())
    assert clone.get_config() == layer.get_config()


def _known_image():
    """A 4x6 image (2x3 patches of 2x2) in [0, 1] and each patch's hand-computed 3-bit and 1-bit class."""
    image = np.zeros((4, 6, 3), "float32")

    def patch(row, col, colour):
        image[2 * row : 2 * row + 2, 2 * col : 2 * col + 2] = colour

    patch(0, 0, (0.0, 0.0, 0.0))  # levels (0, 0, 0)
    patch(0, 1, (1.0, 1.0, 1.0))  # 1.0 is level 7, not 8
    patch(0, 2, (0.5, 0.25, 0.125))  # exactly on bin edges: (4, 2, 1)
    patch(1, 0, (0.375, 0.359375, 0.875))  # on an edge, just below one, on an edge: (3, 2, 7)
    patch(1, 2, (0.99, 0.01, 0.124))  # (7, 0, 0)
    # Not constant: red mean 0.5 (4), green mean 0.25 (2), blue mean 0.9375 (7).
    image[2:4, 2:4, 0] = [[0.0, 1.0], [0.0, 1.0]]
    image[2:4, 2:4, 1] = [[0.0, 0.0], [0.0, 1.0]]
    image[2:4, 2:4, 2] = [[1.0, 1.0], [1.0, 0.75]]
    three_bits = [0, 7 * 64 + 7 * 8 + 7, 4 * 64 + 2 * 8 + 1, 3 * 64 + 2 * 8 + 7, 4 * 64 + 2 * 8 + 7, 7 * 64]
    one_bit = [0, 7, 4, 1, 5, 4]
    return image * 2.0 - 1.0, three_bits, one_bit


def test_mean_colour_bins_of_known_patches_in_row_major_order():
    image, three_bits, one_bit = _known_image()
    images = np.stack([image, image[::-1, ::-1]])
    classes = numpy(mean_colour_bins(images, patch_size=2))
    assert classes.shape == (2, 6) and classes.dtype == np.int32
    np.testing.assert_array_equal(classes[0], three_bits)
    np.testing.assert_array_equal(classes[1], three_bits[::-1])  # rotated by 180 degrees: patches reversed
    np.testing.assert_array_equal(numpy(mean_colour_bins(image[None], 2, bits=1))[0], one_bit)
    with pytest.raises(ValueError, match="not divisible by the patch size"):
        mean_colour_bins(image[None], patch_size=4)
    with pytest.raises(ValueError, match="needs RGB images"):
        mean_colour_bins(image[None, ..., :1], patch_size=2)


def test_mean_colour_bins_follow_the_patch_embedding_token_order():
    rng = np.random.default_rng(0)
    levels = rng.integers(0, 8, (2, 3, 4, 3))  # bin centres of a 3x4 grid of 4x4 patches
    colours = (levels + 0.5) / 8 * 2 - 1
    images = np.repeat(np.repeat(colours, 4, axis=1), 4, axis=2).astype("float32")
    embedding = PatchEmbedding(patch_size=4, hidden_size=3)
    embedding.build(images.shape)
    embedding.kernel.assign(np.eye(3, dtype="float32")[None, None] * np.ones((4, 4, 1, 1), "float32") / 16)
    means = (numpy(embedding(images)) + 1) / 2
    tokens = np.floor(means * 8).astype(int) @ np.array([64, 8, 1])
    np.testing.assert_array_equal(numpy(mean_colour_bins(images, 4)), tokens)


def _encoder(**kwargs):
    return keras_vit.ViT(**{**TINY, **kwargs}, include_top=False)


def _numpy_targets(images, patch):
    batch, height, width, _ = images.shape
    means = images.reshape(batch, height // patch, patch, width // patch, patch, 3).mean(axis=(2, 4))
    levels = np.clip(np.floor((means + 1) / 2 * 8), 0, 7).astype(int)
    return (levels @ np.array([64, 8, 1])).reshape(batch, -1)


def test_loss_is_cross_entropy_over_corrupted_patches_only():
    pretrainer = MaskedPatchPretrainer(_encoder(), seed=0)
    images = np.random.default_rng(1).uniform(-1, 1, (4, 16, 16, 3)).astype("float32")
    y_pred = pretrainer(images)
    logits, mask = numpy(y_pred["logits"]), numpy(y_pred["corrupted_mask"])
    assert logits.shape == (4, 16, 512) and mask.shape == (4, 16)
    targets = _numpy_targets(images, 4)
    shifted = logits.astype("float64") - logits.max(-1, keepdims=True)
    log_probabilities = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    cross_entropy = -np.take_along_axis(log_probabilities, targets[..., None], axis=-1)[..., 0]
    expected = (cross_entropy * mask).sum() / mask.sum()
    loss = float(numpy(pretrainer.compute_loss(x=images, y_pred=y_pred)))
    assert loss == pytest.approx(expected, rel=1e-5)

    noisy = logits + (1 - mask)[..., None] * np.random.default_rng(2).normal(0, 50, logits.shape)
    noisy_loss = pretrainer.compute_loss(x=images, y_pred={"logits": noisy.astype("float32"), "corrupted_mask": mask})
    assert float(numpy(noisy_loss)) == pytest.approx(loss, rel=1e-5)


def _colour_images(count=64, seed=0):
    """Images of one of eight flat colours each: every patch's colour follows from the others'."""
    palette = np.array([[r, g, b] for r in (-0.9, 0.9) for g in (-0.9, 0.9) for b in (-0.9, 0.9)], "float32")
    chosen = palette[np.random.default_rng(seed).integers(0, len(palette), count)]
    return np.broadcast_to(chosen[:, None, None], (count, 16, 16, 3)).copy()


@pytest.fixture(scope="module")
def trained():
    keras.utils.set_random_seed(0)
    encoder = _encoder()
    before = [numpy(v).copy() for v in encoder.weights]
    pretrainer = MaskedPatchPretrainer(encoder, seed=0)
    pretrainer.compile(optimizer=keras.optimizers.Adam(1e-2))
    history = pretrainer.fit(_colour_images(), epochs=8, batch_size=16, verbose=0)
    return pretrainer, before, history.history


def test_fit_on_images_alone_lowers_the_loss(trained):
    pretrainer, _, history = trained
    assert len(history["loss"]) == 8 and "corrupted_accuracy" in history
    assert history["loss"][-1] < 0.3 * history["loss"][0], history["loss"]
    assert history["corrupted_accuracy"][-1] > 0.5
    results = pretrainer.evaluate(_colour_images(seed=1), batch_size=10, verbose=0, return_dict=True)
    assert set(results) == {"loss", "corrupted_accuracy"}


def test_pretrained_encoder_changed_and_fine_tunes_from_its_keras_file(trained, tmp_path):
    pretrainer, before, _ = trained
    encoder = pretrainer.encoder
    changed = [not np.array_equal(old, numpy(v)) for old, v in zip(before, encoder.weights)]
    assert all(changed), [v.path for v, c in zip(encoder.weights, changed) if not c]
    path = tmp_path / "encoder.keras"
    encoder.save(path)
    model = keras_vit.ViT(**TINY, classes=10, weights=str(path))
    weights = {v.path: numpy(v) for v in model.weights}
    for variable in encoder.weights:
        np.testing.assert_array_equal(weights[variable.path], numpy(variable), err_msg=variable.path)
    assert not weights["head/kernel"].any()


def test_keras_round_trip_keeps_weights_and_outputs(trained, tmp_path):
    pretrainer, _, _ = trained
    pretrainer.save(tmp_path / "pretrainer.keras")
    loaded = keras.saving.load_model(tmp_path / "pretrainer.keras")
    assert isinstance(loaded, MaskedPatchPretrainer)
    assert loaded.get_config()["corruption_rate"] == 0.5 and loaded.patch_size == (4, 4)
    np.testing.assert_array_equal(numpy(loaded.corruption.mask_embedding), numpy(pretrainer.corruption.mask_embedding))
    for mine, theirs in zip(pretrainer.colour_head.weights + pretrainer.encoder.weights,
                            loaded.colour_head.weights + loaded.encoder.weights):
        np.testing.assert_array_equal(numpy(mine), numpy(theirs), err_msg=mine.path)
    images = _colour_images(4, seed=3)
    # Keras saves no random-generator state: give both the same draws.
    loaded.corruption.seed_generator.state.assign(pretrainer.corruption.seed_generator.state)
    expected, actual = pretrainer(images), loaded(images)
    np.testing.assert_array_equal(numpy(expected["corrupted_mask"]), numpy(actual["corrupted_mask"]))
    np.testing.assert_allclose(numpy(expected["logits"]), numpy(actual["logits"]), atol=1e-5)


def test_gap_encoder_predicts_every_token_and_hybrid_encoder_uses_the_grid_for_patch_size():
    gap = MaskedPatchPretrainer(_encoder(classifier="gap"))
    assert gap.num_prefix_tokens == 0
    assert gap(np.zeros((2, 16, 16, 3), "float32"))["logits"].shape == (2, 16, 512)

    # A hybrid's chain: convolutions before a 1x1 "embedding" on their feature map.
    images = keras.Input((32, 32, 3))
    x = keras.layers.Conv2D(8, 3, strides=2, padding="same", name="stem")(images)
    x = keras.layers.Conv2D(8, 3, strides=2, padding="same", name="unit")(x)
    x = PatchEmbedding(patch_size=1, hidden_size=16, name="embedding")(x)
    x = ClassToken(name="class_token")(x)
    x = AddPositionEmbedding((8, 8), num_prefix_tokens=1, name="position_embedding")(x)
    x = TransformerBlock(num_heads=2, mlp_dim=32, name="encoderblock_0")(x)
    hybrid = MaskedPatchPretrainer(keras.Model(images, x), bits=2)
    assert hybrid.patch_size == (4, 4)
    out = hybrid(np.zeros((2, 32, 32, 3), "float32"))
    assert out["logits"].shape == (2, 64, 64) and out["corrupted_mask"].shape == (2, 64)
    loss = hybrid.compute_loss(x=np.zeros((2, 32, 32, 3), "float32"), y_pred=out)
    assert np.isfinite(float(numpy(loss)))


def test_the_corruption_sits_inside_the_encoders_own_graph_whatever_its_switches():
    # Registers, an unembedded class token, norm_pre and layer scale all come after the patch embedding:
    # the pretrainer must run them as the encoder does, and predict only from the patch tokens.
    encoder = keras_vit.ViT(image_size=16, patch_size=4, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=32,
                            include_top=False, register_tokens=3, class_token_position_embedding=False,
                            norm_pre=True, layer_scale=0.5)
    pretrainer = MaskedPatchPretrainer(encoder, bits=1)
    images = np.random.default_rng(0).uniform(-1, 1, (2, 16, 16, 3)).astype("float32")
    uncorrupted = pretrainer._encode_patch_tokens(pretrainer._embed_patches(images))
    np.testing.assert_array_equal(numpy(uncorrupted), numpy(encoder(images)))
    assert pretrainer.num_prefix_tokens == 4
    assert pretrainer(images)["logits"].shape == (2, 16, 8)


QUICK = ["--verbose", "0", "--hidden-size", "32", "--num-layers", "1", "--num-heads", "2", "--mlp-dim", "64",
         "--batch-size", "128", "--eval-batch-size", "360", "--epochs", "1", "--warmup-steps", "2"]


def test_cli_masked_patch_pretraining_saves_an_encoder_that_fine_tunes(tmp_path, capsys):
    pretrain, finetune = tmp_path / "pretrain", tmp_path / "finetune"
    accuracy = cli.main(["pretrain", "--objective", "masked-patch", *QUICK, "--output-dir", str(pretrain)])
    assert 0.0 <= accuracy <= 1.0
    assert f"corrupted-patch colour accuracy: {accuracy:.4f}" in capsys.readouterr().out
    for name in ("model.keras", "log.csv", "learning_curve.png"):
        assert (pretrain / name).exists(), name
    with open(pretrain / "log.csv") as f:
        assert {"loss", "corrupted_accuracy", "val_loss", "val_corrupted_accuracy"} <= set(next(csv.reader(f)))
    encoder = keras.saving.load_model(pretrain / "model.keras")
    assert encoder.output_shape == (None, 17, 32)
    with pytest.raises(ValueError, match="is an encoder without a classifier .* fine-tune it first"):
        cli.main(["evaluate", "--weights", str(pretrain / "model.keras")])
    top1 = cli.main(["finetune", *QUICK, "--weights", str(pretrain / "model.keras"), "--image-size", "16",
                     "--output-dir", str(finetune)])
    assert 0.0 <= top1 <= 1.0 and (finetune / "model.keras").exists()


def test_unknown_objective_is_rejected_and_finetune_has_none(capsys):
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["pretrain", "--objective", "jigsaw"])
    assert "invalid choice: 'jigsaw'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["finetune", "--objective", "masked-patch"])
    assert cli.build_parser().parse_args(["pretrain"]).objective == "classification"


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"corruption_rate": 0.0}, "corruption_rate must be in"),
        ({"corruption_rate": 1.5}, "corruption_rate must be in"),
        ({"mask_rate": 0.9, "random_rate": 0.2}, "sum of at most 1"),
        ({"random_rate": -0.1}, "must be non-negative"),
    ],
)
def test_bad_rates_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PatchCorruption(**kwargs)
    with pytest.raises(ValueError, match=message):
        MaskedPatchPretrainer(_encoder(), **kwargs)


def test_encoder_that_is_not_a_token_sequence_vit_is_rejected():
    images = keras.Input((16, 16, 3))
    plain = keras.Model(images, keras.layers.Conv2D(4, 4, strides=4, name="conv")(images))
    message = "encoder must be a keras_vit ViT model with layers named 'embedding' and 'encoderblock_0', ...; {} is not one."
    with pytest.raises(ValueError) as error:
        MaskedPatchPretrainer(plain)
    assert str(error.value) == message.format(repr(plain.name))
    with pytest.raises(ValueError) as error:
        MaskedPatchPretrainer(keras.layers.Dense(4))
    assert str(error.value).startswith(message.split("{}")[0])
    with pytest.raises(ValueError, match=r"include_top=False, pooling=None"):
        MaskedPatchPretrainer(keras_vit.ViT(**TINY, classes=10))
    with pytest.raises(ValueError, match=r"include_top=False, pooling=None"):
        MaskedPatchPretrainer(_encoder(pooling="token"))
