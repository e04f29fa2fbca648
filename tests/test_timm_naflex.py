"""timm's NaFlexVit class: its folders read exactly (tokens and pooled outputs on mixed-aspect NaFlex batches, and
outputs on plain image batches), its architecture table, the refusals, `hf://timm/<arch>.<tag>` handles and
`save_timm` back to NaFlexVit's layout.

The fixtures (`tools/make_naflex_timm_fixtures.py`) are tiny NaFlexVit models written by timm's `save_for_hf`,
one per configuration kind of the 14 architectures, timm's outputs on one batch from timm's own NaFlex eval
pipeline (three aspect ratios, tall, wide, square, at two patch budgets, padded together), and timm's outputs on a
plain image batch (its standard mode).
"""

import json
import os
import shutil

import numpy as np
import pytest
from conftest import fixture, predict
from timm_class_checks import check_timm_takes_the_config, write_timm_hub_cache

import keras_vit
from keras_vit import CheckpointError, checkpoints
from keras_vit.checkpoints.timm.naflex import NAFLEX_ARCHITECTURES
from keras_vit.model.description import is_naflex

KINDS = ("siglip", "gap_registers", "par_gap", "map_registers", "so150m2", "radio_v3", "radio_v4", "parfac",
         "factorized_nonsquare")
with np.load(fixture("timm_naflex_reference.npz")) as _data:
    REFERENCE = dict(_data)
BATCH = {key: REFERENCE[key] for key in ("patches", "patch_grid", "patch_mask")}


def folder(kind):
    return fixture(os.path.join("timm_naflex", kind))


def tokens_model(model):
    """The model's token sequence after its final norm (timm's forward_features)."""
    import keras

    names = [layer.name for layer in model.layers]
    last = "encoder_norm" if "encoder_norm" in names else [name for name in names
                                                           if name.startswith("encoderblock_")][-1]
    return keras.Model(model.inputs, model.get_layer(last).output)


def assert_valid_tokens_equal(tokens, reference, prefix):
    mask = np.concatenate([np.ones((len(BATCH["patch_mask"]), prefix), bool), BATCH["patch_mask"]], axis=1)
    assert tokens.shape == reference.shape
    np.testing.assert_allclose(tokens[mask], reference[mask], atol=1e-5, rtol=0)


# On every backend: the kinds whose position resizes differ most (bilinear anti-aliased with MAP; bicubic
# anti-aliased with registers and GAP; RADIO's 128-row-style table gathered by taps, aligned corners, aspect kept;
# factorized tables, each resized on its own axis). The others differ by switches every backend computes alike, and
# run once.
ON_EVERY_BACKEND = ("siglip", "gap_registers", "radio_v3", "factorized_nonsquare")


@pytest.mark.parametrize("kind", [kind if kind in ON_EVERY_BACKEND else
                                  pytest.param(kind, marks=pytest.mark.backend_independent) for kind in KINDS])
def test_loads_timm_naflexvit_with_exact_outputs_at_three_aspect_ratios_and_two_budgets(kind):
    model = keras_vit.from_pretrained(folder(kind), classifier_activation=None)
    assert is_naflex(model)
    np.testing.assert_allclose(predict(model, BATCH), REFERENCE[f"{kind}/output"], atol=1e-5, rtol=0)
    prefix = model.architecture.num_prefix_tokens
    assert_valid_tokens_equal(predict(tokens_model(model), BATCH), REFERENCE[f"{kind}/tokens"], prefix)


# The image batch is cut by the same keras.ops on every backend; the entry points that differ per backend (`call`
# from JAX's trainer, `__call__` from the others) are tested on every backend in tests/test_naflex.py.
# The kinds whose table resize differs (timm's fixture script stores every kind's): bilinear and bicubic anti-aliased,
# aspect-preserving, RADIO's aligned corners, and the table's own grid.
@pytest.mark.backend_independent
@pytest.mark.parametrize("kind", ("siglip", "gap_registers", "par_gap", "radio_v3", "radio_v4_nonsquare", "parfac",
                                  "factorized_nonsquare"))
