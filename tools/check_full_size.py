"""Check a full-size ViT-B/16 against timm's logits (files from make_fixtures.py).

    python tools/make_fixtures.py --full-size-dir /tmp/full   # in the timm venv
    KERAS_BACKEND=jax python tools/check_full_size.py /tmp/full

Too large to commit or to run in CI; run it after changing the model or the key map.
"""

import os
import sys

import numpy as np

import keras_vit

directory = sys.argv[1]
with np.load(os.path.join(directory, "ViT-B_16_reference.npz")) as data:
    images, logits = data["images"], data["logits"]
model = keras_vit.ViT_B16(weights=os.path.join(directory, "ViT-B_16.npz"), classifier_activation=None)
error = np.abs(np.asarray(model.predict(images, verbose=0)) - logits).max()
print(f"ViT-B/16: {model.count_params()} parameters, max |logit difference| {error:.2e}")
sys.exit(0 if error < 1e-4 and model.count_params() == 86567656 else 1)
