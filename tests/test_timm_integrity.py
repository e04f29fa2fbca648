"""A timm Hub folder whose name, config and tensors disagree is refused, naming the file and what is wrong.

Each case copies a folder that timm's own `save_for_hf` wrote (`fixtures/timm_family/`) and changes one
thing: a tensor dropped, the architecture renamed, a `model_args` or `pretrained_cfg` field edited. On the
unchanged folders the same loads give timm's outputs (`test_timm_family.py`).
"""

import json
import os
import shutil

import numpy as np
import pytest

import keras_vit
from conftest import fixture
from keras_vit import CheckpointError, checkpoints

pytest.importorskip("safetensors")
from safetensors.numpy import load_file, save_file  # noqa: E402

pytestmark = pytest.mark.backend_independent
FAMILY = fixture("timm_family")


def copy(case, tmp_path, config=None, drop=(), architecture=None, model_args=None, pretrained_cfg=None):
    """A copy of a family folder with tensors dropped and `config.json` fields replaced."""
    folder = tmp_path / case
    shutil.copytree(os.path.join(FAMILY, case), folder)
    tensors = load_file(folder / "model.safetensors")
    if drop:
        tensors = {name: value for name, value in tensors.items() if not name.startswith(drop)}
        save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    written = json.loads((folder / "config.json").read_text())
    if architecture:
        written["architecture"] = architecture
    if model_args is not None:
        written["model_args"] = {**written.get("model_args", {}), **model_args}
        written["model_args"] = {key: value for key, value in written["model_args"].items() if value is not None}
    if pretrained_cfg:
        written["pretrained_cfg"].update(pretrained_cfg)
    written.update(config or {})
    (folder / "config.json").write_text(json.dumps(written))
    return folder


def refused(folder, pattern):
    with pytest.raises(CheckpointError, match=pattern) as error:
        keras_vit.from_pretrained(str(folder))
    return str(error.value)


def test_siglip_folder_without_attention_pool_is_refused_not_loaded_as_gap(tmp_path):
    folder = copy("siglip_map", tmp_path, drop=("attn_pool.",))
    refused(folder, r"siglip_map/model.safetensors does not hold timm's 'vit_base_patch16_siglip_224' as its "
                    r"config.json sets it: it lacks attn_pool.\* \(attention pooling; global_pool is map\). "
                    r"Nothing was loaded.$")


def test_quickgelu_clip_name_on_deit_tensors_is_refused(tmp_path):
    folder = copy("deit", tmp_path, architecture="vit_base_patch16_clip_quickgelu_224")
    refused(folder, r"deit/model.safetensors does not hold timm's 'vit_base_patch16_clip_quickgelu_224' as its "
                    r"config.json sets it: it lacks norm_pre.weight \(pre_norm=True\); it has "
                    r"patch_embed.proj.bias \(pre_norm=True\). Nothing was loaded.$")


def test_register_name_on_tensors_without_registers_is_refused(tmp_path):
    folder = copy("dinov2", tmp_path, architecture="vit_small_patch14_reg4_dinov2")
    refused(folder, r"it holds 0 register tokens \(reg_token\) where the architecture has 4 \(reg_tokens\)")


def test_register_count_in_model_args_must_match_the_tensors(tmp_path):
    folder = copy("dinov2_reg", tmp_path, model_args={"reg_tokens": 8})
    refused(folder, r"it holds 4 register tokens \(reg_token\) where the architecture has 8 \(reg_tokens\)")


@pytest.mark.parametrize("architecture, message", [
    ("vit_base_patch16_rope_224", r"lacks 4 tensors of the model its config.json describes \(architecture: "
                                  r"\"vit_base_patch16_rope_224\", depth: 2\): \['blocks.0.gamma_1', "),
    ("vit_pe_core_base_patch16_224", r"lacks 2 tensors of the model its config.json describes .*"
                                     r"\['norm_pre.bias', 'norm_pre.weight'\]"),
    ("vit_small_patch16_dinov3", r"lacks 5 tensors of the model .*'reg_token'\]"),
    ("eva02_base_patch14_224", r"has 4 tensors that are not in timm's Eva layout \(q, k and v apart\): "
                               r"\['blocks.0.attn.qkv.bias', "),
])
def test_rope_names_on_plain_vit_tensors_are_refused_naming_what_differs(tmp_path, architecture, message):
    """A DeiT state dict under a RoPE architecture's name: the Eva reader names the tensors that do not fit."""
    folder = copy("deit", tmp_path, architecture=architecture)
    refused(folder, rf"deit/model.safetensors {message}")


