"""Each family's fine-tuning recipe as its authors ran it: `keras-vit finetune --recipe paper|deit|deit3|mae|beit|eva02`.

A recipe fills every setting of `RECIPE_FIELDS` (the optimizer, its rate,
weight and layer decay, drop path, label smoothing, MixUp, CutMix, random
erasing, RandAugment or 3-Augment, repeated augmentation, EMA, clipping, the
loss) and the warmup's share of the run; each setting the user gives
overrides it, and a per-example policy the user gives (RandAugment or
3-Augment) replaces the recipe's other one. Needs no Keras: the command
checks the name before it loads one.

Example:
>>> settings, warmup, note = recipe_settings("mae", num_layers=12, batch_size=512, given={})
>>> settings["learning_rate"], settings["layer_decay"], warmup
(0.001, 0.65, 0.05)
"""

import dataclasses

# --- Each family's fine-tuning recipe, as its authors ran it -----------------

# The settings a recipe fills (FinetuneConfig's fields); a flag the user gives overrides each.
RECIPE_FIELDS = ("opt", "learning_rate", "weight_decay", "layer_decay", "stochastic_depth", "label_smoothing",
                 "mixup", "cutmix", "reprob", "randaugment", "three_augment", "color_jitter", "aug_repeats", "ema",
                 "clipnorm", "bce_loss", "bce_target_thresh")
_PAPER = dict(opt="sgd", learning_rate=0.01, weight_decay=None, layer_decay=None, stochastic_depth=0.0,
              label_smoothing=0.0, mixup=0.0, cutmix=0.0, reprob=0.0, randaugment=None, three_augment=False,
              color_jitter=None, aug_repeats=0, ema=None, clipnorm=1.0, bce_loss=False, bce_target_thresh=None)
# What the DeiT, MAE, BEiT and EVA-02 scripts share (timm's, DeiT's main.py defaults): AdamW, wd 0.05, no
# clipping, RandAugment rand-m9-mstd0.5-inc1 (timm's (2, 9)).
_ADAMW = dict(_PAPER, opt="adamw", weight_decay=0.05, clipnorm=None, randaugment=(2, 9))
# DeiT III's ImageNet-1k runs (README_revenge.md): LAMB at 3e-3 unscaled at batch 2048, 3-Augment with colour jitter
# 0.3, repeated augmentation, MixUp/CutMix with the binary cross-entropy of targets above 0 (engine.py's
# `targets.gt(0.0)`), no smoothing, no erasing, 5 of 800 warmup epochs.
_DEIT3 = dict(_PAPER, opt="lamb", learning_rate=3e-3, weight_decay=0.05, clipnorm=None, three_augment=True,
              color_jitter=0.3, aug_repeats=3, mixup=0.8, cutmix=1.0, bce_loss=True, bce_target_thresh=0.0,
              warmup_share=5 / 800)


@dataclasses.dataclass(frozen=True)
class Recipe:
    """A fine-tuning recipe: its settings per model size, the batch its rate is stated at, and its source.

    `sizes`: `(most blocks, settings)` from the smallest model up; a model
    takes the first whose block count it does not exceed. `learning_rate`
    there is the rate at `reference_batch` (None: used as it is), scaled
    linearly to the run's batch, as MAE's `blr * batch / 256` and DeiT's
    `5e-4 * batch / 512` are. `warmup_share`: the recipe's warmup epochs over
    its epochs, the share of the run's updates it warms up for.
    """

    name: str
    source: str
    sizes: tuple
    reference_batch: int = None

    def settings(self, num_layers):
        """`(settings, warmup share)` for a model of `num_layers` blocks."""
        for most, settings in self.sizes:
            if most is None or num_layers <= most:
                settings = dict(settings)
                return settings, settings.pop("warmup_share", None)
        raise AssertionError("a recipe's last size has no upper bound")


