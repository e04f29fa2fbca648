"""The settings of the `keras-vit` commands: their defaults, their bounds and the values each takes.

`train(PretrainConfig(...))` and `train(FinetuneConfig(...))` run a whole
job (`keras_vit.training`); each field is a flag of the same name
(`keras_vit.flags`). This module imports only the standard library,
`keras_vit.model.variants` and `keras_vit.data` (numpy), so the command reads and
checks its flags before it imports Keras.
"""

import dataclasses
import os
import typing

from keras_vit.data import HOLDOUT_FRACTION, check_dataset
from keras_vit.data.augmenters import check_policies
from keras_vit.fine_tuning_recipes import RECIPE_FIELDS, RECIPES, recipe_settings
from keras_vit.model.variants import SMALL_VIT, named_variant
from keras_vit.utils.names import HF_PREFIX, looks_like_path
from keras_vit.utils.shapes import as_pair

# The values of `distribution` (`keras_vit.training.distribute`), and the formats and quantizations of `keras-vit export`
# (`keras_vit.model.deployment`).
ENGINES = ("none", "mirrored", "tpu", "data_parallel", "model_parallel", "multi_host")
FORMATS = ("onnx", "litert", "tf_saved_model")
QUANTIZE_MODES = ("int8",)
# Fine-tuning optimizers, by timm's --opt names: the paper's SGD, torch's AdamW and timm's LAMB.
OPTIMIZERS = ("sgd", "adamw", "lamb")


def flag(name):
    """The command-line flag of a setting: `flag("image_size")` is `"--image-size"`."""
    return "--" + name.replace("_", "-")


@dataclasses.dataclass
class _TrainingConfig:
    """The settings pretraining and fine-tuning share; each field is a flag of the same name."""

    # Model: a named variant, else the checkpoint's sizes, else the five size fields.
    model: str = None
    weights: str = None
    # An int or (height, width), a pair once made; None: the checkpoint's own, else the digits' (`at_checkpoint_size`).
    image_size: tuple = None
    drop_remainder: bool = False  # an image_size the patches do not divide: leave out the last rows and columns
    # None: the digits ViT's (SMALL_VIT); a value given with `model` or sized `weights` must agree.
    patch_size: int = None
    hidden_size: int = None
    num_layers: int = None
    num_heads: int = None
    mlp_dim: int = None
    # Data.
    dataset: str = "digits"
    data_dir: str = None
    train_split: str = "train"
    eval_split: str = "test"
    holdout_fraction: float = HOLDOUT_FRACTION
    eval_batch_size: int = 256
    verbose: int = 1
    # Training.
    batch_size: int = 64
    target_batch_size: int = None
    clipnorm: float = 1.0
    label_smoothing: float = 0.0
    dropout: float = 0.0
    stochastic_depth: float = 0.0
    classifier: str = None
    min_crop_area: float = None
    flip: bool = None
    randaugment: tuple = None
    three_augment: bool = False  # DeiT III's 3-Augment (timm's --aa 3a) in place of RandAugment
    color_jitter: float = None  # with three_augment: torchvision's ColorJitter(j, j, j); None: 0.3
    aug_repeats: int = 0  # timm's repeated augmentation: each example this many times an epoch (0: off)
    mixup: float = 0.0
    cutmix: float = 0.0
    reprob: float = 0.0  # timm's random erasing: each image's chance of a box of per-pixel noise
    bce_loss: bool = False  # timm's binary cross-entropy of classes in place of the softmax crossentropy
    bce_target_thresh: float = None  # with bce_loss: targets above it count 1, the rest 0
    workers: int = None  # Decoding processes without TensorFlow; None: data.default_workers.
    mixed_precision: bool = False
    steps_per_execution: int = 1
    distribution: str = "none"
    model_parallel_size: int = 2
    tpu: str = None
    seed: int = 0
    overwrite: bool = False

    def __post_init__(self):
        if self.image_size is not None:
            self.image_size = as_pair(self.image_size, "image_size")
        for name, value in vars(self).items():
            if value is None or name not in _RULES:
                continue
            low, high, allowed = _RULES[name]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not low(value) or not high(value):
                raise ValueError(f"{flag(name)} must be {allowed}, got {value!r}.")
        if self.aug_repeats is not None and self.aug_repeats != int(self.aug_repeats):
            raise ValueError(f"--aug-repeats must be a whole number (3: DeiT's; 0: off), got {self.aug_repeats!r}.")
        if self.model:
            named_variant(self.model)
        if self.three_augment is not None:  # None: fine-tuning's recipe decides, and with_recipe checks
            check_policies(self.randaugment, self.three_augment, self.color_jitter)

    def at_checkpoint_size(self, checkpoint=None):
        """This config with its `image_size` settled: its own, else the checkpoint's (a `WeightsSource`), else the
        digits' (`digits_image_size`).

        A size the checkpoint states and its patches do not divide (timm's
        so400m/14 at 384 px) is trained as its library runs it, the last
        rows and columns left out (`drop_remainder`).
        """
        if self.image_size is not None:
            return self
        own = None if checkpoint is None else checkpoint.image_size
        if own is None:
            return dataclasses.replace(self, image_size=self.digits_image_size)
        return dataclasses.replace(self, image_size=own,
                                   drop_remainder=self.drop_remainder or checkpoint.input_size is not None)

    def sizes(self, checkpoint=None):
        """The `Variant` to build: `model`, else the checkpoint's, else the size fields (the digits ViT's)."""
        given = {name: getattr(self, name) for name in SIZE_FIELDS if getattr(self, name) is not None}
        return model_sizes(self.model, checkpoint, dataclasses.replace(SMALL_VIT, **given), given)


