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
from keras_vit.layers import TransformerBlock
from keras_vit.layers.blocks import BlockSwitches

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


# Block configs as keras_vit wrote them before the switches were declared once (at 60df850), and as 0.x did.
OLD_CONFIGS = [
    ({"name": "encoderblock_3", "trainable": True, "num_heads": 2, "mlp_dim": 32, "dropout_rate": 0.0,
      "attention_dropout_rate": 0.0, "stochastic_depth_rate": 0.0, "activation": "swiglu", "seed": None,
      "layer_norm_epsilon": 1e-05, "qk_norm": True, "layer_scale": 0.1, "differential_attention": True,
      "layer_index": 3, "rope": "axial", "rope_temperature": 100.0, "rope_rotate_half": True, "key_bias": False},
     BlockSwitches(mlp_activation="swiglu", layer_norm_epsilon=1e-5, qk_norm=True, layer_scale=0.1,
                   differential_attention=True, rope="axial", rope_temperature=100.0, rope_rotate_half=True,
                   key_bias=False)),
    ({"name": "encoderblock_0", "num_heads": 2, "mlp_dim": 16, "approximate_gelu": False},
     BlockSwitches(mlp_activation="gelu")),
    ({"name": "encoderblock_0", "num_heads": 2, "mlp_dim": 16, "approximate_gelu": True, "activation": "quick_gelu"},
     BlockSwitches(mlp_activation="quick_gelu")),
]


@pytest.mark.backend_independent  # configs, not values
@pytest.mark.parametrize("config, switches", OLD_CONFIGS)
def test_block_configs_written_before_the_switches_were_declared_once_still_load(config, switches):
    block = TransformerBlock.from_config(dict(config))
    assert block.switches == switches and block.layer_index == config.get("layer_index", 0)
    again = TransformerBlock.from_config(block.get_config())
    assert again.switches == switches and again.layer_index == block.layer_index


if __name__ == "__main__":
    sys.exit(json.dump({name: weight_names(name) for name in ARCHITECTURES}, open(FIXTURE, "w"), indent=0) or 0)