def test_pool_include_prefix_in_model_args_averages_the_register_tokens_too(tmp_path):
    folder = copy("reg_gap", tmp_path, model_args={"pool_include_prefix": True})
    model = keras_vit.from_pretrained(str(folder), include_top=False, pooling="gap")
    assert checkpoints.architecture_of(model).pool_include_prefix
    assert model.get_layer("pool").num_prefix_tokens == 0


def test_a_model_args_key_keras_vit_does_not_compute_is_refused(tmp_path):
    folder = copy("deit", tmp_path, model_args={"pos_embed": "none"})
    refused(folder, r"model_args.pos_embed is 'none', which keras_vit does not compute")
    folder = copy("deit", tmp_path / "1", model_args={"norm_layer": "rmsnorm"})
    refused(folder, r"deit/config.json: model_args.norm_layer is not a VisionTransformer argument keras_vit computes")
    # proj_bias is computed (AIMv2): False where the file has the biases is a disagreement, named.
    folder = copy("deit", tmp_path / "3", model_args={"proj_bias": False})
    refused(folder, r"does not hold timm's 'deit_small_patch16_224' as its config.json sets it: it has "
                    r"blocks.0.attn.proj.bias \(proj_bias=False\)")
    folder = copy("deit", tmp_path / "2", model_args={"frobnicate": 3})
    refused(folder, r"deit/config.json: model_args.frobnicate is not a VisionTransformer argument keras_vit computes")


@pytest.mark.parametrize("field, value, pattern", [
    ("mean", [float("nan"), 0.5, 0.5], r"pretrained_cfg.mean is \[nan, 0.5, 0.5\], which is not finite."),
    ("std", [float("inf"), 0.5, 0.5], r"pretrained_cfg.std is \[inf, 0.5, 0.5\], which is not finite."),
    ("mean", [123.7, 116.3, 103.5], r"pretrained_cfg.mean is \[123.7, 116.3, 103.5\], on the 0-255 scale; timm and "
                                    r"transformers keep pixel statistics on the \[0, 1\] scale \(\[0.4851, 0.4561, "
                                    r"0.4059\]\)."),
    ("std", [True, True, True], r"pretrained_cfg.std is \[True, True, True\]; expected three per-channel numbers"),
])
def test_pixel_statistics_out_of_range_are_refused_naming_the_file_and_field(tmp_path, field, value, pattern):
    folder = copy("deit", tmp_path, pretrained_cfg={field: value})
    refused(folder, r"deit/config.json: " + pattern)


def test_head_count_that_does_not_divide_the_width_names_the_file_and_field(tmp_path):
    folder = copy("deit", tmp_path, model_args={"num_heads": 5})
    refused(folder, r"deit/config.json: model_args.num_heads is 5, which does not divide the width 24 of "
                    r".*deit/model.safetensors.$")


def test_sizes_that_disagree_with_the_name_are_refused(tmp_path):
    folder = copy("deit", tmp_path, config={"model_args": {}})  # timm's deit_small: 384 wide, patch 16
    refused(folder, r"deit/model.safetensors: patch_embed.proj.weight gives patch_size 8, but timm's "
                    r"'deit_small_patch16_224' has 16 \(.*deit/config.json\); the name, config and tensors disagree")


def test_num_classes_must_match_the_head(tmp_path):
    folder = copy("deit", tmp_path, model_args={"num_classes": 7}, config={"num_classes": 7})
    refused(folder, r"deit/model.safetensors: head.weight has 10 classes, but its config.json's num_classes is 7.")
    folder = copy("deit", tmp_path / "2", drop=("head.",))
    refused(folder, r"deit/model.safetensors lacks head.weight and head.bias, which its config.json's num_classes "
                    r"10 needs.")


def test_register_folder_on_an_ambiguous_grid_reads_the_config_input_size(tmp_path):
    # A 3x3 grid beside 5 prefix tokens: 9 rows and 9 - 5 = 4 are both squares, so the table alone cannot say
    # whether the prefix tokens have rows. The name (no_embed_class) and pretrained_cfg.input_size can.
    folder = copy("dinov2_reg", tmp_path, model_args={"img_size": None}, pretrained_cfg={"input_size": [3, 21, 21]})
    tensors = load_file(folder / "model.safetensors")
    tensors["pos_embed"] = np.ascontiguousarray(tensors["pos_embed"][:, :9])
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    source = checkpoints.read_folder(str(folder))
    assert source.grid_size == (3, 3) and not source.architecture.class_token_position_embedding
    assert keras_vit.from_pretrained(str(folder)).input_shape == (None, 21, 21, 3)


