"""Write tests/fixtures/timm_optimizer/: timm's fine-tuning optimizers on the timm fixtures, for keras_vit to equal.

Run in the side venv of tools/make_fixtures.py (timm there, never in the project's venv):

    /work/refvenv/bin/python tools/make_optimizer_fixtures.py

- `groups.json`: for every timm-written fixture folder (tests/fixtures/timm_*/<case>/,
  random values in every tensor), each parameter's `[lr_scale, decays]` in
  timm's `create_optimizer_v2(model, "adamw", weight_decay=0.05,
  layer_decay=0.65)` (`param_groups_layer_decay`: the class's
  `group_matcher` and `no_weight_decay()`).
- `<case>/<opt>/` and `<case>/<opt>_float64/` for the cases of `STEPS` and
  opt in (adamw, lamb): the fixture's model after `STEP_COUNT` steps of
  timm's optimizer (AdamW: torch's; LAMB: timm's), weight decay 0.05, layer
  decay 0.65, a constant rate of 1e-3 with each group's `lr_scale` applied
  as timm's schedulers apply it (`group["lr"] = lr * group["lr_scale"]`),
  on the batches of `<case>/batches.npz` (pixels in [0, 1], channels-last;
  labels). The loss is the cross-entropy of the logits, or for a model
  without a head the mean square of its output. Saved by timm's own
  `save_for_hf`; `_float64` is the same run in float64 (saved in float32),
  whose distance from the float32 run is timm's own rounding noise.
"""

import glob
import json
import os
import shutil
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from make_family_fixtures import FIXTURES, batch_of, save_timm_folder  # noqa: E402

OUT = os.path.join(FIXTURES, "timm_optimizer")
LEARNING_RATE, WEIGHT_DECAY, LAYER_DECAY, STEP_COUNT, BATCH = 1e-3, 0.05, 0.65, 3, 4
# case -> fixture folder, one per timm class (and CaiT's token-only blocks, Gemma 4's clamps, SwiGLU, mixed RoPE)
STEPS = {
    "deit3": "timm_family/deit3",
    "reg_gap": "timm_family/reg_gap",
    "beit_shared": "timm_beit/shared_abs_token",
    "eva02": "timm_eva/eva02_axial",
    "eva02_separate_qkv": "timm_eva/eva02_separate_qkv",
    "beit_swiglu": "timm_beit/swiglu_scale_mlp",
    "naver_mixed": "timm_eva/naver_mixed_offset",
    "relpos_shared": "timm_relpos/table_shared_no_prefix",
    "cait": "timm_cait/token",
    "sam": "timm_sam/windowed_neck",
    "gemma4": "timm_gemma4/classifier_clipped",
}


def timm_model(folder, dtype=torch.float32, weights=None):
    """timm's model of a fixture folder (a hybrid's built as tools/timm_hybrid_fixtures.py builds it: its config
    cannot name its stem), with `weights` (a safetensors file) in place of the folder's own."""
    import timm

    case = os.path.basename(os.path.normpath(folder))
    if os.path.basename(os.path.dirname(os.path.normpath(folder))) == "timm_hybrid":
        from timm_hybrid_fixtures import CASES, build

        model = build(*CASES[case])
        timm.models.load_checkpoint(model, weights or os.path.join(folder, "model.safetensors"), strict=True)
    else:
        model = timm.create_model("local-dir:" + os.path.abspath(folder), pretrained=True)
        if weights:
            timm.models.load_checkpoint(model, weights, strict=True)
    return model.to(dtype)


def timm_optimizer(model, opt):
    from timm.optim import create_optimizer_v2

    optimizer = create_optimizer_v2(model, opt, lr=LEARNING_RATE, weight_decay=WEIGHT_DECAY, layer_decay=LAYER_DECAY)
    for group in optimizer.param_groups:  # as timm's schedulers apply a group's lr_scale
        group["lr"] = LEARNING_RATE * group["lr_scale"]
    return optimizer


def groups_of(model):
    optimizer = timm_optimizer(model, "adamw")
    names = {id(parameter): name for name, parameter in model.named_parameters()}
    return {names[id(parameter)]: [group["lr_scale"], group["weight_decay"] > 0]
            for group in optimizer.param_groups for parameter in group["params"]}


def loss_of(output, labels):
    if output.ndim == 2 and output.shape[-1] > 1 and labels is not None:
        return F.cross_entropy(output, labels)
    return (output ** 2).mean()


def stepped(folder, opt, batches, dtype):
    torch.manual_seed(0)
    model = timm_model(folder, dtype).train()
    optimizer = timm_optimizer(model, opt)
    mean, std = (torch.tensor(model.pretrained_cfg[key], dtype=dtype).view(1, 3, 1, 1) for key in ("mean", "std"))
    for pixels, labels in batches:
        optimizer.zero_grad()
        x = (batch_of(pixels).to(dtype) - mean) / std
        loss_of(model(x), torch.from_numpy(labels).long()).backward()
        optimizer.step()
    return model.float().eval()


def main():
    import timm

    print("timm", timm.__version__, "torch", torch.__version__)
    os.makedirs(OUT, exist_ok=True)
    groups = {}
    for folder in sorted(glob.glob(os.path.join(FIXTURES, "timm_*", "*", "config.json"))):
        case = os.path.relpath(os.path.dirname(folder), FIXTURES)
        if case.startswith("timm_optimizer"):
            continue
        groups[case] = groups_of(timm_model(os.path.dirname(folder)))
    with open(os.path.join(OUT, "groups.json"), "w") as file:
        json.dump(groups, file, indent=0, sort_keys=True)
    for seed, (case, relative) in enumerate(sorted(STEPS.items())):
        folder = os.path.join(FIXTURES, relative)
        model = timm_model(folder)
        with open(os.path.join(folder, "config.json")) as file:
            size = json.load(file).get("model_args", {}).get("img_size") or model.pretrained_cfg["input_size"][1:]
        height, width = (size, size) if isinstance(size, int) else size
        classes = getattr(model, "num_classes", 0)
        rng = np.random.default_rng(1500 + seed)
        batches = [(rng.uniform(0, 1, (BATCH, height, width, 3)).astype("float32"),
                    rng.integers(0, max(classes, 1), BATCH)) for _ in range(STEP_COUNT)]
        shutil.rmtree(os.path.join(OUT, case), ignore_errors=True)
        os.makedirs(os.path.join(OUT, case))
        np.savez(os.path.join(OUT, case, "batches.npz"), pixels=np.stack([b[0] for b in batches]),
                 labels=np.stack([b[1] for b in batches]), source=relative)
        for opt in ("adamw", "lamb"):
            for suffix, dtype in (("", torch.float32), ("_float64", torch.float64)):
                save_timm_folder(stepped(folder, opt, batches, dtype), os.path.join(OUT, case, opt + suffix))
            timm_model(folder, weights=os.path.join(OUT, case, opt, "model.safetensors"))  # read back strictly
        print(case, "written")


if __name__ == "__main__":
    main()
