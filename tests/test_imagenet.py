import keras
import numpy as np
import pytest

from keras_vit import decode_predictions, preprocess_input


@pytest.mark.backend_independent
def test_preprocess_input_maps_pixels_to_minus_one_one():
    pixels = np.array([[0, 127.5, 255]], dtype="float32")
    np.testing.assert_allclose(preprocess_input(pixels), [[-1.0, 0.0, 1.0]])
    out = preprocess_input(np.array([0, 255], dtype="uint8"))
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, [-1.0, 1.0])


def test_preprocess_input_accepts_backend_tensors():
    tensor = keras.ops.convert_to_tensor(np.array([0, 51, 255], dtype="uint8"))
    out = keras.ops.convert_to_numpy(preprocess_input(tensor))
    np.testing.assert_allclose(out, [-1.0, -0.6, 1.0], atol=1e-6)


@pytest.mark.backend_independent
def test_decode_predictions_returns_top_classes_in_order():
    scores = np.zeros((2, 1000), "float32")
    scores[0, [0, 1, 2]] = [0.2, 0.7, 0.1]
    scores[1, 999] = 1.0
    decoded = decode_predictions(scores, top=2)
    assert decoded[0] == [("n01443537", "goldfish", pytest.approx(0.7)), ("n01440764", "tench", pytest.approx(0.2))]
    assert decoded[1][0][:2] == ("n15075141", "toilet_tissue")


@pytest.mark.backend_independent
def test_decode_predictions_rejects_other_shapes_and_names_where_class_names_come_from():
    # It suggested model.class_names, which a model fine-tuned through the API did not have.
    with pytest.raises(ValueError, match=r"^decode_predictions expects ImageNet-1k predictions of shape \(batch, 1000\), "
                                         r"got \(2, 10\); pass class_names=, the model's own \(model\.class_names, kept "
                                         r"by keras_vit\.ViT\(class_names=\.\.\.\) and by keras_vit's training\) or your "
                                         r"data's \(source\.class_names\)\.$"):
        decode_predictions(np.zeros((2, 10)))


@pytest.mark.backend_independent
def test_decode_predictions_gives_probabilities_of_logits():
    # A fine-tuned model's logits were printed as its scores.
    logits = np.array([[2.0, -1.0, 0.5], [0.1, 0.2, 0.3]], "float32")
    probabilities = np.exp(logits - logits.max(-1, keepdims=True))
    probabilities /= probabilities.sum(-1, keepdims=True)
    names = ["cat", "dog", "bird"]
    for from_logits in (None, True):  # decided from the scores, or said
        decoded = decode_predictions(logits, top=2, class_names=names, from_logits=from_logits)
        assert decoded[0] == [("0", "cat", pytest.approx(probabilities[0, 0])),
                              ("2", "bird", pytest.approx(probabilities[0, 2]))]
        assert decoded[1][0] == ("2", "bird", pytest.approx(probabilities[1, 2]))
    softmax = [[0.2, 0.5, 0.3]]  # probabilities stay as they are, and so do scores said not to be logits
    assert decode_predictions(softmax, top=1, class_names=names) == [[("1", "dog", 0.5)]]
    assert decode_predictions(logits, top=1, class_names=names, from_logits=False)[0] == [("0", "cat", 2.0)]


@pytest.mark.backend_independent
def test_decode_predictions_takes_bfloat16_probabilities_as_probabilities():
    """A bfloat16 softmax rounds each score by up to half an epsilon: [0.6, 0.3, 0.1] sums to 1.00244 there, and a
    1000-class row several 1e-3 off 1. They were read as logits, the top class reported at 0.425 (before
    2026-12-07); logits that sum near 1 by chance are not taken for probabilities in float32."""
    names = ["cat", "dog", "bird"]
    scores = keras.ops.convert_to_tensor(np.array([[0.6, 0.3, 0.1]]), "bfloat16")
    assert decode_predictions(scores, top=1, class_names=names) == [[("0", "cat", 0.6015625)]]
    row = keras.ops.softmax(keras.ops.convert_to_tensor(np.random.default_rng(0).normal(0, 3, (2, 1000)), "bfloat16"))
    decoded = decode_predictions(row, top=1)
    assert [best[0][2] for best in decoded] == pytest.approx(np.max(keras.ops.convert_to_numpy(
        keras.ops.cast(row, "float32")), -1))
    near_one = np.array([[0.6, 0.3, 0.1 + 5e-3]], "float32")  # not a distribution in float32: logits
    assert decode_predictions(near_one, top=1, class_names=names)[0][0][2] == pytest.approx(0.4254, abs=1e-4)

