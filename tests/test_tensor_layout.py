"""The declared layout tables: keras_vit's own weights per architecture switch, and each file layout's names.

`tensor_layout.MODEL_WEIGHTS`/`BLOCK_WEIGHTS` must be exactly the weights `ViT` builds for every switch, and
every layout table must name only those weights, so one converter and one completeness check serve all layouts.
"""

import json
import os
import shutil

import numpy as np
import pytest
from conftest import fixture

import keras_vit
from keras_vit import CheckpointError
from keras_vit.checkpoints import tensor_layout
from keras_vit.checkpoints.timm import layout as timm_layout
from keras_vit.checkpoints.transformers import clip as clip_layout
from keras_vit.checkpoints.transformers import dinov2 as dinov2_layout
from keras_vit.checkpoints.transformers import vit as transformers_layout
from keras_vit.model.architecture import Architecture

pytestmark = pytest.mark.backend_independent
LAYOUTS = [timm_layout.LAYOUT, transformers_layout.LAYOUT, dinov2_layout.LAYOUT, clip_layout.LAYOUT]
ARCHITECTURES = {
    "paper": Architecture(),
    "registers_gap": Architecture(class_token=False, classifier="gap", register_tokens=2, fc_norm=True,
                                  class_token_position_embedding=False),
    "clip": Architecture(norm_pre=True, patch_bias=False, layer_norm_epsilon=1e-5, mlp_activation="quick_gelu"),
    "siglip_map": Architecture(class_token=False, classifier="map", qkv_bias=False),
    "dinov2": Architecture(layer_scale=1e-5, qk_norm=True, mlp_activation="swiglu"),
    "no_final_norm": Architecture(final_norm=False),
    "beit3_post_norm": Architecture(attention_output_norm=True, mlp_hidden_norm=True, post_norm=True, fc_norm=True,
                                    classifier="gap"),
}


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_declared_weights_are_exactly_the_weights_vit_builds(name):
    architecture = ARCHITECTURES[name]
    model = keras_vit.ViT(image_size=16, patch_size=8, hidden_size=16, num_layers=2, num_heads=2, mlp_dim=32,
                          include_top=False, pooling=architecture.classifier, architecture=architecture)
    assert tensor_layout.expected_weights(architecture, 2) == {variable.path for variable in model.weights}


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda layout: layout.name)
def test_every_layout_names_only_keras_vit_weights(layout):
    known = set(tensor_layout.MODEL_WEIGHTS) | {name for group in tensor_layout.optional_groups(True) for name in group}
    paths = [tensor_layout._path(value) for value in layout.top.values()]
    paths += [path for _, outputs in layout.reshaped.values() for path in outputs]
    assert set(paths) <= known
    assert {tensor_layout._path(value) for value in layout.block.values()} <= set(tensor_layout.BLOCK_WEIGHTS)


def test_timm_layout_writes_back_every_name_it_reads():
    state = {path: np.zeros((2, 3)) for path in tensor_layout.expected_weights(Architecture(qk_norm=True), 1)}
    written = timm_layout.LAYOUT.write(state)
    assert sorted(timm_layout.LAYOUT.read(written, "written")) == sorted(state)


def test_timm_folder_missing_a_later_blocks_tensor_names_it_in_timms_names(tmp_path):
    from safetensors.numpy import load_file, save_file

    folder = tmp_path / "deit"
    shutil.copytree(os.path.join(fixture("timm_family"), "deit"), folder)
    tensors = load_file(folder / "model.safetensors")
    del tensors["blocks.1.mlp.fc2.bias"]
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError) as error:
        keras_vit.from_pretrained(str(folder))
    assert str(error.value) == (
        f"{folder}/model.safetensors lacks 1 tensors of the model its config.json describes (architecture: "
        "\"deit_small_patch16_224\", depth: 2): ['blocks.1.mlp.fc2.bias'].")


def test_dinov2_folder_with_the_other_mlps_names_is_refused_naming_what_its_config_needs(tmp_path):
    from safetensors.numpy import load_file, save_file

    folder = tmp_path / "dinov2"
    shutil.copytree(fixture("transformers_dinov2"), folder)
    tensors = load_file(folder / "model.safetensors")
    renamed = {name.replace(".mlp.fc1.", ".mlp.weights_in.").replace(".mlp.fc2.", ".mlp.weights_out."): value
               for name, value in tensors.items()}
    save_file(renamed, folder / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    assert not config.get("use_swiglu_ffn")
    with pytest.raises(CheckpointError, match=r"lacks 8 tensors of the model its config.json describes \(model_type: "
                                              r"\"dinov2\", num_hidden_layers: 2, qkv_bias: true, use_swiglu_ffn: "
                                              r"false\): \['encoder.layer.0.mlp.fc1.bias'"):
        keras_vit.from_pretrained(str(folder))