SIZE_FIELDS = ("patch_size", "hidden_size", "num_layers", "num_heads", "mlp_dim")


def _bounds(low=None, high=None, low_open=False, high_open=False, words=""):
    above = (lambda v: True) if low is None else (lambda v: v > low) if low_open else (lambda v: v >= low)
    below = (lambda v: True) if high is None else (lambda v: v < high) if high_open else (lambda v: v <= high)
    return above, below, words


_AT_LEAST_1 = _bounds(1, words="at least 1")
_FRACTION = _bounds(0, 1, high_open=True, words="in [0, 1)")
_OPEN_FRACTION = _bounds(0, 1, low_open=True, high_open=True, words="between 0 and 1")
_NON_NEGATIVE = _bounds(0, words="at least 0")
_POSITIVE = _bounds(0, low_open=True, words="positive")
# The numeric settings and the values that make sense for each; None (where allowed) means the default.
_RULES = {
    **dict.fromkeys(("batch_size", "target_batch_size", "eval_batch_size", "epochs", "steps_per_execution",
                     "model_parallel_size", "lora_rank", *SIZE_FIELDS), _AT_LEAST_1),
    **dict.fromkeys(("label_smoothing", "dropout", "stochastic_depth", "bce_target_thresh"), _FRACTION),
    **dict.fromkeys(("reprob", "color_jitter"), _bounds(0, 1, words="in [0, 1]")),
    "holdout_fraction": _OPEN_FRACTION,
    "ema": _bounds(0, 1, high_open=True, words="in [0, 1) (0: none)"),
    **dict.fromkeys(("warmup_steps", "mixup", "cutmix", "weight_decay", "representation_size", "workers",
                     "aug_repeats"), _NON_NEGATIVE),
    **dict.fromkeys(("learning_rate", "clipnorm"), _POSITIVE),
    "min_crop_area": _bounds(0, 1, low_open=True, words="in (0, 1]"),
    "layer_decay": _bounds(0, 1, low_open=True, words="in (0, 1] (0.65 for BEiT and MAE base, 0.75 for large)"),
}