def test_resize_default_is_timms_antialiased_bicubic_and_flexivits_bilinear():
    assert checkpoints.read_folder(os.path.join(FAMILY, "deit")).position_resize == ("bicubic", True)
    assert checkpoints.read_folder(os.path.join(FAMILY, "flexivit")).position_resize == ("bilinear", False)


@pytest.mark.parametrize("case,size", [("deit", 48), ("deit", 24), ("flexivit", 48), ("flexivit", 24),
                                       ("deit", (16, 64)), ("deit", (64, 16)), ("flexivit", (16, 64))])
def test_loading_at_another_size_gives_timms_own_load_at_that_size(case, size):
    # timm's checkpoint_filter_fn: bicubic with antialias (deit), bilinear without (FlexiViT). A 2x8 or 8x2 grid
    # has as many patches as the file's 4x4, and timm resamples it all the same.
    key = f"{size[0]}x{size[1]}" if isinstance(size, tuple) else size
    with np.load(fixture("timm_resize_reference.npz")) as data:
        images, outputs = data[f"{case}/{key}/images"], data[f"{case}/{key}/outputs"]
    model = keras_vit.from_pretrained(os.path.join(FAMILY, case), image_size=size, classifier_activation=None)
    np.testing.assert_allclose(np.asarray(model.predict(timm_pixels(images, case), verbose=0)), outputs, atol=1e-5,
                               rtol=0)


def timm_pixels(images, case):
    """keras_vit's [-1, 1] input of images in timm's normalised space, by the folder's statistics."""
    with open(os.path.join(FAMILY, case, "config.json")) as f:
        statistics = json.load(f)["pretrained_cfg"]
    return ((images * np.array(statistics["std"]) + np.array(statistics["mean"])) * 2 - 1).astype("float32")


def test_a_non_square_file_loaded_transposed_gives_timms_own_load(tmp_path):
    # tools/make_timm_resize_fixture.py: the deit file resized by timm to 24x40 (3x5), loaded by timm at 40x24.
    with np.load(fixture("timm_resize_reference.npz")) as data:
        table, images, outputs = (data[key] for key in ("deit/24x40/pos_embed", "deit_24x40/40x24/images",
                                                        "deit_24x40/40x24/outputs"))
    folder = copy("deit", tmp_path, model_args={"img_size": [24, 40]}, pretrained_cfg={"input_size": [3, 24, 40]})
    save_file(dict(load_file(folder / "model.safetensors"), pos_embed=table), folder / "model.safetensors",
              metadata={"format": "pt"})
    model = keras_vit.from_pretrained(str(folder), image_size=(40, 24), classifier_activation=None)
    np.testing.assert_allclose(np.asarray(model.predict(timm_pixels(images, "deit"), verbose=0)), outputs, atol=1e-5,
                               rtol=0)


def test_norms_without_biases_are_rmsnorms_and_must_be_the_architectures(tmp_path):
    folder = copy("deit", tmp_path, drop=("blocks.0.norm1.bias", "blocks.0.norm2.bias", "blocks.1.norm1.bias",
                                          "blocks.1.norm2.bias", "norm.bias"))
    refused(folder, r"does not hold timm's 'deit_small_patch16_224' as its config.json sets it: it lacks norm biases "
                    r"\(blocks.0.norm1.bias\): RMSNorms where the architecture's norm_layer is LayerNorm")
    folder = copy("deit", tmp_path / "1", drop=("norm.bias",))
    refused(folder, r"lacks 1 tensors of the model its config.json describes \(architecture: "
                    r"\"deit_small_patch16_224\", depth: 2\): \['norm.bias'\]")
    folder = copy("aimv2", tmp_path / "2", architecture="vit_small_patch16_224",
                  model_args={"img_size": 28, "mlp_ratio": 5.5, "global_pool": "avg", "class_token": False})
    refused(folder, r"aimv2/model.safetensors does not hold timm's 'vit_small_patch16_224' as its config.json sets "
                    r"it: .*it lacks blocks.0.attn.qkv.bias \(qkv_bias=True\); .*it has patch_embed.norm.weight "
                    r"\(embed_norm_layer None\); .*it lacks norm biases .*it has a SwiGLU MLP \(blocks.0.mlp.fc1_g and fc1_x, or "
                    r"an fc1 twice fc2's width\) where the architecture's is plain")
    tensors = load_file(os.path.join(FAMILY, "aimv2", "model.safetensors"))  # AIMv2's SwiGLU packed as DINOv2's
    for block in (0,):
        pieces = [tensors.pop(f"blocks.{block}.mlp.fc1_{part}.weight") for part in "gx"]
        tensors[f"blocks.{block}.mlp.fc1.weight"] = np.concatenate(pieces, 0)
    folder = copy("aimv2", tmp_path / "4")
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    refused(folder, r"it keeps its SwiGLU packed in blocks.0.mlp.fc1.weight where the architecture's has fc1_g and "
                    r"fc1_x")


