"""Fine-tune a ViT at a higher resolution with the paper's recipe, then evaluate.

With no flags it loads runs/pretrain/model.keras (from examples/pretrain.py)
at 32 px instead of 16 (the position embeddings are resized), replaces the
head with a zero-initialised one, fine-tunes with SGD and a cosine schedule,
evaluates on the held-out split and prints `top-1 accuracy: 0.xxxx`. Named
checkpoints work as well:

    python examples/finetune.py --model ViT_B16 --weights imagenet21k --dataset oxford_iiit_pet --image-size 384

See `python examples/finetune.py --help` for every flag.
"""

import sys

from keras_vit.cli import main

if __name__ == "__main__":
    main(["finetune", *sys.argv[1:]])
