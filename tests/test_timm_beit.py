"""BEiT and BEiT v2: timm's `Beit` folders and transformers' `BeitModel` folders read exactly, the relative
position bias tables resized as timm resizes them at load, `save_timm` back to timm's layout, every tool, and the
refusals.

The fixtures (`tools/make_beit_fixtures.py`) are tiny models written by timm's `save_for_hf` and transformers'
`save_pretrained`, random values in every tensor: per-block tables with layer scale and mean pooling (BEiT), a
non-square grid (BEiT v2), a shared table beside each block's with an absolute table, class-token pooling and no
q/v biases, and a shared table alone with SwiGLU and its norm. timm's outputs are kept at each model's own size and,
for two, at another size after timm's `checkpoint_filter_fn` (which resizes the tables).
"""

import json
import os
import shutil
from pathlib import Path

import keras
import numpy as np
import pytest
from conftest import fixture, predict
from timm_class_checks import (
    check_every_tool,
    check_hf_handles,
    check_one_step_moves,
    check_onnx,
    check_save_timm_writes_the_file_back,
)

import keras_vit
from keras_vit import CheckpointError, checkpoints
from keras_vit.layers import kernels
from keras_vit.layers.relative_position import (
    RelativePositionBias,
    relative_position_index,
    relative_table_rows,
    resize_relative_position_table,
)

with np.load(fixture("timm_beit_reference.npz")) as _data:
    REFERENCE = dict(_data)
with np.load(fixture("transformers_beit_reference.npz")) as _data:
    TRANSFORMERS = dict(_data)
with open(fixture("timm_beit/cases.json")) as f:
    CASES = json.load(f)
TOLERANCE = 1e-5
# On every backend: the two attention paths (a block's own table; a shared table added to it); the others differ by
# switches every backend computes alike, and run once.
ON_EVERY_BACKEND = ("beit_v1", "shared_abs_token")


def folder(case):
    return fixture(os.path.join("timm_beit", case))


def load(case, **options):
    return keras_vit.from_pretrained(folder(case), classifier_activation=None, **options)


def output_key(case):
    return "logits" if f"{case}/native/logits" in REFERENCE else "pooled"


@pytest.mark.parametrize("case", [case if case in ON_EVERY_BACKEND else
                                  pytest.param(case, marks=pytest.mark.backend_independent) for case in sorted(CASES)])
def test_loads_timm_beit_with_timms_outputs(case):
    model = load(case)
    images = REFERENCE[f"{case}/native/images"]
    np.testing.assert_allclose(predict(model, images), REFERENCE[f"{case}/native/{output_key(case)}"],
                               atol=TOLERANCE, rtol=0)
    tokens = keras_vit.from_pretrained(folder(case), include_top=False)
    np.testing.assert_allclose(predict(tokens, images), REFERENCE[f"{case}/native/tokens"], atol=TOLERANCE, rtol=0)


@pytest.mark.backend_independent
@pytest.mark.parametrize("case", ["beit_v1", "shared_abs_token"])
def test_loads_at_another_size_with_the_tables_timm_resizes(case):
    images = REFERENCE[f"{case}/other/images"]
    model = load(case, image_size=images.shape[1:3])
    np.testing.assert_allclose(predict(model, images), REFERENCE[f"{case}/other/logits"], atol=TOLERANCE, rtol=0)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(model.get_layer("encoderblock_0").relative_position_bias_table),
                               REFERENCE[f"{case}/other/block0_table"], atol=1e-6, rtol=0)


