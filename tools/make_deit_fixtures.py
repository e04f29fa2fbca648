"""Write the distilled DeiT fixtures: a tiny timm folder, a tiny transformers folder, and their outputs.

Run in the side venv of tools/make_family_fixtures.py (timm, transformers, safetensors):

    /tmp/timm-venv/bin/python tools/make_deit_fixtures.py

Nothing is downloaded. timm's `deit_tiny_distilled_patch16_224` (its
`VisionTransformerDistilled`) is built with `model_args` that only shrink it
(32 px, 8-pixel patches, width 24, 2 blocks, 3 heads, 5 classes), given
random values in every tensor (`make_family_fixtures.randomise`) and written
by timm's `save_for_hf(..., safe_serialization=True)` to
`tests/fixtures/timm_deit_distilled/`; transformers'
`DeiTForImageClassificationWithTeacher` of the same sizes is written by
`save_pretrained` to `tests/fixtures/transformers_deit_distilled/`. Each is
read back by its own library (timm's strict load, transformers'
`from_pretrained`) and must give the same outputs. The `.npz` keeps, for
images in keras_vit's [-1, 1] (`images`, NHWC), each reference's averaged
logits, the class head's and the distillation head's logits, and timm's
`forward_head(pre_logits=True)` (the mean of the two tokens).
"""

import os

import numpy as np
import torch

from make_family_fixtures import FIXTURES, batch_of, numpy, randomise, save_timm_folder

TIMM_FOLDER = os.path.join(FIXTURES, "timm_deit_distilled")
TRANSFORMERS_FOLDER = os.path.join(FIXTURES, "transformers_deit_distilled")
REFERENCE = os.path.join(FIXTURES, "deit_distilled_reference.npz")
MODEL_ARGS = dict(img_size=32, patch_size=8, embed_dim=24, depth=2, num_heads=3, num_classes=5)


def timm_case(images, out):
    import timm

    model = timm.create_model("deit_tiny_distilled_patch16_224", pretrained=False, **MODEL_ARGS)
    randomise(model, torch.Generator().manual_seed(48))
    model.eval()
    mean, std = (torch.tensor(model.pretrained_cfg[key]).view(1, 3, 1, 1) for key in ("mean", "std"))
    x = ((batch_of(images) + 1) / 2 - mean) / std  # keras_vit's [-1, 1] images, normalised as timm's are
    save_timm_folder(model, TIMM_FOLDER)
    rebuilt = timm.create_model("deit_tiny_distilled_patch16_224", pretrained=False, **MODEL_ARGS).eval()
    timm.models.load_checkpoint(rebuilt, os.path.join(TIMM_FOLDER, "model.safetensors"), strict=True)
    with torch.no_grad():
        tokens = model.forward_features(x)
        out["timm/logits"] = numpy(model(x))
        out["timm/class_logits"] = numpy(model.head(tokens[:, 0]))
        out["timm/distillation_logits"] = numpy(model.head_dist(tokens[:, 1]))
        out["timm/pre_logits"] = numpy(model.forward_head(tokens, pre_logits=True))
        np.testing.assert_array_equal(numpy(rebuilt(x)), out["timm/logits"])


def transformers_case(images, out):
    from transformers import DeiTConfig, DeiTForImageClassificationWithTeacher

    config = DeiTConfig(hidden_size=24, num_hidden_layers=2, num_attention_heads=3, intermediate_size=48,
                        image_size=32, patch_size=8, num_labels=5, layer_norm_eps=1e-6)
    torch.manual_seed(49)
    model = DeiTForImageClassificationWithTeacher(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn(parameter.shape) * 0.2 + (1.0 if parameter.ndim == 1 and torch.all(
                parameter == 1) else 0.0))
    model.save_pretrained(TRANSFORMERS_FOLDER, safe_serialization=True)
    rebuilt = DeiTForImageClassificationWithTeacher.from_pretrained(TRANSFORMERS_FOLDER).eval()
    x = batch_of(images)  # no preprocessor_config.json: keras_vit's [-1, 1] images as they are
    with torch.no_grad():
        result = model(pixel_values=x)
        for key in ("logits", "cls_logits", "distillation_logits"):
            out[f"transformers/{key}"] = numpy(getattr(result, key))
        np.testing.assert_array_equal(numpy(rebuilt(pixel_values=x).logits), out["transformers/logits"])


def main():
    images = np.random.default_rng(48).uniform(-1, 1, (2, 32, 32, 3)).astype(np.float32)
    out = {"images": images}
    timm_case(images, out)
    transformers_case(images, out)
    np.savez(REFERENCE, **out)
    print(f"wrote {TIMM_FOLDER}, {TRANSFORMERS_FOLDER} and {REFERENCE}: {sorted(out)}")


if __name__ == "__main__":
    main()
