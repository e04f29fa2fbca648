import json

import keras
import numpy as np
import pytest
from conftest import SMALL, fixture, predict

import keras_vit


def small(**kwargs):
    return keras_vit.ViT(**{"image_size": 32, **SMALL, "classes": 10, **kwargs})


@pytest.mark.backend_independent
def test_variant_table_holds_the_paper_sizes():
    assert keras_vit.VARIANTS["ViT_B16"] == keras_vit.Variant(16, 768, 12, 12, 3072)
    assert keras_vit.VARIANTS["ViT_L32"] == keras_vit.Variant(32, 1024, 24, 16, 4096)
    assert keras_vit.VARIANTS["ViT_H14"] == keras_vit.Variant(14, 1280, 32, 16, 5120)
    assert keras_vit.VARIANTS["ViT_Ti16"] == keras_vit.Variant(16, 192, 12, 3, 768)
    assert keras_vit.decode_variant("S/32") == keras_vit.VARIANTS["ViT_S32"]
    with pytest.raises(ValueError, match="Unknown variant 'X/16'"):
        keras_vit.decode_variant("X/16")


@pytest.mark.backend_independent
@pytest.mark.parametrize("name", sorted(keras_vit.VARIANTS))
def test_parameter_counts_equal_timm(name):
    with open(fixture("parameter_counts.json")) as f:
        expected = json.load(f)[name]
    # Deferred initialisation: the shapes are built, the big weights are never filled.
    with keras.StatelessScope():
        model = getattr(keras_vit, name)(classes=1000)
    assert model.count_params() == expected
    assert model.name == name


def test_named_constructor_forwards_keywords():
    model = keras_vit.ViT_Ti16(image_size=64, classes=7, classifier="gap", name="tiny")
    assert model.output_shape == (None, 7)
    assert model.input_shape == (None, 64, 64, 3)
    assert model.name == "tiny"
    assert "class_token" not in [layer.name for layer in model.layers]


def test_head_starts_at_zero_and_predicts_uniformly():
    model = small()
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(model.get_layer("head").kernel), 0.0)
    probs = predict(model, np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3)).astype("float32"))
    np.testing.assert_allclose(probs, 0.1, atol=1e-6)


@pytest.mark.parametrize(
    "kwargs,shape",
    [
        (dict(include_top=False), (None, 17, 48)),
        (dict(include_top=False, pooling="token"), (None, 48)),
        (dict(include_top=False, pooling="gap"), (None, 48)),
        (dict(include_top=False, classifier="gap"), (None, 16, 48)),
        (dict(representation_size=32, classes=5), (None, 5)),
        (dict(image_size=(24, 40)), (None, 10)),
    ],
)
def test_output_shapes(kwargs, shape):
    assert small(**kwargs).output_shape == shape


def test_pooled_features_are_taken_from_the_normed_sequence():
    images = np.random.default_rng(1).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    sequence = small(include_top=False)
    token = keras.Model(sequence.input, keras_vit.layers.TokenPooling("token")(sequence.output))
    gap = keras.Model(sequence.input, keras_vit.layers.TokenPooling("gap")(sequence.output))
    tokens = predict(sequence, images)
    np.testing.assert_allclose(predict(token, images), tokens[:, 0], atol=1e-6)
    np.testing.assert_allclose(predict(gap, images), tokens[:, 1:].mean(1), atol=1e-6)
    np.testing.assert_allclose(tokens.mean(-1), 0.0, atol=1e-4)  # encoder_norm is the last op


