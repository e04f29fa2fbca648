"""transformers' SigLIP 2 (NaFlex) folders, written by transformers' own save_pretrained and image processor
(tools/make_naflex_hf_fixtures.py), read with transformers' outputs on padded batches of mixed aspect ratios."""

import json
import re
import shutil

import numpy as np
import pytest
from conftest import fixture, predict

import keras_vit
from keras_vit import CheckpointError, cli

pytest.importorskip("safetensors")

CASES = ("transformers_siglip2_vision", "transformers_siglip2", "transformers_siglip2_no_head")
BUDGETS = (11, 30)
PATCH = 4


@pytest.fixture(scope="module")
def reference():
    with np.load(fixture("transformers_siglip2_reference.npz")) as data:
        return dict(data)


def processor_output(reference, case, budget):
    """The processor's batch as it gave it: float32 pixel_values, int64 spatial_shapes, int32 pixel_attention_mask."""
    return {key: reference[f"{case}/{budget}/{key}"] for key in ("pixel_values", "spatial_shapes",
                                                                "pixel_attention_mask")}


def naflex_inputs(reference, case, budget):
    """The processor's batch as keras_vit's NaFlex inputs: its pixel_values mapped back to [-1, 1]."""
    values = reference[f"{case}/{budget}/pixel_values"]
    channels = values.reshape(*values.shape[:2], -1, 3)  # (row, column, channel) order: channels last
    pixels = channels * reference[f"{case}/std"] + reference[f"{case}/mean"]
    return {"patches": (pixels * 2 - 1).reshape(values.shape).astype("float32"),
            "patch_grid": reference[f"{case}/{budget}/spatial_shapes"].astype("int32"),
            "patch_mask": reference[f"{case}/{budget}/pixel_attention_mask"].astype(bool)}


def images_of(batch):
    """Each image of a NaFlex batch, whole again: `(rows * patch, columns * patch, 3)` in [-1, 1]."""
    images = []
    for patches, (rows, cols) in zip(batch["patches"], batch["patch_grid"]):
        blocks = patches[: rows * cols].reshape(rows, cols, PATCH, PATCH, 3).transpose(0, 2, 1, 3, 4)
        images.append(blocks.reshape(rows * PATCH, cols * PATCH, 3))
    return images


@pytest.mark.backend_independent
def test_fixture_batches_mix_three_aspect_ratios_with_padding(reference):
    for case in CASES:
        for budget in BUDGETS:
            batch = naflex_inputs(reference, case, budget)
            rows, cols = batch["patch_grid"].T
            assert (rows > cols).any() and (rows < cols).any() and (abs(rows - cols) <= 1).any()
            assert len({tuple(grid) for grid in batch["patch_grid"]}) == 3
            assert (batch["patch_mask"].sum(1) < batch["patch_mask"].shape[1]).any()  # padding in every batch
            assert (batch["patch_mask"].sum(1) == rows * cols).all()


def both_budgets(reference, case, key=None):
    """The two budgets' batches as one (the first padded to the second's length), or `key`'s references so."""
    if key is not None:
        parts = [reference[f"{case}/{budget}/{key}"] for budget in BUDGETS]
        if parts[0].ndim == 3:
            parts[0] = np.pad(parts[0], ((0, 0), (0, parts[1].shape[1] - parts[0].shape[1]), (0, 0)))
        return np.concatenate(parts)
    batches = [naflex_inputs(reference, case, budget) for budget in BUDGETS]
    length = batches[1]["patches"].shape[1]
    pad = {"patches": ((0, 0), (0, length - batches[0]["patches"].shape[1]), (0, 0)),
           "patch_mask": ((0, 0), (0, length - batches[0]["patch_mask"].shape[1])), "patch_grid": ((0, 0), (0, 0))}
    return {key: np.concatenate([np.pad(batches[0][key], pad[key]), batches[1][key]]) for key in pad}


def run(model, batch):
    """`model` on a NaFlex batch, compiled (one XLA program rather than many small eager ones)."""
    outputs = model.predict(batch, batch_size=len(batch["patch_grid"]), verbose=0)
    return [np.asarray(output) for output in outputs] if isinstance(outputs, list) else np.asarray(outputs)


@pytest.mark.parametrize("case", CASES)
def test_siglip2_folders_load_as_naflex_models_with_transformers_outputs(case, reference):
    import keras

    model = keras_vit.from_pretrained(fixture(case))  # pooler_output, or (headless) last_hidden_state
    assert {tensor.name for tensor in model.inputs} == {"patches", "patch_grid", "patch_mask"}
    batch, tokens = both_budgets(reference, case), both_budgets(reference, case, "last_hidden_state")
    valid = batch["patch_mask"]
    if case.endswith("no_head"):  # no head in transformers, so no pooled output: from_pretrained gives the tokens
        assert model.output_shape == (None, None, 32)
        np.testing.assert_allclose(run(model, batch)[valid], tokens[valid], atol=1e-5, rtol=0)
        return
    both = keras.Model(model.inputs, [model.get_layer("encoder_norm").output, model.output])
    got_tokens, got_pooled = run(both, batch)
    np.testing.assert_allclose(got_tokens[valid], tokens[valid], atol=1e-5, rtol=0)
    np.testing.assert_allclose(got_pooled, both_budgets(reference, case, "pooler_output"), atol=1e-5, rtol=0)


