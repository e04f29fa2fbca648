"""The `keras-vit` command: pretrain, finetune, evaluate, predict, inspect, convert.

Defaults follow the paper (Appendix B) except where the embedded digits data
set needs smaller numbers; every number is a flag. `examples/pretrain.py` and
`examples/finetune.py` are this command's `pretrain` and `finetune`.
"""

import argparse
import sys

from keras_vit import distribute
from keras_vit.variants import SMALL_VIT


def _model_flags(parser):
    group = parser.add_argument_group("model")
    group.add_argument("--model", help="a named variant, e.g. ViT_B16 (default: the size flags below, "
                       "or the sizes saved in --weights)")
    group.add_argument("--weights", help="a named checkpoint, or a .npz / .keras / .weights.h5 file")
    group.add_argument("--image-size", type=int, default=32, help="input resolution in pixels")
    group.add_argument("--patch-size", type=int, default=SMALL_VIT.patch_size)
    group.add_argument("--hidden-size", type=int, default=SMALL_VIT.hidden_size)
    group.add_argument("--num-layers", type=int, default=SMALL_VIT.num_layers)
    group.add_argument("--num-heads", type=int, default=SMALL_VIT.num_heads)
    group.add_argument("--mlp-dim", type=int, default=SMALL_VIT.mlp_dim)


def _data_flags(parser, training=True):
    group = parser.add_argument_group("data")
    group.add_argument("--dataset", default="digits",
                       help="'digits' (embedded), a tensorflow-datasets name, or a folder of class sub-folders")
    group.add_argument("--data-dir", help="tensorflow-datasets data directory (manual-download sets)")
    if training:
        group.add_argument("--train-split", default="train")
    group.add_argument("--eval-split", default="test")
    group.add_argument("--eval-batch-size", type=int, default=256)
    group.add_argument("--verbose", type=int, default=1, help="Keras progress: 0 silent, 1 bar, 2 per epoch")


def _training_flags(parser, stage):
    pretrain = stage == "pretrain"
    group = parser.add_argument_group("training")
    group.add_argument("--output-dir", default=f"runs/{stage}", help="logs, learning curve, model.keras")
    group.add_argument("--epochs", type=int, default=60 if pretrain else 10)
    group.add_argument("--batch-size", type=int, default=64, help="global batch per step")
    group.add_argument("--target-batch-size", type=int,
                       help="reach this batch by gradient accumulation (the paper: 4096 pretraining, 512 fine-tuning)")
    group.add_argument("--learning-rate", type=float, default=1e-3 if pretrain else 0.01)
    group.add_argument("--warmup-steps", type=int, default=100 if pretrain else 20,
                       help="linear warmup (the paper: 10k pretraining, 500 fine-tuning)")
    group.add_argument("--clipnorm", type=float, default=1.0, help="global gradient-norm clip")
    group.add_argument("--label-smoothing", type=float, default=0.0)
    group.add_argument("--dropout", type=float, default=0.0)
    group.add_argument("--stochastic-depth", type=float, default=0.0)
    group.add_argument("--classifier", choices=["token", "gap"], help="default: the checkpoint's, else token")
    if pretrain:
        group.add_argument("--objective", choices=["classification", "masked-patch"], default="classification",
                           help="supervised labels, or the paper's self-supervised masked patch prediction "
                           "(saves the encoder only)")
        group.add_argument("--weight-decay", type=float, default=0.1, help="decoupled, kernels only")
        group.add_argument("--decay", choices=["linear", "cosine"], default="linear")
        group.add_argument("--representation-size", type=int, default=0, help="pre-logits width (0: none)")
    else:
        group.add_argument("--ema", type=float, help="Polyak averaging momentum, e.g. 0.9999")
        parser.set_defaults(representation_size=0, objective="classification")
    group.add_argument("--min-crop-area", type=float,
                       help="Inception crop's smallest area (default 0.05; 0.6 for digits)")
    group.add_argument("--flip", action=argparse.BooleanOptionalAction,
                       help="random horizontal flips (default on; off for digits, which flips change)")
    group.add_argument("--randaugment", type=float, nargs=2, metavar=("NUM_OPS", "MAGNITUDE"))
    group.add_argument("--mixup", type=float, default=0.0, help="MixUp alpha (0: off)")
    group.add_argument("--cutmix", type=float, default=0.0, help="CutMix factor (0: off)")
    group.add_argument("--mixed-precision", action="store_true", help="mixed_bfloat16")
    group.add_argument("--steps-per-execution", type=int, default=1)
    group.add_argument("--distribution", choices=distribute.ENGINES, default="none")
    group.add_argument("--model-parallel-size", type=int, default=2)
    group.add_argument("--tpu", help="TPU name or address for --distribution tpu")
    group.add_argument("--seed", type=int, default=0)


def build_parser():
    parser = argparse.ArgumentParser(prog="keras-vit", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)

    pretrain = commands.add_parser("pretrain", help="train a ViT from scratch (Adam, weight decay, warmup)")
    _model_flags(pretrain), _data_flags(pretrain), _training_flags(pretrain, "pretrain")
    pretrain.set_defaults(image_size=16)

    finetune = commands.add_parser("finetune", help="fine-tune a checkpoint (SGD, cosine, zero head)")
    _model_flags(finetune), _data_flags(finetune), _training_flags(finetune, "finetune")
    finetune.set_defaults(weights="runs/pretrain/model.keras")

    evaluate = commands.add_parser("evaluate", help="top-1 / top-5 of a model on a data-set split")
    _model_flags(evaluate), _data_flags(evaluate, training=False)
    evaluate.set_defaults(weights="runs/finetune/model.keras")

    predict = commands.add_parser("predict", help="top-5 labels of image files")
    _model_flags(predict)
    predict.add_argument("images", nargs="+", help="image files")
    predict.add_argument("--labels", help="class names, one a line (default: classes.txt or ImageNet)")
    predict.add_argument("--crop-fraction", type=float, help="resize then centre-crop this fraction")
    predict.set_defaults(weights="runs/finetune/model.keras")

    inspect = commands.add_parser("inspect", help="write the paper's Figure 7 plots and an attention rollout")
    _model_flags(inspect)
    inspect.add_argument("image", help="an image file")
    inspect.add_argument("--output-dir", default="runs/inspect")
    inspect.set_defaults(weights="runs/finetune/model.keras")

    convert = commands.add_parser("convert", help="convert an original .npz checkpoint to .keras")
    convert.add_argument("weights", help="a .npz or .weights.h5 file, or a named checkpoint with --model")
    convert.add_argument("output", help="the .keras file to write")
    convert.add_argument("--model", help="the variant, for named checkpoints (default: read from the file)")
    convert.add_argument("--image-size", type=int, help="default: the checkpoint's own resolution")
    convert.add_argument("--classes", type=int, help="default: the checkpoint's head")
    return parser


def main(argv=None):
    from keras_vit import training

    args = build_parser().parse_args(argv)
    if args.command in ("pretrain", "finetune"):
        if getattr(args, "randaugment", None):
            args.randaugment = (int(args.randaugment[0]), args.randaugment[1])
        return training.train(args, args.command)
    return getattr(training, args.command)(args)


def console_main():
    """The `keras-vit` entry point: runs a command, exit status 0 on success."""
    main()
    return 0


if __name__ == "__main__":
    sys.exit(console_main())
