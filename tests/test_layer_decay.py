"""The fine-tuning optimizers of BEiT, MAE and DeiT: timm's parameter groups, and each step equal to timm's.

The references are tests/fixtures/timm_optimizer/ (tools/make_optimizer_fixtures.py): timm's own param groups
for every timm fixture, and the fixtures' weights after three steps of timm's AdamW and LAMB (weight decay 0.05,
layer decay 0.65), in float32 and float64.
"""

import json
import os
import re
import shutil

import keras
import numpy as np
import pytest
from conftest import fixture
from keras import ops
from safetensors.numpy import load_file, save_file

import keras_vit
from keras_vit.training import param_groups, recipes

OPTIMIZER = fixture("timm_optimizer")
with open(os.path.join(OPTIMIZER, "groups.json")) as _file:
    TIMM_GROUPS = json.load(_file)
STEP_CASES = sorted(name for name in os.listdir(OPTIMIZER) if os.path.isdir(os.path.join(OPTIMIZER, name)))
# The cases whose update path differs by backend beyond the torch pass's: a gathered table (TensorFlow's
# IndexedSlices), RoPE, a plain ViT. Each class's groups are backend-independent (the test above); the torch pass
# steps every class.
EVERY_BACKEND = ("beit_shared", "deit3", "eva02")
LEARNING_RATE, WEIGHT_DECAY, LAYER_DECAY = 1e-3, 0.05, 0.65
# Where timm holds a fused variable as several tensors, LAMB (a trust ratio per tensor) is refused.
LAMB_REFUSED = {
    "gemma4": "LAMB's trust ratio is one per timm tensor, and timm holds Gemma 4's q, k and v and its gate and up "
              "projections apart, where gemma4_vit_167m fuses them: use opt='adamw' (--opt adamw), which steps them "
              "alike.",
    "beit_swiglu": "timm holds BEiT's two SwiGLU layers (mlp.fc1_g and mlp.fc1_x) apart",
    "eva02_separate_qkv": "timm holds Eva's two SwiGLU layers (mlp.fc1_g and mlp.fc1_x, where it scales the MLP or "
                          "names none) apart",
}


def _coded_folder(source, groups, folder):
    """A copy of timm folder `source` whose every parameter holds one number, 10 to the power of its timm group's
    index in the returned `pairs`; buffers keep their values. Read by keras_vit, each variable then says which timm
    group it came from (where keras_vit sums tensors, as a parallel block's two output biases, a multiple of it)."""
    pairs = sorted({tuple(pair) for pair in groups.values()})
    tensors = load_file(os.path.join(source, "model.safetensors"))
    for name in tensors:
        if name in groups:
            tensors[name] = np.full_like(tensors[name], 10.0 ** pairs.index(tuple(groups[name])))
    os.makedirs(folder)
    shutil.copy(os.path.join(source, "config.json"), folder)
    save_file(tensors, os.path.join(folder, "model.safetensors"))
    return pairs


@pytest.mark.backend_independent
@pytest.mark.parametrize("case", sorted(TIMM_GROUPS))
def test_each_variable_gets_the_rate_scale_and_decay_of_its_timm_param_group(case, tmp_path):
    """Every trainable variable of every timm fixture (each class, hybrid stems, CaiT's token-only blocks, SAM's
    neck, RoPE frequencies, NaFlex) gets the `lr_scale` and weight decay of the group timm's
    `create_optimizer_v2(model, "adamw", weight_decay=0.05, layer_decay=0.65)` puts its tensors in."""
    groups = TIMM_GROUPS[case]
    pairs = _coded_folder(fixture(case), groups, tmp_path / "coded")
    model = keras_vit.from_pretrained(str(tmp_path / "coded"))
    ours = param_groups.parameter_groups(model, layer_decay=LAYER_DECAY)
    wrong = []
    for variable in model.trainable_weights:
        values = np.unique(ops.convert_to_numpy(variable))
        codes = {int(np.floor(np.log10(value) + 1e-6)) for value in values[values != 0]}
        assert len(codes) == 1 and codes <= set(range(len(pairs))), \
            f"{case}: {variable.path} reads from timm tensors of groups {codes} (of {len(pairs)})"
        scale, decays = pairs[codes.pop()]
        got = ours[variable.path]
        if not (np.isclose(got[0], scale, rtol=1e-9) and got[1] == decays):
            wrong.append(f"{variable.path}: ours {got}, timm's ({scale}, {decays})")
    assert not wrong, f"{case} ({param_groups.timm_class(model)}): " + "; ".join(wrong)


