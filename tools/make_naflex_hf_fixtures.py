"""Write transformers' SigLIP 2 NaFlex fixtures into tests/fixtures/ (transformers' own writer and processor).

Run in the side venv (transformers, torch, safetensors, Pillow; never the project's venv):

    /work/sidevenv/bin/python tools/make_naflex_hf_fixtures.py

No keras_vit code runs, and nothing is downloaded. Each case (`CASES`) builds
a tiny model from its config class, puts random values in every tensor
(LayerNorm weights around 1; biases, the probe, the position table and the
rest around 0), writes it with `save_pretrained` (safetensors) beside its
image processor's `preprocessor_config.json` (`Siglip2ImageProcessorPil`),
reads the folder back with `from_pretrained` and checks it gives the same
outputs:

- `transformers_siglip2_vision`: a `Siglip2VisionModel` with its attention-pooling head;
- `transformers_siglip2`: a whole `Siglip2Model` (its text tower too, as the
  Hub's repositories are), whose processor normalises by ImageNet's
  statistics (not SigLIP 2's 0.5), so the NaFlex model's own input
  normalisation is exercised;
- `transformers_siglip2_no_head`: a `Siglip2VisionModel` with
  `vision_use_head: false` (no pooled output).

`transformers_siglip2_reference.npz` keeps, for each case and each of two
patch budgets (`BUDGETS`), the processor's output for three uint8 images of
three aspect ratios (`IMAGE_SHAPES`: tall, wide, square) processed at once,
`<case>/<budget>/{pixel_values, spatial_shapes, pixel_attention_mask}` with
the processor's own dtypes (float32, int64, int32), and
the vision tower's `last_hidden_state` and `pooler_output` (where it has a
head) on them. `<case>/mean` and `<case>/std` are the processor's
statistics, to map `pixel_values` back to keras_vit's [-1, 1]. The file
`transformers_siglip2_config_fields.json` keeps the fields and defaults of
`Siglip2VisionConfig` and `Siglip2Config`, for the test that every field is
read or irrelevant.
"""

import json
import os
import shutil

import numpy as np
import torch
import transformers
from make_family_fixtures import randomise_transformers

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "fixtures")
KEEP = {"config.json", "model.safetensors", "preprocessor_config.json"}
VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, patch_size=4)
TEXT = dict(vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
            max_position_embeddings=8, projection_size=16)
IMAGENET = dict(image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225])
# case -> (model class, its config, processor keywords)
CASES = {
    "transformers_siglip2_vision": (transformers.Siglip2VisionModel,
                                    lambda: transformers.Siglip2VisionConfig(**VISION, num_patches=16), {}),
    "transformers_siglip2": (transformers.Siglip2Model, lambda: transformers.Siglip2Config(
        text_config=TEXT, vision_config=dict(VISION, num_patches=64)), IMAGENET),
    "transformers_siglip2_no_head": (transformers.Siglip2VisionModel, lambda: transformers.Siglip2VisionConfig(
        **VISION, num_patches=16, vision_use_head=False), {}),
}
# Patch budgets: below the 4x4 table (grids of fewer rows or columns, where the antialiased resize matters) and
# above it.
BUDGETS = (11, 30)
IMAGE_SHAPES = ((44, 14, 3), (13, 37, 3), (23, 25, 3))  # tall, wide, square-ish (height, width, channels)


def vision_tower(model):
    return getattr(model, "vision_model", model)


def run(model, batch):
    with torch.no_grad():
        result = vision_tower(model)(pixel_values=torch.from_numpy(batch["pixel_values"]),
                                     pixel_attention_mask=torch.from_numpy(batch["pixel_attention_mask"]),
                                     spatial_shapes=torch.from_numpy(batch["spatial_shapes"]))
    pooled = None if result.pooler_output is None else result.pooler_output.numpy()
    return result.last_hidden_state.numpy(), pooled


def write_case(seed, case, out):
    model_class, config, processor_kwargs = CASES[case]
    generator = torch.Generator().manual_seed(700 + seed)
    model = model_class(config()).eval()
    randomise_transformers(model, generator)  # LayerNorm weights around 1, the rest around 0
    folder = os.path.join(FIXTURES, case)
    shutil.rmtree(folder, ignore_errors=True)
    model.save_pretrained(folder)
    processor = transformers.Siglip2ImageProcessorPil(patch_size=VISION["patch_size"], max_num_patches=BUDGETS[0],
                                                      **processor_kwargs)
    processor.save_pretrained(folder)
    for stale in set(os.listdir(folder)) - KEEP:
        os.remove(os.path.join(folder, stale))
    again = model_class.from_pretrained(folder).eval()
    rng = np.random.default_rng(700 + seed)
    images = [rng.integers(0, 256, shape, dtype=np.uint8) for shape in IMAGE_SHAPES]
    out[f"{case}/mean"], out[f"{case}/std"] = np.array(processor.image_mean), np.array(processor.image_std)
    for budget in BUDGETS:
        batch = dict(processor(images, max_num_patches=budget, return_tensors="np"))
        tokens, pooled = run(model, batch)
        tokens_again, pooled_again = run(again, batch)
        if not (np.array_equal(tokens, tokens_again) and (pooled is None or np.array_equal(pooled, pooled_again))):
            raise AssertionError(f"{case}: transformers read its own files back differently")
        grids, valid = batch["spatial_shapes"], batch["pixel_attention_mask"].sum(1)
        if len({tuple(grid) for grid in grids}) != 3 or valid.min() == batch["pixel_attention_mask"].shape[1]:
            raise AssertionError(f"{case}: budget {budget} gives grids {grids.tolist()}, valid {valid.tolist()}: "
                                 "three different grids and some padding are the point")
        prefix = f"{case}/{budget}/"
        for key in ("pixel_values", "spatial_shapes", "pixel_attention_mask"):  # as the processor gives them
            out[prefix + key] = batch[key]
        out[prefix + "last_hidden_state"] = tokens
        if pooled is not None:
            out[prefix + "pooler_output"] = pooled
        print(f"{case} budget {budget}: grids {grids.tolist()}, valid {valid.tolist()}, "
              f"tokens {tokens.shape}, pooled {None if pooled is None else pooled.shape}")
    sizes = {name: os.path.getsize(os.path.join(folder, name)) for name in sorted(os.listdir(folder))}
    print(f"{case}: files {sizes}")


def config_fields():
    """The own fields (and defaults) of the two config classes the reader reads, as tools/make_family_fixtures.py
    records the others'."""
    def plain(value):
        return value if isinstance(value, (bool, int, float, str, type(None), list)) else repr(value)

    classes = (transformers.Siglip2VisionConfig, transformers.Siglip2Config)
    return {cls.model_type: {name.lstrip("_"): plain(getattr(cls, name, None)) for name in cls.__annotations__}
            for cls in classes}


def main():
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    out = {}
    for seed, case in enumerate(CASES):
        write_case(seed, case, out)
    out["transformers_version"] = np.array(transformers.__version__)
    np.savez(os.path.join(FIXTURES, "transformers_siglip2_reference.npz"), **out)
    fields = dict(config_fields(), transformers_version=transformers.__version__)
    with open(os.path.join(FIXTURES, "transformers_siglip2_config_fields.json"), "w") as f:
        json.dump(fields, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
