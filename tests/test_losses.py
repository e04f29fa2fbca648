"""The recipes' binary cross-entropy against timm's `BinaryCrossEntropy` (tests/fixtures/timm_augmentation/bce.json,
from tools/make_augmentation_fixtures.py: timm's loss of timm's own MixUp targets)."""

import json
import re

import numpy as np
import pytest
from conftest import fixture

from keras_vit.training.losses import BinaryCrossentropyOfClasses

with open(fixture("timm_augmentation/bce.json")) as _file:
    CASES = json.load(_file)["cases"]


@pytest.mark.parametrize("case", CASES, ids=lambda case: f"smoothing{case['smoothing']}-threshold{case['threshold']}")
def test_binary_crossentropy_of_mixed_targets_equals_timms(case):
    loss = BinaryCrossentropyOfClasses(label_smoothing=case["smoothing"], target_threshold=case["threshold"])
    ours = float(loss(np.array(case["unsmoothed"], "float32"), np.array(case["logits"], "float32")))
    np.testing.assert_allclose(ours, case["loss"], rtol=1e-6)


@pytest.mark.backend_independent
def test_binary_crossentropy_refuses_integer_labels():
    with pytest.raises(ValueError, match=re.escape(
            "The binary cross-entropy of classes scores one-hot or mixed targets of the logits' shape (batch, classes) "
            "= (2, 3), got targets of shape (2,): pass one-hot labels (one_hot=True).")):
        BinaryCrossentropyOfClasses()(np.array([0, 2]), np.zeros((2, 3), "float32"))
