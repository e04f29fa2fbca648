"""Write tests/fixtures/timm_gemma4/ and transformers_gemma4_vision/: tiny Gemma 4 vision towers saved by timm and by
transformers, and their outputs.

Run in the side venv of tools/make_fixtures.py (timm and transformers there, never in the project's venv):

    /work/refvenv/bin/python tools/make_gemma4_fixtures.py

timm cases (timm/models/gemma4_vit.py, through registered architectures at
tiny sizes: 32-wide embeddings in 2 heads of 16, 2 blocks, an MLP 24 wide,
8-pixel patches, position tables of 32 entries per axis), with random values
in every tensor (norms around 1, the clamps of the clipped projections at
bounds that bind on about a tenth of their values, `std_scale` around 1),
saved by timm's `save_for_hf` to `tests/fixtures/timm_gemma4/<case>/` and
read back strictly by timm:

- `classifier_clipped` (`gemma4_vit_167m`): clamped projections, mean pool,
  the RMSNorm without a gain, a 5-class head; 48x48 images.
- `encoder_soft_grouped` (`gemma4_vit_570m_enc`): the soft tokens of a 6x9
  grid (48x72 images), standardised, with one key/value head (grouped-query).
- `classifier_soft_no_norm` (`gemma4_vit_570m`): `encoder_pool='soft'` (the
  standardised soft tokens averaged), no final norm, headless.

The transformers case is `Gemma4VisionModel` (a `Gemma4VisionConfig` of the
same sizes, clamped projections, standardised), saved by `save_pretrained`
to `tests/fixtures/transformers_gemma4_vision/` and read back by
`from_pretrained`; its input is its own processor's patches (channel-last
within each patch) of a 48x72 image and their positions.

Gemma 4's image processor (transformers' Pillow backend, 4-pixel patches,
70 soft tokens) on a 30x52 and a 130x90 photo (one enlarged, one shrunk) is kept as
`processor/{photo,pixels}_{0,1}` (uint8, the pixels as the image its patches
make), and transformers' `get_aspect_ratio_preserving_size` on 305 sizes and 4
budgets in `gemma4_patch_budget_sizes.json` (null where it refuses).

`gemma4_reference.npz` keeps, per case, two images (channels-last, in
keras_vit's [-1, 1], on 8-bit levels) and the reference's outputs for them
(timm: `<case>/native/{images,logits|pooled|soft_tokens,tokens}`, `tokens`
the patches after the blocks; transformers:
`transformers/native/{images,soft_tokens}`).
Case i (1-based) draws from torch.Generator().manual_seed(1300 + i) and
numpy.random.default_rng(1300 + i).
"""

import json
import os
import shutil
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(__file__))
from make_beit_fixtures import image_batch  # noqa: E402
from make_family_fixtures import FIXTURES, batch_of, numpy, save_timm_folder  # noqa: E402

TIMM_FOLDER = os.path.join(FIXTURES, "timm_gemma4")
TRANSFORMERS_FOLDER = os.path.join(FIXTURES, "transformers_gemma4_vision")
REFERENCE = os.path.join(FIXTURES, "gemma4_reference.npz")
TINY = dict(embed_dim=32, num_heads=2, head_dim=16, depth=2, intermediate_size=24, patch_size=8,
            position_embedding_size=32)
CASES = {
    "classifier_clipped": ("gemma4_vit_167m", dict(TINY, img_size=48, num_classes=5), (48, 48)),
    "encoder_soft_grouped": ("gemma4_vit_570m_enc", dict(TINY, img_size=(48, 72), num_kv_heads=1), (48, 72)),
    "classifier_soft_no_norm": ("gemma4_vit_570m", dict(TINY, img_size=48, num_classes=0, encoder_pool="soft",
                                                        final_norm=False), (48, 48)),
}


def randomise_gemma4(model, generator, scale=0.2):
    """Norm weights and `std_scale` around 1, clamp bounds that bind now and then, every other tensor around 0."""
    with torch.no_grad():
        for name, tensor in model.state_dict(keep_vars=True).items():
            noise = torch.randn(tensor.shape, generator=generator) * scale
            if "norm" in name or name.endswith("std_scale"):
                noise = noise + 1.0
            elif name.endswith(("input_min", "output_min")):
                noise = -(1.2 + noise.abs())
            elif name.endswith(("input_max", "output_max")):
                noise = 1.2 + noise.abs()
            tensor.copy_(noise)


def timm_case(case, arch, model_args, size, seed, out):
    import timm

    model = timm.create_model(arch, pretrained=False, **model_args).eval()
    randomise_gemma4(model, torch.Generator().manual_seed(seed))
    folder = os.path.join(TIMM_FOLDER, case)
    save_timm_folder(model, folder)
    again = timm.create_model(arch, pretrained=False, **model_args).eval()
    timm.models.load_checkpoint(again, os.path.join(folder, "model.safetensors"), strict=True)
    images = image_batch(np.random.default_rng(seed), *size)
    pixels = batch_of(((images + 1) / 2).astype(np.float32))  # pretrained_cfg: mean 0, std 1
    with torch.no_grad():
        outputs, tokens = numpy(again(pixels)), numpy(again.forward_features(pixels))
        if not np.array_equal(outputs, numpy(model(pixels))):
            raise AssertionError(f"{case}: timm read its own file back differently")
    kind = "soft_tokens" if arch.endswith("_enc") else "logits" if model_args.get("num_classes") else "pooled"
    out[f"{case}/native/images"], out[f"{case}/native/{kind}"], out[f"{case}/native/tokens"] = images, outputs, tokens


