"""Pretrain a ViT from scratch with the paper's recipe (Adam, weight decay, warmup).

With no flags it runs offline on the embedded digits (scikit-learn's
handwritten digits, upsampled): a small ViT at 16 px, saved to
runs/pretrain/model.keras for examples/finetune.py. Any tensorflow-datasets
name, image folder, variant and checkpoint work too:

    python examples/pretrain.py --dataset cifar10 --model ViT_S16 --image-size 224

See `python examples/pretrain.py --help` for every flag.
"""

import sys

from keras_vit.cli import main

if __name__ == "__main__":
    main(["pretrain", *sys.argv[1:]])