def test_a_table_that_does_not_fit_the_configs_img_size_is_refused(tmp_path):
    # 1 + 25 rows (a 5x5 grid, 40 px) beside model_args.img_size 32 (4x4): not read as a 40-pixel model.
    folder = copy("deit", tmp_path)
    tensors = load_file(folder / "model.safetensors")
    tensors["pos_embed"] = np.zeros((1, 26, 24), "float32")
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    refused(folder, r"deit/config.json: model_args.img_size is \[32, 32\], a 4x4 grid of 8-pixel patches, but the "
                    r"file's position table has 26 rows, 25 of them for patches \(a 5x5 grid: 40 px\); set it to the "
                    r"size the table was trained at. Nothing was loaded.$")


def test_a_table_of_no_square_grid_says_the_file_states_no_grid(tmp_path):
    tensors = load_file(os.path.join(FAMILY, "deit", "model.safetensors"))
    tensors["pos_embed"] = np.ascontiguousarray(tensors["pos_embed"][:, :15])  # 1 + 14 rows: no square
    save_file(tensors, tmp_path / "odd.safetensors")
    with pytest.raises(CheckpointError, match=r"odd.safetensors: its position table has 15 rows, which are no square "
                                              r"grid after 1 prefix tokens, and the file does not state its grid") as error:
        keras_vit.from_pretrained(str(tmp_path / "odd.safetensors"), num_heads=3, image_size=32)
    assert "old_grid_size" not in str(error.value)


def test_model_args_switches_take_timms_null_defaults(tmp_path):
    # Values of another kind: test_malformed_files.py::test_a_config_field_of_another_kind_is_refused_in_one_line...
    folder = copy("reg_gap", tmp_path, model_args={"fc_norm": None, "init_values": 1e-5})  # timm's own defaults
    assert checkpoints.architecture_of(keras_vit.from_pretrained(str(folder))).fc_norm
    # timm takes attn_layer by name, as its differential model functions set it (and save_timm's keywords).
    folder = copy("differential", tmp_path / "4", model_args={"attn_layer": "diff"})
    assert checkpoints.architecture_of(keras_vit.from_pretrained(str(folder))).differential_attention
    folder = copy("deit", tmp_path / "5", model_args={"attn_layer": "flash"})
    refused(folder, r"deit/config.json: model_args.attn_layer is 'flash'; expected one of '', 'attn', 'diff'.$")


def test_a_beit3_block_without_its_inner_attention_norm_is_refused(tmp_path):
    folder = copy("inner_norms", tmp_path, drop=("blocks.0.attn.norm.",))
    refused(folder, r"inner_norms/model.safetensors does not hold timm's 'beit3_base_patch16_224' as its config.json "
                    r"sets it: it lacks blocks.0.attn.norm.weight \(scale_attn_norm=True\). Nothing was loaded.$")


def test_a_differential_block_without_its_lambda_is_refused_by_name(tmp_path):
    folder = copy("differential", tmp_path, drop=("blocks.1.attn.lambda_q1",))
    refused(folder, r"differential/model.safetensors lacks 1 tensors of the model its config.json describes "
                    r"\(architecture: \"vit_dwee_patch16_reg1_gap_256\", depth: 2\): \['blocks.1.attn.lambda_q1'\]")


def test_a_parallel_block_without_a_piece_of_a_split_or_summed_tensor_is_refused_by_name(tmp_path):
    folder = copy("parallel", tmp_path, drop=("blocks.1.mlp_out_proj.bias",))
    refused(folder, r"parallel/model.safetensors holds \['blocks.1.attn_out_proj.bias'\] but not "
                    r"\['blocks.1.mlp_out_proj.bias'\], which come together. Nothing was loaded.")
    folder = copy("parallel_differential", tmp_path / "1", drop=("blocks.0.in_proj.weight",))
    refused(folder, r"parallel_differential/model.safetensors holds \['blocks.0.in_proj.bias'\] but not "
                    r"\['blocks.0.in_proj.weight'\], which come together. Nothing was loaded.")
    folder = copy("parallel", tmp_path / "2", architecture="vit_wee_patch16_reg1_gap_256")
    refused(folder, r"parallel/model.safetensors does not hold timm's 'vit_wee_patch16_reg1_gap_256' as its "
                    r"config.json sets it: it has blocks.0.in_norm.weight \(block_fn Block\)\. Nothing was loaded.")