def _loss(model):
    if len(model.outputs[0].shape) == 2 and model.outputs[0].shape[-1] > 1:
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return lambda labels, outputs: ops.mean(ops.square(outputs))  # a headless model: timm's mean square


def _weights(folder):
    return {variable.path: ops.convert_to_numpy(variable) for variable in keras_vit.from_pretrained(folder).weights}


@pytest.mark.parametrize("opt", ["adamw", "lamb"])
@pytest.mark.parametrize("case", STEP_CASES)
def test_three_steps_equal_timms(case, opt):
    """From timm-written weights and the same batches, three steps of `finetuning_optimizer(opt=...)` (weight decay
    0.05, layer decay 0.65, a constant rate) give timm's weights, to 1e-3 of how far each tensor moved, plus eight
    times timm's own float32 distance from its float64 run (which the next steps' gradients carry) and 1e-4 of a
    step. Where the exact gradient is about 0 (a key bias, CaiT's talking-heads logit bias), Adam's step follows
    float32 noise, ours and timm's each their own, by up to the rate: such a tensor is held to that."""
    if case not in EVERY_BACKEND and keras.backend.backend() != "torch":
        pytest.skip("every class steps in the torch pass; this backend steps " + ", ".join(EVERY_BACKEND))
    with np.load(os.path.join(OPTIMIZER, case, "batches.npz")) as batches:
        pixels, labels, source = batches["pixels"], batches["labels"], str(batches["source"])
    model = keras_vit.from_pretrained(fixture(source), classifier_activation=None)
    if opt == "lamb" and case in LAMB_REFUSED:
        with pytest.raises(ValueError, match=re.escape(LAMB_REFUSED[case])):
            recipes.finetuning_optimizer(LEARNING_RATE, opt=opt, layer_decay=LAYER_DECAY, model=model)
        return
    optimizer = recipes.finetuning_optimizer(
        LEARNING_RATE, opt=opt, weight_decay=WEIGHT_DECAY, layer_decay=LAYER_DECAY, model=model,
        global_clipnorm=1.0 if opt == "lamb" else None)  # timm's Lamb clips to norm 1 itself; AdamW does not
    model.compile(optimizer=optimizer, loss=_loss(model))
    start = {variable.path: ops.convert_to_numpy(variable) for variable in model.weights}
    for images, targets in zip(pixels, labels):
        model.train_on_batch(images * 2 - 1, targets)  # keras_vit's [-1, 1]; timm's pixels normalised alike
    timm32 = _weights(os.path.join(OPTIMIZER, case, opt))
    timm64 = _weights(os.path.join(OPTIMIZER, case, opt + "_float64"))
    worst = []
    for variable in model.trainable_weights:
        ours, theirs = ops.convert_to_numpy(variable), timm32[variable.path]
        moved = np.abs(theirs - start[variable.path]).max()
        assert moved > 0, f"{variable.path} did not move in timm's run"
        noise = np.abs(theirs - timm64[variable.path]).max()
        tolerance = 1e-3 * moved + 8 * noise + 1e-4 * LEARNING_RATE
        if noise > 0.01 * moved:  # its exact gradient is about 0: each Adam step of noise moves it by up to the rate
            tolerance = max(tolerance, 2 * len(pixels) * LEARNING_RATE * optimizer.parameter_groups[variable.path][0])
        if np.abs(ours - theirs).max() > tolerance:
            worst.append(f"{variable.path}: {np.abs(ours - theirs).max():.3g} > {tolerance:.3g} (moved {moved:.3g})")
    assert not worst, f"{case}, {opt}: " + "; ".join(worst)


