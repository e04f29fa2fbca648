"""Write the eval-preprocessing references: photos, timm's and transformers' own pipelines, and a tiny predict case.

Run in the side venv of tools/make_fixtures.py (timm, transformers, torchvision,
Pillow and scikit-learn there, never in the project's venv):

    python -m venv /tmp/timm-venv
    /tmp/timm-venv/bin/pip install torch==2.14.1 torchvision==0.29.1 timm transformers safetensors scikit-learn pillow
    /tmp/timm-venv/bin/python tools/make_preprocessing_fixtures.py

Nothing is downloaded and no keras_vit code runs. It writes:

`tests/fixtures/photos/{landscape,portrait,odd}.jpg`: three real photographs
made from scikit-learn's two shipped photos (`china.jpg`, `flower.jpg`,
640x427), cropped to a box of the target's aspect ratio and resized with
Pillow's LANCZOS to ImageNet-like sizes with odd and even edges
(500x375, 333x500, 457x341, width x height), saved by Pillow as JPEG
(quality 90). Every pipeline below reads them as its library reads a file:
`PIL.Image.open(path).convert("RGB")`.

`tests/fixtures/preprocessing/timm_<case>/config.json`: the config.json that
timm's own hub writer (`timm.models._hub.save_config_for_hf`) writes for the
real pretrained tag (`timm.create_model(name, pretrained=False)`, so
`pretrained_cfg` is the registry's). Each case's transform is timm's own
`create_transform(**resolve_data_config({}, model=model))`, eval mode.

`tests/fixtures/preprocessing/hf_<case>/preprocessor_config.json`: a
transformers image processor (the PIL backend, transformers' "slow" one)
built with the values of the Hub checkpoint's preprocessor_config.json
(`HF_CASES`, copied by hand: nothing can be downloaded), written by its own
`save_pretrained` and read back by the same class's `from_pretrained`; the
read-back processor makes the outputs.

`tests/fixtures/preprocessing_reference.npz` keeps, per case and photo:
`<case>/<photo>/pixels` (uint8, HxWx3: the image right before the conversion
to floats; timm: the PIL image after the steps before `MaybeToTensor`;
transformers: `round((pixel_values * std + mean) / rescale_factor)`, which
must be within 1e-3 of an integer everywhere), `<case>/<photo>/resized_hw`
(the size after the resize, before the crop) and `<case>/<photo>/crop_top_left`
(where the crop was found in the resized image by exact search), and, for
the first photo only, `<case>/<photo>/window` (the final float32 model input,
HWC, its top-left 32x32) and `<case>/<photo>/channel_sums` (float64 sums of
the whole final input per channel). `<case>/mean`, `<case>/std` are the
statistics the library applied, `<case>/data_config` (timm: the resolved data
config; transformers: the read-back processor's `to_dict()`) as JSON.

`tests/fixtures/preprocessing/timm_predict/`: a tiny `vit_tiny_patch16_224`
(32 px, 8 px patches, one block, 10 classes; random values in every tensor)
whose `pretrained_cfg` says 32 px, crop_pct 0.875, bicubic, ImageNet
statistics, with ten made-up `label_names`, written by timm's `save_for_hf`
(config.json and model.safetensors) and read back twice: by
`timm.create_model("local-dir:<folder>", pretrained=True)` (timm's own reader
of the folder, config and weights) and by `create_model(arch,
pretrained=False, **model_args)` with a strict `load_checkpoint`. Its eval
transform (from the folder's config) and float32 forward pass on
`landscape.jpg` give `timm_predict/{pixels,logits,top5_indices,
top5_probabilities}` in the npz.
"""

import json
import os
import shutil
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(__file__))
from make_family_fixtures import FIXTURES, randomise  # noqa: E402

PHOTOS = os.path.join(FIXTURES, "photos")
FOLDER = os.path.join(FIXTURES, "preprocessing")
REFERENCE = os.path.join(FIXTURES, "preprocessing_reference.npz")

# photo -> (scikit-learn sample, (width, height), source box (left, top, right, bottom) of the target's aspect ratio)
PHOTO_CASES = {
    "landscape": ("china.jpg", (500, 375), (35.0, 0.0, 35.0 + 427 * 4 / 3, 427.0)),
    "portrait": ("flower.jpg", (333, 500), (180.0, 0.0, 180.0 + 427 * 333 / 500, 427.0)),
    "odd": ("china.jpg", (457, 341), (120.0, 40.0, 120.0 + 380 * 457 / 341, 420.0)),
}
FIRST_PHOTO = "landscape"

