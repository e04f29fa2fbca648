"""Checks the tests of timm's other ViT classes share (Beit, VisionTransformerRelPos, NaFlexVit): an offline Hub cache
of timm folders, every tool on one loaded model, ONNX, one training step that moves the biases' weights, and the
config.json save_timm writes as timm's constructor takes it."""

import json
import shutil
import warnings

import keras
import numpy as np
from conftest import fixture, predict

import keras_vit
from keras_vit.tools import analysis

TOLERANCE = 1e-5


def write_timm_hub_cache(cache, tags, folder_of, edit_args=None):
    """A Hugging Face cache holding `hf://timm/<name>.<tag>` for each `(name, tag)` of `tags`: the fixture folder
    `folder_of(name)` under that name and tag, its `model_args` changed by `edit_args(name, model_args)`."""
    for name, tag in tags:
        repo = cache / f"models--timm--{name}.{tag}"
        (repo / "refs").mkdir(parents=True)
        (repo / "refs" / "main").write_text("0" * 40)
        snapshot = repo / "snapshots" / ("0" * 40)
        shutil.copytree(folder_of(name), snapshot)
        config = json.loads((snapshot / "config.json").read_text())
        if edit_args is not None:
            edit_args(name, config["model_args"])
        config["architecture"], config["pretrained_cfg"]["tag"] = name, tag
        (snapshot / "config.json").write_text(json.dumps(config))


def check_every_tool(model, images, tmp_path, prefix_tokens, int8_share, mixed_heads=False, windowed=False):
    """`.keras` save and reload, its `from_pretrained` rebuild, attention weights (each row summing to one, unless
    `mixed_heads`: CaiT's talking heads mix the heads' weights after the softmax), a block's feature map, LoRA (the
    relative positions frozen, the outputs unchanged) and int8 (within `int8_share` of the outputs' scale). With
    `windowed` (SAM's first block), the maps of the windowed blocks, laid on the grid, lose the weight on the
    padding."""
    expected = predict(model, images)
    model.save(str(tmp_path / "model.keras"))
    np.testing.assert_array_equal(predict(keras.saving.load_model(str(tmp_path / "model.keras")), images), expected)
    rebuilt = keras_vit.from_pretrained(str(tmp_path / "model.keras"), classifier_activation=None)
    np.testing.assert_allclose(predict(rebuilt, images), expected, atol=TOLERANCE, rtol=0)
    weights = analysis.attention_weights(model, images)
    tokens = model.get_layer("encoderblock_0").output.shape[1]
    assert [w.shape[-2:] for w in weights] == [(tokens, tokens)] * len(weights)  # windowed blocks' on the grid
    if not (mixed_heads or windowed):  # a windowed block's padding takes some of each row's weight
        np.testing.assert_allclose(weights[0].sum(-1), 1.0, atol=1e-5)
    assert analysis.attention_rollout(weights).shape == (len(images), tokens, tokens)
    features = keras_vit.feature_extractor(model, (0,))
    block = keras.Model(model.input, model.get_layer("encoderblock_0").output)
    grid = features.output_shape[1:3]
    np.testing.assert_array_equal(predict(features, images),
                                  predict(block, images)[:, prefix_tokens:].reshape(len(images), *grid, -1))
    keras_vit.enable_lora(model, rank=2)
    assert not [v.path for v in model.trainable_weights if "relative_position" in v.path or "talking" in v.path
                or "rel_pos" in v.path]
    np.testing.assert_allclose(predict(model, images), expected, atol=TOLERANCE, rtol=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = keras_vit.merge_lora(model)
        model.quantize("int8")
    assert 0 < np.abs(predict(model, images) - expected).max() < int8_share * np.abs(expected).max()


def check_onnx(model, images, tmp_path):
    """The model exported to ONNX gives its outputs in onnxruntime."""
    import onnxruntime

    path = str(tmp_path / "model.onnx")
    model.export(path, format="onnx", verbose=False)
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    (feed,) = session.get_inputs()
    np.testing.assert_allclose(session.run(None, {feed.name: images})[0], predict(model, images), atol=1e-4)


def check_one_step_moves(model, names, count):
    """One SGD step of `model` (3 classes, 16 px), every weight random, changes each of its `count` trainable weights
    whose path holds one of `names`."""
    weights = [v for v in model.trainable_weights if any(name in v.path for name in names)]
    assert len(weights) == count
    rng = np.random.default_rng(0)
    for variable in model.weights:  # zeros (a class token, a head) would hold some gradients at zero
        variable.assign(rng.normal(0, 0.2, variable.shape).astype("float32"))
    before = [keras.ops.convert_to_numpy(v).copy() for v in weights]
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss="sparse_categorical_crossentropy")
    model.fit(np.random.default_rng(1).uniform(-1, 1, (4, 16, 16, 3)).astype("float32"), np.array([0, 1, 2, 0]),
              epochs=1, verbose=0)
    assert all(np.abs(keras.ops.convert_to_numpy(v) - b).max() > 0 for v, b in zip(weights, before))