def transformers_case(seed, out):
    from transformers import Gemma4VisionConfig, Gemma4VisionModel

    config = Gemma4VisionConfig(hidden_size=32, intermediate_size=24, num_hidden_layers=2, num_attention_heads=2,
                                num_key_value_heads=2, head_dim=16, patch_size=8, position_embedding_size=32,
                                pooling_kernel_size=3, use_clipped_linears=True, standardize=True)
    model = Gemma4VisionModel(config).eval()
    randomise_gemma4(model, torch.Generator().manual_seed(seed))
    shutil.rmtree(TRANSFORMERS_FOLDER, ignore_errors=True)
    model.save_pretrained(TRANSFORMERS_FOLDER, safe_serialization=True)
    again = Gemma4VisionModel.from_pretrained(TRANSFORMERS_FOLDER).eval()
    images = image_batch(np.random.default_rng(seed), 48, 72)
    rows, cols, patch = 6, 9, 8
    pixels = ((images + 1) / 2).astype(np.float32).reshape(2, rows, patch, cols, patch, 3)
    patches = torch.from_numpy(pixels.transpose(0, 1, 3, 2, 4, 5).reshape(2, rows * cols, -1).copy())  # P-P-C
    grid = np.stack(np.meshgrid(np.arange(cols), np.arange(rows), indexing="xy"), -1).reshape(-1, 2)  # (x, y)
    positions = torch.from_numpy(np.broadcast_to(grid, (2, rows * cols, 2)).copy())
    with torch.no_grad():
        soft = numpy(again(pixel_values=patches, pixel_position_ids=positions).last_hidden_state)
        if not np.array_equal(soft, numpy(model(pixel_values=patches, pixel_position_ids=positions)
                                          .last_hidden_state)):
            raise AssertionError("transformers read its own folder back differently")
    out["transformers/native/images"], out["transformers/native/soft_tokens"] = images, soft.reshape(2, -1, 32)


def processor_case(seed, out):
    """Gemma 4's processor (its Pillow backend) on two small photos, and its size rule on many sizes and budgets."""
    from transformers.models.gemma4.image_processing_gemma4 import get_aspect_ratio_preserving_size
    from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

    processor = Gemma4ImageProcessorPil(patch_size=4, max_soft_tokens=70)
    rng = np.random.default_rng(seed)
    for index, (height, width) in enumerate(((30, 52), (130, 90))):
        photo = rng.integers(0, 256, (height, width, 3)).astype(np.uint8)
        done = processor(images=photo, return_tensors="np")
        valid = done["image_position_ids"][0, :, 0] >= 0
        positions, patches = done["image_position_ids"][0][valid], done["pixel_values"][0][valid]
        rows, cols = positions[:, 1].max() + 1, positions[:, 0].max() + 1
        image = patches.reshape(rows, cols, 4, 4, 3).transpose(0, 2, 1, 3, 4).reshape(rows * 4, cols * 4, 3)
        out[f"processor/photo_{index}"] = photo
        out[f"processor/pixels_{index}"] = np.round(image * 255).astype(np.uint8)
    sizes = [(int(h), int(w)) for h, w in rng.integers(1, 5000, (300, 2))] + [(10, 4000), (4000, 10), (48, 48),
                                                                           (1, 1000), (3000, 4000)]
    rules = []
    for height, width in sizes:
        for budget, patch, kernel in ((2520, 16, 3), (630, 16, 3), (630, 8, 3), (10080, 16, 3)):
            try:
                size = list(get_aspect_ratio_preserving_size(height, width, patch, budget, kernel))
            except ValueError:
                size = None
            rules.append([height, width, budget, patch, kernel, size])
    with open(os.path.join(FIXTURES, "gemma4_patch_budget_sizes.json"), "w") as f:
        json.dump(rules, f)
        f.write("\n")


def main():
    torch.set_num_threads(1)
    out = {}
    for index, (case, (arch, model_args, size)) in enumerate(CASES.items(), start=1):
        timm_case(case, arch, model_args, size, 1300 + index, out)
        print(case, "written")
    transformers_case(1300 + len(CASES) + 1, out)
    print("transformers written")
    processor_case(1300 + len(CASES) + 2, out)
    print("processor written")
    np.savez_compressed(REFERENCE, **out)
    with open(os.path.join(TIMM_FOLDER, "cases.json"), "w") as f:
        json.dump({case: dict(architecture=arch, model_args=args) for case, (arch, args, _) in CASES.items()}, f,
                  indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