# case -> timm model name with its pretrained tag.
TIMM_CASES = {
    "timm_deit": "deit_small_patch16_224.fb_in1k",
    "timm_eva02_448": "eva02_base_patch14_448.mim_in22k_ft_in22k_in1k",
    "timm_siglip": "vit_base_patch16_siglip_224.webli",
    "timm_augreg": "vit_base_patch16_224.augreg2_in21k_ft_in1k",
    # The only ViT tags in timm's registry at crop_pct 0.875 (256 -> 224) and bilinear, with mean 0 and std 1.
    "timm_miil": "vit_base_patch16_224_miil.in21k_ft_in1k",
}

IMAGENET_MEAN, IMAGENET_STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
CLIP_MEAN, CLIP_STD = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]
# case -> (processor class (PIL backend), the Hub checkpoint, its preprocessor_config.json values as published).
HF_CASES = {
    "hf_dinov2": ("BitImageProcessorPil", "facebook/dinov2-base", dict(
        do_resize=True, size={"shortest_edge": 256}, resample=3, do_center_crop=True,
        crop_size={"height": 224, "width": 224}, do_rescale=True, rescale_factor=0.00392156862745098,
        do_normalize=True, image_mean=IMAGENET_MEAN, image_std=IMAGENET_STD, do_convert_rgb=True)),
    # The Hub file is the old feature-extractor form: "size": 224 and "crop_size": 224 as plain integers.
    "hf_clip": ("CLIPImageProcessorPil", "openai/clip-vit-base-patch32", dict(
        do_resize=True, size=224, resample=3, do_center_crop=True, crop_size=224,
        do_normalize=True, image_mean=CLIP_MEAN, image_std=CLIP_STD)),
    # Also the old form: "size": 224, bilinear (resample 2), no crop.
    "hf_vit": ("ViTImageProcessorPil", "google/vit-base-patch16-224", dict(
        do_resize=True, size=224, resample=2, do_normalize=True, image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5])),
    "hf_siglip": ("SiglipImageProcessorPil", "google/siglip-base-patch16-224", dict(
        do_resize=True, size={"height": 224, "width": 224}, resample=3, do_rescale=True,
        rescale_factor=0.00392156862745098, do_normalize=True, image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5])),
}
# What transformers must make of the Hub values (the legacy integers included), checked after the read-back.
HF_EXPECTED_SIZES = {
    "hf_dinov2": ({"shortest_edge": 256}, {"height": 224, "width": 224}),
    "hf_clip": ({"shortest_edge": 224}, {"height": 224, "width": 224}),
    "hf_vit": ({"height": 224, "width": 224}, None),
    "hf_siglip": ({"height": 224, "width": 224}, None),
}

PREDICT_ARCH = "vit_tiny_patch16_224"
PREDICT_ARGS = dict(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, num_classes=10)
PREDICT_CFG = dict(input_size=(3, 32, 32), crop_pct=0.875, crop_mode="center", interpolation="bicubic",
                   mean=tuple(IMAGENET_MEAN), std=tuple(IMAGENET_STD))
PREDICT_LABELS = ["red kite", "grey heron", "stone bridge", "paper lantern", "green tea", "brass bell",
                  "river otter", "pine cone", "clay pot", "silk fan"]


def write_photos():
    """The three JPEGs from scikit-learn's shipped photos; returns {photo: path}."""
    from PIL import Image
    from sklearn.datasets import load_sample_image

    os.makedirs(PHOTOS, exist_ok=True)
    paths = {}
    for photo, (sample, size, box) in PHOTO_CASES.items():
        source = Image.fromarray(load_sample_image(sample))
        image = source.resize(size, Image.Resampling.LANCZOS, box=box)
        path = os.path.join(PHOTOS, f"{photo}.jpg")
        image.save(path, format="JPEG", quality=90)
        with Image.open(path) as check:
            if check.size != size or check.format != "JPEG":
                raise AssertionError(f"{photo}: wrote {check.format} {check.size}, meant {size}")
        kib = os.path.getsize(path) / 1024
        print(f"photo {photo}: {size[0]}x{size[1]} (w x h) from {sample} box {tuple(round(v, 2) for v in box)}, "
              f"{kib:.1f} KiB")
        if kib > 80:
            raise AssertionError(f"{photo}.jpg is {kib:.1f} KiB, over 80")
        paths[photo] = path
    return paths