@dataclasses.dataclass
class PretrainConfig(_TrainingConfig):
    """`keras-vit pretrain`: the paper's Adam recipe; by default the small digits ViT at 16 px."""

    stage: typing.ClassVar[str] = "pretrain"
    digits_image_size: typing.ClassVar[int] = 16  # without a checkpoint to take the size of
    output_dir: str = "runs/pretrain"
    epochs: int = 60
    learning_rate: float = 1e-3
    warmup_steps: int = None  # None: a share of the updates (recipes.warmup_updates), at most longest_warmup
    longest_warmup: typing.ClassVar[int] = 100
    objective: str = "classification"
    weight_decay: float = 0.1
    decay: str = "linear"
    representation_size: int = 0


@dataclasses.dataclass
class FinetuneConfig(_TrainingConfig):
    """`keras-vit finetune`: the paper's SGD recipe with a zero head; by default runs/pretrain at its own size.

    `weights=None` starts from a random initialisation, at 32 px unless `image_size` says otherwise.
    """

    stage: typing.ClassVar[str] = "finetune"
    digits_image_size: typing.ClassVar[int] = 32  # without a checkpoint to take the size of
    weights: str = "runs/pretrain/model.keras"  # what `keras-vit pretrain` writes
    output_dir: str = "runs/finetune"
    epochs: int = 10
    warmup_steps: int = None  # None: the recipe's share of the updates, else a tenth, at most longest_warmup
    longest_warmup: typing.ClassVar[int] = 20
    # The fine-tuning recipe (`keras_vit.fine_tuning_recipes`) that fills each of its settings left None below.
    recipe: str = "paper"
    learning_rate: float = None  # a recipe's rate at its batch, scaled to this run's
    # The optimizer (timm's --opt): the paper's "sgd", or "adamw" / "lamb" with timm's parameter groups.
    opt: str = None
    weight_decay: float = None  # 0.05 for adamw and lamb unless the recipe says otherwise
    layer_decay: float = None  # layer-wise rate decay (adamw, lamb): each layer's rate times this per layer above it
    ema: float = None  # 0: none, where the recipe has one
    clipnorm: float = None
    label_smoothing: float = None
    stochastic_depth: float = None
    mixup: float = None
    cutmix: float = None
    reprob: float = None
    bce_loss: bool = None
    bce_target_thresh: float = None
    three_augment: bool = None
    aug_repeats: int = None

    def __post_init__(self):
        super().__post_init__()
        if self.recipe not in RECIPES:
            raise ValueError(f"Unknown recipe {self.recipe!r} (--recipe); expected one of {', '.join(RECIPES)}.")
        check_optimizer(self.opt or RECIPES[self.recipe].sizes[0][1]["opt"], self.weight_decay, self.layer_decay)
        # The per-example policies do not depend on the model's size: checked before any weights are read.
        settings, _, _ = recipe_settings(self.recipe, 1, 1, self._given())
        check_policies(settings["randaugment"], settings["three_augment"], settings["color_jitter"])

    def _given(self):
        """The recipe's settings this config gives itself (not None)."""
        return {name: getattr(self, name) for name in RECIPE_FIELDS if getattr(self, name) is not None}

    def with_recipe(self, num_layers, batch_size):
        """`(config, warmup share, note)`: this config with each setting of its recipe it leaves None filled for a
        model of `num_layers` blocks trained at `batch_size` (`fine_tuning_recipes.recipe_settings`)."""
        settings, share, note = recipe_settings(self.recipe, num_layers, batch_size, self._given())
        settings["ema"] = settings["ema"] or None
        check_optimizer(settings["opt"], settings["weight_decay"], settings["layer_decay"])
        return dataclasses.replace(self, **settings), share, note  # __post_init__ checks the policies again
    lora_rank: int = None  # LoRA adapters of this rank on every block's qkv; only they and the head train