def _json_kind(value):
    if value is None or isinstance(value, (bool, str, list)):
        return {type(None): "null", bool: "bool", str: "str", list: "list"}[type(value)]
    return "int" if isinstance(value, int) else "number" if isinstance(value, float) else "object"


def check_timm_takes_the_config(config):
    """Each `model_args` keyword of a `config.json` is one the constructor of timm's class of its `architecture`
    takes, of a JSON kind its annotation admits (`keyword_kinds`, recorded by tools/make_timm_registry.py from timm
    itself): what `timm.create_model("local-dir:...")` passes it. An int is a number; `img_size` and `patch_size`
    may be `[height, width]` where the annotation says int, as every timm class passes them through `to_2tuple`."""
    registry = json.loads(open(fixture("timm_registry.json")).read())
    timm_class = registry["architectures"][config["architecture"]]["class"]
    kinds = registry["keyword_kinds"][timm_class] or registry["keyword_kinds"]["VisionTransformer"]  # Distilled: *args
    for key, value in config["model_args"].items():
        assert key in kinds, f"timm's {timm_class} takes no keyword {key!r}"
        allowed = set(kinds[key]) | ({"number"} if "number" in kinds[key] else set())
        kind = _json_kind(value)
        if key in ("img_size", "patch_size") and kind == "list":
            allowed.add("list")
        if kind == "int" and "number" in allowed:
            allowed.add("int")
        assert "any" in allowed or kind in allowed, (
            f"model_args.{key} is {value!r}, a JSON {kind}, but timm's {timm_class} takes {sorted(kinds[key])}")


def check_save_timm_writes_the_file_back(model, folder, architecture, images, tmp_path):
    """`save_timm(model, architecture=)` writes exactly the tensors of the timm file in `folder` it was loaded from
    (names and values), and the folder it writes loads back with the same outputs."""
    from keras_vit import checkpoints
    from keras_vit.checkpoints.state_dict_files import read_state_dict

    path = tmp_path / "saved" / "model.safetensors"
    path.parent.mkdir()
    checkpoints.save_timm(model, str(path), architecture=architecture)
    written, original = read_state_dict(str(path)), read_state_dict(str(folder / "model.safetensors"))
    assert sorted(written) == sorted(original)
    for name, value in original.items():
        np.testing.assert_array_equal(written[name], value, err_msg=name)
    again = keras_vit.from_pretrained(str(tmp_path / "saved"), classifier_activation=None)
    np.testing.assert_array_equal(predict(again, images), predict(model, images))
    check_timm_takes_the_config(json.loads((tmp_path / "saved" / "config.json").read_text()))


def check_hf_handles(tmp_path, tags, folder_of, reference, case_of, edit_args=None):
    """Each `(name, tag)` of `tags` as an `hf://timm/<name>.<tag>` handle, from an offline cache of the fixture
    folder `folder_of(name)`, gives the outputs `reference` (an `.npz` path) keeps for `case_of(name)`, to 1e-5 of their
    scale (of 1 where they are smaller)."""
    from test_pretrained import run_offline

    write_timm_hub_cache(tmp_path / "hub", tags, folder_of, edit_args)
    code = (
        "import numpy as np, keras, keras_vit\n"
        f"data = np.load({str(reference)!r})\n"
        f"for (name, tag), case in {[(tag, case_of(tag[0])) for tag in tags]!r}:\n"
        "    model = keras_vit.from_pretrained(f'hf://timm/{name}.{tag}', classifier_activation=None)\n"
        "    key = next(key for key in ('logits', 'pooled', 'soft_tokens') if f'{case}/native/{key}' in data.files)\n"
        "    expected = data[f'{case}/native/{key}']\n"
        "    gap = np.abs(keras.ops.convert_to_numpy(model(data[f'{case}/native/images'])) - expected).max()\n"
        "    print('GAP', name, float(gap / max(1.0, np.abs(expected).max())))\n"
    )
    done = run_offline(tmp_path / "hub", code)
    assert done.returncode == 0, done.stderr[-3000:]
    gaps = [float(line.split()[-1]) for line in done.stdout.splitlines() if line.startswith("GAP")]
    assert len(gaps) == len(tags) and max(gaps) < TOLERANCE, done.stdout