def read_photo(path):
    from PIL import Image

    return Image.open(path).convert("RGB")


def find_crop(resized, crop):
    """(top, left) where `crop` (HxWx3) sits in `resized` (HxWx3), found by exact search; it must be unique."""
    rows, cols = resized.shape[0] - crop.shape[0], resized.shape[1] - crop.shape[1]
    found = [(top, left) for top in range(rows + 1) for left in range(cols + 1)
             if np.array_equal(resized[top, left], crop[0, 0])
             and np.array_equal(resized[top:top + crop.shape[0], left:left + crop.shape[1]], crop)]
    if len(found) != 1:
        raise AssertionError(f"crop found at {found}, not exactly once")
    return found[0]


def keep_first_photo(out, key, final_chw):
    """The final float32 model input's top-left 32x32 window (HWC) and its float64 per-channel sums."""
    final_chw = np.asarray(final_chw)
    if final_chw.dtype != np.float32 or final_chw.ndim != 3 or final_chw.shape[0] != 3:
        raise AssertionError(f"{key}: final input {final_chw.dtype} {final_chw.shape}")
    out[f"{key}/window"] = final_chw.transpose(1, 2, 0)[:32, :32].copy()
    out[f"{key}/channel_sums"] = final_chw.astype(np.float64).sum(axis=(1, 2))


def timm_steps(transform):
    """The eval transform's steps before the conversion to floats, and the rest (conversion and Normalize)."""
    from timm.data.transforms import MaybeToTensor
    from torchvision import transforms

    steps = list(transform.transforms)
    for index, step in enumerate(steps):
        if isinstance(step, (MaybeToTensor, transforms.ToTensor)):
            return steps[:index], steps[index:]
    raise AssertionError(f"no ToTensor in {transform}")


def write_timm_cases(photos, out):
    import timm
    from timm.data import create_transform, resolve_data_config
    from timm.models._hub import load_model_config_from_path, save_config_for_hf
    from torchvision import transforms

    for case, name in TIMM_CASES.items():
        model = timm.create_model(name, pretrained=False).eval()
        config = resolve_data_config({}, model=model)
        transform = create_transform(**config)
        folder = os.path.join(FOLDER, case)
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(folder)
        save_config_for_hf(model, os.path.join(folder, "config.json"))
        # timm's own reader of the written file must resolve the same preprocessing.
        read_cfg, _, _ = load_model_config_from_path(folder)
        read_config = resolve_data_config({}, pretrained_cfg=read_cfg)
        if same_values(read_config) != same_values(config):
            raise AssertionError(f"{case}: config.json resolves to {read_config}, the model to {config}")
        del model

        before, after = timm_steps(transform)
        normalize = after[-1]
        if not isinstance(normalize, transforms.Normalize) or len(after) != 2:
            raise AssertionError(f"{case}: unexpected tail {after}")
        applied_mean, applied_std = np.asarray(normalize.mean, np.float64), np.asarray(normalize.std, np.float64)
        if not (np.allclose(applied_mean, config["mean"], rtol=0, atol=1e-7)
                and np.allclose(applied_std, config["std"], rtol=0, atol=1e-7)):
            raise AssertionError(f"{case}: Normalize holds {applied_mean} {applied_std}, config {config}")
        out[f"{case}/mean"] = np.asarray(config["mean"], np.float64)
        out[f"{case}/std"] = np.asarray(config["std"], np.float64)
        out[f"{case}/data_config"] = json.dumps(config)
        out[f"{case}/model_name"] = name
        print(f"{case} ({name}): {config}")
        print(f"  transform: {[repr(step) for step in transform.transforms]}")

        for photo, path in photos.items():
            image = read_photo(path)
            for step in before[:-1]:  # the resize (the last step before ToTensor is the crop)
                image = step(image)
            resized = np.asarray(image)
            cropped = before[-1](image)
            pixels = np.asarray(cropped).copy()
            final = transform(read_photo(path))  # the whole pipeline, once more, from the file
            rebuilt = normalize(after[0](cropped))
            if not torch.equal(final, rebuilt):
                raise AssertionError(f"{case}/{photo}: the steps do not rebuild the transform's output")
            key = f"{case}/{photo}"
            out[f"{key}/pixels"] = pixels
            out[f"{key}/resized_hw"] = np.array(resized.shape[:2])
            out[f"{key}/crop_top_left"] = np.array(find_crop(resized, pixels))
            if photo == FIRST_PHOTO:
                keep_first_photo(out, key, final.numpy())
            print(f"  {photo}: {image_size(path)} -> resized {resized.shape[1]}x{resized.shape[0]} -> "
                  f"crop {pixels.shape[1]}x{pixels.shape[0]} at (top, left) {tuple(out[f'{key}/crop_top_left'].tolist())}")