# The processor's dict is mapped by the same keras.ops on every backend; the entry points that differ per backend are
# tested on every backend in tests/test_naflex.py.
@pytest.mark.backend_independent
@pytest.mark.parametrize("case", CASES)
def test_siglip2_models_take_their_processors_output_as_it_comes_with_transformers_outputs(case, reference):
    # pixel_values normalised by the processor (ImageNet's statistics in transformers_siglip2), an int32 mask, int64
    # grids: passed straight in.
    model = keras_vit.from_pretrained(fixture(case))
    key = "last_hidden_state" if case.endswith("no_head") else "pooler_output"
    for budget in BUDGETS:
        batch, expected = processor_output(reference, case, budget), reference[f"{case}/{budget}/{key}"]
        got = predict(model, batch)
        if key == "last_hidden_state":
            valid = batch["pixel_attention_mask"].astype(bool)
            got, expected = got[valid], expected[valid]
        np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)


@pytest.mark.backend_independent
@pytest.mark.parametrize("case, seed", [(case, seed) for seed, case in enumerate(CASES)])
def test_source_records_siglip2s_resize_and_patch_budget_and_naflex_batch_matches_its_processor(case, seed,
                                                                                                 reference):
    source = keras_vit.checkpoints.read_weights(fixture(case))
    assert (source.naflex, source.position_resize, source.grid_size) == (
        True, ("bilinear", True), (8, 8) if case == "transformers_siglip2" else (4, 4))
    assert source.naflex_preprocessing == {"rule": "siglip2", "max_patches": 11, "interpolation": "bilinear"}
    # The images the generator gave transformers' processor; naflex_batch with the recorded keywords cuts the same.
    rng = np.random.default_rng(700 + seed)
    images = [rng.integers(0, 256, shape, dtype=np.uint8) for shape in ((44, 14, 3), (13, 37, 3), (23, 25, 3))]
    batch = keras_vit.data.naflex_batch(images, PATCH, buckets=(), **source.naflex_preprocessing)
    expected = naflex_inputs(reference, case, 11)
    np.testing.assert_array_equal(batch["patch_grid"], expected["patch_grid"])
    np.testing.assert_array_equal(batch["patch_mask"], expected["patch_mask"])
    valid = expected["patch_mask"]  # (the processor's zero padding is not -1 once mapped back)
    np.testing.assert_allclose(batch["patches"][valid], expected["patches"][valid], atol=1e-5, rtol=0)


@pytest.mark.backend_independent
@pytest.mark.parametrize("case", ["transformers_siglip2_vision", "transformers_siglip2_no_head"])
def test_naflex_false_runs_the_same_weights_on_whole_images(case, reference):
    # transformers runs SigLIP 2 on patch sequences only; the weights are a ViT all the same. A dynamic-resolution
    # model resizes the table to each image's grid as the NaFlex model does: it equals transformers on each image
    # alone, and a fixed-size model at the table's own size equals the NaFlex model on a full grid of that size.
    folder, pooling = fixture(case), (None if case.endswith("no_head") else "map")
    dynamic = keras_vit.from_pretrained(folder, naflex=False, image_size=(None, None))
    batch = naflex_inputs(reference, case, 30)
    key = "pooler_output" if pooling else "last_hidden_state"
    for index, image in enumerate(images_of(batch)):
        expected = reference[f"{case}/30/{key}"][index]
        got = dynamic.predict(image[None], verbose=0)[0]
        np.testing.assert_allclose(got, expected if pooling else expected[: len(got)], atol=1e-5, rtol=0)
    fixed = keras_vit.from_pretrained(folder, naflex=False)
    assert fixed.input_shape == (None, 16, 16, 3)
    image = np.random.default_rng(9).uniform(-1, 1, (16, 16, 3)).astype("float32")
    full = {"patches": image.reshape(4, 4, 4, 4, 3).transpose(0, 2, 1, 3, 4).reshape(1, 16, 48),
            "patch_grid": np.array([[4, 4]], "int32"), "patch_mask": np.ones((1, 16), bool)}
    np.testing.assert_allclose(fixed.predict(image[None], verbose=0), run(keras_vit.from_pretrained(folder), full),
                               atol=1e-5, rtol=0)