@pytest.mark.backend_independent
def test_bad_optimizer_settings_are_refused_in_one_line():
    from keras_vit.configs import FinetuneConfig

    with pytest.raises(ValueError, match=r"^Unknown optimizer 'adam' \(--opt\); expected one of sgd, adamw, lamb\.$"):
        FinetuneConfig(opt="adam")
    with pytest.raises(ValueError, match=re.escape(
            "The paper's SGD fine-tuning has one rate for every layer; --layer-decay 0.65 needs --opt adamw or lamb "
            "(as BEiT, MAE and DeiT fine-tune), or leave --layer-decay out.")):
        FinetuneConfig(layer_decay=0.65)
    with pytest.raises(ValueError, match=re.escape("--layer-decay must be in (0, 1] (0.65 for BEiT and MAE base, 0.75 "
                                                   "for large), got 1.5.")):
        FinetuneConfig(opt="adamw", layer_decay=1.5)
    model = keras_vit.ViT(image_size=16, patch_size=8, hidden_size=8, num_layers=1, num_heads=2, mlp_dim=16,
                          classes=3)
    with pytest.raises(ValueError, match=re.escape("layer_decay must be in (0, 1]")):
        param_groups.parameter_groups(model, layer_decay=0.0)


@pytest.mark.backend_independent
def test_the_default_warmup_is_a_share_of_the_run_so_the_first_update_moves():
    """A short run's first (or only) update was at rate 0 where the default warmup outlasted it."""
    assert recipes.warmup_updates(3) == 0 and recipes.warmup_updates(1) == 0
    assert recipes.warmup_updates(220, longest=20) == 20  # the digits job: unchanged
    assert recipes.warmup_updates(50, warmup_steps=80) == 50
    from keras_vit import training

    optimizer = training.finetuning_recipe(0.01, total_updates=3)
    assert float(ops.convert_to_numpy(optimizer.learning_rate)) == pytest.approx(0.01)  # the rate of update 1


def test_lora_trains_only_its_adapters_and_the_optimizer_state_survives_a_keras_file(tmp_path):
    model = keras_vit.ViT(image_size=16, patch_size=8, hidden_size=8, num_layers=2, num_heads=2, mlp_dim=16,
                          classes=3, classifier_activation=None)
    keras_vit.enable_lora(model, 2)
    optimizer = recipes.finetuning_optimizer(1e-3, opt="adamw", layer_decay=0.65, model=model)
    assert set(optimizer.parameter_groups) == {variable.path for variable in model.trainable_weights}
    assert all("lora" in path or path.startswith("head/") for path in optimizer.parameter_groups)
    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    images, labels = np.random.default_rng(0).uniform(-1, 1, (4, 16, 16, 3)), np.array([0, 1, 2, 0])
    model.train_on_batch(images, labels)
    model.save(tmp_path / "model.keras")
    again = keras.saving.load_model(tmp_path / "model.keras")
    assert again.optimizer.parameter_groups == optimizer.parameter_groups
    assert int(ops.convert_to_numpy(again.optimizer.iterations)) == 1
    for ours, theirs in zip(optimizer.variables, again.optimizer.variables):
        np.testing.assert_array_equal(ops.convert_to_numpy(ours), ops.convert_to_numpy(theirs))
    keras.backend.clear_session()
    with pytest.raises(ValueError, match="has no parameter group for encoderblock_0/qkv/lora_kernel_a"):
        other = keras_vit.ViT(image_size=16, patch_size=8, hidden_size=8, num_layers=1, num_heads=2, mlp_dim=16,
                              classes=3, classifier_activation=None)
        optimizer = recipes.finetuning_optimizer(1e-3, opt="lamb", model=other)
        keras_vit.enable_lora(other, 2)
        other.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        other.train_on_batch(images, labels)


