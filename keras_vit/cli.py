"""The `keras-vit` command: pretrain, finetune, evaluate, predict, inspect, convert, export.

Defaults follow the paper (Appendix B) except where the embedded digits data
set needs smaller numbers; every number is a flag. This module only turns
flags into calls of `keras_vit.training` and `keras_vit.inference`; the
training flags live in `keras_vit.flags`, shared with `examples/pretrain.py`
and `examples/finetune.py`.
"""

import argparse
import inspect
import sys

from keras_vit import deployment, flags, inference, training
from keras_vit.variants import named_variant


def _defaults(function):
    """The keyword defaults of `function` (the size flags stay unset: the file's or the digits ViT's)."""
    defaults = {name: parameter.default for name, parameter in inspect.signature(function).parameters.items()
                if parameter.default is not inspect.Parameter.empty}
    defaults.pop("sizes", None)
    return defaults


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


def build_parser():
    parser = argparse.ArgumentParser(prog="keras-vit", description=__doc__.splitlines()[0])
    parser.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    commands = parser.add_subparsers(dest="command", required=True)

    pretrain = commands.add_parser("pretrain", help="train a ViT from scratch (Adam, weight decay, warmup)")
    flags.add_config_flags(pretrain, training.PretrainConfig)

    finetune = commands.add_parser("finetune", help="fine-tune a checkpoint (SGD, cosine, zero head)")
    flags.add_config_flags(finetune, training.FinetuneConfig)

    evaluate = commands.add_parser("evaluate", help="top-1 / top-5 of a model on a data-set split")
    flags.add_model_flags(evaluate), flags.add_data_flags(evaluate, training=False)
    flags.add_eval_transform_flags(evaluate)
    evaluate.set_defaults(**_defaults(inference.evaluate))

    predict = commands.add_parser("predict", help="top-5 labels of image files")
    flags.add_model_flags(predict)
    predict.add_argument("images", nargs="+", help="image files")
    predict.add_argument("--labels", help="class names, one a line (default: classes.txt or ImageNet)")
    flags.add_eval_transform_flags(predict)
    predict.set_defaults(**_defaults(inference.predict))

    inspect_ = commands.add_parser("inspect", help="write the paper's Figure 7 plots and an attention rollout")
    flags.add_model_flags(inspect_)
    inspect_.add_argument("image", help="an image file")
    inspect_.add_argument("--output-dir")
    inspect_.set_defaults(**_defaults(inference.inspect))

    convert = commands.add_parser("convert", help="convert an original .npz checkpoint to .keras")
    convert.add_argument("weights", help="a .npz / .weights.h5 / .safetensors file, a timm or transformers folder, "
                         "hf://org/name, or a named checkpoint with --model")
    convert.add_argument("output", help="the .keras file to write")
    convert.add_argument("--model", help="the variant, for named checkpoints (default: read from the file)")
    flags.add_image_size_flag(convert, "default: the checkpoint's own resolution")
    convert.add_argument("--classes", type=int, help="default: the checkpoint's head")
    convert.add_argument("--num-heads", type=int, help="for a file that does not store its head count "
                         "(default: the file's, or --model's)")
    export = commands.add_parser("export", help="export a model to ONNX, LiteRT or a TensorFlow SavedModel")
    export.add_argument("source", metavar="MODEL",
                        help="a .keras file, an original .npz, a timm or transformers file or folder, or hf://org/name")
    export.add_argument("--output", help="default: MODEL's name with .onnx, .tflite or _saved_model")
    export.add_argument("--format", choices=deployment.FORMATS, help="onnx: any backend; litert: tensorflow; "
                        "tf_saved_model: tensorflow or jax")
    export.add_argument("--quantize", choices=deployment.QUANTIZE_MODES,
                        help="8-bit weights (default: none, float32)")
    export.add_argument("--num-heads", type=int, help="for a file that does not store its head count (default: the "
                        "file's, or its width's named variant's)")
    export.set_defaults(**_defaults(inference.export))
    for command in commands.choices.values():
        command.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    return _show_defaults(parser)


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.command == "pretrain":
        return training.train(flags.config_from_flags(training.PretrainConfig, args))
    if args.command == "finetune":
        return training.train(flags.config_from_flags(training.FinetuneConfig, args))
    if args.command == "export":
        return inference.export(args.source, args.output, args.format, args.quantize, args.num_heads)
    function = getattr(inference, args.command)
    parameters = inspect.signature(function).parameters
    kwargs = {name: getattr(args, name) for name in parameters if name != "sizes"}
    if "image_size" in kwargs:
        kwargs["image_size"] = flags.image_size_flag(kwargs["image_size"])
    if args.model:
        named_variant(args.model)  # An unknown name is the error, not a missing default file.
    if "sizes" in parameters:
        kwargs["sizes"] = {name: getattr(args, name) for name in training.SIZE_FIELDS if getattr(args, name) is not None}
    return function(**kwargs)


# What a user can fix: bad flags, files and data. Anything else is a bug and keeps its traceback.
USER_ERRORS = (ValueError, ImportError, FileNotFoundError, FileExistsError, IsADirectoryError, PermissionError, NotImplementedError)


def console_main(argv=None):
    """The `keras-vit` entry point: exit status 0 on success, 2 with one line for a user error (--debug: traceback)."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        main(argv)
    except USER_ERRORS as error:
        if "--debug" in argv:
            raise
        message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        print(f"keras-vit: error: {message}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(console_main())