def changed_folder(tmp_path, case, tensors=None, config=None, processor=None):
    """A copy of fixture `case` with `tensors(dict)`, `config(dict)` and `processor(dict)` applied in place."""
    from safetensors.numpy import load_file, save_file

    folder = tmp_path / case
    shutil.copytree(fixture(case), folder)
    if tensors:
        state = load_file(folder / "model.safetensors")
        tensors(state)
        save_file(state, folder / "model.safetensors")
    for name, change in (("config.json", config), ("preprocessor_config.json", processor)):
        if change:
            fields = json.loads((folder / name).read_text())
            change(fields)
            (folder / name).write_text(json.dumps(fields))
    return str(folder)


def fifteen_rows(state):
    state["embeddings.position_embedding.weight"] = state["embeddings.position_embedding.weight"][:15]


@pytest.mark.backend_independent
@pytest.mark.parametrize("case, tensors, config, processor, message", [
    ("transformers_siglip2_vision", fifteen_rows, lambda c: c.update(num_patches=15), None,
     "{folder}/model.safetensors: embeddings.position_embedding.weight has 15 rows, which are no square grid; "
     "SigLIP 2 reshapes its position table to a square (num_patches a square number), so this is no SigLIP 2 "
     "checkpoint."),
    ("transformers_siglip2_vision", None, lambda c: c.update(num_patches=25), None,
     "{folder}/config.json: num_patches is 25, but the file's position table has 16 rows; set it to 16."),
    ("transformers_siglip2_vision", None, lambda c: c.update(patch_size=5), None,
     "{folder}/model.safetensors: embeddings.patch_embedding.weight has shape [32, 48], but {folder}/config.json's "
     "patch_size 5 and num_channels 3 make a Linear of 75 inputs (SigLIP 2 embeds each 5x5x3 patch): set them to "
     "the file's."),
    ("transformers_siglip2", None, lambda c: c["vision_config"].update(patch_size=2), None,
     "{folder}/model.safetensors: embeddings.patch_embedding.weight has shape [32, 48], but {folder}/config.json "
     "(vision_config)'s patch_size 2 and num_channels 3 make a Linear of 12 inputs (SigLIP 2 embeds each 2x2x3 "
     "patch): set them to the file's."),
    ("transformers_siglip2_vision", None, None, lambda p: p.update(patch_size=8),
     "{folder}/preprocessor_config.json: patch_size is 8, but the model's patches are 4 pixels: the processor "
     "would cut patches the model cannot embed; set it to the model's."),
    ("transformers_siglip2_vision", None, None, lambda p: p.update(size={"height": 16, "width": 16}),
     "{folder}/preprocessor_config.json: field 'size' is not one keras_vit computes, so its evaluation "
     "preprocessing cannot be reproduced (it knows do_convert_rgb, do_normalize, do_rescale, do_resize, "
     "feature_extractor_type, image_mean, image_processor_type, image_std, max_num_patches, patch_size, "
     "processor_class, resample, rescale_factor)."),
])
def test_siglip2_folders_that_transformers_cannot_run_are_refused_in_one_line(case, tensors, config, processor,
                                                                               message, tmp_path):
    folder = changed_folder(tmp_path, case, tensors, config, processor)
    with pytest.raises(CheckpointError, match=f"^{re.escape(message.format(folder=folder))}$"):
        keras_vit.from_pretrained(folder)


@pytest.mark.backend_independent
def test_every_siglip2_config_field_is_computed_checked_or_irrelevant_at_inference():
    # tools/make_naflex_hf_fixtures.py records the fields and defaults of transformers' own config classes.
    from keras_vit.checkpoints.transformers import siglip2
    from keras_vit.checkpoints.transformers.vit import INFERENCE_IRRELEVANT

    with open(fixture("transformers_siglip2_config_fields.json")) as f:
        recorded = json.load(f)
    for model_type, read in siglip2.CONFIG_DEFAULTS.items():
        assert set(recorded[model_type]) <= set(read) | set(INFERENCE_IRRELEVANT), model_type
        assert {key: recorded[model_type].get(key) for key in read} == read, model_type


@pytest.mark.backend_independent
def test_cli_converts_a_siglip2_folder_and_inspects_it_whole_at_its_own_grid(tmp_path, capsys):
    import keras

    image = (np.random.default_rng(0).uniform(size=(40, 24, 3)) * 255).astype("uint8")
    keras.utils.save_img(tmp_path / "x.png", image)
    folder, converted = fixture("transformers_siglip2_vision"), str(tmp_path / "siglip2.keras")
    cli.main(["convert", folder, converted])
    assert capsys.readouterr().out.strip().endswith("parameters, NaFlex patch sequences of any grid")
    assert {tensor.name for tensor in keras.saving.load_model(converted).inputs} == {
        "patches", "patch_grid", "patch_mask"}
    for weights in (folder, converted):  # the folder and its .keras file are NaFlex models alike
        written = cli.main(["inspect", "--weights", weights, str(tmp_path / "x.png"), "--output-dir",
                            str(tmp_path)])
        assert written and all(path.endswith(".png") for path in written.values())
