"""Write the reference fixtures in tests/fixtures/ from timm, an independent ViT.

Run in a separate venv that has timm (it needs torchvision, which is large):

    python -m venv /tmp/timm-venv
    /tmp/timm-venv/bin/pip install torch==2.14.1 torchvision==0.29.1 timm scipy
    /tmp/timm-venv/bin/python tools/make_fixtures.py [--full-size-dir DIR]

For each small model it builds a timm `VisionTransformer` with tanh GELU,
fills every tensor with random values, writes it as an original-layout
`.npz` (and once in the big_vision layout with scanned blocks, once with big_vision's MAP head), reads that
file back with timm's own `.npz` loader to prove the layout, and stores the
logits timm computes for fixed random images. It also stores interpolation
references (torch and scipy) and the parameter counts of the named variants.
Hybrid (ResNet+ViT) cases use timm's hybrid model with the original Flax
model's two epsilons (weight standardisation divides by `std + 1e-5`,
GroupNorm adds 1e-6; timm's defaults are `sqrt(var + 1e-8)` and 1e-5), so
the logits are those of the released checkpoints' own arithmetic.
With `--full-size-dir`, it writes a full ViT-B/16 and R50+ViT-B/16 checkpoint
and their logits there (too big to commit) for `tools/check_full_size.py`.
"""

import argparse
import json
import os
from functools import partial

import numpy as np
import scipy.ndimage
import torch
import torch.nn.functional as F
from timm.layers import GroupNormAct, HybridEmbed, StdConv2dSame
from timm.models.resnetv2 import ResNetV2
from timm.models.vision_transformer import VisionTransformer, _load_weights

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures")
GELU_TANH = partial(torch.nn.GELU, approximate="tanh")


def numpy(tensor):
    return tensor.detach().cpu().numpy().astype(np.float32)


def randomise(model, generator, scale=0.2, keep_init=False):
    """Random values in every tensor, so no mapping error can hide behind zeros or ones.

    `keep_init=True` adds the noise to timm's initialisation instead, which
    keeps a deep, wide model's activations at realistic scales.
    """
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator) * scale
            if keep_init:
                noise = noise + parameter
            elif name.endswith(("norm1.weight", "norm2.weight")) or name == "norm.weight":
                noise = noise + 1.0
            parameter.copy_(noise)


class OriginalStdConv2dSame(StdConv2dSame):
    """timm's weight-standardised conv with the original's `(w - mean) / (std + 1e-5)`."""

    def forward(self, x):
        from timm.layers.padding import pad_same

        if self.same_pad:
            x = pad_same(x, self.kernel_size, self.stride, self.dilation)
        weight = self.weight
        centred = weight - weight.mean(dim=(1, 2, 3), keepdim=True)
        std = centred.square().mean(dim=(1, 2, 3), keepdim=True).sqrt()
        return F.conv2d(x, centred / (std + 1e-5), self.bias, self.stride, self.padding, self.dilation, self.groups)


def resnet_to_original_layout(backbone):
    """timm's ResNetV2 (non-pre-activation) -> `conv_root`, `gn_root`, `block{i}/unit{j}/...`."""
    out = {
        "conv_root/kernel": numpy(backbone.stem.conv.weight).transpose(2, 3, 1, 0),
        "gn_root/scale": numpy(backbone.stem.norm.weight),
        "gn_root/bias": numpy(backbone.stem.norm.bias),
    }
    for i, stage in enumerate(backbone.stages, start=1):
        for j, block in enumerate(stage.blocks, start=1):
            base = f"block{i}/unit{j}/"
            layers = [(f"conv{r}", f"gn{r}", getattr(block, f"conv{r}"), getattr(block, f"norm{r}")) for r in (1, 2, 3)]
            if block.downsample is not None:
                layers.append(("conv_proj", "gn_proj", block.downsample.conv, block.downsample.norm))
            for conv_name, norm_name, conv, norm in layers:
                out[base + f"{conv_name}/kernel"] = numpy(conv.weight).transpose(2, 3, 1, 0)
                out[base + f"{norm_name}/scale"] = numpy(norm.weight)
                out[base + f"{norm_name}/bias"] = numpy(norm.bias)
    return out