RECIPES = {
    "paper": Recipe("paper", "the paper's Appendix B fine-tuning (SGD, momentum 0.9, no weight decay, clipping 1); "
                    "the rate is the digits job's", ((None, _PAPER),)),
    "deit": Recipe("deit", "DeiT's README and main.py defaults (lr 5e-4 x batch / 512, 300 epochs)", (
        (None, dict(_ADAMW, learning_rate=5e-4, stochastic_depth=0.1, label_smoothing=0.1, mixup=0.8, cutmix=1.0,
                    reprob=0.25, aug_repeats=3, ema=0.99996, warmup_share=5 / 300)),), reference_batch=512),
    "deit3": Recipe("deit3", "DeiT III's README_revenge.md ImageNet-1k commands (batch 2048, 800 epochs; "
                    "B's values at 12 blocks: S/16 ran at 4e-3 with drop path 0.05)", (
        (12, dict(_DEIT3, stochastic_depth=0.2)),
        (24, dict(_DEIT3, stochastic_depth=0.45)),
        (None, dict(_DEIT3, stochastic_depth=0.6))), reference_batch=2048),
    "mae": Recipe("mae", "MAE's FINETUNE.md and main_finetune.py (blr at batch 256)", (
        (12, dict(_ADAMW, learning_rate=5e-4, layer_decay=0.65, stochastic_depth=0.1, label_smoothing=0.1,
                  mixup=0.8, cutmix=1.0, reprob=0.25, warmup_share=5 / 100)),
        (24, dict(_ADAMW, learning_rate=1e-3, layer_decay=0.75, stochastic_depth=0.2, label_smoothing=0.1,
                  mixup=0.8, cutmix=1.0, reprob=0.25, warmup_share=5 / 50)),
        (None, dict(_ADAMW, learning_rate=1e-3, layer_decay=0.75, stochastic_depth=0.3, label_smoothing=0.1,
                    mixup=0.8, cutmix=1.0, reprob=0.25, warmup_share=5 / 50))), reference_batch=256),
    "beit": Recipe("beit", "BEiT v2's get_started_cls.md (models pretrained 1600 epochs, batch 1024) and "
                   "run_class_finetuning.py's defaults", (
        (12, dict(_ADAMW, learning_rate=5e-4, layer_decay=0.6, stochastic_depth=0.2, label_smoothing=0.1,
                  mixup=0.8, cutmix=1.0, reprob=0.25, warmup_share=20 / 100)),
        (None, dict(_ADAMW, learning_rate=2e-4, layer_decay=0.8, stochastic_depth=0.2, label_smoothing=0.1,
                    mixup=0.8, cutmix=1.0, reprob=0.25, warmup_share=5 / 50))), reference_batch=1024),
    "eva02": Recipe("eva02", "EVA-02's asuka README, MIM-pretrained models fine-tuned on IN-1K (batch 1024, EMA)", (
        (12, dict(_ADAMW, learning_rate=1e-4, layer_decay=0.7, stochastic_depth=0.1, label_smoothing=0.1,
                  ema=0.9999, warmup_share=3 / 30)),
        (None, dict(_ADAMW, learning_rate=5e-5, layer_decay=0.8, stochastic_depth=0.15, label_smoothing=0.2,
                    ema=0.9999, warmup_share=3 / 30))), reference_batch=1024),
}


def recipe_settings(name, num_layers, batch_size, given):
    """`(settings, warmup share, note)`: recipe `name`'s settings for a model of `num_layers` blocks trained at
    `batch_size`, each setting in `given` (the user's, not None) in place of the recipe's, and one line that says
    what was used."""
    if name not in RECIPES:
        raise ValueError(f"Unknown recipe {name!r} (--recipe); expected one of {', '.join(RECIPES)}.")
    recipe = RECIPES[name]
    settings, share = recipe.settings(num_layers)
    scaled = ""
    if recipe.reference_batch and "learning_rate" not in given:
        scaled = f" (its {settings['learning_rate']:g} at batch {recipe.reference_batch}, scaled to {batch_size})"
        settings["learning_rate"] = settings["learning_rate"] * batch_size / recipe.reference_batch
    settings.update(given)
    # One per-example policy (timm's --aa takes one): the one the user gives replaces the recipe's other one.
    if given.get("three_augment") and "randaugment" not in given:
        settings["randaugment"] = None
    if given.get("randaugment") and "three_augment" not in given:
        settings["three_augment"] = False
    if not settings["three_augment"] and "color_jitter" not in given:  # the recipe's jitter goes with its 3-Augment
        settings["color_jitter"] = None
    if settings["opt"] == "sgd":  # the paper's SGD has neither decay: a recipe's are dropped, the user's refused later
        settings.update({key: given.get(key) for key in ("weight_decay", "layer_decay")})
    shown = ", ".join(f"{key} {settings[key]:g}" if isinstance(settings[key], float) else f"{key} {settings[key]}"
                      for key in RECIPE_FIELDS
                      if settings[key] not in (None, False, 0.0) or (key == "bce_target_thresh" and settings[key] == 0))
    overridden = f"; given: {', '.join(sorted(given))}" if given else ""
    return settings, share, f"recipe {name} ({recipe.source}): {shown}{scaled}{overridden}"