def test_input_tensor_is_used_as_the_input():
    images = keras.Input((32, 32, 3))
    model = small(input_tensor=images)
    assert model.inputs[0] is images
    with pytest.raises(ValueError, match="image_size 64 disagrees with input_tensor's"):
        small(input_tensor=keras.Input((32, 32, 3)), image_size=64)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(image_size=30), r"image_size \(30, 30\) is not divisible by patch_size 8"),
        (dict(num_heads=5), "hidden_size 48 is not divisible by num_heads 5"),
        (dict(include_top=False, pooling="max"), "Unknown pooling 'max'"),
        (dict(classifier="mean"), "Unknown classifier 'mean'"),
        (dict(pooling="gap"), "pooling applies only with include_top=False"),
        (dict(include_top=False, classifier="gap", pooling="token"), "needs a class token"),
        (dict(image_size=(32, 32, 3)), r"image_size must be an int or \(height, width\) of ints, got \(32, 32, 3\)"),
        (dict(image_size="32"), r"image_size must be an int or \(height, width\) of ints, got '32'"),
        (dict(image_size=32.0), r"image_size must be an int or \(height, width\) of ints, got 32.0"),
        (dict(image_size=(32, 0)), r"image_size must be positive, got \(32, 0\)"),
    ],
)
def test_bad_arguments_raise_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        small(**kwargs)


