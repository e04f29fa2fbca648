"""RoPE ViTs from timm's `Eva` class and transformers' DINOv3: loaded with the references' outputs, with every tool.

The fixtures are tiny models written by timm's `save_for_hf` and
transformers' `save_pretrained` (`tools/make_eva_fixtures.py`), with the
references' logits at the model's own size and at a second one (RoPE
recomputed on the new grid), so the coordinates are tested, not one grid.
"""

import json
import os
import re

import keras
import numpy as np
import pytest
from conftest import fixture
from timm_class_checks import check_timm_takes_the_config

import keras_vit
from keras_vit import CheckpointError, checkpoints
from keras_vit.checkpoints.state_dict_files import read_state_dict
from keras_vit.checkpoints.timm.eva_families import EVA_ARCHITECTURES, eva_switches_to_architecture
from keras_vit.layers.rope import RotaryPositions, grid_coordinates, rope_frequencies

REFERENCE = np.load(fixture("timm_eva_reference.npz"))
with open(fixture("timm_eva/cases.json")) as f:
    CASES = json.load(f)
TOLERANCE = 2e-5


# Cases of one config setting each, read as the reference reads it (the RoPE forms and blocks are the other cases'):
# their outputs depend on the reading, not on the backend, so one pass runs them.
SETTING_CASES = {"naver_mixed_offset", "post_norm_init_values", "init_values_zero", "patch_size_pair",
                 "transformers_dinov3_no_registers"}


def one_pass_for_settings(cases):
    return [pytest.param(case, marks=pytest.mark.backend_independent) if case in SETTING_CASES else case
            for case in cases]


def case_folder(case):
    return fixture(f"timm_eva/{case}")


def load(case, **options):
    folder = fixture(case) if case.startswith("transformers_") else case_folder(case)
    return keras_vit.from_pretrained(folder, classifier_activation=None, **options)


