"""A folder's name, config and tensors must agree, or nothing loads: per family, files that lie about themselves.

Each case copies a fixture written by the reference's own writer and makes one part of it contradict the rest: a
table of another length than its config's model has, or a config field that sizes a table the tensors do not fit.
timm's strict load and transformers' `from_pretrained` refuse each of them; keras_vit refuses it in one line naming
the file, the tensor and the field, where it used to resize the table to the model it wanted (SAM's, before
2026-12-07).
"""

import json
import shutil

import numpy as np
import pytest
from conftest import fixture

import keras_vit
from keras_vit import CheckpointError

pytest.importorskip("safetensors")
pytestmark = pytest.mark.backend_independent


def lying_folder(tmp_path, source, tensors=None, config=None):
    """A copy of the fixture folder `source` with `tensors(dict)` and `config(dict)` edited in place."""
    from safetensors.numpy import load_file, save_file

    target = tmp_path / "lying"
    shutil.copytree(fixture(source), target)
    if tensors is not None:
        state = load_file(target / "model.safetensors")
        tensors(state)
        save_file(state, target / "model.safetensors", metadata={"format": "pt"})
    if config is not None:
        fields = json.loads((target / "config.json").read_text())
        config(fields)
        (target / "config.json").write_text(json.dumps(fields))
    return target


def retensored(name, change):
    """An edit replacing tensor `name` with `change(tensor)`."""
    return lambda state: state.update({name: np.ascontiguousarray(change(state[name]))})


def rows(name, count):
    """An edit giving tensor `name` `count` rows (linearly resampled, as a resize at save would)."""
    def resampled(table):
        positions = np.linspace(0, table.shape[0] - 1, count)
        return np.stack([np.interp(positions, np.arange(table.shape[0]), column) for column in table.T],
                        -1).astype(table.dtype)
    return retensored(name, resampled)


def model_args(**changes):
    """An edit setting `model_args` fields; a None deletes the field."""
    def edit(config):
        config["model_args"].update(changes)
        for key in [key for key, value in changes.items() if value is None]:
            del config["model_args"][key]
    return edit


def pretrained_cfg(**changes):
    return lambda config: config["pretrained_cfg"].update(changes)


def both(*edits):
    return lambda config: [edit(config) for edit in edits]


def table_grid(side):
    """A CaiT position table `(1, n, c)` resampled to a `side` x `side` grid (its values do not matter)."""
    return lambda table: np.resize(table, (1, side * side, table.shape[-1]))


def fields(**changes):
    return lambda config: config.update(changes)


# timm's windowed_neck: a 6x6 grid in 4x4 windows, block 1 global (its tables 11 rows, the others 7); transformers'
# SamVisionModel fixture is the same model.
SAM_GLOBAL = ("{path}: blocks.1.attn.rel_pos_h has 9 rows, but block 1 is global in {config} (model_args.global_attn_indexes "
              "[1]), and its tables on the file's 6x6 patch grid have 2*6 - 1 = 11 rows. Nothing was loaded.")
SAM_CASES = {
    "global table of another grid": ("timm_sam/windowed_neck", rows("blocks.1.attn.rel_pos_h", 9), None, SAM_GLOBAL),
    "windowed table of another window": (
        "timm_sam/windowed_neck", rows("blocks.0.attn.rel_pos_w", 9), None,
        "{path}: blocks.0.attn.rel_pos_w has 9 rows, but {config}'s model_args.window_size 4 makes block 0 attend within 4x4 "
        "windows (model_args.global_attn_indexes [1]), whose tables have 2*4 - 1 = 7 rows. Nothing was loaded."),
    "config window_size over another window's tables": (
        "timm_sam/windowed_neck", None, model_args(window_size=3),
        "{path}: blocks.0.attn.rel_pos_h has 7 rows, but {config}'s model_args.window_size 3 makes block 0 attend within 3x3 "
        "windows (model_args.global_attn_indexes [1]), whose tables have 2*3 - 1 = 5 rows. Nothing was loaded."),
    "config global_attn_indexes over another block's tables": (
        "timm_sam/windowed_neck", None, model_args(global_attn_indexes=[2]),
        "{path}: blocks.1.attn.rel_pos_h has 11 rows, but {config}'s model_args.window_size 4 makes block 1 attend within 4x4 "
        "windows (model_args.global_attn_indexes [2]), whose tables have 2*4 - 1 = 7 rows (11 rows are a global "
        "block's: the config's model_args.global_attn_indexes or model_args.window_size is not the file's). Nothing "
        "was loaded."),
    "transformers: global table of another grid": (
        "transformers_sam_vision", rows("vision_encoder.layers.1.attn.rel_pos_h", 9), None,
        "{path}: vision_encoder.layers.1.attn.rel_pos_h has 9 rows, but block 1 is global in {config} (global_attn_indexes "
        "[1]), and its tables on the file's 6x6 patch grid have 2*6 - 1 = 11 rows. Nothing was loaded."),
    "transformers: config global_attn_indexes over another block's tables": (
        "transformers_sam_vision", None, fields(global_attn_indexes=[2]),
        "{path}: vision_encoder.layers.1.attn.rel_pos_h has 11 rows, but {config}'s window_size 4 makes block 1 attend within "
        "4x4 windows (global_attn_indexes [2]), whose tables have 2*4 - 1 = 7 rows (11 rows are a global block's: the "
        "config's global_attn_indexes or window_size is not the file's). Nothing was loaded."),
}


