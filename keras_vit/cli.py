"""The `keras-vit` command: pretrain, finetune, evaluate, predict, inspect, convert.

Defaults follow the paper (Appendix B) except where the embedded digits data
set needs smaller numbers; every number is a flag. This module only turns
flags into calls of `keras_vit.training` and `keras_vit.inference`; the
training flags live in `keras_vit.flags`, shared with `examples/pretrain.py`
and `examples/finetune.py`.
"""

import argparse
import inspect
import sys

from keras_vit import flags, inference, training
from keras_vit.variants import SMALL_VIT, Variant

_SIZES = ("patch_size", "hidden_size", "num_layers", "num_heads", "mlp_dim")


def _defaults(function):
    """The keyword defaults of `function`, the size flags' from its `sizes`."""
    defaults = {name: parameter.default for name, parameter in inspect.signature(function).parameters.items()
                if parameter.default is not inspect.Parameter.empty}
    sizes = defaults.pop("sizes", None)
    if sizes is not None:
        defaults.update({name: getattr(sizes, name) for name in _SIZES})
    return defaults


def build_parser():
    parser = argparse.ArgumentParser(prog="keras-vit", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)

    pretrain = commands.add_parser("pretrain", help="train a ViT from scratch (Adam, weight decay, warmup)")
    flags.add_config_flags(pretrain, training.PretrainConfig)

    finetune = commands.add_parser("finetune", help="fine-tune a checkpoint (SGD, cosine, zero head)")
    flags.add_config_flags(finetune, training.FinetuneConfig)

    evaluate = commands.add_parser("evaluate", help="top-1 / top-5 of a model on a data-set split")
    flags.add_model_flags(evaluate), flags.add_data_flags(evaluate, training=False)
    evaluate.set_defaults(**_defaults(inference.evaluate))

    predict = commands.add_parser("predict", help="top-5 labels of image files")
    flags.add_model_flags(predict)
    predict.add_argument("images", nargs="+", help="image files")
    predict.add_argument("--labels", help="class names, one a line (default: classes.txt or ImageNet)")
    predict.add_argument("--crop-fraction", type=float, help="resize then centre-crop this fraction")
    predict.set_defaults(**_defaults(inference.predict))

    inspect_ = commands.add_parser("inspect", help="write the paper's Figure 7 plots and an attention rollout")
    flags.add_model_flags(inspect_)
    inspect_.add_argument("image", help="an image file")
    inspect_.add_argument("--output-dir")
    inspect_.set_defaults(**_defaults(inference.inspect))

    convert = commands.add_parser("convert", help="convert an original .npz checkpoint to .keras")
    convert.add_argument("weights", help="a .npz or .weights.h5 file, or a named checkpoint with --model")
    convert.add_argument("output", help="the .keras file to write")
    convert.add_argument("--model", help="the variant, for named checkpoints (default: read from the file)")
    convert.add_argument("--image-size", type=int, help="default: the checkpoint's own resolution")
    convert.add_argument("--classes", type=int, help="default: the checkpoint's head")
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.command == "pretrain":
        return training.train(flags.config_from_flags(training.PretrainConfig, args))
    if args.command == "finetune":
        return training.train(flags.config_from_flags(training.FinetuneConfig, args))
    function = getattr(inference, args.command)
    kwargs = {name: getattr(args, name) for name in inspect.signature(function).parameters if name != "sizes"}
    if "sizes" in inspect.signature(function).parameters:
        kwargs["sizes"] = Variant(**{name: getattr(args, name) for name in _SIZES})
    return function(**kwargs)


def console_main():
    """The `keras-vit` entry point: runs a command, exit status 0 on success.

    A finished --output-dir (or --weights the run would replace) is not an
    error to trace back: the reason is printed, and the status is 1.
    """
    try:
        main()
    except FileExistsError as error:
        print(f"keras-vit: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(console_main())