def test_a_plain_image_batch_gives_timms_standard_mode_outputs(kind):
    # timm's NaFlexVit takes (batch, 3, height, width) images too: it cuts them itself and resizes the table to their
    # one grid (3 x 5 here; radio_v4_nonsquare's images are on its table's own 4 x 6 grid, which it adds unchanged).
    images = REFERENCE.get(f"{kind}/standard_images", REFERENCE["standard_images"])
    model = keras_vit.from_pretrained(folder(kind), classifier_activation=None)
    np.testing.assert_allclose(predict(model, images), REFERENCE[f"{kind}/standard_output"], atol=1e-5, rtol=0)


@pytest.mark.backend_independent
def test_an_image_on_the_grid_of_a_non_square_aspect_preserving_table_gets_the_table_unchanged():
    # timm adds the table as it is where an image's grid is the table's (4 x 6 here), and resizes it to a square of
    # the longer side, then crops, elsewhere (the 6 x 4 image, the smaller grids).
    kind = "radio_v4_nonsquare"
    batch = {key: REFERENCE[f"{kind}/{key}"] for key in ("patches", "patch_grid", "patch_mask")}
    assert batch["patch_grid"][:2].tolist() == [[4, 6], [6, 4]]
    model = keras_vit.from_pretrained(folder(kind), classifier_activation=None)
    np.testing.assert_allclose(predict(model, batch), REFERENCE[f"{kind}/output"], atol=1e-5, rtol=0)
    tokens, reference = predict(tokens_model(model), batch), REFERENCE[f"{kind}/tokens"]
    mask = np.concatenate([np.ones((len(tokens), model.architecture.num_prefix_tokens), bool), batch["patch_mask"]], 1)
    np.testing.assert_allclose(tokens[mask], reference[mask], atol=1e-5, rtol=0)


@pytest.mark.backend_independent
def test_naflex_source_carries_timms_position_resize_and_eval_rule():
    radio = checkpoints.read_weights(folder("radio_v3"))
    assert (radio.naflex, radio.position_resize, radio.resize_align_corners, radio.resize_aspect_preserving,
            tuple(radio.grid_size)) == (True, ("bilinear", False), True, True, (7, 7))
    assert checkpoints.read_weights(folder("radio_v4")).resize_align_corners is False
    siglip = checkpoints.read_weights(folder("siglip"))
    assert (siglip.position_resize, siglip.resize_aspect_preserving) == (("bilinear", True), False)
    assert siglip.naflex_preprocessing == {"rule": "timm", "max_patches": 576, "interpolation": "bicubic"}


def _with_config(tmp_path, kind, **changes):
    copy = tmp_path / kind
    shutil.copytree(folder(kind), copy)
    config = json.loads((copy / "config.json").read_text())
    for key, value in changes.items():
        if key == "architecture":
            config[key] = value
        elif key == "interpolation":
            config["pretrained_cfg"][key] = value
        else:
            config["model_args"][key] = value
    (copy / "config.json").write_text(json.dumps(config))
    return str(copy)


@pytest.mark.backend_independent
@pytest.mark.parametrize("changes, message", [
    (dict(pos_embed_use_grid_sample=True), "sets pos_embed_use_grid_sample=True: the grid-sample resize of the "
                                           "position table, which keras_vit's NaFlex model does not compute"),
    (dict(rope_type="axial"), "sets rope_type='axial': RoPE, which keras_vit's NaFlex model does not compute"),
    (dict(pos_embed="none"), "timm's 'naflexvit_base_patch16_par_gap' sets pos_embed='none': no position table (only "
                             "pos_embed='learned' or 'factorized'), which keras_vit's NaFlex model does not compute "
                             "(only timm's default 'learned')."),
    (dict(architecture="naflexvit_base_patch16_parfac_gap"),
     "model.safetensors: embeds.pos_embed_y has shape None, but timm's 'naflexvit_base_patch16_parfac_gap' with "
     "pos_embed='factorized' builds a (1, 5, 16) table (pos_embed_grid_size [5, 5], "),
    (dict(not_an_argument=1), "model_args.not_an_argument is not a NaFlexVit argument keras_vit computes"),
    (dict(pos_embed_grid_size=[4, 4]), "embeds.pos_embed has shape (1, 5, 5, 16), but timm's "
                                       "'naflexvit_base_patch16_par_gap' builds a (1, 4, 4, width) table"),
    (dict(interpolation="random"), "par_gap/config.json: pretrained_cfg.interpolation 'random' is not a filter "
                                   "keras_vit resizes NaFlex images with (nearest, lanczos, bilinear, bicubic, box, "
                                   "hamming); nothing was loaded."),
])
def test_refuses_naflexvit_settings_keras_vit_does_not_compute_by_name(tmp_path, changes, message):
    with pytest.raises(CheckpointError, match=None) as error:
        keras_vit.from_pretrained(_with_config(tmp_path, "par_gap", **changes))
    assert message in str(error.value) and "\n" not in str(error.value)


