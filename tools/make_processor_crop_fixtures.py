"""Write transformers folders whose image processor crops smaller than their config's image_size, as published.

facebook/dinov2-* say `image_size: 518` in config.json (the table's 37x37 grid
of 14-pixel patches) while their preprocessor_config.json resizes the shortest
edge to 256 and crops 224: transformers' `AutoImageProcessor` gives 224-pixel
images, and `Dinov2Model` resizes its table to their 16x16 grid on every call
(`interpolate_pos_encoding`). These are the same, shrunk: a table of 8x8
patches (64 px), a crop of 32 px after a shortest edge of 36 (bicubic,
ImageNet statistics).

Run in the side venv of tools/make_fixtures.py (transformers, torch, Pillow):

    /tmp/timm-venv/bin/python tools/make_processor_crop_fixtures.py

Nothing is downloaded and no keras_vit code runs. For each case a tiny
`Dinov2Model` (`Dinov2WithRegistersModel`) with random values in every tensor
and its `BitImageProcessorPil` are written by their own `save_pretrained` to
`tests/fixtures/<case>/` (config.json, model.safetensors, preprocessor_config.json),
read back by `AutoImageProcessor.from_pretrained(folder, backend="pil")` (the
PIL backend, which keras_vit's eval transforms compute; transformers 5's
default is the torchvision one) and `AutoModel.from_pretrained(folder)`, and
the photo `tests/fixtures/photos/landscape.jpg` goes through both:
`transformers_processor_crop_reference.npz` keeps `<case>/pixel_values`
(NCHW, what the processor gave) and `<case>/pooler_output` (the normed class
token), and `<case>/torchvision_pooler_output`, the same through the default
torchvision backend, for comparison.
"""

import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(__file__))
from make_family_fixtures import FIXTURES, randomise_transformers, save_transformers_folder  # noqa: E402

PHOTO = os.path.join(FIXTURES, "photos", "landscape.jpg")
COMMON = dict(image_size=64, patch_size=8, hidden_size=24, num_hidden_layers=2, num_attention_heads=3, mlp_ratio=2,
              layerscale_value=1.0)
# facebook/dinov2-base's preprocessor_config.json, shrunk: shortest edge 256 -> 36, crop 224 -> 32.
PROCESSOR = dict(do_resize=True, size={"shortest_edge": 36}, resample=3, do_center_crop=True,
                 crop_size={"height": 32, "width": 32}, do_rescale=True, rescale_factor=1 / 255, do_normalize=True,
                 image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225], do_convert_rgb=True)
CASES = {"transformers_dinov2_crop": ("Dinov2Config", "Dinov2Model", {}),
         "transformers_dinov2_registers_crop": ("Dinov2WithRegistersConfig", "Dinov2WithRegistersModel",
                                                dict(num_register_tokens=2))}


def main():
    import transformers
    from PIL import Image

    out = {"transformers_version": transformers.__version__}
    for seed, (case, (config_name, model_name, extra)) in enumerate(CASES.items()):
        generator = torch.Generator().manual_seed(300 + seed)
        model = getattr(transformers, model_name)(getattr(transformers, config_name)(**COMMON, **extra)).eval()
        randomise_transformers(model, generator)
        folder = save_transformers_folder(model, case)
        transformers.BitImageProcessorPil(**PROCESSOR).save_pretrained(folder)
        with open(os.path.join(folder, "config.json")) as f:
            if json.load(f)["image_size"] != 64:
                raise AssertionError(f"{case}: config.json does not keep image_size 64")
        photo = Image.open(PHOTO).convert("RGB")
        again = transformers.AutoModel.from_pretrained(folder).eval()
        for key, backend in (("", "pil"), ("torchvision_", "torchvision")):
            processor = transformers.AutoImageProcessor.from_pretrained(folder, backend=backend)
            pixels = processor(images=photo, return_tensors="pt")["pixel_values"]
            if tuple(pixels.shape) != (1, 3, 32, 32):
                raise AssertionError(f"{case}: the {backend} processor gave {tuple(pixels.shape)}")
            with torch.no_grad():
                pooled = again(pixel_values=pixels).pooler_output.numpy()
            if not key:
                out[f"{case}/pixel_values"] = pixels.numpy()
                with torch.no_grad():
                    if not np.array_equal(model(pixel_values=pixels).pooler_output.numpy(), pooled):
                        raise AssertionError(f"{case}: transformers read its own files back differently")
            out[f"{case}/{key}pooler_output"] = pooled
            print(f"{case} ({type(processor).__name__}): pooler_output {pooled.shape}")
        print(f"  PIL vs torchvision backend: max abs {np.abs(out[f'{case}/pooler_output'] - out[f'{case}/torchvision_pooler_output']).max():.3g}")
    path = os.path.join(FIXTURES, "transformers_processor_crop_reference.npz")
    np.savez(path, **out)
    print(f"{len(out)} arrays in {path}")


if __name__ == "__main__":
    main()
