"""Training on NaFlex batches (`keras_vit.data.naflex_batches`): buckets, draws, labels, loss scale, compile count."""

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit import data
from keras_vit.data.naflex_batches import NaFlexBatches, naflex_training_stream

TINY = dict(patch_size=4, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=32)


def labelled_by_colour(count=48, seed=0):
    """Images of many shapes whose every pixel is 20 * label: any crop, flip or resize shows its label."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 5, count)
    images = np.zeros((count, 40, 40, 3), "uint8")
    for image, label in zip(images, labels):
        image[:] = 20 * label
    return data.from_arrays(images, labels)


@pytest.mark.backend_independent
def test_each_batch_is_padded_to_its_drawn_length_and_holds_max_tokens_worth_of_images():
    batches = NaFlexBatches(labelled_by_colour(), patch_size=4, seq_lens=(16, 36), max_tokens=144, seed=3)
    lengths = set()
    for index in range(len(batches)):
        inputs, labels = batches[index]
        length = inputs["patches"].shape[1]
        lengths.add(length)
        assert length in (16, 36) and len(labels) == 144 // length
        assert inputs["patches"].shape[-1] == 48
        rows, cols = inputs["patch_grid"].T
        assert (rows * cols <= length).all() and (inputs["patch_mask"].sum(1) == rows * cols).all()
        data.check_naflex_batch(inputs, 4)
    assert lengths == {16, 36}


@pytest.mark.backend_independent
def test_every_image_keeps_its_own_label_through_crop_flip_and_resize():
    source = labelled_by_colour()
    batches = NaFlexBatches(source, patch_size=4, seq_lens=(16, 36), max_tokens=144, seed=1)
    seen = 0
    for index in range(len(batches)):
        inputs, labels = batches[index]
        for patches, mask, label in zip(inputs["patches"], inputs["patch_mask"], labels):
            np.testing.assert_allclose(patches[mask], 20 * label / 127.5 - 1, atol=1e-6)
            seen += 1
    assert seen == sum(len(batches[i][1]) for i in range(len(batches)))


@pytest.mark.backend_independent
def test_draws_are_keyed_by_seed_and_epoch_so_a_resumed_run_sees_the_same_batches():
    source = labelled_by_colour(count=96)
    options = dict(patch_size=4, seq_lens=(16, 36, 64), max_tokens=192, patch_sizes=(4, 8))
    stream, steps = naflex_training_stream(source, epochs=3, seed=7, **options)
    resumed, _ = naflex_training_stream(source, epochs=3, initial_epoch=1, seed=7, **options)
    for index in range(steps):
        first, again = stream[steps + index], resumed[index]
        for key in first[0]:
            np.testing.assert_array_equal(first[0][key], again[0][key])
        np.testing.assert_array_equal(first[1], again[1])
    plans = [NaFlexBatches(source, seed=7, epoch=epoch, **options).plan for epoch in (0, 1)]
    assert plans[0] != plans[1]
    assert {patch for *_, patch in plans[0] + plans[1]} == {4, 8}


@pytest.mark.backend_independent
@pytest.mark.parametrize("mode, expected", [("linear", [4.0, 1.0]), ("sqrt", [2.0, 1.0])])
def test_loss_scale_weighs_each_image_by_its_batch_size_over_the_smallest(mode, expected):
    batches = NaFlexBatches(labelled_by_colour(count=200), patch_size=4, seq_lens=(16, 64), max_tokens=256,
                            loss_scale=mode, seed=2)
    weights = {batch[0]["patches"].shape[1]: batch[2] for batch in (batches[i] for i in range(len(batches)))}
    np.testing.assert_allclose(weights[16], expected[0])  # 16 images of 16 patches vs 4 of 64
    np.testing.assert_allclose(weights[64], expected[1])
    assert len(weights[16]) == 16 and len(weights[64]) == 4


def test_fit_applies_the_loss_scale_and_compiles_once_per_bucket(monkeypatch):
    from keras_vit.layers.naflex import NaFlexPatchEmbedding

    keras.utils.set_random_seed(0)
    model = keras_vit.ViT(naflex=True, **TINY, classes=5, image_size=16)
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss="sparse_categorical_crossentropy")
    batches = NaFlexBatches(labelled_by_colour(count=200), patch_size=4, seq_lens=(16, 64), max_tokens=256,
                            loss_scale="linear", seed=2)
    inputs, labels, weights = next(batches[i] for i in range(len(batches)) if batches[i][0]["patches"].shape[1] == 16)
    plain = model.train_on_batch(inputs, labels)
    scaled = model.train_on_batch(inputs, labels, sample_weight=weights)
    np.testing.assert_allclose(scaled, 4.0 * plain, rtol=1e-5)

    calls = []
    original = NaFlexPatchEmbedding.call
    monkeypatch.setattr(NaFlexPatchEmbedding, "call",
                        lambda self, patches: calls.append(tuple(patches.shape)) or original(self, patches))
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    model.fit(batches, epochs=2, verbose=0)
    buckets = {(count, length, 48) for _, count, length, _ in batches.plan}
    assert len(buckets) == 2 and len(batches) > 10
    if keras.backend.backend() == "jax":
        # One trace per bucket, and one more of the first batch: Keras' symbolic build of the optimizer's state
        # (`Trainer._symbolic_build`), which compiles nothing. A second fit traces nothing new.
        assert set(calls) == buckets and len(calls) == len(buckets) + 1
        calls.clear()
        model.fit(batches, epochs=1, verbose=0)
        assert calls == []


def test_tf_data_gives_the_same_batches_and_fit_takes_them():
    if keras.backend.backend() != "tensorflow":
        pytest.skip("tf.data feeds TensorFlow's fit: checked in the TensorFlow pass")
    from keras_vit.data.naflex_batches import as_tf_dataset

    stream, steps = naflex_training_stream(labelled_by_colour(count=96), epochs=1, patch_size=4, seq_lens=(16, 36),
                                           max_tokens=144, loss_scale="sqrt")
    dataset = as_tf_dataset(stream)
    for index, (inputs, labels, weights) in enumerate(dataset.as_numpy_iterator()):
        expected = stream[index]
        for key in inputs:
            np.testing.assert_array_equal(inputs[key], expected[0][key])
        np.testing.assert_array_equal(labels, expected[1])
        np.testing.assert_array_equal(weights, expected[2])
    assert index == steps - 1
    model = keras_vit.ViT(naflex=True, **TINY, classes=5, image_size=16)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    history = model.fit(dataset, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
