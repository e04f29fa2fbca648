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
def test_decode_predictions_rejects_other_shapes():
    with pytest.raises(ValueError, match=r"shape \(batch, 1000\), got \(2, 10\)"):
        decode_predictions(np.zeros((2, 10)))