@pytest.mark.backend_independent
def test_a_recipe_fills_what_the_user_left_open_for_the_models_size_and_batch():
    from keras_vit.configs import FinetuneConfig

    config, share, note = FinetuneConfig(recipe="mae", weights=None).with_recipe(num_layers=24, batch_size=512)
    assert (config.opt, config.learning_rate, config.layer_decay, config.stochastic_depth, share) == \
        ("adamw", 1e-3 * 512 / 256, 0.75, 0.2, 0.1)
    assert (config.mixup, config.cutmix, config.reprob, config.label_smoothing, config.randaugment) == \
        (0.8, 1.0, 0.25, 0.1, (2, 9))
    assert note == ("recipe mae (MAE's FINETUNE.md and main_finetune.py (blr at batch 256)): opt adamw, "
                    "learning_rate 0.002, weight_decay 0.05, layer_decay 0.75, stochastic_depth 0.2, label_smoothing "
                    "0.1, mixup 0.8, cutmix 1, reprob 0.25, randaugment (2, 9) (its 0.001 at batch 256, scaled to "
                    "512)")
    given = FinetuneConfig(recipe="eva02", weights=None, learning_rate=3e-4, ema=0.0, opt="lamb")
    config, share, note = given.with_recipe(num_layers=12, batch_size=64)
    assert (config.learning_rate, config.ema, config.opt, config.layer_decay, share) == (3e-4, None, "lamb", 0.7, 0.1)
    assert note.endswith("; given: ema, learning_rate, opt")
    config, _, note = FinetuneConfig(recipe="beit", weights=None, opt="sgd").with_recipe(12, 64)
    assert (config.opt, config.layer_decay, config.weight_decay) == ("sgd", None, None)
    assert note.endswith("; given: opt") and "layer_decay" not in note
    paper, share, _ = FinetuneConfig(weights=None).with_recipe(12, 64)  # the digits job's settings, as before
    assert (paper.opt, paper.learning_rate, paper.clipnorm, paper.label_smoothing, paper.mixup, share) == \
        ("sgd", 0.01, 1.0, 0.0, 0.0, None)
    # DeiT III: LAMB, 3-Augment with jitter, repeats, BCE of targets above 0; a RandAugment given replaces 3-Augment.
    config, share, note = FinetuneConfig(recipe="deit3", weights=None).with_recipe(num_layers=24, batch_size=1024)
    assert (config.opt, config.learning_rate, config.stochastic_depth, config.three_augment, config.color_jitter,
            config.aug_repeats, config.bce_loss, config.bce_target_thresh, config.randaugment, config.reprob,
            config.label_smoothing, share) == ("lamb", 1.5e-3, 0.45, True, 0.3, 3, True, 0.0, None, 0.0, 0.0, 5 / 800)
    assert "bce_loss True, bce_target_thresh 0 (its 0.003 at batch 2048, scaled to 1024)" in note
    config, _, _ = FinetuneConfig(recipe="deit3", weights=None, randaugment=(2, 9)).with_recipe(12, 64)
    assert (config.randaugment, config.three_augment, config.color_jitter) == ((2, 9), False, None)
    config, share, _ = FinetuneConfig(recipe="deit", weights=None, three_augment=True).with_recipe(12, 512)
    assert (config.randaugment, config.three_augment, config.aug_repeats, config.ema, config.learning_rate, share) == \
        (None, True, 3, 0.99996, 5e-4, 5 / 300)
    with pytest.raises(ValueError, match=re.escape("Unknown recipe 'deit9' (--recipe); expected one of paper, deit, "
                                                   "deit3, mae, beit, eva02.")):
        FinetuneConfig(recipe="deit9")
    with pytest.raises(ValueError, match=re.escape("--layer-decay 0.65 needs --opt adamw or lamb")):
        FinetuneConfig(layer_decay=0.65)  # the paper's recipe: SGD
    # A jitter without 3-Augment is refused when the config is made, before any weights are read.
    with pytest.raises(ValueError, match=re.escape("color_jitter 0.5 (--color-jitter) is applied with 3-Augment")):
        FinetuneConfig(color_jitter=0.5)
    assert FinetuneConfig(recipe="deit3", color_jitter=0.5).color_jitter == 0.5