def same_values(config):
    """A data config with its sequences as tuples (timm keeps tuples, JSON gives lists)."""
    return {k: tuple(v) if isinstance(v, (list, tuple)) else v for k, v in config.items()}


def image_size(path):
    from PIL import Image

    with Image.open(path) as image:
        return "x".join(map(str, image.size))


def write_hf_cases(photos, out):
    import transformers

    for case, (class_name, checkpoint, values) in HF_CASES.items():
        processor_class = getattr(transformers, class_name)
        folder = os.path.join(FOLDER, case)
        shutil.rmtree(folder, ignore_errors=True)
        processor_class(**values).save_pretrained(folder)
        processor = processor_class.from_pretrained(folder)
        if type(processor) is not processor_class or processor.backend != "pil":
            raise AssertionError(f"{case}: read back as {type(processor).__name__} ({processor.backend})")
        expected_size, expected_crop = HF_EXPECTED_SIZES[case]
        size = {k: v for k, v in dict(processor.size).items() if v is not None}
        crop = None
        if processor.do_center_crop:
            crop = {k: v for k, v in dict(processor.crop_size).items() if v is not None}
        if size != expected_size or crop != expected_crop:
            raise AssertionError(f"{case}: size {size}, crop_size {crop}")
        mean = np.asarray(processor.image_mean, np.float64)
        std = np.asarray(processor.image_std, np.float64)
        scale = float(processor.rescale_factor)
        out[f"{case}/mean"], out[f"{case}/std"] = mean, std
        out[f"{case}/rescale_factor"] = np.float64(scale)
        out[f"{case}/data_config"] = json.dumps(processor.to_dict())
        out[f"{case}/hub_values"] = json.dumps(dict(checkpoint=checkpoint, **values))
        print(f"{case} ({class_name}, {checkpoint}): size {size}, crop_size {crop}, resample {processor.resample}, "
              f"rescale {scale}, mean {list(mean)}, std {list(std)}")

        for photo, path in photos.items():
            values_np = processor(images=read_photo(path), return_tensors="np")["pixel_values"]
            if values_np.dtype != np.float32 or values_np.shape[:2] != (1, 3):
                raise AssertionError(f"{case}/{photo}: pixel_values {values_np.dtype} {values_np.shape}")
            final = values_np[0]
            raw = (final.astype(np.float64).transpose(1, 2, 0) * std + mean) / scale
            error = np.abs(raw - np.round(raw)).max()
            if error > 1e-3 or raw.min() < -1e-3 or raw.max() > 255 + 1e-3:
                raise AssertionError(f"{case}/{photo}: recovered pixels off integers by {error}")
            pixels = np.round(raw).astype(np.uint8)
            key = f"{case}/{photo}"
            out[f"{key}/pixels"] = pixels
            # The resized image before the crop, from the same processor with its crop switched off.
            if processor.do_center_crop:
                resized_values = processor(images=read_photo(path), return_tensors="np", do_center_crop=False)
                resized = np.round((resized_values["pixel_values"][0].astype(np.float64).transpose(1, 2, 0)
                                    * std + mean) / scale).astype(np.uint8)
                top_left = find_crop(resized, pixels)
            else:
                resized, top_left = pixels, (0, 0)
            out[f"{key}/resized_hw"] = np.array(resized.shape[:2])
            out[f"{key}/crop_top_left"] = np.array(top_left)
            if photo == FIRST_PHOTO:
                keep_first_photo(out, key, final)
            print(f"  {photo}: {image_size(path)} -> resized {resized.shape[1]}x{resized.shape[0]} -> "
                  f"crop {pixels.shape[1]}x{pixels.shape[0]} at (top, left) {top_left}; off integers by {error:.2e}")