@pytest.mark.backend_independent
def test_refuses_factorized_tables_under_a_learned_config_and_tables_off_their_grid(tmp_path):
    from safetensors.numpy import load_file, save_file

    copy = _with_config(tmp_path, "par_gap")
    tensors = load_file(os.path.join(copy, "model.safetensors"))
    tensors["embeds.pos_embed_y"] = tensors["embeds.pos_embed_x"] = np.zeros((1, 5, 16), "float32")
    save_file(tensors, os.path.join(copy, "model.safetensors"))
    with pytest.raises(CheckpointError) as error:
        keras_vit.from_pretrained(copy)
    assert str(error.value) == (
        f"{copy}/model.safetensors holds factorized position tables (embeds.pos_embed_y, embeds.pos_embed_x), but "
        f"timm's 'naflexvit_base_patch16_par_gap' sets pos_embed='learned' ({copy}/config.json): timm would not load "
        "it. Nothing was loaded.")
    wrong_grid = _with_config(tmp_path / "grid", "factorized_nonsquare", pos_embed_grid_size=[6, 4])
    with pytest.raises(CheckpointError) as error:
        keras_vit.from_pretrained(wrong_grid)
    assert str(error.value) == (
        f"{wrong_grid}/model.safetensors: embeds.pos_embed_y has shape (1, 4, 16), but timm's "
        "'naflexvit_base_patch16_parfac_gap' with pos_embed='factorized' builds a (1, 6, 16) table "
        f"(pos_embed_grid_size [6, 4], {wrong_grid}/config.json). Nothing was loaded.")


# The 11 pretrained tags: (architecture, tag) -> the fixture kind whose configuration it has.
PRETRAINED = {(name, tag): kind for name, entry in NAFLEX_ARCHITECTURES.items() for tag in entry.tags
              for kind in [{"naflexvit_base_patch16_gap": "gap_registers", "naflexvit_base_patch16_par_gap": "par_gap",
                            "naflexvit_base_patch16_siglip": "siglip", "naflexvit_so400m_patch16_siglip": "siglip",
                            "naflexvit_base_patch16_radio_v3": "radio_v3", "naflexvit_huge_patch16_radio_v3":
                            "radio_v3", "naflexvit_base_patch16_parfac_gap": "parfac"}.get(
                                name, "radio_v4" if "radio" in name else None)]}


