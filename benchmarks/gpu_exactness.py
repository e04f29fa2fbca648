"""keras_vit's float32 logits against timm's on the same device, for one fixed input: exactness where it runs.

timm's `vit_base_patch16_224` (random weights, seed 0, `pretrained=False`: nothing is downloaded) is written as a
state dict and loaded into `keras_vit.ViT_B16`; both run one fixed batch in float32 on the machine's accelerator
(or CPU) and the script prints the largest difference relative to the largest logit, and fails above 1e-5. On a
GPU this also measures what TF32 or any other default matmul precision does to keras_vit and to timm (keras_vit's
float32 models compute float32 products there: `keras_vit.layers.kernels.float32_matmuls`). Usage:

    KERAS_BACKEND=jax python benchmarks/gpu_exactness.py [--tiny]   # timm, safetensors and a backend installed

`--tiny`: a 2-block ViT at 32 px, for a rehearsal on a CPU.
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

    tiny = "--tiny" in sys.argv[1:]
    size = 32 if tiny else 224
    torch.manual_seed(0)
    if tiny:
        reference = timm.models.vision_transformer.VisionTransformer(img_size=32, patch_size=16, embed_dim=48, depth=2,
                                                                     num_heads=2).eval()
    else:
        reference = timm.create_model("vit_base_patch16_224", pretrained=False).eval()
    with torch.no_grad():  # random biases, norms and tokens too, so that no mapping hides behind zeros or ones
        for parameter in reference.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.02)
    images = np.random.default_rng(0).uniform(-1, 1, (8, size, size, 3)).astype("float32")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.no_grad():
        expected = reference.to(device)(torch.from_numpy(images.transpose(0, 3, 1, 2)).to(device)).cpu().numpy()
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "vit_b16.safetensors")
        save_file({name: value.detach().cpu().contiguous() for name, value in reference.state_dict().items()}, path)
        if tiny:
            model = keras_vit.ViT(image_size=32, patch_size=16, hidden_size=48, num_layers=2, num_heads=2, mlp_dim=192,
                                  weights=path, mlp_activation="gelu", classifier_activation=None)
        else:
            model = keras_vit.ViT_B16(weights=path, mlp_activation="gelu", classifier_activation=None)
    found = keras.ops.convert_to_numpy(model.predict(images, batch_size=8, verbose=0))
    largest = float(np.abs(found - expected).max())
    error = largest / float(np.abs(expected).max())
    try:
        where = keras.distribution.list_devices()[0]
    except AttributeError:  # a backend without Keras' distribution support (torch): it runs on torch's device
        where = device
    print(f"exactness on {keras.backend.backend()} ({where}) vs timm on {device}: "
          f"max |keras_vit - timm| = {largest:.2e}, / max |timm| = {error:.2e} (float32 logits, 8 images of {size} px)")
    return 0 if error < 1e-5 else 1


if __name__ == "__main__":
    sys.exit(main())
