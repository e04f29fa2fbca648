"""The `keras-vit` command: pretrain, finetune, evaluate, predict, inspect, convert, export.

Defaults follow the paper (Appendix B) except where the embedded digits data
set needs smaller numbers; every number is a flag. This module only turns
flags into calls of `keras_vit.training` and `keras_vit.tools.inference`; the
training flags live in `keras_vit.flags`, shared with `examples/pretrain.py`
and `examples/finetune.py`.

The flags are parsed before Keras is imported (`keras_vit.startup`): `--help`
and a mistyped flag need no backend, and the backend is chosen, where the
user chose none, before Keras reads it.
"""

import argparse
import inspect
import sys

from keras_vit import configs, flags, startup
from keras_vit.model.variants import named_variant

FINETUNED = "runs/finetune/model.keras"
# The defaults of the commands that `keras_vit.tools.inference` runs: its functions' own, written here so that parsing
# imports no Keras (test_cli checks that they agree).
INFERENCE_DEFAULTS = {
    "evaluate": dict(weights=FINETUNED, dataset="digits", eval_split="test", eval_batch_size=256, verbose=1),
    "predict": dict(weights=FINETUNED, topk=5, as_json=False),
    "inspect": dict(weights=FINETUNED, output_dir="runs/inspect"),
    "export": dict(format="onnx"),
}


def build_parser():
    parser = flags.Parser(prog="keras-vit", description=__doc__.splitlines()[0])
    parser.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    commands = parser.add_subparsers(dest="command", required=True)

    pretrain = commands.add_parser("pretrain", help="train a ViT from scratch (Adam, weight decay, warmup)")
    flags.add_config_flags(pretrain, configs.PretrainConfig)

    finetune = commands.add_parser("finetune", help="fine-tune a checkpoint, or train from --weights none "
                                   "(SGD, cosine, zero head)")
    flags.add_config_flags(finetune, configs.FinetuneConfig)

    evaluate = commands.add_parser("evaluate", help="top-1 / top-5 of a model on a data-set split or image folder")
    flags.add_model_flags(evaluate), flags.add_data_flags(evaluate, training=False)
    flags.add_eval_transform_flags(evaluate)

    predict = commands.add_parser("predict", help="the top classes of image files, with their probabilities")
    flags.add_model_flags(predict)
    predict.add_argument("images", nargs="+", help="image files, or folders (every image in them)")
    predict.add_argument("--labels", help="class names, one a line (default: classes.txt, the model's own names, "
                         "or ImageNet's)")
    predict.add_argument("--topk", type=int, help="classes shown per image")
    predict.add_argument("--json", dest="as_json", action="store_true",
                         help="print one JSON list on stdout, an object per image, instead of text")
    flags.add_eval_transform_flags(predict)

    inspect_ = commands.add_parser("inspect", help="write the paper's Figure 7 plots and an attention rollout")
    flags.add_model_flags(inspect_)
    inspect_.add_argument("image", help="an image file")
    inspect_.add_argument("--output-dir")

    convert = commands.add_parser("convert", help="convert an original .npz checkpoint to .keras")
    convert.add_argument("weights", help="a .npz / .weights.h5 / .safetensors file, a timm or transformers folder, "
                         "hf://org/name, or a named checkpoint with --model")
    convert.add_argument("output", help="the .keras file to write")
    convert.add_argument("--model", help="the variant, for named checkpoints (default: read from the file)")
    flags.add_image_size_flag(convert, "default: the checkpoint's own resolution")
    flags.add_drop_remainder_flag(convert)
    convert.add_argument("--classes", type=int, help="default: the checkpoint's head")
    convert.add_argument("--num-heads", type=int, help="for a file that does not store its head count "
                         "(default: the file's, or --model's)")
    export = commands.add_parser("export", help="export a model to ONNX, LiteRT or a TensorFlow SavedModel")
    export.add_argument("source", metavar="MODEL",
                        help="a .keras file, an original .npz, a timm or transformers file or folder, or hf://org/name")
    export.add_argument("--output", help="default: MODEL's name with .onnx, .tflite or _saved_model")
    export.add_argument("--format", choices=configs.FORMATS, help="onnx: any backend; litert: tensorflow; "
                        "tf_saved_model: tensorflow or jax")
    export.add_argument("--quantize", choices=configs.QUANTIZE_MODES,
                        help="8-bit weights (default: none, float32)")
    export.add_argument("--num-heads", type=int, help="for a file that does not store its head count (default: the "
                        "file's, or its width's named variant's)")
    commands.metavar = "{" + ",".join(commands.choices) + "}"  # what a missing command's error lists
    for name, defaults in INFERENCE_DEFAULTS.items():
        commands.choices[name].set_defaults(**defaults)
    for command in commands.choices.values():
        command.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    return _show_defaults(parser)