def check_optimizer(opt, weight_decay=None, layer_decay=None):
    """Refuse an unknown fine-tuning optimizer, or the paper's SGD with a weight or layer decay it does not have."""
    if opt not in OPTIMIZERS:
        raise ValueError(f"Unknown optimizer {opt!r} (--opt); expected one of {', '.join(OPTIMIZERS)}.")
    if opt != "sgd":
        return
    for name, value, what in (("weight_decay", weight_decay, "no weight decay"),
                              ("layer_decay", layer_decay, "one rate for every layer")):
        if value:
            raise ValueError(f"The paper's SGD fine-tuning has {what}; {flag(name)} {value!r} needs --opt adamw or "
                             f"lamb (as BEiT, MAE and DeiT fine-tune), or leave {flag(name)} out.")


def model_sizes(model=None, checkpoint=None, default=SMALL_VIT, given=None):
    """The `Variant` to build: the named `model`, else the checkpoint's sizes, else `default`.

    `given` are sizes the user set explicitly (`{"hidden_size": 32}`); they
    must agree with the named or saved sizes, which they would otherwise
    silently lose to.
    """
    if model:
        chosen, source = named_variant(model), f"--model {model}"
    elif checkpoint is not None and checkpoint.sizes is not None:
        chosen, source = checkpoint.sizes, f"--weights {checkpoint.description}"
    else:
        return default
    check_sizes_agree(chosen, source, given)
    return chosen


def check_sizes_agree(sizes, source, given):
    """Raise if a size the user set (`given`, e.g. `{"hidden_size": 32}`) differs from `sizes`, which `source` has."""
    for name, value in (given or {}).items():
        if getattr(sizes, name) != value:
            raise ValueError(
                f"{flag(name)} {value} disagrees with {source}, whose {name} is "
                f"{getattr(sizes, name)}; leave the size flags out to use its sizes."
            )


def check_weights_file(weights):
    """Raise where `weights` names a file or folder that is not there (finetune's default, `keras-vit pretrain`'s
    model, with what to run or pass instead). Needs no Keras: the command checks it before it loads one."""
    if weights == FinetuneConfig.weights and not os.path.exists(weights):
        raise FileNotFoundError(
            f"Weights file not found: {weights}, finetune's default --weights (what `keras-vit pretrain` "
            "writes): run `keras-vit pretrain` first, or pass --weights none (a random initialisation), --weights "
            "PATH (a .keras, .npz or .safetensors file, a timm or transformers folder), --weights hf://org/name, "
            "or a named checkpoint such as --model ViT_B16 --weights imagenet21k.")
    if weights and not weights.startswith(HF_PREFIX) and looks_like_path(weights) and not os.path.exists(weights):
        raise FileNotFoundError(f"Weights file not found: {weights}")


def path_errors(config):
    """The errors of a command's paths that are not there, its dataset's and its weights' (a training config, or the
    parsed flags of evaluate, predict and inspect): what the command checks before it imports Keras
    (`raise_all(path_errors(config))`), and `training.check_inputs` with its output folder's."""
    errors = []
    for check in (lambda: check_dataset(getattr(config, "dataset", "digits"), getattr(config, "data_dir", None)),
                  lambda: check_weights_file(getattr(config, "weights", None))):
        try:
            check()
        except (ValueError, OSError) as error:
            errors.append(error)
    return errors


def raise_all(errors):
    """Raise `errors` (exceptions) as one, or nothing where there is none: what a user can fix is said at once, not
    one run at a time.

    One error is raised as it is; several as one of their type (`ValueError`
    where their types differ) that numbers their messages.
    """
    if len(errors) == 1:
        raise errors[0]
    if errors:
        kinds = {type(error) for error in errors}
        kind = kinds.pop() if len(kinds) == 1 else ValueError
        raise kind(f"{len(errors)} problems: " + " ".join(f"({n}) {error}" for n, error in enumerate(errors, 1)))