@pytest.mark.skipif(keras.backend.backend() == "tensorflow",
                    reason="the keras.ops update runs in the jax pass, torch's _foreach_ kernel in the torch pass")
@pytest.mark.parametrize("opt", ["adamw", "lamb"])
def test_accumulation_ema_and_mixed_precision_are_applied(opt):
    """In mixed_bfloat16, with 2 batches an update and an EMA: the first batch moves no weight, the second makes
    the one update (its moments in float32), and the average follows the weights."""
    model = keras_vit.ViT(image_size=16, patch_size=8, hidden_size=8, num_layers=2, num_heads=2, mlp_dim=16,
                          classes=3, classifier_activation=None, dtype="mixed_bfloat16")
    optimizer = recipes.finetuning_optimizer(1e-2, opt=opt, layer_decay=0.65, model=model, ema_momentum=0.5,
                                             gradient_accumulation_steps=2)
    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    images, labels = np.random.default_rng(0).uniform(-1, 1, (4, 16, 16, 3)), np.array([0, 1, 2, 0])
    start = [ops.convert_to_numpy(v) for v in model.trainable_variables]
    model.train_on_batch(images, labels)  # accumulated only
    assert all(np.array_equal(a, ops.convert_to_numpy(v)) for a, v in zip(start, model.trainable_variables))
    model.train_on_batch(images, labels)  # the update
    moved = {v.path for a, v in zip(start, model.trainable_variables) if not np.array_equal(a, ops.convert_to_numpy(v))}
    assert "head/kernel" in moved and int(ops.convert_to_numpy(optimizer.iterations)) == 1
    assert all(v.dtype == "float32" for v in optimizer._momentums + optimizer._velocities)
    averages = optimizer._model_variables_moving_average
    assert any(not np.array_equal(ops.convert_to_numpy(a), b) for a, b in zip(averages, start))


@pytest.mark.backend_independent
def test_a_run_shorter_than_its_average_says_so(capsys):
    from keras_vit.training import run

    run.note_short_average(0.99996, 300), run.note_short_average(0.9, 300), run.note_short_average(None, 3)
    assert capsys.readouterr().out == (
        "note: --ema 0.99996 averages over about 25,000 updates, more than this run's 300; the saved weights, which "
        "are the average, stay close to the starting ones (--ema 0 turns it off)\n")


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="torch's _foreach_ kernel is the PyTorch backend's path")
@pytest.mark.parametrize("opt", ["adamw", "lamb"])
def test_torch_kernels_equal_the_keras_ops_update(monkeypatch, opt):
    """`kernels.torch_adamw` and `kernels.torch_lamb` (torch's `_foreach_` ops per param group) step as
    `LayerDecayAdamW.update_step` and `LayerDecayLamb.update_step` do through `keras.ops`, with and without decay,
    at every layer's rate."""
    from keras_vit.layers import kernels

    weights = {}
    for fused in (True, False):  # the same gradients on both paths: only the optimizer's step differs
        monkeypatch.setattr(kernels, "use_torch_kernels", lambda: fused)
        keras.utils.set_random_seed(0)
        model = keras_vit.ViT(image_size=16, patch_size=8, hidden_size=8, num_layers=2, num_heads=2, mlp_dim=16,
                              classes=3, classifier_activation=None)
        optimizer = recipes.finetuning_optimizer(recipes.WarmupDecay(1e-2, 10, 2), opt=opt, weight_decay=0.3,
                                                 layer_decay=0.5, model=model)
        rng = np.random.default_rng(0)
        for _ in range(3):
            optimizer.apply([ops.convert_to_tensor(rng.normal(size=v.shape), "float32") for v in model.trainable_variables],
                            model.trainable_variables)
        weights[fused] = [ops.convert_to_numpy(v) for v in model.weights + optimizer.variables]
    for fused, plain in zip(weights[True], weights[False]):
        np.testing.assert_allclose(fused, plain, rtol=1e-5, atol=1e-7)
