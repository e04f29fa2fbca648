"""Check full-size ViT-B/16 and R50+ViT-B/16 against timm's logits (files from make_fixtures.py).

    python tools/make_fixtures.py --full-size-dir /tmp/full   # in the timm venv
    KERAS_BACKEND=jax python tools/check_full_size.py /tmp/full

Too large to commit or to run in CI; run it after changing the model or the key map.
"""

import json
import os
import sys

import numpy as np

import keras_vit

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures")
directory = sys.argv[1]
with open(os.path.join(FIXTURES, "parameter_counts.json")) as f:
    timm_counts = json.load(f)
failed = False
for file, variant in (("ViT-B_16", "ViT_B16"), ("R50+ViT-B_16", "ViT_R50_B16")):
    with np.load(os.path.join(directory, f"{file}_reference.npz")) as data:
        images, logits = data["images"], data["logits"]
    constructor = getattr(keras_vit, variant)
    model = constructor(weights=os.path.join(directory, f"{file}.npz"), classifier_activation=None)
    error = np.abs(np.asarray(model.predict(images, verbose=0)) - logits).max()
    print(f"{variant}: {model.count_params()} parameters (timm {timm_counts[variant]}), "
          f"max |logit difference| {error:.2e}")
    failed |= error > 1e-4 or model.count_params() != timm_counts[variant]
sys.exit(1 if failed else 0)