@pytest.mark.backend_independent
def test_hf_handles_of_the_pretrained_tags_read_from_an_offline_cache(tmp_path):
    pytest.importorskip("huggingface_hub")
    from test_pretrained import run_offline

    assert len(PRETRAINED) == 11
    cache = tmp_path / "hub"
    kinds = {name: kind for (name, _), kind in PRETRAINED.items()}

    def fixture_sizes(name, args):  # the fixture's sizes, layer scale and registers where the tag's have others
        own = NAFLEX_ARCHITECTURES[json.loads(open(os.path.join(folder(kinds[name]), "config.json")).read())[
            "architecture"]].cfg
        args.update({key: own[key] for key in ("mlp_ratio", "init_values", "reg_tokens")})

    write_timm_hub_cache(cache, list(PRETRAINED), lambda name: folder(kinds[name]), fixture_sizes)
    code = (
        "import numpy as np, keras, keras_vit\n"
        f"data = np.load({fixture('timm_naflex_reference.npz')!r})\n"
        "batch = {key: data[key] for key in ('patches', 'patch_grid', 'patch_mask')}\n"
        f"for (name, tag), kind in {sorted(PRETRAINED.items())!r}:\n"
        "    try:\n"
        "        model = keras_vit.from_pretrained(f'hf://timm/{name}.{tag}', classifier_activation=None)\n"
        "    except keras_vit.CheckpointError as error:\n"
        "        print('REFUSED', name, str(error).split(': ', 1)[1]); continue\n"
        "    gap = np.abs(keras.ops.convert_to_numpy(model(batch)) - data[f'{kind}/output']).max()\n"
        "    print('GAP', name, float(gap))\n"
    )
    done = run_offline(cache, code)
    assert done.returncode == 0, done.stderr[-3000:]
    gaps = [line.split() for line in done.stdout.splitlines() if line.startswith("GAP")]
    refused = [line for line in done.stdout.splitlines() if line.startswith("REFUSED")]
    assert len(gaps) == 11 and max(float(gap[-1]) for gap in gaps) < 1e-5 and not refused, done.stdout


@pytest.mark.backend_independent
def test_save_timm_writes_naflexvit_that_reads_back_with_the_same_outputs(tmp_path):
    model = keras_vit.from_pretrained(folder("radio_v3"), classifier_activation=None)
    path = tmp_path / "saved" / "model.safetensors"
    path.parent.mkdir()
    checkpoints.save_timm(model, str(path), architecture="naflexvit_base_patch16_radio_v3")
    config = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert config["architecture"] == "naflexvit_base_patch16_radio_v3"
    assert config["model_args"]["pos_embed_grid_size"] == [7, 7] and config["model_args"]["reg_tokens"] == 7
    check_timm_takes_the_config(config)
    again = keras_vit.from_pretrained(str(tmp_path / "saved"), classifier_activation=None)
    np.testing.assert_array_equal(predict(again, BATCH), predict(model, BATCH))


@pytest.mark.backend_independent
@pytest.mark.parametrize("kind", ("parfac", "factorized_nonsquare"))
def test_save_timm_writes_factorized_tables_back_under_timms_names_and_config(tmp_path, kind):
    from safetensors.numpy import load_file

    model = keras_vit.from_pretrained(folder(kind), classifier_activation=None)
    path = tmp_path / "saved" / "model.safetensors"
    path.parent.mkdir()
    checkpoints.save_timm(model, str(path), architecture="naflexvit_base_patch16_parfac_gap")
    args = json.loads((tmp_path / "saved" / "config.json").read_text())["model_args"]
    original = json.loads(open(os.path.join(folder(kind), "config.json")).read())["model_args"]
    assert args["pos_embed"] == "factorized" and args["pos_embed_grid_size"] == original["pos_embed_grid_size"]
    assert args["pos_embed_ar_preserving"] == original.get("pos_embed_ar_preserving", True)
    check_timm_takes_the_config(json.loads((tmp_path / "saved" / "config.json").read_text()))
    written, timms = load_file(str(path)), load_file(os.path.join(folder(kind), "model.safetensors"))
    assert sorted(written) == sorted(timms)  # embeds.pos_embed_y and _x, no embeds.pos_embed
    for name, value in timms.items():
        np.testing.assert_array_equal(written[name], value, err_msg=name)
    again = keras_vit.from_pretrained(str(tmp_path / "saved"), classifier_activation=None)
    np.testing.assert_array_equal(predict(again, BATCH), predict(model, BATCH))


@pytest.mark.backend_independent
def test_factorized_tables_load_as_a_naflex_model_only():
    for arguments, message in ((dict(naflex=False), "Factorized position tables apply to NaFlex models only, as "
                                                    "timm's NaFlexVit builds them; pass naflex=True."),
                               (dict(position_embedding_factorized=False),
                                f"{folder('parfac')}/model.safetensors holds factorized position tables; leave "
                                "position_embedding_factorized unset.")):
        with pytest.raises(ValueError) as error:
            keras_vit.from_pretrained(folder("parfac"), **arguments)
        assert str(error.value) == message