@pytest.mark.parametrize("case", one_pass_for_settings(sorted(CASES)))
def test_loads_timm_eva_with_timms_logits_at_two_sizes(case):
    # RoPE is computed by each backend's ops: every backend runs this.
    for key in ("native", "other"):
        images = REFERENCE[f"{case}/{key}/images"]
        model = load(case, image_size=images.shape[1:3])
        np.testing.assert_allclose(model.predict(images, verbose=0), REFERENCE[f"{case}/{key}/logits"],
                                   atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("case", one_pass_for_settings(["transformers_dinov3", "transformers_dinov3_no_registers"]))
def test_loads_transformers_dinov3_with_its_pooled_output_at_two_sizes(case):
    for key in ("native", "other"):
        images = REFERENCE[f"{case}/{key}/images"]
        model = load(case, image_size=images.shape[1:3])
        np.testing.assert_allclose(model.predict(images, verbose=0), REFERENCE[f"{case}/{key}/pooled"],
                                   atol=TOLERANCE, rtol=0)


@pytest.mark.backend_independent
def test_dynamic_resolution_rope_model_gives_timms_logits_at_any_size():
    model = load("dinov3", image_size=(None, None))
    for key in ("native", "other"):
        images = REFERENCE[f"dinov3/{key}/images"]
        np.testing.assert_allclose(model.predict(images, verbose=0), REFERENCE[f"dinov3/{key}/logits"],
                                   atol=TOLERANCE, rtol=0)


@pytest.mark.backend_independent
def test_rope_coordinates_and_frequencies_are_timms_forms():
    # timm's _build_grid: 'xy' swaps the channels, ref_feat_shape rescales, DINOv3 centres pixels in [-1, 1].
    ij = np.asarray(grid_coordinates(2, 3))
    assert ij.tolist() == [[0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [1, 2]]
    xy = np.asarray(grid_coordinates(2, 3, offset=1.0, indexing="xy"))
    assert xy[:, 0].tolist() == [1, 2, 3, 1, 2, 3] and xy[:, 1].tolist() == [1, 1, 1, 2, 2, 2]
    rescaled = np.asarray(grid_coordinates(2, 4, reference_grid=(16, 16)))
    np.testing.assert_allclose(rescaled[:4, 1], [0, 4, 8, 12])
    centred = np.asarray(grid_coordinates(2, 2, form="dinov3"))
    np.testing.assert_allclose(centred, [[-0.5, -0.5], [-0.5, 0.5], [0.5, -0.5], [0.5, 0.5]])
    np.testing.assert_allclose(rope_frequencies("axial", 16, 10000.0), 10000.0 ** -(np.arange(4) / 4), rtol=1e-6)
    np.testing.assert_allclose(rope_frequencies("dinov3", 16, 100.0), 2 * np.pi / 100.0 ** (np.arange(4) * 4 / 16),
                               rtol=1e-6)
    positions = np.asarray(RotaryPositions((1, 2), num_prefix_tokens=2)(np.zeros((1, 4, 8))))
    assert positions.tolist() == [[0, 0], [0, 0], [0, 0], [0, 1]]  # prefix tokens are not rotated


@pytest.mark.backend_independent
def test_rope_model_tools_keep_its_outputs(tmp_path):
    images = REFERENCE["naver_mixed_ape/native/images"]
    expected = REFERENCE["naver_mixed_ape/native/logits"]
    model = load("naver_mixed_ape")
    model.save(tmp_path / "m.keras")
    again = keras.saving.load_model(tmp_path / "m.keras")
    np.testing.assert_allclose(again.predict(images, verbose=0), expected, atol=TOLERANCE, rtol=0)
    features = keras_vit.tools.features.feature_extractor(model, (0, 1))(images)
    assert [tuple(f.shape) for f in features] == [(2, 3, 3, 32)] * 2
    attentions = keras_vit.tools.analysis.attention_weights(model, images)
    assert [a.shape for a in attentions] == [(2, 2, 10, 10)] * 2
    np.testing.assert_allclose(attentions[0].sum(-1), 1.0, atol=1e-5)
    adapted = keras_vit.enable_lora(model, rank=2)
    np.testing.assert_allclose(keras_vit.merge_lora(adapted).predict(images, verbose=0), expected, atol=TOLERANCE)
    quantized = load("naver_mixed_ape")
    quantized.quantize("int8")
    assert np.abs(quantized.predict(images, verbose=0) - expected).max() < 0.1


@pytest.mark.backend_independent
@pytest.mark.parametrize("case", ["eva02_axial", "eva02_separate_qkv", "naver_mixed_ape", "dinov3", "pe_core",
                                  "sapiens2"])
def test_save_timm_writes_the_file_timm_wrote(case, tmp_path):
    # The same names and values as timm's own save_for_hf file: timm's strict load takes it.
    model = load(case)
    with open(os.path.join(case_folder(case), "config.json")) as f:
        name = json.load(f)["architecture"]
    path = checkpoints.save_timm(model, str(tmp_path / "w.safetensors"), architecture=name)
    check_timm_takes_the_config(json.loads((tmp_path / "config.json").read_text()))
    written, original = read_state_dict(path), read_state_dict(os.path.join(case_folder(case), "model.safetensors"))
    assert sorted(written) == sorted(original)
    for tensor in original:
        np.testing.assert_allclose(written[tensor], original[tensor], atol=1e-7, rtol=0, err_msg=tensor)
    arguments = checkpoints.timm_arguments(model, name)
    sizes = ("embed_dim", "depth", "num_heads", "num_kv_heads")
    given = CASES[case]["model_args"]
    assert {key: arguments[key] for key in sizes if key in arguments} == {key: given[key] for key in sizes
                                                                          if key in given}


@pytest.mark.backend_independent
def test_an_attention_pooled_eva_without_prefix_tokens_rebuilds_as_its_own_name():
    # PE-core gigantic has no class token; its table claimed the attention pool took prefix tokens, which no
    # built model can have, so save_timm refused it (found by tools/timm_family_coverage.py's round trip).
    name = "vit_pe_core_gigantic_patch14_448"
    architecture = keras_vit.Architecture(**eva_switches_to_architecture(EVA_ARCHITECTURES[name].switches))
    model = keras_vit.ViT(image_size=28, patch_size=14, hidden_size=64, num_layers=1, num_heads=16, mlp_dim=373,
                          include_top=False, pooling="map", architecture=architecture)
    arguments = checkpoints.timm_arguments(model, name)
    assert (arguments["embed_dim"], arguments["num_heads"], arguments["num_classes"]) == (64, 16, 0)


@pytest.mark.backend_independent
def test_save_timm_refuses_what_the_named_eva_does_not_rebuild(tmp_path):
    with pytest.raises(CheckpointError, match="pass architecture= the Eva name it is"):
        checkpoints.save_timm(load("dinov3"), str(tmp_path / "w.safetensors"))
    with pytest.raises(CheckpointError, match=r"timm's 'eva02_tiny_patch14_224' builds .*rope='axial'"):
        checkpoints.save_timm(load("dinov3"), str(tmp_path / "w.safetensors"), architecture="eva02_tiny_patch14_224")
    # Eva's blocks always have output biases: timm's strict load would miss attn.proj.bias and mlp.fc*.bias.
    name = "vit_small_patch16_dinov3"
    switches = eva_switches_to_architecture(EVA_ARCHITECTURES[name].switches)
    model = keras_vit.ViT(image_size=32, patch_size=16, hidden_size=32, num_layers=1, num_heads=2, mlp_dim=128,
                          classes=4, architecture=keras_vit.Architecture(**dict(switches, projection_bias=False)))
    path = str(tmp_path / "w.safetensors")
    with pytest.raises(CheckpointError, match=f"^{re.escape(path)}: timm's 'vit_small_patch16_dinov3' builds "
                                              r"projection_bias=True where vit has projection_bias=False; pass "
                                              r"architecture= a timm name that builds the same model. Nothing was "
                                              r"written.$"):
        checkpoints.save_timm(model, path, architecture=name)
    assert not os.listdir(tmp_path)


def copy_case(case, tmp_path, change_tensors=None, change_config=None):
    import shutil

    from safetensors.numpy import save_file

    folder = tmp_path / f"{case}_{len(os.listdir(tmp_path))}"
    shutil.copytree(case_folder(case), folder)
    if change_tensors:
        tensors = change_tensors(read_state_dict(str(folder / "model.safetensors")))
        save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    if change_config:
        with open(folder / "config.json") as f:
            config = json.load(f)
        change_config(config)
        with open(folder / "config.json", "w") as f:
            json.dump(config, f)
    return str(folder)


@pytest.mark.backend_independent
def test_rope_files_that_disagree_with_their_config_are_refused(tmp_path):
    without_freqs = copy_case("naver_mixed_ape", tmp_path, lambda t: {k: v for k, v in t.items() if k != "rope.freqs"})
    with pytest.raises(CheckpointError, match=r"lacks rope.freqs, but the mixed-RoPE model its config.json describes "
                                              r"has learned frequencies of shape \(2, 2, 2, 8\)"):
        keras_vit.from_pretrained(without_freqs)
    renamed = copy_case("dinov3", tmp_path, change_config=lambda c: c.update(architecture="eva02_tiny_patch14_224"))
    with pytest.raises(CheckpointError, match=r"patch_embed.proj.weight gives patch_size 16, but timm's "
                                              r"'eva02_tiny_patch14_224' has 14 .*Nothing was loaded"):
        keras_vit.from_pretrained(renamed)
    no_bias = copy_case("eva02_axial", tmp_path, lambda t: {k: v for k, v in t.items() if not k.endswith("v_bias")})
    with pytest.raises(CheckpointError, match=r"holds .*blocks.0.attn.q_bias.* but not .*blocks.0.attn.v_bias"):
        keras_vit.from_pretrained(no_bias)


def keys_and_values_of(block, heads):
    """A tensor change: block `block`'s k_proj and v_proj as wide as `heads` key/value heads (of width 8)."""
    def change(tensors):
        for name in [f"blocks.{block}.attn.{part}.{kind}" for part in ("k_proj", "v_proj") for kind in ("weight", "bias")]:
            tensors[name] = np.ascontiguousarray(np.concatenate([tensors[name]] * heads)[:8 * heads])
        return tensors
    return change


def key_narrower_value_wider(block):
    """A tensor change: block `block`'s k_proj one head (of width 8) narrower and v_proj one head wider, so that
    together they are as wide as before (a check of their sum alone lets them through)."""
    def change(tensors):
        for kind in ("weight", "bias"):
            key, value = (f"blocks.{block}.attn.{part}.{kind}" for part in ("k_proj", "v_proj"))
            extra = np.random.default_rng(0).normal(0, 0.2, (8, *tensors[value].shape[1:])).astype("float32")
            tensors[key] = np.ascontiguousarray(tensors[key][:-8])
            tensors[value] = np.concatenate([tensors[value], extra])
        return tensors
    return change


# The sapiens2 fixture (4 heads of width 8, key/value heads (4, 2, 4)) changed -> the one line that refuses it.
GROUPED_QUERY_REFUSALS = {
    "key_narrower_value_wider": (key_narrower_value_wider(1), None,
                                 "{file}: blocks.1.attn.k_proj.weight gives 1 key/value heads, but "
                                 "model_args.num_kv_heads has 2 for block 1; the name, config and tensors disagree: "
                                 "set model_args.num_kv_heads to the file's, one per block. Nothing was loaded."),
    "config_not_dividing": (None, lambda config: config["model_args"].update(num_kv_heads=[4, 3, 4]),
                            "{config}: model_args.num_kv_heads is 3 for block 1, which does not divide num_heads 4; "
                            "set it to a divisor of 4 (each key/value head serves num_heads / num_kv_heads query "
                            "heads). Nothing was loaded."),
    "tensors_not_dividing": (keys_and_values_of(1, 3), None,
                             "{file}: blocks.1.attn.k_proj.weight gives 3 key/value heads of width 8, which do not "
                             "divide num_heads 4: no timm Eva of these sizes holds it (check model_args.num_heads and "
                             "embed_dim against the file). Nothing was loaded."),
    "tensors_not_the_configs": (keys_and_values_of(1, 1), None,
                                "{file}: blocks.1.attn.k_proj.weight gives 1 key/value heads, but "
                                "model_args.num_kv_heads has 2 for block 1; the name, config and tensors disagree: "
                                "set model_args.num_kv_heads to the file's, one per block. Nothing was loaded."),
    "the_names_for_another_depth": (None, lambda config: config["model_args"].pop("num_kv_heads"),
                                    "{config}: timm's 'vit_base_patch16_sapiens2' num_kv_heads is for 12 blocks, but "
                                    "depth is 3: timm takes one count per block (or one number for all); list them in "
                                    "model_args.num_kv_heads. Nothing was loaded."),
}


@pytest.mark.backend_independent
@pytest.mark.parametrize("case", sorted(GROUPED_QUERY_REFUSALS))
def test_grouped_query_attention_that_does_not_divide_the_heads_is_refused(case, tmp_path):
    change_tensors, change_config, message = GROUPED_QUERY_REFUSALS[case]
    folder = copy_case("sapiens2", tmp_path, change_tensors, change_config)
    with pytest.raises(CheckpointError) as error:
        keras_vit.from_pretrained(folder)
    assert str(error.value) == message.format(config=os.path.join(folder, "config.json"),
                                              file=os.path.join(folder, "model.safetensors"))


@pytest.mark.backend_independent
def test_a_null_among_num_kv_heads_is_that_blocks_full_attention_as_in_timm(tmp_path):
    # timm's AttentionRope takes `num_kv_heads or num_heads`: [null, 2, null] builds (4, 2, 4), the fixture's own.
    folder = copy_case("sapiens2", tmp_path, change_config=lambda c: c["model_args"].update(num_kv_heads=[None, 2, None]))
    images = REFERENCE["sapiens2/native/images"]
    model = keras_vit.from_pretrained(folder, classifier_activation=None, image_size=images.shape[1:3])
    assert [layer.num_kv_heads for layer in model.layers if layer.name.startswith("encoderblock_")] == [4, 2, 4]
    np.testing.assert_allclose(model.predict(images, verbose=0), REFERENCE["sapiens2/native/logits"], atol=TOLERANCE,
                               rtol=0)


@pytest.mark.backend_independent
@pytest.mark.parametrize("case", ["timm_eva/eva02_axial", "timm_family/deit"])
def test_no_pooling_is_refused_as_timm_then_gives_every_tokens_logits(case, tmp_path):
    # timm's global_pool '' maps every token through the head, (batch, tokens, classes); keras_vit's models pool.
    import shutil

    folder = tmp_path / "unpooled"
    shutil.copytree(fixture(case), folder)
    config = json.loads((folder / "config.json").read_text())
    config["model_args"]["global_pool"] = ""
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=f"^{re.escape(str(folder / 'config.json'))}: global_pool is ''; timm "
                                              r"then gives an output for every token, unpooled, which keras_vit's "
                                              r"models do not: set it to 'token', 'avg' or 'map' \(keras_vit.tools.features."
                                              r"feature_extractor gives the tokens\).$"):
        keras_vit.from_pretrained(str(folder))


@pytest.mark.backend_independent
def test_a_transformers_dinov3_gated_mlp_other_than_silu_is_refused(tmp_path):
    import shutil

    folder = tmp_path / "dinov3"
    shutil.copytree(fixture("transformers_dinov3"), folder)
    with open(folder / "config.json") as f:
        config = json.load(f)
    config["hidden_act"] = "gelu"
    with open(folder / "config.json", "w") as f:
        json.dump(config, f)
    with pytest.raises(CheckpointError, match="use_gated_mlp with hidden_act 'gelu'"):
        keras_vit.from_pretrained(str(folder))


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="PyTorch builds layers on its meta device")
@pytest.mark.parametrize("case, rotate_half", [("eva02_axial", False), ("sapiens2", True)])
def test_rope_models_build_without_running_a_real_forward_pass(monkeypatch, case, rotate_half):
    # Keras' torch backend infers shapes on the meta device; an op it cannot run there made Keras fall back to
    # running every block on real batch-83 tensors while building: minutes for a full-size EVA-02 (interleaved
    # RoPE), gigabytes for a Sapiens2 at 1024x768 (keras.ops.repeat of grouped keys and values).
    from keras_vit.layers import rope

    devices = []
    rotate = rope.rotate_queries_and_keys

    def recording(query, *args, **kwargs):
        devices.append(query.device.type)
        return rotate(query, *args, **kwargs)

    monkeypatch.setattr(rope, "rotate_queries_and_keys", recording)
    model = load(case)
    assert model.architecture.rope_rotate_half is rotate_half and devices
    assert set(devices) == {"meta"}, devices