def write_predict_case(photos, out):
    import timm
    from timm.data import create_transform, resolve_data_config
    from timm.models._hub import save_for_hf

    case = "timm_predict"
    folder = os.path.join(FOLDER, case)
    model = timm.create_model(PREDICT_ARCH, pretrained=False, pretrained_cfg_overlay=PREDICT_CFG,
                              **PREDICT_ARGS).eval()
    randomise(model, torch.Generator().manual_seed(400))
    shutil.rmtree(folder, ignore_errors=True)
    save_for_hf(model, folder, model_config=dict(label_names=PREDICT_LABELS), safe_serialization=True)
    for stale in set(os.listdir(folder)) - {"config.json", "model.safetensors"}:
        os.remove(os.path.join(folder, stale))
    with open(os.path.join(folder, "config.json")) as f:
        written = json.load(f)
    if written.get("label_names") != PREDICT_LABELS:
        raise AssertionError(f"label_names written as {written.get('label_names')}")

    # timm's own reader of the folder (config.json and the weights) ...
    loaded = timm.create_model(f"local-dir:{folder}", pretrained=True).eval()
    # ... and the architecture with the written model_args and a strict load of the safetensors.
    again = timm.create_model(PREDICT_ARCH, pretrained=False, **written["model_args"]).eval()
    timm.models.load_checkpoint(again, os.path.join(folder, "model.safetensors"), strict=True)
    config = resolve_data_config({}, model=loaded)
    if same_values(config) != same_values(PREDICT_CFG):
        raise AssertionError(f"the folder's data config is {config}, not {PREDICT_CFG}")
    if loaded.pretrained_cfg.get("label_names") != PREDICT_LABELS:
        raise AssertionError("the folder's label_names did not come back")
    transform = create_transform(**config)
    before, _ = timm_steps(transform)

    image = read_photo(photos[FIRST_PHOTO])
    batch = transform(image)[None]
    pixels = image
    for step in before:
        pixels = step(pixels)
    with torch.no_grad():
        logits = model(batch)
        for other in (loaded, again):
            if not torch.equal(other(batch), logits):
                raise AssertionError("timm read its own files back differently")
        probabilities = torch.softmax(logits, dim=-1)
        top5 = torch.topk(probabilities, 5, dim=-1)
    out[f"{case}/data_config"] = json.dumps(config)
    out[f"{case}/photo"] = FIRST_PHOTO
    out[f"{case}/pixels"] = np.asarray(pixels).copy()
    out[f"{case}/logits"] = logits[0].numpy().astype(np.float32)
    out[f"{case}/top5_indices"] = top5.indices[0].numpy().astype(np.int64)
    out[f"{case}/top5_probabilities"] = top5.values[0].numpy().astype(np.float32)
    sizes = {name: os.path.getsize(os.path.join(folder, name)) for name in sorted(os.listdir(folder))}
    print(f"{case} ({PREDICT_ARCH} {PREDICT_ARGS}): {config}; files {sizes}")
    print(f"  transform: {[repr(step) for step in transform.transforms]}")
    print(f"  logits {np.round(out[f'{case}/logits'], 4)}")
    ranked = zip(top5.indices[0].tolist(), top5.values[0].tolist())
    print(f"  top5 {[(index, PREDICT_LABELS[index], round(p, 4)) for index, p in ranked]}")


def main():
    import PIL
    import timm
    import torchvision
    import transformers

    versions = dict(timm=timm.__version__, transformers=transformers.__version__,
                    torchvision=torchvision.__version__, torch=torch.__version__, pillow=PIL.__version__)
    print(f"versions {versions}")
    photos = write_photos()
    out = {"versions": json.dumps(versions), "photos": np.array(list(photos))}
    write_timm_cases(photos, out)
    write_hf_cases(photos, out)
    write_predict_case(photos, out)
    np.savez_compressed(REFERENCE, **out)
    mib = os.path.getsize(REFERENCE) / 2**20
    print(f"{REFERENCE}: {len(out)} arrays, {mib:.2f} MiB")
    if mib > 4:
        raise AssertionError("the reference npz is over 4 MiB")


if __name__ == "__main__":
    main()