def test_keras_file_round_trip_gives_identical_outputs(tmp_path):
    model = small(representation_size=16, dropout_rate=0.1, stochastic_depth_rate=0.1)
    rng = np.random.default_rng(2)
    for variable in model.weights:
        variable.assign(rng.normal(scale=0.1, size=variable.shape).astype("float32"))
    images = rng.uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    path = str(tmp_path / "vit.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_array_equal(predict(loaded, images), predict(model, images))
    assert [l.get_config() for l in loaded.layers] == [l.get_config() for l in model.layers]


def test_model_exports_as_a_tf_saved_model_with_identical_outputs(tmp_path):
    if keras.backend.backend() == "torch":
        pytest.skip("Keras exports a TF SavedModel from the jax and tensorflow backends only")
    import tensorflow as tf

    model = small()
    rng = np.random.default_rng(3)
    for variable in model.weights:
        variable.assign(rng.normal(scale=0.1, size=variable.shape).astype("float32"))
    images = rng.uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    path = str(tmp_path / "exported")
    model.export(path, format="tf_saved_model", verbose=False)
    loaded = tf.saved_model.load(path)  # held: its variables die with it
    served = loaded.serve(images).numpy()
    np.testing.assert_allclose(served, predict(model, images), atol=1e-6)


def test_model_config_round_trip():
    model = small(classifier="gap")
    clone = keras.Model.from_config(model.get_config())
    assert [l.get_config() for l in clone.layers] == [l.get_config() for l in model.layers]


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_mixed_precision_keeps_float32_weights_and_outputs(policy):
    keras.config.set_dtype_policy(policy)
    model = small()
    assert all(v.dtype == "float32" for v in model.weights)
    probs = model(np.zeros((2, 32, 32, 3), "float32"))
    assert keras.backend.standardize_dtype(probs.dtype) == "float32"
    assert keras.backend.standardize_dtype(model.get_layer("encoderblock_0").output.dtype) == (
        keras.config.dtype_policy().compute_dtype
    )


def test_model_trains_with_fit():
    model = small(dropout_rate=0.1, stochastic_depth_rate=0.1)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy")
    rng = np.random.default_rng(3)
    images = rng.uniform(-1, 1, (16, 32, 32, 3)).astype("float32")
    labels = rng.integers(0, 10, 16)
    history = model.fit(images, labels, batch_size=8, epochs=3, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]


# --- Image sizes and layouts, alike on every backend ------------------------------

class OneBatch(keras.utils.PyDataset):
    """One batch of images (and labels), whose shapes Keras learns only inside its loop."""

    def __init__(self, *arrays):
        super().__init__()
        self.arrays = arrays

    def __len__(self):
        return 1

    def __getitem__(self, index):
        return self.arrays


@pytest.mark.parametrize("size", [(36, 36), (40, 56), (24, 24)])
def test_fixed_size_model_refuses_another_size_on_every_entry_point(size):
    model = small(classes=3)
    images = np.zeros((2, *size, 3), "float32")
    message = (r"Input 0 with name 'images' of layer 'vit' is incompatible with the layer: "
               rf"expected shape=\(None, 32, 32, 3\), found shape=\((?:2|None), {size[0]}, {size[1]}, 3\)")
    model.compile(optimizer="sgd", loss="categorical_crossentropy")
    labels = np.eye(3, dtype="float32")[[0, 1]]
    # 36 pixels make the 4x4 patches of 32: Keras' JAX trainer cropped them silently from a PyDataset.
    for call in (lambda: model.predict(images, verbose=0), lambda: model(images),
                 lambda: model.evaluate(images, labels, verbose=0), lambda: model.fit(images, labels, verbose=0),
                 lambda: model.predict_on_batch(images), lambda: model.fit(OneBatch(images, labels), verbose=0),
                 lambda: model.predict(OneBatch(images), verbose=0)):
        with pytest.raises(ValueError, match=message):
            call()


def test_a_failed_call_leaves_the_model_usable(tmp_path):
    model = small(classes=3)
    model.compile(optimizer="adam", loss="categorical_crossentropy")
    images = np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    before = model.predict(images, verbose=0)
    wrong = np.zeros((2, 36, 36, 3), "float32")
    labels = np.eye(3, dtype="float32")[[0, 1]]
    # On JAX, Keras detaches every variable while fit, evaluate and predict loop, and the check fails inside.
    for call in (lambda: model.fit(OneBatch(wrong, labels), verbose=0),
                 lambda: model.evaluate(OneBatch(wrong, labels), verbose=0),
                 lambda: model.predict(OneBatch(wrong), verbose=0)):
        with pytest.raises(ValueError, match="is incompatible with the layer"):
            call()
    np.testing.assert_allclose(model.predict(images, verbose=0), before, atol=1e-6)
    model.save_weights(str(tmp_path / "after_failure.weights.h5"))
    model.fit(images, labels, verbose=0)


@pytest.mark.parametrize("shape,message", [
    ((2, 32, 32, 1), r"\(2, 32, 32, 1\) are not RGB channels-last \(None, 32, 32, 3\); they are grayscale \(one "
                     r"channel\): repeat it with np.repeat\(x, 3, axis=-1\)"),
    ((2, 3, 32, 32), r"they look channels-first \(batch, 3, height, width\): transpose them with "
                     r"np.transpose\(x, \(0, 2, 3, 1\)\)"),
    ((2, 32, 32, 4), "they have an alpha channel: drop it with x"),
    ((32, 32, 3), r"Got one image of shape \(32, 32, 3\); the model takes a batch \(None, 32, 32, 3\): add a batch axis"),
])
def test_image_layout_errors_name_the_layout_and_the_fix(shape, message):
    with pytest.raises(ValueError, match=message):
        small().predict(np.zeros(shape, "float32"), verbose=0)


def test_model_class_survives_a_keras_round_trip(tmp_path):
    path = str(tmp_path / "vit.keras")
    small().save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded, keras_vit.applications.vit.VisionTransformer)
    with pytest.raises(ValueError, match="is incompatible with the layer"):
        loaded.predict(np.zeros((1, 36, 36, 3), "float32"), verbose=0)


def test_drop_remainder_leaves_out_the_rows_and_columns_no_patch_fills_and_survives_a_keras_file(tmp_path):
    with pytest.raises(ValueError, match=r"image_size \(30, 30\) is not divisible by patch_size 8; pass "
                                         r"drop_remainder=True"):
        keras_vit.ViT(image_size=30, **SMALL)
    model = keras_vit.ViT(image_size=(30, 27), drop_remainder=True, **SMALL)
    cropped = keras_vit.ViT(image_size=(24, 24), **SMALL)
    cropped.set_weights(model.get_weights())
    images = np.random.default_rng(0).uniform(-1, 1, (2, 30, 27, 3)).astype("float32")
    np.testing.assert_allclose(predict(model, images), predict(cropped, images[:, :24, :24]), atol=1e-6)
    model.save(tmp_path / "remainder.keras")
    again = keras.saving.load_model(tmp_path / "remainder.keras")
    assert again.input_shape == (None, 30, 27, 3)
    np.testing.assert_allclose(predict(again, images), predict(model, images), atol=1e-6)