@pytest.mark.backend_independent
def test_table_resize_is_bilinear_over_timms_geometric_offsets():
    """An independent reference: scipy's linear RegularGridInterpolator over the offsets timm's resize places, the
    targets clamped to the outermost (timm's interpolator takes the edge value beyond it)."""
    from scipy.interpolate import RegularGridInterpolator

    def offsets(source, target):  # timm's bisection for the ratio whose geometric series reaches the target
        low, high = 1.01, 1.5
        while high - low > 1e-6:
            ratio = (low + high) / 2
            low, high = (low, ratio) if (1 - ratio ** (source // 2)) / (1 - ratio) > target // 2 else (ratio, high)
        steps = np.cumsum([1.0] + [ratio ** (i + 1) for i in range(source // 2 - 1)])
        return np.concatenate([-steps[::-1], [0.0], steps])

    rng = np.random.default_rng(3)
    for old, new in (((3, 5), (4, 6)), ((4, 4), (7, 3)), ((6, 6), (3, 3))):
        table = rng.normal(size=(relative_table_rows(old), 2)).astype("float32")
        source, target = (2 * old[0] - 1, 2 * old[1] - 1), (2 * new[0] - 1, 2 * new[1] - 1)
        ys, xs = offsets(source[0], target[0]), offsets(source[1], target[1])
        points = np.stack(np.meshgrid(np.clip(np.arange(target[0]) - target[0] // 2, ys[0], ys[-1]),
                                      np.clip(np.arange(target[1]) - target[1] // 2, xs[0], xs[-1]),
                                      indexing="ij"), -1)
        expected = np.stack([RegularGridInterpolator((ys, xs), table[:-3, head].reshape(source))(points).ravel()
                             for head in range(2)], -1)
        resized = resize_relative_position_table(table, old, new)
        np.testing.assert_allclose(resized[:-3], expected, atol=1e-5)
        np.testing.assert_array_equal(resized[-3:], table[-3:])  # the class token's rows, kept


@pytest.mark.backend_independent
def test_relative_position_index_gives_each_pair_its_offset_and_the_class_tokens_three_rows():
    grid = (2, 3)
    index = relative_position_index(grid)
    patches = relative_table_rows(grid) - 3
    cells = [(row, col) for row in range(2) for col in range(3)]
    for q, (qr, qc) in enumerate(cells):
        for k, (kr, kc) in enumerate(cells):
            assert index[1 + q, 1 + k] == (qr - kr + 1) * 5 + (qc - kc + 2)
    assert (index[0, 1:] == patches).all() and (index[1:, 0] == patches + 1).all() and index[0, 0] == patches + 2


@pytest.mark.parametrize("case", ["transformers_beit", pytest.param("transformers_beit_shared",
                                                                   marks=pytest.mark.backend_independent)])
def test_loads_transformers_beit_with_transformers_outputs(case):
    images = TRANSFORMERS[f"{case}/native/images"]
    model = keras_vit.from_pretrained(fixture(case), classifier_activation=None)
    key = "logits" if f"{case}/native/logits" in TRANSFORMERS else "pooled"
    np.testing.assert_allclose(predict(model, images), TRANSFORMERS[f"{case}/native/{key}"], atol=TOLERANCE, rtol=0)
    tokens = keras_vit.from_pretrained(fixture(case), include_top=False)
    np.testing.assert_allclose(predict(tokens, images), TRANSFORMERS[f"{case}/native/tokens"], atol=TOLERANCE,
                               rtol=0)


@pytest.mark.backend_independent
@pytest.mark.parametrize("case", ["transformers_beit", "transformers_beit_shared"])
def test_loads_transformers_beit_at_another_size_as_its_interpolate_pos_encoding(case):
    """transformers resizes the tables bilinearly on every call (`interpolate_pos_encoding=True`), not as timm."""
    images = TRANSFORMERS[f"{case}/other/images"]
    model = keras_vit.from_pretrained(fixture(case), classifier_activation=None, image_size=images.shape[1:3])
    key = "logits" if f"{case}/other/logits" in TRANSFORMERS else "pooled"
    np.testing.assert_allclose(predict(model, images), TRANSFORMERS[f"{case}/other/{key}"], atol=TOLERANCE, rtol=0)


@pytest.mark.backend_independent
def test_evaluation_preprocessing_is_the_configs():
    transform = load("beit_v1").eval_transform
    assert (transform.crop_fraction, transform.interpolation, transform.convention) == (0.9, "bicubic", "timm")
    transform = load("swiglu_scale_mlp").eval_transform
    assert (transform.crop_fraction, transform.interpolation) == (0.95, "bicubic")
    # transformers' BeitImageProcessor: squashed to its size, bicubic, no crop (its do_reduce_labels: labels alone).
    transform = keras_vit.from_pretrained(fixture("transformers_beit")).eval_transform
    assert (transform.resize_size, transform.crop_mode, transform.interpolation) == ((32, 32), "squash", "bicubic")


@pytest.mark.backend_independent
@pytest.mark.parametrize("case, architecture", [("beit_v1", "beit_base_patch16_224"),
                                                ("shared_abs_token", "beit_base_patch16_224"),
                                                ("swiglu_scale_mlp", "beitv2_large_patch16_224")])
def test_save_timm_writes_timms_own_tensors_back(case, architecture, tmp_path):
    check_save_timm_writes_the_file_back(load(case), Path(folder(case)), architecture,
                                         REFERENCE[f"{case}/native/images"], tmp_path)


@pytest.mark.backend_independent
def test_hf_handles_of_the_pretrained_tags_read_from_an_offline_cache(tmp_path):
    pytest.importorskip("huggingface_hub")
    registry = json.loads(open(fixture("timm_registry.json")).read())["architectures"]
    tags = [(name, tag) for name, entry in sorted(registry.items()) if entry["class"] == "Beit"
            for tag in entry["tags"]]
    assert len(tags) == 13
    # The fixture's layer scale where the tag's architecture has another, as timm's model_args say it.
    check_hf_handles(tmp_path, tags, lambda name: folder("beit_v1"), fixture("timm_beit_reference.npz"),
                     lambda name: "beit_v1", lambda name, args: args.update(init_values=0.1))


@pytest.mark.backend_independent
def test_every_tool_works_on_beit(tmp_path):
    check_every_tool(load("shared_abs_token"), REFERENCE["shared_abs_token/native/images"], tmp_path, 1, 0.05)


def test_beit_exports_to_onnx(tmp_path):
    if keras.backend.backend() == "jax":
        pytest.skip("ONNX export runs on the TensorFlow and PyTorch backends")
    pytest.importorskip("onnxruntime")
    check_onnx(load("beit_v1"), REFERENCE["beit_v1/native/images"], tmp_path)


def test_the_learned_bias_gets_the_gradient_of_plain_attention():
    """The written-out gradient of `softmax_attention` (JAX and TensorFlow on CPUs) gives the bias the logits'
    gradient, summed over the batch, as differentiating `softmax(q k / sqrt(d) + bias) v` does."""
    if keras.backend.backend() != "jax":
        pytest.skip("the written-out gradient is checked where JAX differentiates it")
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(0)
    query, key, value = (rng.normal(size=(3, 5, 2, 4)).astype("float32") for _ in range(3))
    bias = rng.normal(size=(1, 2, 5, 5)).astype("float32")
    upstream = rng.normal(size=(3, 5, 2, 4)).astype("float32")

    def plain(q, k, v, b):
        logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / 2.0 + b
        return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(logits, -1), v)

    def written(q, k, v, b):
        return kernels.softmax_attention(q, k, v, bias=b)

    expected = jax.vjp(plain, query, key, value, bias)[1](upstream)
    found = jax.vjp(written, query, key, value, bias)[1](upstream)
    for got, want in zip(found, expected):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5)


@pytest.mark.backend_independent
def test_beit_trains_its_tables_one_step():
    model = keras_vit.ViT(image_size=16, patch_size=8, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=32,
                          classes=3, relative_position_bias=True, shared_relative_position_bias=True,
                          position_embedding=False)
    check_one_step_moves(model, ("relative_position_bias_table",), 2)


FIXED_GRID = ("A relative position bias, SAM's windows or its neck are built for one patch grid (as timm's Beit, "
              "VisionTransformerRelPos and VisionTransformerSAM take one input size at a time): build the model at a "
              "fixed image_size; loading a checkpoint at another size resizes its tables, as timm does.")
TABLE_PREFIX = ("A relative position bias table has three rows for a class token and none for other prefix tokens: it "
                "takes the class token alone, or no prefix token (no register or distillation tokens).")


@pytest.mark.backend_independent
@pytest.mark.parametrize("arguments, message", [
    (dict(image_size=(None, None), relative_position_bias=True),
     FIXED_GRID),
    (dict(naflex=True, shared_relative_position_bias=True),
     FIXED_GRID),
    (dict(image_size=16, relative_position_bias=True, register_tokens=2), TABLE_PREFIX),
    (dict(image_size=16, shared_relative_position_bias="table", classifier="gap", register_tokens=1), TABLE_PREFIX),
    (dict(image_size=16, relative_position_bias=True, differential_attention=True),
     "relative_position_bias is not supported with differential_attention=True (no timm architecture combines "
     "them)."),
    (dict(image_size=16, relative_position_bias="log"),
     "Unknown relative_position_bias 'log'; expected one of ('table', 'mlp', 'mlp_swin') or None."),
    (dict(image_size=16, relative_position_bias="mlp", relative_position_mlp_dim=0),
     "relative_position_mlp_dim must be a whole number >= 1, got 0."),
])
def test_relative_position_biases_refuse_what_they_cannot_be_in_one_line(arguments, message):
    with pytest.raises(ValueError) as error:
        keras_vit.ViT(patch_size=8, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=32, **arguments)
    assert str(error.value) == message


@pytest.mark.backend_independent
def test_refuses_a_beit_file_whose_tables_are_not_its_configs_grid(tmp_path):
    target = tmp_path / "beit"
    shutil.copytree(folder("beit_v1"), target)
    config = json.loads((target / "config.json").read_text())
    config["model_args"]["img_size"] = [40, 32]  # a 5x4 grid: the file's tables are a 4x4 grid's
    config["pretrained_cfg"]["input_size"] = [3, 40, 32]
    (target / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError) as error:
        keras_vit.from_pretrained(str(target))
    assert str(error.value) == (
        f"{target / 'model.safetensors'}: blocks.0.attn.relative_position_bias_table has shape (52, 2), but timm "
        "builds (66, 2) for its 5x4 patch grid and 2 heads (the config's img_size and num_heads). Nothing was loaded.")


@pytest.mark.backend_independent
def test_save_timm_of_a_beit_needs_a_beit_name(tmp_path):
    model = load("beit_v1")
    with pytest.raises(CheckpointError) as error:
        checkpoints.save_timm(model, str(tmp_path / "model.safetensors"))
    assert str(error.value) == (
        f"{model.name} has a relative position bias, as timm's Beit and VisionTransformerRelPos classes: pass "
        "architecture= the name it is (beit_base_patch16_224, beitv2_base_patch16_224, vit_relpos_base_patch16_224, "
        "...).")
    assert not os.listdir(tmp_path)


@pytest.mark.backend_independent
@pytest.mark.parametrize("change, message", [
    (dict(architecture="vit_base_patch16_224"),
     "{path} has 10 tensors that are not in timm's VisionTransformer layout: ['blocks.0.attn.q_bias', "
     "'blocks.0.attn.relative_position_bias_table', 'blocks.0.attn.v_bias', 'blocks.0.gamma_1', 'blocks.0.gamma_2', "
     "'...']; keras_vit reads timm ViT state dicts (blocks.N.attn.qkv.weight, ...)."),
    (dict(model_args={"use_shared_rel_pos_bias": True}),
     "{path} lacks 1 tensors of the model its config.json describes (architecture: \"beit_base_patch16_224\", "
     "depth: 2): ['rel_pos_bias.relative_position_bias_table']."),
])
def test_a_beit_file_whose_config_says_another_model_is_refused_by_its_tensors(change, message, tmp_path):
    target = tmp_path / "beit"
    shutil.copytree(folder("beit_v1"), target)
    config = json.loads((target / "config.json").read_text())
    config["architecture"] = change.get("architecture", config["architecture"])
    config["model_args"].update(change.get("model_args", {}))
    (target / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError) as error:
        keras_vit.from_pretrained(str(target))
    assert str(error.value) == message.format(path=target / "model.safetensors")


@pytest.mark.backend_independent
def test_shared_table_layer_gives_its_bias_for_every_pair():
    layer = RelativePositionBias((2, 2), num_heads=3)
    tokens = np.zeros((1, 5, 8), "float32")
    layer.build(tokens.shape)
    table = np.random.default_rng(0).normal(size=(relative_table_rows((2, 2)), 3)).astype("float32")
    layer.relative_position_bias_table.assign(table)
    bias = keras.ops.convert_to_numpy(layer(tokens))
    index = relative_position_index((2, 2))
    np.testing.assert_array_equal(bias[0], table[index].transpose(2, 0, 1))


@pytest.mark.backend_independent
def test_masked_patch_pretraining_takes_a_beit_without_a_position_table():
    """BEiT's own pretraining is masked image modelling: the pretrainer takes its grid from the model, not a table."""
    encoder = keras_vit.ViT(image_size=16, patch_size=4, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=32,
                            include_top=False, relative_position_bias=True, position_embedding=False)
    pretrainer = keras_vit.MaskedPatchPretrainer(encoder, seed=0)
    assert pretrainer.grid_size == (4, 4)
    table = encoder.get_layer("encoderblock_0").relative_position_bias_table
    before = keras.ops.convert_to_numpy(table).copy()
    pretrainer.compile(optimizer=keras.optimizers.SGD(1.0))
    pretrainer.fit(np.random.default_rng(0).uniform(-1, 1, (4, 16, 16, 3)).astype("float32"), epochs=1, verbose=0)
    assert np.abs(keras.ops.convert_to_numpy(table) - before).max() > 0


@pytest.mark.backend_independent
def test_a_null_model_arg_leaves_the_names_own_value_as_timm_create_model_does(tmp_path):
    """timm's create_model drops keywords that are None: `init_values: null` keeps beit_base's own 0.1 (the file's
    gammas), where reading it as None would build no layer scale."""
    target = tmp_path / "beit"
    shutil.copytree(folder("beit_v1"), target)
    config = json.loads((target / "config.json").read_text())
    config["model_args"].update(init_values=None, use_rel_pos_bias=None)
    (target / "config.json").write_text(json.dumps(config))
    model = keras_vit.from_pretrained(str(target), classifier_activation=None)
    images = REFERENCE["beit_v1/native/images"]
    np.testing.assert_allclose(predict(model, images), REFERENCE["beit_v1/native/logits"], atol=TOLERANCE, rtol=0)
