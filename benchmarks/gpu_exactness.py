"""keras_vit's float32 logits against timm's on the same device, for one fixed input: exactness where it runs.

timm's `vit_base_patch16_224` (random weights, seed 0, `pretrained=False`: nothing is downloaded) is written as a
state dict and loaded into `keras_vit.ViT_B16`; both run one fixed batch in float32 on the machine's accelerator
(or CPU) and the script prints the largest difference relative to the largest logit, and fails above 1e-4. On a
GPU this also measures what TF32 or any other default matmul precision does to keras_vit and to timm. Usage:

    KERAS_BACKEND=jax python benchmarks/gpu_exactness.py     # timm, safetensors and a backend installed
"""

import os
import sys
import tempfile

import numpy as np
import torch

import keras
import keras_vit


def main():
    import timm
    from safetensors.torch import save_file

    torch.manual_seed(0)
    reference = timm.create_model("vit_base_patch16_224", pretrained=False).eval()
    with torch.no_grad():  # random biases, norms and tokens too, so that no mapping hides behind zeros or ones
        for parameter in reference.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.02)
    images = np.random.default_rng(0).uniform(-1, 1, (8, 224, 224, 3)).astype("float32")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.no_grad():
        expected = reference.to(device)(torch.from_numpy(images.transpose(0, 3, 1, 2)).to(device)).cpu().numpy()
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "vit_b16.safetensors")
        save_file({name: value.detach().cpu().contiguous() for name, value in reference.state_dict().items()}, path)
        model = keras_vit.ViT_B16(weights=path, mlp_activation="gelu", classifier_activation=None)
    found = keras.ops.convert_to_numpy(model.predict(images, batch_size=8, verbose=0))
    error = float(np.abs(found - expected).max() / np.abs(expected).max())
    try:
        where = keras.distribution.list_devices()[0]
    except AttributeError:  # a backend without Keras' distribution support (torch): it runs on torch's device
        where = device
    print(f"exactness on {keras.backend.backend()} ({where}) vs timm on {device}: "
          f"max |keras_vit - timm| / max |timm| = {error:.2e} (float32 logits, 8 images of 224 px)")
    return 0 if error < 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