def to_original_layout(model, pre_logits=None):
    """timm -> the original vision_transformer `.npz` names and layouts."""
    hidden = model.embed_dim
    heads = model.blocks[0].attn.num_heads
    out = {
        "embedding/kernel": numpy(model.patch_embed.proj.weight).transpose(2, 3, 1, 0),
        "embedding/bias": numpy(model.patch_embed.proj.bias),
        "Transformer/posembed_input/pos_embedding": numpy(model.pos_embed),
        "Transformer/encoder_norm/scale": numpy(model.norm.weight),
        "Transformer/encoder_norm/bias": numpy(model.norm.bias),
    }
    if model.cls_token is not None:
        out["cls"] = numpy(model.cls_token)
    if hasattr(model.patch_embed, "backbone"):
        out.update(resnet_to_original_layout(model.patch_embed.backbone))
    for index, block in enumerate(model.blocks):
        base = f"Transformer/encoderblock_{index}/"
        attention = base + "MultiHeadDotProductAttention_1/"
        out[base + "LayerNorm_0/scale"] = numpy(block.norm1.weight)
        out[base + "LayerNorm_0/bias"] = numpy(block.norm1.bias)
        out[base + "LayerNorm_2/scale"] = numpy(block.norm2.weight)
        out[base + "LayerNorm_2/bias"] = numpy(block.norm2.bias)
        kernels = numpy(block.attn.qkv.weight).reshape(3, hidden, hidden)
        biases = numpy(block.attn.qkv.bias).reshape(3, heads, hidden // heads)
        for part, name in enumerate(("query", "key", "value")):
            out[attention + f"{name}/kernel"] = kernels[part].T.reshape(hidden, heads, -1)
            out[attention + f"{name}/bias"] = biases[part]
        out[attention + "out/kernel"] = numpy(block.attn.proj.weight).T.reshape(heads, -1, hidden)
        out[attention + "out/bias"] = numpy(block.attn.proj.bias)
        for dense, layer in (("Dense_0", block.mlp.fc1), ("Dense_1", block.mlp.fc2)):
            out[base + f"MlpBlock_3/{dense}/kernel"] = numpy(layer.weight).T
            out[base + f"MlpBlock_3/{dense}/bias"] = numpy(layer.bias)
    if pre_logits is not None:
        out["pre_logits/kernel"], out["pre_logits/bias"] = pre_logits["kernel"], pre_logits["bias"]
        out["head/kernel"], out["head/bias"] = pre_logits["head_kernel"], pre_logits["head_bias"]
    else:
        out["head/kernel"] = numpy(model.head.weight).T
        out["head/bias"] = numpy(model.head.bias)
    return out


def to_big_vision_layout(original):
    """The same weights under big_vision's names, with scanned (stacked) blocks."""
    renames = {
        "MultiHeadDotProductAttention_1": "MultiHeadDotProductAttention_0",
        "LayerNorm_2": "LayerNorm_1",
        "MlpBlock_3": "MlpBlock_0",
    }
    out, blocks = {}, {}
    for key, value in original.items():
        if key.startswith("Transformer/encoderblock_"):
            index, _, rest = key[len("Transformer/encoderblock_"):].partition("/")
            for old, new in renames.items():
                rest = rest.replace(old, new)
            blocks.setdefault(rest, {})[int(index)] = value
        elif key == "Transformer/posembed_input/pos_embedding":
            out["params/pos_embedding"] = value
        else:
            out["params/" + key] = value
    for rest, by_index in blocks.items():
        out["params/Transformer/encoderblock/" + rest] = np.stack([by_index[i] for i in sorted(by_index)])
    return out


def to_big_vision_map_layout(model):
    """A timm `global_pool="map"` model under big_vision's names, blocks unscanned: its `MAPHead_0` (probe, attention,
    LayerNorm, MlpBlock), a top-level `pos_embedding` and the `_0`/`_1` block modules."""
    hidden, pool = model.embed_dim, model.attn_pool
    heads = pool.num_heads
    original = to_original_layout(model)
    out = {}
    for key, value in original.items():
        for old, new in (("MultiHeadDotProductAttention_1", "MultiHeadDotProductAttention_0"),
                         ("LayerNorm_2", "LayerNorm_1"), ("MlpBlock_3", "MlpBlock_0")):
            key = key.replace(old, new)
        out["pos_embedding" if key == "Transformer/posembed_input/pos_embedding" else key] = value
    base = "MAPHead_0/"
    attention = base + "MultiHeadDotProductAttention_0/"
    out[base + "probe"] = numpy(pool.latent)
    key_value = numpy(pool.kv.weight).reshape(2, hidden, hidden)
    key_value_bias = numpy(pool.kv.bias).reshape(2, heads, hidden // heads)
    projections = {"query": (numpy(pool.q.weight), numpy(pool.q.bias).reshape(heads, -1)),
                   "key": (key_value[0], key_value_bias[0]), "value": (key_value[1], key_value_bias[1])}
    for name, (kernel, bias) in projections.items():
        out[attention + f"{name}/kernel"] = kernel.T.reshape(hidden, heads, -1)
        out[attention + f"{name}/bias"] = bias
    out[attention + "out/kernel"] = numpy(pool.proj.weight).T.reshape(heads, -1, hidden)
    out[attention + "out/bias"] = numpy(pool.proj.bias)
    out[base + "LayerNorm_0/scale"] = numpy(pool.norm.weight)
    out[base + "LayerNorm_0/bias"] = numpy(pool.norm.bias)
    for dense, layer in (("Dense_0", pool.mlp.fc1), ("Dense_1", pool.mlp.fc2)):
        out[base + f"MlpBlock_0/{dense}/kernel"] = numpy(layer.weight).T
        out[base + f"MlpBlock_0/{dense}/bias"] = numpy(layer.bias)
    return out


def write_map_case():
    """`vit_map_big_vision.npz`: big_vision's MAP-head ViT (`pool_type="map"`, no class token), timm's
    `global_pool="map"` model with tanh GELU, written under big_vision's names and read back by timm's own `.npz`
    loader; its logits in `vit_map_big_vision_reference.npz`. Its own random streams: the other fixtures stay."""
    generator = torch.Generator().manual_seed(7)
    rng = np.random.default_rng(7)
    kwargs = dict(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=3, mlp_ratio=2.0, num_classes=10,
                  act_layer=GELU_TANH, class_token=False, global_pool="map", fc_norm=False)
    model = VisionTransformer(**kwargs).eval()
    model.fixture_factory = partial(VisionTransformer, **kwargs)
    randomise(model, generator)
    with torch.no_grad():
        model.attn_pool.norm.weight.add_(1.0)
    path = os.path.join(FIXTURES, "vit_map_big_vision.npz")
    arrays = to_big_vision_map_layout(model)
    np.savez(path, **arrays)
    check_timm_reads(model, path)
    images = rng.uniform(-1, 1, size=(2, 32, 32, 3)).astype(np.float32)
    with torch.no_grad():
        logits = numpy(model(torch.from_numpy(images.transpose(0, 3, 1, 2))))
    np.savez(os.path.join(FIXTURES, "vit_map_big_vision_reference.npz"), images=images, logits=logits)
    print(f"vit_map_big_vision: logits {logits.shape}, {len(arrays)} arrays")


def check_timm_reads(model, path):
    """Load the written file with timm's own loader and require identical tensors."""
    fresh = model.fixture_factory()
    _load_weights(fresh, path)
    for (name, expected), (_, loaded) in zip(model.state_dict().items(), fresh.state_dict().items()):
        if not torch.equal(expected, loaded):
            raise AssertionError(f"timm read back {name} differently from {path}")


def small_model(generator, image_size, class_token=True, num_classes=10):
    kwargs = dict(
        img_size=image_size, patch_size=8, embed_dim=48, depth=2, num_heads=3, mlp_ratio=2.0,
        num_classes=num_classes, act_layer=GELU_TANH, class_token=class_token,
        global_pool="token" if class_token else "avg", fc_norm=False,
    )
    model = VisionTransformer(**kwargs).eval()
    model.fixture_factory = partial(VisionTransformer, **kwargs)
    randomise(model, generator)
    return model


def hybrid(image_size, layers, width=64, embed_dim=768, depth=12, num_heads=12, num_classes=1000,
           original_numerics=True, act_layer=GELU_TANH, **kwargs):
    """timm's ResNet+ViT hybrid: ResNetV2 without pre-activation, SAME padding, 1x1 patches."""
    conv = OriginalStdConv2dSame if original_numerics else partial(StdConv2dSame, eps=1e-8)
    norm = partial(GroupNormAct, num_groups=32, eps=1e-6 if original_numerics else 1e-5)

    def build():
        backbone = ResNetV2(layers=layers, channels=tuple(4 * width * 2**i for i in range(4)),
                            stem_chs=width, num_classes=0, global_pool="", preact=False,
                            stem_type="same", conv_layer=conv, norm_layer=norm)
        return VisionTransformer(img_size=image_size, patch_size=1, embed_dim=embed_dim, depth=depth,
                                 num_heads=num_heads, num_classes=num_classes, act_layer=act_layer,
                                 embed_layer=partial(HybridEmbed, backbone=backbone), **kwargs)

    model = build().eval()
    model.fixture_factory = build
    return model


def small_hybrid(generator, image_size):
    model = hybrid(image_size, layers=(1, 2), width=32, embed_dim=48, depth=2, num_heads=3,
                   mlp_ratio=2.0, num_classes=10)
    randomise(model, generator)
    with torch.no_grad():  # GroupNorm scales near 1, as trained ones are, so activations stay O(1).
        for name, parameter in model.named_parameters():
            if "backbone" in name and "norm" in name and name.endswith("weight"):
                parameter.add_(1.0)
    return model


def write_case(name, model, images, pre_logits=None, extra_layouts=()):
    arrays = to_original_layout(model, pre_logits)
    path = os.path.join(FIXTURES, f"{name}.npz")
    np.savez(path, **arrays)
    check_timm_reads(model, path)  # timm skips pre-logits; every other tensor must match.
    with torch.no_grad():
        batch = torch.from_numpy(images.transpose(0, 3, 1, 2))
        if pre_logits is None:
            logits = numpy(model(batch))
        else:  # timm dropped the representation layer: finish the head in numpy.
            features = numpy(model.forward_head(model.forward_features(batch), pre_logits=True))
            hidden = np.tanh(features.astype(np.float64) @ pre_logits["kernel"] + pre_logits["bias"])
            logits = (hidden @ pre_logits["head_kernel"] + pre_logits["head_bias"]).astype(np.float32)
    np.savez(os.path.join(FIXTURES, f"{name}_reference.npz"), images=images, logits=logits)
    for suffix, layout in dict(extra_layouts).items():
        layout_path = os.path.join(FIXTURES, f"{name}_{suffix}.npz")
        np.savez(layout_path, **layout(arrays))
        check_timm_reads(model, layout_path)
    print(f"{name}: logits {logits.shape}, {len(arrays)} arrays")


def write_resize_references(rng):
    """Interpolation references: torch (half-pixel) and scipy (align corners)."""
    cases = {}
    table = rng.normal(size=(1, 1 + 7 * 7, 6)).astype(np.float32)
    grid = torch.from_numpy(table[:, 1:].reshape(1, 7, 7, 6).transpose(0, 3, 1, 2))
    cases["table"] = table
    for mode in ("bilinear", "bicubic"):
        for antialias in (False, True):
            for new in ((12, 12), (5, 9), (3, 3)):
                resized = F.interpolate(grid, size=new, mode=mode, align_corners=False, antialias=antialias)
                patches = numpy(resized).transpose(0, 2, 3, 1).reshape(1, -1, 6)
                key = f"torch_{mode}_aa{int(antialias)}_{new[0]}x{new[1]}"
                cases[key] = np.concatenate([table[:, :1], patches], axis=1)
    for new in (12, 5):
        zoomed = scipy.ndimage.zoom(table[0, 1:].reshape(7, 7, 6), (new / 7, new / 7, 1), order=1)
        cases[f"scipy_zoom_{new}"] = np.concatenate([table[:, :1], zoomed.reshape(1, -1, 6)], axis=1)
    np.savez(os.path.join(FIXTURES, "resize_reference.npz"), **cases)
    print(f"resize: {len(cases) - 1} references")


def write_patch_resize_references():
    """timm's `resample_patch_embed` (FlexiViT PI-resize) of random kernels, in timm's (out, in, h, w) layout."""
    from timm.layers import resample_patch_embed

    rng = np.random.default_rng(1)  # Its own stream: the other fixtures stay as they are.
    kernel = torch.from_numpy(rng.normal(size=(8, 3, 4, 4)).astype(np.float32))
    cases = {"kernel": numpy(kernel)}
    for interpolation, antialias in (("bicubic", True), ("bilinear", False)):
        for new in ((8, 8), (6, 5), (2, 2)):
            resized = resample_patch_embed(kernel, list(new), interpolation=interpolation, antialias=antialias)
            cases[f"{interpolation}_aa{int(antialias)}_{new[0]}x{new[1]}"] = numpy(resized)
    np.savez(os.path.join(FIXTURES, "patch_resize_reference.npz"), **cases)
    print(f"patch resize: {len(cases) - 1} references")


def write_dynamic_references():
    """timm's `dynamic_img_size` logits and `forward_intermediates` of the `vit_token` fixture's weights.

    The weights are read from `vit_token.npz` by timm's own loader into a model
    built with `dynamic_img_size=True` (bicubic, anti-aliased position resize).
    """
    rng = np.random.default_rng(2)  # Its own stream: the other fixtures stay as they are.
    kwargs = dict(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=3, mlp_ratio=2.0, num_classes=10,
                  act_layer=GELU_TANH, global_pool="token", fc_norm=False, dynamic_img_size=True)
    model = VisionTransformer(**kwargs).eval()
    _load_weights(model, os.path.join(FIXTURES, "vit_token.npz"))
    cases = {}
    with torch.no_grad():
        for height, width in ((24, 40), (48, 48), (32, 32)):
            images = rng.uniform(-1, 1, size=(2, height, width, 3)).astype(np.float32)
            batch = torch.from_numpy(images.transpose(0, 3, 1, 2))
            key = f"{height}x{width}"
            cases[f"images_{key}"] = images
            cases[f"logits_{key}"] = numpy(model(batch))
            for norm in (False, True):
                maps = model.forward_intermediates(batch, indices=[0, 1], norm=norm, output_fmt="NCHW",
                                                   intermediates_only=True)
                for index, features in enumerate(maps):
                    cases[f"features_{key}_block{index}_norm{int(norm)}"] = numpy(features).transpose(0, 2, 3, 1)  # NHWC
    np.savez(os.path.join(FIXTURES, "vit_token_dynamic_reference.npz"), **cases)
    print(f"dynamic: {len(cases)} arrays")


def write_timm_hub_references():
    """A tiny timm ViT as timm publishes one on the Hub: `config.json` + `model.safetensors`, by timm's own writer.

    Built with `timm.create_model` (exact GELU, as every timm ViT), random
    values in every tensor, saved with `save_for_hf` (with class labels), read back by
    `timm.models.load_checkpoint(..., strict=True)`; the
    logits of fixed images and timm's state-dict names and shapes are kept.
    """
    import json

    import timm
    from timm.models._hub import save_for_hf

    generator = torch.Generator().manual_seed(3)
    rng = np.random.default_rng(3)  # Its own stream: the other fixtures stay as they are.
    args = dict(img_size=32, patch_size=8, embed_dim=24, depth=2, num_heads=3, mlp_ratio=2.0, num_classes=5)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, **args).eval()
    randomise(model, generator)
    folder = os.path.join(FIXTURES, "timm_hub")
    # Class labels as timm writes them: ids (label_names) and readable descriptions.
    labels = dict(label_names=[f"d{i}" for i in range(5)], label_descriptions={f"d{i}": f"digit {i}" for i in range(5)})
    save_for_hf(model, folder, model_config=labels, safe_serialization=True)
    weights = os.path.join(folder, "model.safetensors")
    for stale in set(os.listdir(folder)) - {"config.json", "model.safetensors"}:
        os.remove(os.path.join(folder, stale))  # pytorch_model.bin: the fixture keeps only the safetensors
    again = timm.create_model("vit_tiny_patch16_224", pretrained=False, **args).eval()
    timm.models.load_checkpoint(again, weights, strict=True)
    images = rng.uniform(-1, 1, size=(2, 32, 32, 3)).astype(np.float32)
    with torch.no_grad():
        batch = torch.from_numpy(images.transpose(0, 3, 1, 2))
        logits = numpy(model(batch))
        if not np.array_equal(logits, numpy(again(batch))):
            raise AssertionError("timm read its own files back differently")
    names = json.dumps({name: list(tensor.shape) for name, tensor in model.state_dict().items()})
    np.savez(os.path.join(FIXTURES, "timm_hub_reference.npz"), images=images, logits=logits, state_dict_shapes=names)
    print(f"timm hub: {sorted(os.listdir(folder))}, logits {logits.shape}")


def write_transformers_references():
    """A tiny `ViTForImageClassification` as `save_pretrained` writes it (layer_norm_eps 1e-12, exact GELU).

    Random values in every tensor; the folder is read back with
    `from_pretrained` and must give the same logits.
    """
    from transformers import ViTConfig, ViTForImageClassification

    generator = torch.Generator().manual_seed(4)
    rng = np.random.default_rng(4)  # Its own stream: the other fixtures stay as they are.
    config = ViTConfig(image_size=32, patch_size=8, hidden_size=24, num_hidden_layers=2, num_attention_heads=3,
                       intermediate_size=48, num_labels=5, id2label={i: f"digit {i}" for i in range(5)},
                       label2id={f"digit {i}": i for i in range(5)})
    model = ViTForImageClassification(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator) * 0.2
            parameter.copy_(noise + (1.0 if "layernorm" in name and name.endswith("weight") else 0.0))
    folder = os.path.join(FIXTURES, "transformers_vit")
    model.save_pretrained(folder)
    again = ViTForImageClassification.from_pretrained(folder).eval()
    images = rng.uniform(-1, 1, size=(2, 32, 32, 3)).astype(np.float32)
    with torch.no_grad():
        batch = torch.from_numpy(images.transpose(0, 3, 1, 2))
        logits = numpy(model(pixel_values=batch).logits)
        if not np.array_equal(logits, numpy(again(pixel_values=batch).logits)):
            raise AssertionError("transformers read its own files back differently")
    np.savez(os.path.join(FIXTURES, "transformers_vit_reference.npz"), images=images, logits=logits)
    print(f"transformers: {sorted(os.listdir(folder))}, logits {logits.shape}")


def write_parameter_counts():
    sizes = {"Ti": (192, 12, 3), "S": (384, 12, 6), "B": (768, 12, 12), "L": (1024, 24, 16), "H": (1280, 32, 16)}
    counts = {}
    for name in ("Ti16", "S16", "S32", "B8", "B16", "B32", "L16", "L32", "H14"):
        width, patch = name.rstrip("0123456789"), int(name.lstrip("TiSBLH"))
        dim, depth, heads = sizes[width]
        with torch.device("meta"):
            model = VisionTransformer(img_size=224, patch_size=patch, embed_dim=dim, depth=depth,
                                      num_heads=heads, num_classes=1000)
        counts[f"ViT_{name}"] = sum(p.numel() for p in model.parameters())
    hybrids = {"R50_B16": ((3, 4, 9), "B"), "R26_B32": ((2, 2, 2, 2), "B"),
               "R26_S32": ((2, 2, 2, 2), "S"), "R50_L32": ((3, 4, 6, 3), "L")}
    for name, (layers, width) in hybrids.items():
        dim, depth, heads = sizes[width]
        with torch.device("meta"):
            model = hybrid(224, layers, embed_dim=dim, depth=depth, num_heads=heads)
        counts[f"ViT_{name}"] = sum(p.numel() for p in model.parameters())
    with open(os.path.join(FIXTURES, "parameter_counts.json"), "w") as f:
        json.dump(counts, f, indent=1)
    print("parameter counts:", counts)


def write_full_size(directory, generator, rng):
    os.makedirs(directory, exist_ok=True)
    kwargs = dict(img_size=224, patch_size=16, embed_dim=768, depth=12, num_heads=12,
                  num_classes=1000, act_layer=GELU_TANH)
    model = VisionTransformer(**kwargs).eval()
    model.fixture_factory = partial(VisionTransformer, **kwargs)
    models = {"ViT-B_16": model, "R50+ViT-B_16": hybrid(224, (3, 4, 9))}
    images = rng.uniform(-1, 1, size=(2, 224, 224, 3)).astype(np.float32)
    for name, model in models.items():
        randomise(model, generator, scale=0.02, keep_init=True)
        path = os.path.join(directory, f"{name}.npz")
        np.savez(path, **to_original_layout(model))
        check_timm_reads(model, path)
        with torch.no_grad():
            logits = numpy(model(torch.from_numpy(images.transpose(0, 3, 1, 2))))
        np.savez(os.path.join(directory, f"{name}_reference.npz"), images=images, logits=logits)
        print(f"full-size {name} written to", directory)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full-size-dir", help="also write a full ViT-B/16 checkpoint here")
    parser.add_argument("--only", choices=["patch_resize", "dynamic", "timm_hub", "transformers", "map"],
                        help="write only this fixture")
    args = parser.parse_args()
    os.makedirs(FIXTURES, exist_ok=True)
    if args.only:
        {"patch_resize": write_patch_resize_references, "dynamic": write_dynamic_references,
         "timm_hub": write_timm_hub_references, "transformers": write_transformers_references,
         "map": write_map_case}[args.only]()
        return
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    rng = np.random.default_rng(0)

    def images(height, width):
        return rng.uniform(-1, 1, size=(2, height, width, 3)).astype(np.float32)

    write_case("vit_token", small_model(generator, 32), images(32, 32),
               extra_layouts={"big_vision": to_big_vision_layout})
    write_case("vit_gap", small_model(generator, 32, class_token=False), images(32, 32))
    write_case("vit_nonsquare", small_model(generator, (24, 40)), images(24, 40))
    representation = {
        "kernel": rng.normal(scale=0.2, size=(48, 32)).astype(np.float32),
        "bias": rng.normal(scale=0.2, size=(32,)).astype(np.float32),
        "head_kernel": rng.normal(scale=0.2, size=(32, 10)).astype(np.float32),
        "head_bias": rng.normal(scale=0.2, size=(10,)).astype(np.float32),
    }
    write_case("vit_prelogits", small_model(generator, 32, num_classes=0), images(32, 32),
               pre_logits=representation)
    write_resize_references(rng)
    write_parameter_counts()
    write_case("hybrid_token", small_hybrid(generator, 32), images(32, 32))
    write_case("hybrid_nonsquare", small_hybrid(generator, (24, 40)), images(24, 40))
    write_patch_resize_references()
    write_dynamic_references()
    write_timm_hub_references()
    write_transformers_references()
    write_map_case()
    if args.full_size_dir:
        write_full_size(args.full_size_dir, generator, rng)


if __name__ == "__main__":
    main()
