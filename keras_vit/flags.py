"""The flags of `keras-vit pretrain` / `finetune` and of the examples, in one place.

Each training flag is a field of `configs.PretrainConfig` or
`configs.FinetuneConfig` (`--image-size` is `image_size`, `configs.flag`)
and takes its default from there; `keras_vit.cli` adds the commands' own
flags. `Parser` gives an unknown flag the closest known ones, and
`in_flags` writes the keyword arguments a library error advises as flags.
Nothing here imports Keras.

Example:
>>> from keras_vit.configs import PretrainConfig
>>> config = parse_config(PretrainConfig, ["--epochs", "3"])
>>> config.epochs, config.image_size, config.at_checkpoint_size(None).image_size
(3, None, (16, 16))
"""

import argparse
import dataclasses
import difflib
import re

from keras_vit.configs import ENGINES, OPTIMIZERS, flag
from keras_vit.fine_tuning_recipes import RECIPES
from keras_vit.data import HOLDOUT_FRACTION
from keras_vit.data.preprocessing import PILLOW_FILTERS
from keras_vit.data.randaugment import RandAugment
from keras_vit.model.variants import SMALL_VIT


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors, and the closest flags or command for an unknown one."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")

    def parse_args(self, args=None, namespace=None):
        parsed, unknown = self.parse_known_args(args, namespace)
        if unknown:
            command = self.command(getattr(parsed, "command", None))
            command.error(unknown_arguments(unknown, command))
        return parsed

    def _check_value(self, action, value):
        """An unknown command: one line with the command it may have meant (`predcit` -> `predict`)."""
        if isinstance(action, argparse._SubParsersAction) and value not in action.choices:
            close = difflib.get_close_matches(value, list(action.choices), n=1)
            hint = f"did you mean {close[0]}?" if close else f"the commands are {', '.join(action.choices)}"
            raise argparse.ArgumentError(None, f"unknown command {value!r}; {hint}")
        super()._check_value(action, value)

    def command(self, name):
        """The parser of the sub-command `name`, or this parser where it has none of that name."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction) and name in action.choices:
                return action.choices[name]
        return self


def close_flags(name, parser):
    """The flags of `parser` that `name` (an unknown flag) may have meant: `--lr` -> `--learning-rate`."""
    known = [option for option in parser._option_string_actions if option.startswith("--")]
    wanted = "--" + name.lstrip("-").replace("_", "-")
    if wanted in known:
        return [wanted]
    initials = [option for option in known if "".join(word[0] for word in option[2:].split("-")) == wanted[2:]]
    return initials or difflib.get_close_matches(wanted, known, n=2, cutoff=0.6)


def unknown_arguments(arguments, parser):
    """One line for arguments `parser` does not take: each unknown flag with the flags it may have meant."""
    unknown = [argument.split("=", 1)[0] for argument in arguments if re.match(r"-+[A-Za-z]", argument)]
    if not unknown:
        return f"unrecognized arguments: {' '.join(arguments)}"
    listed = f"{parser.prog} --help lists the flags"
    if len(unknown) == 1:
        close = close_flags(unknown[0], parser)
        return f"unknown flag {unknown[0]}; " + (f"did you mean {' or '.join(close)}?" if close else listed)
    described = [f"{name} (did you mean {' or '.join(close)}?)" if (close := close_flags(name, parser)) else name
                 for name in unknown]
    return f"unknown flags {', '.join(described)}; {listed}"


# A keyword argument named in a message: `name=value`, `name=` or `name=(24, 40)`, in backquotes or not.
_KEYWORD = re.compile(r"`?\b([a-z][a-z0-9_]*)=(\(\d+, \d+\)|'[^']*'|\"[^\"]*\"|[\w+\-/:]+(?:\.\w+)*)?`?")


def in_flags(message, parser):
    """`message` with each keyword argument that is a flag of `parser` written as that flag.

    `pass num_heads=3` -> `pass --num-heads 3`; `drop_remainder=True` ->
    `--drop-remainder`; `weights=PATH` -> `--weights PATH`. Library errors
    advise keywords; the command's user types flags. Keywords `parser` does
    not take stay as they are.
    """
    def as_flag(match):
        name, value = match.group(1), match.group(2)
        action = parser._option_string_actions.get(flag(name))
        if action is None:
            return match.group(0)
        if action.nargs == 0:  # a switch: `drop_remainder=True`
            return flag(name) if value in (None, "True") else match.group(0)
        if value is None:
            return flag(name)
        value = value.strip("'\"")
        value = "none" if value == "None" else re.sub(r"\((\d+), (\d+)\)", r"\1x\2", value)
        return f"{flag(name)} {value}"

    return _KEYWORD.sub(as_flag, message)


def add_model_flags(parser, digits_image_size=32):
    """`--model`, `--weights`, `--image-size` (default: the checkpoint's own, else `digits_image_size`), the sizes."""
    group = parser.add_argument_group("model")
    group.add_argument("--model", help="a named variant, e.g. ViT_B16 (default: the size flags below, "
                       "or the sizes saved in --weights)")
    group.add_argument("--weights", type=weights_flag,
                       help="a named checkpoint, a .npz / .keras / .weights.h5 / .safetensors file, a timm or "
                       "transformers folder, hf://org/name, or none (random initialisation)")
    add_image_size_flag(group, f"default: the checkpoint's own resolution, else {digits_image_size}")
    add_drop_remainder_flag(group)
    digits = "default: the digits ViT's {}, or the sizes of --model / --weights"
    group.add_argument("--patch-size", type=int, help=digits.format(SMALL_VIT.patch_size))
    group.add_argument("--hidden-size", type=int, help=digits.format(SMALL_VIT.hidden_size))
    group.add_argument("--num-layers", type=int, help=digits.format(SMALL_VIT.num_layers))
    group.add_argument("--num-heads", type=int, help=digits.format(SMALL_VIT.num_heads))
    group.add_argument("--mlp-dim", type=int, help=digits.format(SMALL_VIT.mlp_dim))


def weights_flag(value):
    """`--weights none` (any case) is None, a random initialisation; any other value is a name or a path."""
    return None if value.lower() == "none" else value


def add_drop_remainder_flag(parser):
    parser.add_argument("--drop-remainder", action="store_true",
                        help="an --image-size the patch size does not divide: leave out the last rows and columns "
                        "that fill no patch, as timm does")


def add_eval_transform_flags(parser):
    """`--crop-fraction`, `--interpolation`, `--max-patches` (NaFlex): the checkpoint's own eval preprocessing, one
    field overridden."""
    group = parser.add_argument_group("preprocessing (default: the checkpoint's own: timm's pretrained_cfg, "
                                      "transformers' preprocessor_config.json, vit_jax's for .npz files)")
    group.add_argument("--crop-fraction", type=float, help="resize to the model's size / this, then centre-crop "
                       "(timm's crop_pct; fixed-size models)")
    group.add_argument("--interpolation", choices=PILLOW_FILTERS, help="Pillow's resize filter")
    group.add_argument("--max-patches", type=int, help="a NaFlex model's patch budget: each image keeps its aspect "
                       "ratio at the most patches it fits (default: the checkpoint's, else 256)")


def add_data_flags(parser, training=True):
    group = parser.add_argument_group("data")
    group.add_argument("--dataset",
                       help="'digits' (embedded), a tensorflow-datasets name, or a folder of class sub-folders")
    group.add_argument("--data-dir", help="tensorflow-datasets data directory (manual-download sets)")
    if training:
        group.add_argument("--train-split")
        group.add_argument("--holdout-fraction", type=float,
                           help="an image folder without train/test sub-folders: the part of each class held out "
                           f"for evaluation (default {HOLDOUT_FRACTION})")
    else:
        group.add_argument("--holdout-fraction", type=float, nargs="?", const=HOLDOUT_FRACTION, metavar="FRACTION",
                           help="an image folder without train/test sub-folders: score only the part of each class "
                           "that finetune held out with this --holdout-fraction (given alone: "
                           f"{HOLDOUT_FRACTION}, finetune's default); default: every image")
    group.add_argument("--eval-split")
    group.add_argument("--eval-batch-size", type=int)
    group.add_argument("--verbose", type=int, help="Keras progress: 0 silent, 1 bar, 2 per epoch")


def add_training_flags(parser, config_class):
    pretrain = config_class.stage == "pretrain"
    group = parser.add_argument_group("training")
    if not pretrain:
        group.add_argument("--recipe", choices=list(RECIPES),
                           help="fill every setting whose default is the recipe's as a family's authors fine-tuned: "
                           "the paper's SGD, DeiT's AdamW, DeiT III's LAMB with 3-Augment, or MAE's, BEiT v2's or "
                           "EVA-02's AdamW with layer decay, drop path, RandAugment, MixUp, CutMix, random erasing, "
                           "repeated augmentation; each flag given overrides it (docs/training.md's table)")
    recipe = "" if pretrain else " (default: the --recipe's)"
    group.add_argument("--output-dir", help="logs, learning curve, model.keras")
    group.add_argument("--overwrite", action="store_true",
                       help="train again into a finished --output-dir (or over its own --weights), replacing it")
    group.add_argument("--epochs", type=int)
    group.add_argument("--batch-size", type=int, help="global batch per step")
    group.add_argument("--target-batch-size", type=int,
                       help="reach this batch by gradient accumulation (the paper: 4096 pretraining, 512 fine-tuning)")
    group.add_argument("--learning-rate", type=float, help="peak rate" + ("" if pretrain else
                       " (default: the --recipe's, at its batch, scaled linearly to --target-batch-size or --batch-size)"))
    group.add_argument("--warmup-steps", type=int, help="linear warmup in updates (the paper: 10k pretraining, 500 "
                       f"fine-tuning; default: a tenth of the run's updates, at most {config_class.longest_warmup})")
    group.add_argument("--clipnorm", type=float, help="global gradient-norm clip" + recipe)
    group.add_argument("--label-smoothing", type=float, help="label smoothing" + recipe)
    group.add_argument("--dropout", type=float)
    group.add_argument("--stochastic-depth", "--drop-path", dest="stochastic_depth", type=float,
                       help="drop path: the last block's rate, the others' growing linearly from 0 (as timm's)" + recipe)
    group.add_argument("--classifier", choices=["token", "gap"], help="default: the checkpoint's, else token")
    if pretrain:
        group.add_argument("--objective", choices=["classification", "masked-patch"],
                           help="supervised labels, or the paper's self-supervised masked patch prediction "
                           "(saves the encoder only)")
        group.add_argument("--weight-decay", type=float, help="decoupled, kernels only")
        group.add_argument("--decay", choices=["linear", "cosine"])
        group.add_argument("--representation-size", type=int, help="pre-logits width (0: none)")
    else:
        group.add_argument("--ema", type=float, help="Polyak averaging momentum, e.g. 0.9999; 0: none" + recipe)
        group.add_argument("--opt", choices=OPTIMIZERS,
                           help="sgd: the paper's (momentum 0.9, no weight decay); adamw (torch's) or lamb (timm's) "
                           "with timm's parameter groups: no decay on biases, norms, tokens and position tables" + recipe)
        group.add_argument("--weight-decay", type=float, help="adamw and lamb's decoupled decay" + recipe)
        group.add_argument("--layer-decay", type=float,
                           help="layer-wise rate decay of adamw and lamb, as timm's: each layer's rate times this "
                           "for every layer above it (0.65: BEiT and MAE base; 0.75: large)" + recipe)
        group.add_argument("--lora-rank", type=int,
                           help="train LoRA adapters of this rank on every block's qkv and the head only")
    group.add_argument("--min-crop-area", type=float,
                       help="Inception crop's smallest area (default 0.05; 0.6 for digits)")
    group.add_argument("--flip", action=argparse.BooleanOptionalAction,
                       help="random horizontal flips (default on; off for digits, which flips change)")
    group.add_argument("--randaugment", type=float, nargs=2, metavar=("NUM_OPS", "MAGNITUDE"),
                       help="timm's RandAugment rand-mMAGNITUDE-nNUM_OPS-mstd0.5-inc1 on each training example "
                       "(MAGNITUDE 0-10; 2 9 is timm's rand-m9-mstd0.5-inc1)" + recipe)
    group.add_argument("--three-augment", action=argparse.BooleanOptionalAction,
                       help="DeiT III's 3-Augment (timm's --aa 3a) on each training example, in place of RandAugment: "
                       "grayscale, solarize or Gaussian blur, then --color-jitter" + recipe)
    group.add_argument("--color-jitter", type=float,
                       help="with --three-augment: brightness, contrast and saturation factors in [1-J, 1+J], as "
                       "torchvision's ColorJitter (default 0.3)" + recipe)
    group.add_argument("--aug-repeats", type=int, help="timm's repeated augmentation: each example this many times an "
                       "epoch, differently augmented, the epoch cut to a multiple of 256 (3: DeiT's; 0: off)" + recipe)
    group.add_argument("--mixup", type=float, help="MixUp alpha (0: off)" + recipe)
    group.add_argument("--cutmix", type=float, help="CutMix factor (0: off)" + recipe)
    group.add_argument("--reprob", type=float, help="timm's random erasing: each image's chance of a box of "
                       "per-pixel noise (0.25 in DeiT's and MAE's recipes; 0: off)" + recipe)
    group.add_argument("--bce-loss", action=argparse.BooleanOptionalAction,
                       help="timm's binary cross-entropy of classes (DeiT III's) in place of the softmax crossentropy"
                       + recipe)
    group.add_argument("--bce-target-thresh", type=float, help="with --bce-loss: targets above it count 1, else 0 (DeiT III's: "
                       "0)" + recipe)
    group.add_argument("--workers", type=int, help="processes that decode and crop image files where TensorFlow "
                       "is not installed (default: every core but one; none for arrays); tf.data sizes "
                       "its own threads")
    group.add_argument("--mixed-precision", action="store_true", help="mixed_bfloat16")
    group.add_argument("--steps-per-execution", type=int)
    group.add_argument("--distribution", choices=ENGINES)
    group.add_argument("--model-parallel-size", type=int)
    group.add_argument("--tpu", help="TPU name or address for --distribution tpu")
    group.add_argument("--seed", type=int)


def add_config_flags(parser, config_class):
    """Every flag of `config_class` (a training config), with its defaults."""
    add_model_flags(parser, config_class.digits_image_size), add_data_flags(parser)
    add_training_flags(parser, config_class)
    parser.set_defaults(**dataclasses.asdict(config_class()))
    return parser


def config_from_flags(config_class, args):
    """The `config_class` that parsed flags `args` (an `argparse.Namespace`) describe."""
    values = {field.name: getattr(args, field.name) for field in dataclasses.fields(config_class)}
    values["image_size"] = image_size_flag(values["image_size"])
    if values["randaugment"]:
        values["randaugment"] = tuple(int(v) if v == int(v) else v for v in values["randaugment"])
        RandAugment(*values["randaugment"])  # a policy outside timm's ranges is refused before anything is built
    return config_class(**values)


def add_image_size_flag(parser, default=None):
    """`--image-size`, one argument (`96`, `96x128` or `96,128`), so that it never takes a command's file names."""
    help = "input resolution in pixels: SIZE, or HEIGHTxWIDTH (e.g. 224 or 224x320)"
    parser.add_argument("--image-size", metavar="SIZE", help=f"{help}; {default}" if default else help)


def image_size_flag(value):
    """`--image-size 32` -> 32; `--image-size 24x40` (or `24,40`) -> (24, 40); anything else is an error.

    A value that is not a string (a config's default) is returned as it is.
    """
    if not isinstance(value, str):
        return value
    sides = value.lower().replace(",", "x").split("x")
    if len(sides) not in (1, 2) or not all(side.strip().isdigit() for side in sides):
        raise ValueError(f"--image-size takes SIZE or HEIGHTxWIDTH in pixels, one argument such as 224 or 224x320; "
                         f"got {value!r}.")
    sides = [int(side) for side in sides]
    return sides[0] if len(sides) == 1 else tuple(sides)


def parse_config(config_class, argv=None, description=None):
    """Parse command-line flags (`sys.argv[1:]` by default) into a `config_class`."""
    parser = add_config_flags(Parser(description=description), config_class)
    return config_from_flags(config_class, parser.parse_args(argv))