def test_a_sam_global_blocks_tables_still_resize_to_the_image_size_asked_for(keras_vit_log):
    """The one legitimate resize: from the file's own grid (6x6) to the model's (8x8 at 64 px), as timm's get_rel_pos
    does on the fly; the windowed blocks' tables stay as they are."""
    model = keras_vit.from_pretrained(fixture("timm_sam/windowed_neck"), image_size=64)
    assert tuple(model.get_layer("encoderblock_1").rel_pos_h.shape) == (15, 8)
    assert tuple(model.get_layer("encoderblock_0").rel_pos_h.shape) == (7, 8)
    assert "from 11 to 15 offsets (the file's 6x6 patch grid to the model's; linear" in keras_vit_log.text


# Other families' sizes: a table or kernel that timm loads as it is (no resample in its filter) must be the one its
# config builds; a hybrid's stem ends in the kernel its name fixes. Each loaded, resized, before 2026-12-07.
CAIT_TABLE = ("{config}: pretrained_cfg.input_size (fixed_input_size true) is [32, 32], a 4x4 grid of 8-pixel "
              "patches, but the file's position table has 25 rows, 25 of them for patches (a 5x5 grid: 40 px); set it "
              "to the size the table was trained at. Nothing was loaded.")
SIZE_CASES = {
    "CaiT table of another grid than its fixed input size": (
        "timm_cait/token", retensored("pos_embed", table_grid(5)), model_args(img_size=None), CAIT_TABLE),
    "CaiT without img_size or fixed_input_size (timm builds 224 px)": (
        "timm_cait/token", None, both(model_args(img_size=None), pretrained_cfg(fixed_input_size=False)),
        "{config}: with no model_args.img_size and no fixed_input_size, timm's default img_size is [224, 224], a 28x28 "
        "grid of 8-pixel patches, but the file's position table has 16 rows, 16 of them for patches (a 4x4 grid: 32 "
        "px); set it to the size the table was trained at. Nothing was loaded."),
    **{f"{family} patch kernel 8x4 under patch_size 8": (
        folder, retensored("patch_embed.proj.weight", lambda kernel: kernel[..., ::2]), None,
        "{path}: patch_embed.proj.weight gives patch_size (8, 4), but model_args.patch_size has 8 ({config}); the "
        "name, config and tensors disagree. Nothing was loaded.")
       for family, folder in (("CaiT", "timm_cait/token"), ("RelPos", "timm_relpos/table_cls_gap"),
                              ("SAM", "timm_sam/windowed_neck"))},
    "ViTamin stem ending in a 5x5 convolution": (
        "timm_hybrid/mbconv", retensored("patch_embed.backbone.pool.proj.weight",
                                         lambda kernel: np.pad(kernel, ((0, 0), (0, 0), (1, 1), (1, 1)))), None,
        "{path}: patch_embed.backbone.pool.proj.weight is a 5x5 kernel, but ViTamin's MbConvStages (timm's "
                  "'vitamin_small_224') ends in a 3x3 one. Nothing was loaded."),
    "MobileCLIP stem ending in a 4x4 convolution": (
        "timm_hybrid/conv_stem", retensored("patch_embed.backbone.2.conv.weight",
                                            lambda kernel: kernel.repeat(2, 2).repeat(2, 3) / 4),
        model_args(img_size=[64, 96]),
        "{path}: patch_embed.backbone.2.conv.weight is a 4x4 kernel, but MobileCLIP's ConvStem (timm's "
        "'vit_base_mci_224') ends in a 2x2 one. Nothing was loaded."),
    "BEiT absolute table of no stated size beside relative tables of the config's": (
        "timm_beit/shared_abs_token", retensored("pos_embed", lambda table: np.resize(table, (1, 26, 32))),
        model_args(img_size=None),  # a TypeError before 2026-12-07
        "{path}: 'blocks.0.attn.relative_position_bias_table' has shape (52, 2) but the model expects (84, 2); the "
        "file has hidden size 32. Nothing was loaded."),
}


@pytest.mark.parametrize("case", sorted({**SAM_CASES, **SIZE_CASES}))
def test_tables_and_sizes_that_contradict_their_file_are_refused_not_resized(case, tmp_path):
    source, tensors, config, message = {**SAM_CASES, **SIZE_CASES}[case]
    folder = lying_folder(tmp_path, source, tensors, config)
    with pytest.raises(CheckpointError) as error:
        keras_vit.from_pretrained(str(folder))
    assert str(error.value) == message.format(path=folder / "model.safetensors", config=folder / "config.json")

