"""What lower precision does to the digits example's fine-tuned model: top-1 and agreement with float32.

    python examples/pretrain.py && python examples/finetune.py      # the digits example
    KERAS_BACKEND=jax python benchmarks/digits_precision.py [--model runs/finetune/model.keras] \\
        [--dtypes float32,bfloat16,mixed_bfloat16,int8]

For each precision, on the 360 held-out digits: top-1 accuracy, the
fraction of images whose top-1 class equals float32's, and the largest
logit difference from float32. bfloat16 rebuilds the file with
`from_pretrained(..., dtype=...)`; int8 is Keras' `model.quantize("int8")`
on the loaded model.
"""

import argparse
import warnings

import keras
import numpy as np

import keras_vit
from keras_vit import data
from keras_vit.model.vision_transformer import native_image_size
from keras_vit.tools.inference import outputs_logits


def load(path, dtype):
    model = keras.saving.load_model(path, compile=False)
    if dtype in ("bfloat16", "mixed_bfloat16"):  # the same file rebuilt in that precision
        activation = None if outputs_logits(model) else "softmax"
        return keras_vit.from_pretrained(path, dtype=dtype, classifier_activation=activation)
    if dtype == "int8":
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*does not have a `quantize` method.*")
            model.quantize("int8")
    elif dtype != "float32":
        raise SystemExit(f"unknown dtype {dtype!r}")
    return model


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="runs/finetune/model.keras")
    parser.add_argument("--dtypes", default="float32,bfloat16,mixed_bfloat16,int8")
    args = parser.parse_args()
    reference = load(args.model, "float32")
    size = native_image_size(reference)[0]
    _, (images, labels) = data.digits(image_size=size)
    images = keras_vit.preprocess_input(images)
    float_logits = np.asarray(reference.predict(images, batch_size=120, verbose=0), "float32")
    print(f"backend {keras.backend.backend()}; {args.model}; {len(labels)} held-out digits at {size} px")
    print(f"{'dtype':14s} {'top-1':>7s} {'agrees with float32':>20s} {'max |logit diff|':>17s}")
    for dtype in args.dtypes.split(","):
        logits = np.asarray(load(args.model, dtype).predict(images, batch_size=120, verbose=0), "float32")
        top1 = (logits.argmax(-1) == labels).mean()
        agreement = (logits.argmax(-1) == float_logits.argmax(-1)).mean()
        print(f"{dtype:14s} {top1:7.2%} {agreement:20.2%} {np.abs(logits - float_logits).max():17.4f}")


if __name__ == "__main__":
    main()
