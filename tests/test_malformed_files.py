"""Files that are wrong in their types or structure get one clear CheckpointError naming the file and the field,
in Python and as the CLI's one-line error; none loads as a silently wrong model."""

import json
import os
import re
import shutil
import struct
import zipfile

import numpy as np
import pytest
from conftest import SMALL, fixture

import keras_vit
from keras_vit import CheckpointError, checkpoints, cli

pytest.importorskip("safetensors")

TIMM_FOLDER = fixture("timm_hub")
TIMM = dict(image_size=32, patch_size=8, hidden_size=24, num_layers=2, mlp_dim=48)
FLOAT_ONLY = r"weights must be floating point, but '{name}' is {dtype}; the file is corrupt, quantized or not a " \
             r"checkpoint of weights\. Nothing was loaded\."


def safetensors_parts(path):
    data = open(path, "rb").read()
    (length,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8:8 + length]), data[8 + length:]


def write_safetensors(path, header, body):
    encoded = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(encoded)) + encoded + body)
    return str(path)


def retyped(source, target, tensor, dtype="I32"):
    """`source` with one tensor's header dtype rewritten (same byte size): its float bytes now read as integers."""
    header, body = safetensors_parts(source)
    header[tensor]["dtype"] = dtype
    return write_safetensors(target, header, body)


def h5_with_an_integer_weight(path):
    """Rewrite the first weight array of a Keras `.weights.h5` file as int32."""
    import h5py

    with h5py.File(path, "r+") as archive:
        names = []
        archive.visititems(lambda name, item: names.append(name) if isinstance(item, h5py.Dataset) else None)
        name = sorted(names)[0]
        values = archive[name][()]
        del archive[name]
        archive[name] = values.astype("int32")
    return name


# --- Integer weights: refused by the one loading step every reader shares ------------------------------------


# Each writer returns (what to load, its sizes, the file that errors name, the tensor as the file names it, its dtype).
def integer_npz(tmp_path):
    with np.load(fixture("vit_token.npz")) as data:
        arrays = dict(data)
    arrays["Transformer/encoder_norm/scale"] = arrays["Transformer/encoder_norm/scale"].view("int32")
    np.savez(tmp_path / "int.npz", **arrays)
    path = str(tmp_path / "int.npz")
    return path, dict(SMALL, image_size=32), path, "Transformer/encoder_norm/scale", "int32"


def integer_timm(tmp_path):
    path = retyped(os.path.join(TIMM_FOLDER, "model.safetensors"), tmp_path / "int.safetensors", "blocks.0.norm1.weight")
    return path, dict(TIMM, num_heads=3), path, "blocks.0.norm1.weight", "int32"


def integer_timm_folder(tmp_path):
    folder = tmp_path / "timm"
    shutil.copytree(TIMM_FOLDER, folder)
    retyped(folder / "model.safetensors", folder / "model.safetensors", "blocks.1.mlp.fc2.bias")
    return str(folder), dict(TIMM, num_heads=3), f"{folder}/model.safetensors", "blocks.1.mlp.fc2.bias", "int32"


def integer_transformers(tmp_path):
    folder = tmp_path / "hf"
    shutil.copytree(fixture("transformers_vit"), folder)
    retyped(folder / "model.safetensors", folder / "model.safetensors", "vit.layernorm.weight")
    return str(folder), dict(TIMM), f"{folder}/model.safetensors", "vit.layernorm.weight", "int32"


def integer_keras(tmp_path):
    model = keras_vit.ViT(image_size=32, **SMALL, classes=10)
    model.save(tmp_path / "whole.keras")
    with zipfile.ZipFile(tmp_path / "whole.keras") as archive:
        archive.extractall(tmp_path / "unpacked")
    name = h5_with_an_integer_weight(tmp_path / "unpacked" / "model.weights.h5")
    with zipfile.ZipFile(tmp_path / "int.keras", "w") as archive:
        for entry in sorted(os.listdir(tmp_path / "unpacked")):
            archive.write(tmp_path / "unpacked" / entry, entry)
    path = str(tmp_path / "int.keras")
    return path, dict(SMALL, image_size=32, classes=10), path, name, "int32"


