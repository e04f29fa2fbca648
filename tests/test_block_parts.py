"""The encoder block composed of parts keeps the weight names and order of every file written before.

Weight paths (`encoderblock_0/qkv/kernel`) are what every layout table
maps, and the `.weights.h5` keys inside a `.keras` file (the attribute
names of the block's sublayers) are what Keras reads back.
`fixtures/block_weight_names.json` holds both for tiny models of each block
shape, written by this file (`python tests/test_block_parts.py`) at commit
60df850, before the block was split into attention, MLP and block shapes.
"""

import json
import os
import sys
import tempfile

import h5py
import pytest

import keras_vit

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "block_weight_names.json")
TINY = dict(patch_size=8, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=32, image_size=16, classes=3)
ARCHITECTURES = {
    "plain": {},
    "rope_swiglu_qk_norm_layer_scale": dict(rope="axial", mlp_activation="swiglu", qk_norm=True, layer_scale=1e-5),
    "mixed_rope_without_key_bias": dict(rope="mixed", key_bias=False, qkv_bias=True),
    "differential_qk_norm": dict(differential_attention=True, qk_norm=True),
    "parallel_layer_scale": dict(parallel=True, layer_scale=1e-5),
    "post_norm_layer_scale": dict(post_norm=True, layer_scale=0.1),
    "rms_norm_scale_norms_without_biases": dict(normalization="rms_norm", attention_output_norm=True,
                                                mlp_hidden_norm=True, projection_bias=False, qkv_bias=False),
}


def weight_names(name):
    """The variable paths of a tiny model in order (optimizer states index them so) and the keys and shapes of its
    `.weights.h5` file."""
    model = keras_vit.ViT(**TINY, architecture=keras_vit.Architecture(**ARCHITECTURES[name]))
    path = os.path.join(tempfile.mkdtemp(), "model.weights.h5")
    model.save_weights(path)
    stored = {}
    with h5py.File(path, "r") as file:
        file.visititems(lambda key, item: stored.update({key: list(item.shape)})
                        if isinstance(item, h5py.Dataset) else None)
    return {"paths": [variable.path for variable in model.weights], "stored": stored}


@pytest.mark.backend_independent  # names, not values
@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_every_block_shape_keeps_its_weight_paths_their_order_and_stored_keys(name):
    with open(FIXTURE) as file:
        expected = json.load(file)[name]
    assert weight_names(name) == expected


if __name__ == "__main__":
    sys.exit(json.dump({name: weight_names(name) for name in ARCHITECTURES}, open(FIXTURE, "w"), indent=0) or 0)