def _show_defaults(parser):
    """Add "(default: ...)" to every flag's help, in every sub-command, unless the help already says it."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command in action.choices.values():
                _show_defaults(command)
        elif action.option_strings and action.default is not argparse.SUPPRESS and action.nargs != 0:
            if "default" not in (action.help or ""):
                action.help = f"{action.help} (default: %(default)s)" if action.help else "(default: %(default)s)"
    return parser


def announce(note):
    print(f"keras-vit: {note}", file=sys.stderr)


def run(args):
    """Run parsed command-line `args`; Keras is imported only now, once its backend is chosen."""
    startup.choose_backend(announce)
    startup.hide_import_banner("tensorflow")
    config = None
    if args.command in ("pretrain", "finetune"):
        config_class = configs.PretrainConfig if args.command == "pretrain" else configs.FinetuneConfig
        config = flags.config_from_flags(config_class, args)
        configs.raise_all(configs.path_errors(config))  # a mistyped folder or file is said before Keras loads
    elif getattr(args, "model", None):
        named_variant(args.model)  # An unknown name is the error, not a missing default file.
    if args.command in ("evaluate", "inspect"):  # (predict names its missing images and weights in one line, after)
        configs.raise_all(configs.path_errors(args))
    # Bad flag values are refused above, before Keras loads; `api` registers every class a .keras file may name.
    from keras_vit import api, training  # noqa: F401
    from keras_vit.tools import inference

    if config is not None:
        return training.train(config)
    if args.command == "export":
        return inference.export(args.source, args.output, args.format, args.quantize, args.num_heads)
    function = getattr(inference, args.command)
    parameters = inspect.signature(function).parameters
    kwargs = {name: getattr(args, name) for name in parameters if name != "sizes"}
    if "image_size" in kwargs:
        kwargs["image_size"] = flags.image_size_flag(kwargs["image_size"])
    if "sizes" in parameters:
        kwargs["sizes"] = {name: getattr(args, name) for name in configs.SIZE_FIELDS if getattr(args, name) is not None}
    return function(**kwargs)


def main(argv=None):
    """Parse `argv` (`sys.argv[1:]` by default) and run the command; a user error raises."""
    return run(build_parser().parse_args(argv))


# What a user can fix: bad flags, files and data. Anything else is a bug and keeps its traceback.
USER_ERRORS = (ValueError, ImportError, FileNotFoundError, FileExistsError, IsADirectoryError, PermissionError,
               NotImplementedError)


def console_main(argv=None):
    """The `keras-vit` entry point: exit status 0 on success, 2 with one line for a user error (--debug: traceback).

    The line names flags where the error names keyword arguments (`flags.in_flags`).
    """
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    args = parser.parse_args(argv)  # A bad flag exits here, with status 2 and one line.
    try:
        run(args)
    except USER_ERRORS as error:
        if "--debug" in argv:
            raise
        message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        print(f"keras-vit: error: {flags.in_flags(message, parser.command(args.command))}", file=sys.stderr)
        return 2
    return 0