def integer_weights_h5(tmp_path):
    model = keras_vit.ViT(image_size=32, **SMALL, classes=10)
    model.save_weights(tmp_path / "int.weights.h5")
    name = h5_with_an_integer_weight(tmp_path / "int.weights.h5")
    path = str(tmp_path / "int.weights.h5")
    return path, dict(SMALL, image_size=32, classes=10), path, name, "int32"


@pytest.mark.backend_independent
@pytest.mark.parametrize("write", [integer_npz, integer_timm, integer_timm_folder, integer_transformers, integer_keras,
                                   integer_weights_h5],
                         ids=["npz", "timm", "timm_folder", "transformers", "keras", "weights_h5"])
def test_every_reader_refuses_integer_weights_naming_the_tensor_as_the_file_does(write, tmp_path):
    path, sizes, described, name, dtype = write(tmp_path)
    message = f"^{re.escape(described)}: " + FLOAT_ONLY.format(name=re.escape(name), dtype=dtype) + "$"
    with pytest.raises(CheckpointError, match=message):
        keras_vit.ViT(**sizes, weights=path)
    with pytest.raises(CheckpointError, match=message):
        keras_vit.from_pretrained(path, **({"num_heads": sizes["num_heads"]} if "num_heads" in sizes else {}))


def test_a_file_of_int8_tensors_is_refused():
    arrays = {name: np.ones(shape, "int8") for name, shape in
              ((name, value.shape) for name, value in checkpoints.read_timm(
                  os.path.join(TIMM_FOLDER, "model.safetensors")).state.items())}
    source = checkpoints.WeightsSource("int8 file", arrays)
    with pytest.raises(CheckpointError, match=r"^int8 file: weights must be floating point, but '[^']+' is int8, "
                                              r"'[^']+' is int8, '[^']+' is int8 \(and \d+ more\)"):
        keras_vit.ViT(**TIMM, num_heads=3, weights=source)


# --- A tensor of the wrong shape: named as the file names it, in the file's shape ------------------------------


def widened(tensors, name, by):
    """`tensors` with `name` `by` rows longer (its first axis)."""
    return dict(tensors, **{name: np.concatenate([tensors[name], tensors[name][:by]])})


def wide_timm_folder(tmp_path):
    from safetensors.numpy import load_file, save_file

    folder = tmp_path / "timm"
    shutil.copytree(TIMM_FOLDER, folder)
    save_file(widened(load_file(folder / "model.safetensors"), "blocks.1.mlp.fc1.weight", 2),
              folder / "model.safetensors")
    return str(folder), str(folder / "model.safetensors"), "'blocks.1.mlp.fc1.weight' has shape (50, 24) but the " \
        "model expects (48, 24); the file has hidden size 24"


def wide_dinov2_folder(tmp_path):
    from safetensors.numpy import load_file, save_file

    folder = tmp_path / "dinov2"
    shutil.copytree(fixture("transformers_dinov2"), folder)
    save_file(widened(load_file(folder / "model.safetensors"), "encoder.layer.1.layer_scale1.lambda1", 2),
              folder / "model.safetensors")
    return str(folder), str(folder / "model.safetensors"), "'encoder.layer.1.layer_scale1.lambda1' has shape (26,) " \
        "but the model expects (24,); the file has hidden size 24"


def wide_npz(tmp_path):
    with np.load(fixture("vit_token.npz")) as data:
        arrays = dict(data)
    name = "Transformer/encoderblock_1/MlpBlock_3/Dense_1/kernel"
    np.savez(tmp_path / "wide.npz", **widened(arrays, name, 4))
    path = str(tmp_path / "wide.npz")
    return path, path, f"'{name}' has shape (100, 48) but the model expects (96, 48); the file has hidden size 48"


@pytest.mark.backend_independent
@pytest.mark.parametrize("write", [wide_timm_folder, wide_dinov2_folder, wide_npz])
def test_a_tensor_of_another_shape_is_refused_in_the_files_own_name_and_shape(write, tmp_path):
    weights, path, message = write(tmp_path)
    with pytest.raises(CheckpointError, match=f"^{re.escape(f'{path}: {message}. Nothing was loaded.')}$"):
        keras_vit.from_pretrained(weights)


# --- Malformed Hub files: one CheckpointError naming the file and the field, and the CLI's one line ------------


def edited_folder(tmp_path, edit):
    folder = tmp_path / "hub"
    shutil.copytree(TIMM_FOLDER, folder)
    config = json.loads((folder / "config.json").read_text())
    config = edit(config)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def set_field(**changes):
    def edit(config):
        for key, value in changes.items():
            if key in ("num_heads", "patch_size", "img_size"):
                config["model_args"][key] = value
            else:
                config[key] = value
        return config
    return edit


MALFORMED_CONFIGS = [
    ("list", lambda c: [c], r"{folder}/config.json is a JSON list; timm's and transformers' config.json is an object"),
    ("architecture_null", set_field(architecture=None),
     r"{folder}/config.json: architecture is None; expected timm's model name \(a string such as"),
    ("model_args_list", set_field(model_args=[1]),
     r"{folder}/config.json: model_args is a JSON list; timm writes an object of VisionTransformer arguments"),
]


@pytest.mark.backend_independent
@pytest.mark.parametrize("edit, message", [case[1:] for case in MALFORMED_CONFIGS],
                         ids=[case[0] for case in MALFORMED_CONFIGS])
def test_a_malformed_timm_config_names_the_file_and_the_field(edit, message, tmp_path, capsys):
    folder = edited_folder(tmp_path, edit)
    message = message.format(folder=folder)
    with pytest.raises(CheckpointError, match=f"^{message}"):
        keras_vit.from_pretrained(str(folder))
    assert cli.console_main(["export", str(folder), "--output", str(tmp_path / "out.onnx")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("keras-vit: error: ")
    assert not os.path.exists(tmp_path / "out.onnx")


# Every config field keras_vit reads has one kind (keras_vit.checkpoints.config_fields); a value of another kind, or
# one that contradicts another field, is one line naming the file, the field, the value and what is expected.
FIELD_REFUSALS = [
    ("timm_hub", {"model_args.num_heads": "three"}, "model_args.num_heads is 'three'; expected a positive int."),
    ("timm_hub", {"model_args.patch_size": 0}, "model_args.patch_size is 0; expected a positive int or [side, side]."),
    ("timm_hub", {"model_args.patch_size": [16, 8]},
     "model_args.patch_size is [16, 8]; expected a positive int or [side, side]."),
    ("timm_hub", {"model_args.img_size": "big"}, "model_args.img_size is 'big'; expected a positive int or "
                                                  "[height, width]."),
    ("timm_hub", {"model_args.reg_tokens": "4"}, "model_args.reg_tokens is '4'; expected a whole number >= 0."),
    ("timm_hub", {"model_args.qkv_bias": 1}, "model_args.qkv_bias is 1; expected true or false."),
    ("timm_hub", {"model_args.num_classes": -1}, "model_args.num_classes is -1; expected a whole number >= 0."),
    ("timm_eva/eva02_axial", {"model_args.ref_feat_shape": "16"},
     "model_args.ref_feat_shape is '16'; expected a positive int, [height, width] or null."),
    ("timm_eva/eva02_axial", {"model_args.ref_feat_shape": [16]},
     "model_args.ref_feat_shape is [16]; expected a positive int, [height, width] or null."),
    ("timm_eva/eva02_axial", {"model_args.rope_temperature": 0},
     "model_args.rope_temperature is 0; expected a finite number > 0."),
    ("timm_eva/eva02_axial", {"model_args.rope_temperature": -100.0},
     "model_args.rope_temperature is -100.0; expected a finite number > 0."),
    ("timm_eva/eva02_axial", {"model_args.rope_temperature": float("nan")},
     "model_args.rope_temperature is nan; expected a finite number > 0."),
    ("timm_eva/eva02_axial", {"model_args.rope_temperature": [100]},
     "model_args.rope_temperature is [100]; expected a finite number > 0."),
    ("timm_eva/eva02_axial", {"model_args.rope_grid_offset": [1, 1]},
     "model_args.rope_grid_offset is [1, 1]; expected a finite number."),
    ("timm_eva/eva02_axial", {"model_args.rope_type": "mrope"},
     "model_args.rope_type is 'mrope'; expected one of 'cat', 'mixed', 'dinov3'."),
    ("timm_eva/dinov3", {"model_args.swiglu_align_to": "8"},
     "model_args.swiglu_align_to is '8'; expected a whole number >= 0 or null."),
    ("timm_eva/dinov3", {"model_args.img_size": "64"},
     "model_args.img_size is '64'; expected a positive int or [height, width]."),
    ("timm_eva/dinov3", {"pretrained_cfg.input_size": [3, 64]},
     "pretrained_cfg.input_size is [3, 64]; expected [channels, height, width]."),
    ("timm_eva/pe_core", {"model_args.attn_pool_num_heads": 5},
     "model_args.attn_pool_num_heads is 5, which does not divide the width 32 of {folder}/model.safetensors."),
    ("timm_eva/pe_core", {"model_args.attn_pool_mlp_ratio": -4},
     "model_args.attn_pool_mlp_ratio is -4; expected a finite number > 0 or null."),
    ("timm_eva/sbb_registers", {"model_args.num_reg_tokens": -1},
     "model_args.num_reg_tokens is -1; expected a whole number >= 0."),
    ("timm_eva/naver_mixed_ape", {"model_args.rope_rotate_half": True},
     "model_args.rope_rotate_half is True with rope_type 'mixed'; expected false (timm's mixed RoPE rotates "
     "interleaved pairs)."),
    ("transformers_vit", {"num_attention_heads": "three"}, "num_attention_heads is 'three'; expected a positive int."),
    ("transformers_vit", {"patch_size": 0}, "patch_size is 0; expected a positive int or [side, side]."),
    ("transformers_vit", {"image_size": [32]}, "image_size is [32]; expected a positive int or [height, width]."),
    ("transformers_vit", {"layer_norm_eps": "small"}, "layer_norm_eps is 'small'; expected a small positive number."),
    ("transformers_vit", {"hidden_act": ["gelu"]}, "hidden_act is ['gelu']; expected a name."),
    ("transformers_dinov3", {"rope_theta": True}, "rope_theta is True; expected a finite number > 0."),
    ("transformers_dinov3", {"rope_theta": [100]}, "rope_theta is [100]; expected a finite number > 0."),
    ("transformers_dinov3", {"rope_theta": 0}, "rope_theta is 0; expected a finite number > 0."),
    ("transformers_dinov3", {"num_register_tokens": -1}, "num_register_tokens is -1; expected a whole number >= 0."),
    ("transformers_dinov3", {"mlp_bias": False}, "mlp_bias is false; expected true (keras_vit computes DINOv3's "
                                                 "biases on the attention output and both MLP layers)."),
]


@pytest.mark.backend_independent
@pytest.mark.parametrize("source, changes, message", FIELD_REFUSALS,
                         ids=[f"{source.split('/')[-1]}-{'-'.join(changes)}-{list(changes.values())[0]!r}"
                              for source, changes, _ in FIELD_REFUSALS])
def test_a_config_field_of_another_kind_is_refused_in_one_line_naming_it(source, changes, message, tmp_path, capsys):
    folder = tmp_path / "folder"
    shutil.copytree(fixture(source), folder)
    config = json.loads((folder / "config.json").read_text())
    for key, value in changes.items():
        *parents, field = key.split(".")
        inner = config
        for parent in parents:
            inner = inner.setdefault(parent, {})
        inner[field] = value
    (folder / "config.json").write_text(json.dumps(config))
    expected = f"{folder}/config.json: {message.format(folder=folder)}"
    with pytest.raises(CheckpointError) as error:
        keras_vit.from_pretrained(str(folder))
    assert str(error.value) == expected
    assert cli.console_main(["export", str(folder), "--output", str(tmp_path / "out.onnx")]) == 2
    assert capsys.readouterr().err == f"keras-vit: error: {expected}\n"


@pytest.mark.backend_independent
def test_every_config_field_the_readers_read_has_one_kind():
    from keras_vit.checkpoints.config_fields import FIELD_KINDS
    from keras_vit.checkpoints.timm import config as timm_config
    from keras_vit.checkpoints.timm import eva_families as timm_eva_families
    from keras_vit.checkpoints.timm import eva_layout as timm_eva_layout
    from keras_vit.checkpoints.timm import families as timm_families
    from keras_vit.checkpoints.transformers import clip as clip_layout
    from keras_vit.checkpoints.transformers import dinov2 as dinov2_layout
    from keras_vit.checkpoints.transformers import dinov3 as dinov3_layout
    from keras_vit.checkpoints.transformers import vit as transformers_layout

    # Dropout, initialisation and train-time RoPE augmentations are not read; keywords computed only at timm's
    # default are compared with it; id2label only names the classes (other JSON gives no names, not another model).
    unread = {*timm_families.INFERENCE_NEUTRAL_KEYWORDS, *timm_eva_families.TRAINING_ONLY_KEYWORDS,
              *timm_families.DEFAULT_ONLY_KEYWORDS, "id2label"}
    timm = {*timm_config.VISION_TRANSFORMER_ARGUMENTS, *timm_eva_layout.EVA_ARGUMENTS}
    transformers = {key for defaults in (*transformers_layout.CONFIG_DEFAULTS.values(),
                                         *dinov2_layout.CONFIG_DEFAULTS.values(), *clip_layout.CONFIG_DEFAULTS.values(),
                                         dinov3_layout.CONFIG_DEFAULTS) for key in defaults}
    assert sorted((timm | transformers) - unread - set(FIELD_KINDS)) == []


def malformed_header(tmp_path, edit):
    header, body = safetensors_parts(os.path.join(TIMM_FOLDER, "model.safetensors"))
    return write_safetensors(tmp_path / "bad.safetensors", edit(header), body)


def overlap(header):
    names = sorted((n for n in header if n != "__metadata__"), key=lambda n: header[n]["data_offsets"][0])
    first, second = names[0], names[1]
    start = header[first]["data_offsets"][0]
    size = header[second]["data_offsets"][1] - header[second]["data_offsets"][0]
    header[second]["data_offsets"] = [start, start + size]  # inside the first tensor's bytes
    return header


def overlapping_names():
    header, _ = safetensors_parts(os.path.join(TIMM_FOLDER, "model.safetensors"))
    return sorted((n for n in header if n != "__metadata__"), key=lambda n: header[n]["data_offsets"][0])[:2]


# The safetensors package checks the header; keras_vit names the file and passes its reason on, on one line.
@pytest.mark.backend_independent
@pytest.mark.parametrize("edit, message", [
    (lambda header: [header], r"is not a readable .safetensors file: Error while deserializing header: invalid JSON "
                              r"in header: invalid type: sequence"),
    (overlap, "is not a readable .safetensors file: Error while deserializing header: invalid offset for tensor "
              f"`{overlapping_names()[1]}`"),
    (lambda header: {**header, "x": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}},
     r"is not a readable .safetensors file: Error while deserializing header: invalid JSON in header: invalid "
     r"value: integer `-1`"),
], ids=["list", "overlapping", "negative_shape"])
def test_a_malformed_safetensors_header_is_one_clear_error(edit, message, tmp_path, capsys):
    path = malformed_header(tmp_path, edit)
    with pytest.raises(CheckpointError, match=f"^{path}.*{message}"):
        keras_vit.from_pretrained(path, num_heads=3)
    assert cli.console_main(["export", path, "--num-heads", "3"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


@pytest.mark.backend_independent
@pytest.mark.parametrize("dtype, scale, message", [
    ("U16", 2, FLOAT_ONLY.format(name=r"blocks\.0\.norm1\.weight", dtype="uint16")),
    ("F8_E4M3", 4, r"tensor 'blocks\.0\.norm1\.weight' is stored as F8_E4M3, which keras_vit does not read: weights "
                   r"must be F64, F32, F16 or BF16\. Dequantize the file first\. Nothing was loaded\."),
])
def test_a_tensor_of_a_dtype_no_vit_weight_has_is_refused_naming_the_tensor_and_its_dtype(dtype, scale, message,
                                                                                          tmp_path):
    """Unsigned and float8 tensors (once a KeyError of a hand-written dtype table) are named as the file names them
    (not by the Keras weight they would become), with their dtype."""
    header, body = safetensors_parts(os.path.join(TIMM_FOLDER, "model.safetensors"))
    entry = header["blocks.0.norm1.weight"]
    entry["dtype"], entry["shape"] = dtype, [entry["shape"][0] * scale]  # the same bytes, read as `dtype`
    path = write_safetensors(tmp_path / "odd.safetensors", header, body)
    with pytest.raises(CheckpointError, match=f"^{re.escape(path)}: {message}$"):
        keras_vit.ViT(**TIMM, num_heads=3, weights=path)


@pytest.mark.backend_independent
def test_from_pretrained_of_something_that_is_no_path_says_what_it_takes():
    with pytest.raises(CheckpointError, match=r"^from_pretrained takes a path or an hf://org/name handle, got int 3\.$"):
        keras_vit.from_pretrained(3)


@pytest.mark.backend_independent
def test_every_checkpoint_error_is_a_one_line_cli_error(tmp_path, capsys, monkeypatch):
    def broken(*args, **kwargs):
        raise CheckpointError("x.safetensors: something is wrong\nwith a second line")

    import keras_vit.applications.pretrained

    monkeypatch.setattr(keras_vit.applications.pretrained, "from_pretrained", broken)  # what `export` reads a checkpoint with
    assert cli.console_main(["export", "x.safetensors"]) == 2
    assert capsys.readouterr().err == "keras-vit: error: x.safetensors: something is wrong\n"


# --- The CLI takes the overrides its errors suggest ----------------------------------------------------------


def headless_state_dict(tmp_path):
    """A bare timm state dict (no config.json) of width 24: no named variant's, so no head count."""
    shutil.copy(os.path.join(TIMM_FOLDER, "model.safetensors"), tmp_path / "vit.safetensors")
    return str(tmp_path / "vit.safetensors")


@pytest.mark.backend_independent
def test_export_and_convert_take_the_head_count_their_errors_ask_for(tmp_path, capsys):
    path = headless_state_dict(tmp_path)
    assert cli.console_main(["export", path]) == 2
    assert "does not store its head count and its width 24 is no named variant's; pass --num-heads N." in \
           capsys.readouterr().err
    assert cli.console_main(["convert", path, str(tmp_path / "vit.keras")]) == 2
    assert "or pass `num_heads` (--num-heads)" in capsys.readouterr().err
    assert cli.console_main(["convert", path, str(tmp_path / "vit.keras"), "--num-heads", "3"]) == 0
    converted = keras_vit.from_pretrained(str(tmp_path / "vit.keras"))
    assert converted.get_layer("encoderblock_0").num_heads == 3


# --- File modes ---------------------------------------------------------------------------------------------


@pytest.mark.backend_independent
def test_written_checkpoints_follow_the_users_umask(tmp_path):
    model = keras_vit.ViT(image_size=32, **SMALL, classes=10)
    previous = os.umask(0o022)
    try:
        checkpoints.save_timm(model, tmp_path / "a" / "model.safetensors")
        checkpoints.save_npz(model, str(tmp_path / "a.npz"))
        os.umask(0o077)
        checkpoints.save_timm(model, tmp_path / "private" / "model.safetensors")
    finally:
        os.umask(previous)
    assert [os.stat(tmp_path / "a" / name).st_mode & 0o777 for name in ("model.safetensors", "config.json")] == [0o644] * 2
    assert os.stat(tmp_path / "a.npz").st_mode & 0o777 == 0o644
    assert [os.stat(tmp_path / "private" / name).st_mode & 0o777
            for name in ("model.safetensors", "config.json")] == [0o600] * 2
