"""Write reference fixtures for the timm ViT families and transformers' DINOv2 into tests/fixtures/.

Run in the same separate venv as tools/make_fixtures.py (timm needs torchvision,
which is large), with transformers and safetensors added:

    python -m venv /tmp/timm-venv
    /tmp/timm-venv/bin/pip install torch==2.14.1 torchvision==0.29.1 timm transformers safetensors scipy
    /tmp/timm-venv/bin/python tools/make_family_fixtures.py [--only timm|transformers|towers|resize|fields|timm_hybrid] \
        [--case NAME ...]

Nothing is downloaded: every model is built with `pretrained=False`.

For each case in `CASES` it builds the real timm architecture with
`timm.create_model(arch, pretrained=False, **model_args)`, where `model_args`
only shrinks it (image, patch and embedding size, depth, heads, classes), so
every family switch (class and register tokens, `no_embed_class`, pre-norm,
fc_norm, MAP pooling, layer scale, QuickGELU, SwiGLUPacked, epsilons) stays
exactly as timm defines it. Every tensor gets random values (norm weights
around 1, layer-scale gammas around 0.5 so they matter, biases, tokens and
position tables around 0). The model is written by timm's own
`save_for_hf(..., safe_serialization=True)` to `tests/fixtures/timm_family/<case>/`
(only `config.json` and `model.safetensors` are kept), read back by a fresh
`timm.create_model(..., **model_args)` and `timm.models.load_checkpoint(..., strict=True)`,
and must give identical outputs. `tests/fixtures/timm_family_reference.npz`
keeps, per case, `<case>/images` (NHWC), `<case>/outputs` (`model(x)`: logits,
or pooled features when headless), `<case>/features` (`forward_features`),
`<case>/state_dict_shapes`, `<case>/model_args`, `<case>/architecture` and
`<case>/switches` (what timm actually built, as JSON). `dinov2_reg` also
keeps `forward_intermediates` outputs and `dynamic_img_size=True` outputs
at a non-square size.

The transformers cases write a tiny `Dinov2Model` and
`Dinov2WithRegistersModel` with `save_pretrained` to
`tests/fixtures/transformers_dinov2{,_registers}/`, read them back with
`from_pretrained`, and keep `last_hidden_state` and `pooler_output` of images
of exactly the configured size (so neither model interpolates its position
table) in `tests/fixtures/transformers_dinov2_reference.npz`.

`--only towers` writes a tiny `CLIPVisionModel`, a whole `SiglipModel`
(text tower included, as the Hub's SigLIP repositories are) and a
`SiglipVisionModel` with `vision_use_head: false` (PaliGemma's towers: no
head, no `pooler_output`) with their image processors'
`preprocessor_config.json`, to
`tests/fixtures/transformers_{clip_vision,siglip,siglip_no_head}/`
(`--case` rewrites only those named). The references in
`transformers_vision_towers_reference.npz` are the vision tower's outputs
for `images` in [-1, 1] (keras_vit's input) normalised by the processor's
statistics.

`--only resize` builds nothing: it reads the five transformers fixture
folders above with `from_pretrained` and keeps, in
`transformers_resize_reference.npz`, their outputs at other image sizes
than the configured 32 (`RESIZE_SIZES`), where transformers interpolates
the position table itself (`interpolate_pos_encoding=True`; DINOv2 always
does): `images/<height>x<width>` (one image in keras_vit's [-1, 1], shared
by the cases) and `<case>/<height>x<width>` (ViT's logits, the others'
`pooler_output`).

`--only timm_hybrid` writes tiny ResNet hybrids (`tools/timm_hybrid_fixtures.py`).

`--only fields` writes `transformers_config_fields.json`: the fields (and
defaults) of each config class the folder readers read, from the
installed transformers, so a test checks that the readers decide on every
one of them.
"""

import argparse
import json
import os
import shutil

import numpy as np
import torch
import torch.nn as nn

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures")
TIMM_FOLDER = os.path.join(FIXTURES, "timm_family")
KEEP = {"config.json", "model.safetensors"}

# case -> (timm architecture, model_args). Only sizes are overridden, plus the
# switch a case is about where timm has no such architecture of its own.
SMALL = dict(img_size=32, patch_size=8, embed_dim=24, depth=2, num_heads=3)
DINO = dict(img_size=28, patch_size=7, embed_dim=24, depth=2, num_heads=3)
CASES = {
    "dinov2": ("vit_small_patch14_dinov2", dict(DINO, num_classes=0)),
    "dinov2_reg": ("vit_small_patch14_reg4_dinov2", dict(DINO, num_classes=0)),
    # mlp_ratio (2.66667 * 2), mlp_layer (SwiGLUPacked) and act_layer (SiLU) are the architecture's own.
    "dinov2_giant_swiglu": ("vit_giant_patch14_dinov2", dict(DINO, depth=1, num_classes=0)),
    "clip_openai_quickgelu": ("vit_base_patch16_clip_quickgelu_224", dict(SMALL, num_classes=8)),
    "clip_laion": ("vit_base_patch16_clip_224", dict(SMALL, num_classes=0)),
    "siglip_map": ("vit_base_patch16_siglip_224", dict(SMALL, num_classes=0)),
    "siglip_map_head": ("vit_base_patch16_siglip_224", dict(SMALL, num_classes=7)),
    "siglip_gap": ("vit_base_patch16_siglip_gap_224", dict(SMALL, num_classes=0)),
    "deit3": ("deit3_small_patch16_224", dict(SMALL, num_classes=10)),
    "deit": ("deit_small_patch16_224", dict(SMALL, num_classes=10)),
    "reg_gap": ("vit_medium_patch16_reg4_gap_256", dict(SMALL, num_classes=10)),
    # timm's own qkv_bias=False ViT with pretrained weights (MIIL ImageNet-21k, timm/ on the Hub).
    "no_qkv_bias": ("vit_base_patch16_224_miil", dict(SMALL, num_classes=10)),
    "qk_norm": ("vit_small_patch16_224", dict(SMALL, num_classes=10, qk_norm=True)),
    "flexivit": ("flexivit_small", dict(SMALL, num_classes=10)),
    "class_token_gap": ("vit_small_patch16_224", dict(SMALL, num_classes=6, global_pool="avg")),
    # The Hub's own configs have no model_args: timm's own tiny test_vit2 (1 register, no class token, avg pool,
    # layer scale) at its own sizes, with no model_args written (see write_timm_case).
    "hub_no_model_args": ("test_vit2", dict(num_classes=0)),
    # 46 px on 14-pixel patches, as so400m/14 at 384 px: timm's VALID convolution leaves 4 rows and columns unseen.
    "siglip_remainder": ("vit_so400m_patch14_siglip_384", dict(SMALL, img_size=46, patch_size=14, depth=1,
                                                               num_classes=0)),
    "post_norm": ("vit_base_patch16_rpn_224", dict(SMALL, num_classes=5)),
    "inner_norms": ("beit3_base_patch16_224", dict(SMALL, depth=1, num_classes=4)),
    "pool_include_prefix": ("test_vit3", dict(SMALL, depth=1, num_classes=0)),
    # RmsNorm everywhere and on the patches, the unpacked SwiGLU (fc1_g, fc1_x), no biases but the patches'.
    "aimv2": ("aimv2_large_patch14_224", dict(DINO, patch_size=14, depth=1, num_classes=5)),
    # timm's own RmsNorm test model (the norm at its default epsilon, fc_norm an RmsNorm too).
    "rms_norm": ("test_vit4", dict(SMALL, depth=1, num_classes=0)),
    # DiffAttention in two blocks (lambda_init depends on the block's index), registers, layer scale.
    "differential": ("vit_dwee_patch16_reg1_gap_256", dict(SMALL, embed_dim=32, num_heads=2, num_classes=6)),
    # ParallelScalingBlock (one in_proj, two output projections, one layer scale); without qkv biases the MLP's
    # is apart (mlp_bias).
    "parallel": ("vit_pwee_patch16_reg1_gap_256", dict(SMALL, embed_dim=32, num_heads=2, num_classes=6,
                                                       qkv_bias=False)),
    # DiffParallelScalingBlock: the same with differential attention and one fused out_proj; the MLP's bias and the
    # qkv biases in in_proj.bias.
    "parallel_differential": ("vit_dpwee_patch16_reg1_gap_256", dict(SMALL, embed_dim=32, num_heads=2,
                                                                     num_classes=0)),
    # Both differential blocks with qk_norm: timm normalises each half-width query and key.
    "differential_qk_norm": ("vit_dwee_patch16_reg1_gap_256", dict(SMALL, depth=1, embed_dim=32, num_heads=2,
                                                                   num_classes=6, qk_norm=True)),
    "parallel_differential_qk_norm": ("vit_dpwee_patch16_reg1_gap_256", dict(SMALL, depth=1, embed_dim=32,
                                                                             num_heads=2, num_classes=0,
                                                                             qk_norm=True)),
}
DYNAMIC_SIZE = (42, 28)  # dinov2_reg's dynamic_img_size images (height, width), a 6x4 grid from a 4x4 table.


def numpy(tensor):
    return tensor.detach().cpu().numpy().astype(np.float32)


def randomise(model, generator, scale=0.2):
    """Random values in every tensor, so no mapping error can hide behind zeros or ones.

    Norm weights (every LayerNorm/RmsNorm: block, pre, final, fc, q/k and
    attention-pool norms) are around 1, layer-scale gammas around 0.5 (not
    timm's 1e-5, so a missed layer scale changes the outputs), everything
    else (biases, tokens, position tables, latents) around 0.
    """
    from timm.layers import LayerScale, RmsNorm

    norm_weights, gammas = set(), set()
    for name, module in model.named_modules():
        prefix = f"{name}." if name else ""
        if isinstance(module, (nn.LayerNorm, RmsNorm)) and module.weight is not None:
            norm_weights.add(prefix + "weight")
        if isinstance(module, LayerScale):
            gammas.add(prefix + "gamma")
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator) * scale
            if name in norm_weights:
                noise = noise + 1.0
            elif name in gammas:
                noise = noise * 0.5 + 0.5
            parameter.copy_(noise)
    parameters = dict(model.named_parameters())
    missing = [name for name in model.state_dict() if name not in parameters]
    if missing:
        raise AssertionError(f"state-dict entries that are not parameters (not randomised): {missing}")


def norm_info(module):
    if isinstance(module, nn.Identity):
        return "Identity"
    return {"type": type(module).__name__, "eps": getattr(module, "eps", None),
            "affine": getattr(module, "weight", None) is not None}


def act_info(module):
    return {"type": type(module).__name__, "repr": repr(module)}


def switches(model):
    """What timm built, from the model itself: the answers a reader of these checkpoints must reproduce."""
    block = model.blocks[0]
    if not hasattr(block, "attn"):  # a parallel block: its parameters' shapes say what it is
        return {"block_type": type(block).__name__, "num_reg_tokens": model.num_reg_tokens,
                "global_pool": model.global_pool, "lambda_init": getattr(block, "lambda_init", None),
                "parameters": {name: list(value.shape) for name, value in block.named_parameters()}}
    attn, mlp = block.attn, block.mlp
    info = {
        "num_prefix_tokens": model.num_prefix_tokens,
        "num_reg_tokens": model.num_reg_tokens,
        "has_class_token": model.cls_token is not None,
        "no_embed_class": model.no_embed_class,
        "global_pool": model.global_pool,
        "pool_include_prefix": getattr(model, "pool_include_prefix", None),
        "pos_embed_shape": list(model.pos_embed.shape) if model.pos_embed is not None else None,
        "grid_size": list(model.patch_embed.grid_size),
        "patch_size": list(model.patch_embed.patch_size),
        "patch_embed_bias": model.patch_embed.proj.bias is not None,
        "patch_embed_norm": norm_info(model.patch_embed.norm),
        "norm_pre": norm_info(model.norm_pre),
        "norm": norm_info(model.norm),
        "fc_norm": norm_info(model.fc_norm),
        "block_norm1": norm_info(block.norm1),
        "block_norm2": norm_info(block.norm2),
        "block_type": type(block).__name__,
        "attn_type": type(attn).__name__,
        "num_heads": attn.num_heads,
        "head_dim": attn.head_dim,
        "qkv_bias": attn.qkv.bias is not None,
        "proj_bias": attn.proj.bias is not None,
        "q_norm": norm_info(attn.q_norm),
        "k_norm": norm_info(attn.k_norm),
        "attn_out_norm": norm_info(attn.norm),
        "layer_scale": not isinstance(getattr(block, "ls1", nn.Identity()), nn.Identity),  # ResPostBlock has none
        "layer_scale_type": type(getattr(block, "ls1", nn.Identity())).__name__,
        "mlp_type": type(mlp).__name__,
        "mlp_fc1": list(mlp.fc1.weight.shape) if hasattr(mlp, "fc1") else  # SwiGLU: fc1_g and fc1_x
        [list(mlp.fc1_g.weight.shape), list(mlp.fc1_x.weight.shape)],
        "proj_bias": attn.proj.bias is not None,
        "mlp_fc2": list(mlp.fc2.weight.shape),
        "mlp_gate_last": getattr(mlp, "gate_last", None),
        "mlp_norm": norm_info(mlp.norm),
        "act_layer": act_info(mlp.act),
        "has_attn_pool": model.attn_pool is not None,
        "head": "Identity" if isinstance(model.head, nn.Identity) else list(model.head.weight.shape),
        "num_features": model.num_features,
        "layer_norm_eps": sorted({m.eps for m in model.modules() if isinstance(m, nn.LayerNorm)}),
        "dynamic_img_size": model.dynamic_img_size,
    }
    pool = model.attn_pool
    if pool is not None:
        info["attn_pool"] = {
            "type": type(pool).__name__,
            "num_heads": pool.num_heads,
            "head_dim": pool.head_dim,
            "latent_len": pool.latent_len,
            "latent_shape": list(pool.latent.shape),
            "pool": pool.pool,
            "pos_embed": pool.pos_embed is not None,
            "q_proj": not isinstance(pool.q, nn.Identity),
            "q_bias": getattr(pool.q, "bias", None) is not None,
            "kv_bias": pool.kv.bias is not None,
            "q_norm": norm_info(pool.q_norm),
            "k_norm": norm_info(pool.k_norm),
            "norm": norm_info(pool.norm),
            "mlp_type": type(pool.mlp).__name__ if pool.mlp is not None else None,
            "mlp_fc1": list(pool.mlp.fc1.weight.shape) if pool.mlp is not None else None,
            "mlp_act": act_info(pool.mlp.act) if pool.mlp is not None else None,
            "out_features": pool.out_features,
        }
    return info


def batch_of(images):
    return torch.from_numpy(images.transpose(0, 3, 1, 2))  # NHWC -> NCHW


def save_timm_folder(model, folder):
    """`model` in a fresh `folder` by timm's own `save_for_hf`, keeping only `config.json` and the weights."""
    from timm.models._hub import save_for_hf

    shutil.rmtree(folder, ignore_errors=True)
    save_for_hf(model, folder, safe_serialization=True)
    for stale in set(os.listdir(folder)) - KEEP:
        os.remove(os.path.join(folder, stale))


def record_case(out, case, arch, model_args, model, images, outputs, features):
    """Keep a timm case's name, `model_args`, images, outputs, features and state-dict shapes in `out`."""
    out[f"{case}/architecture"] = arch
    out[f"{case}/model_args"] = json.dumps(model_args)
    out[f"{case}/images"] = images
    out[f"{case}/outputs"] = outputs
    out[f"{case}/features"] = features
    out[f"{case}/state_dict_shapes"] = json.dumps({k: list(v.shape) for k, v in model.state_dict().items()})


def write_timm_case(case, arch, model_args, seed, out):
    import timm

    generator = torch.Generator().manual_seed(100 + seed)
    rng = np.random.default_rng(100 + seed)  # Its own stream per case: adding a case changes no other.
    model = timm.create_model(arch, pretrained=False, **model_args).eval()
    randomise(model, generator)
    folder = os.path.join(TIMM_FOLDER, case)
    save_timm_folder(model, folder)
    config_path = os.path.join(folder, "config.json")
    if case == "hub_no_model_args":
        with open(config_path) as f:
            config = json.load(f)
        config.pop("model_args", None)  # as the Hub's own timm configs: no model_args, the input size stated
        config["pretrained_cfg"]["input_size"] = list(model.pretrained_cfg["input_size"])
        with open(config_path, "w") as f:
            json.dump(config, f, indent=2)
    weights = os.path.join(folder, "model.safetensors")
    again = timm.create_model(arch, pretrained=False, **model_args).eval()
    timm.models.load_checkpoint(again, weights, strict=True)

    size = model.patch_embed.img_size
    images = rng.uniform(-1, 1, size=(2, size[0], size[1], 3)).astype(np.float32)
    with torch.no_grad():
        batch = batch_of(images)
        outputs, features = numpy(model(batch)), numpy(model.forward_features(batch))
        if not (np.array_equal(outputs, numpy(again(batch)))
                and np.array_equal(features, numpy(again.forward_features(batch)))):
            raise AssertionError(f"{case}: timm read its own files back differently")
    info = switches(model)
    record_case(out, case, arch, model_args, model, images, outputs, features)
    out[f"{case}/switches"] = json.dumps(info)
    if case == "dinov2_reg":
        write_dinov2_reg_extras(case, arch, model_args, model, weights, batch, rng, out)
    sizes = {name: os.path.getsize(os.path.join(folder, name)) for name in sorted(os.listdir(folder))}
    print(f"{case} ({arch}): outputs {outputs.shape}, features {features.shape}, files {sizes}")
    print(f"  switches {json.dumps(info)}")


def write_dinov2_reg_extras(case, arch, model_args, model, weights, batch, rng, out):
    """forward_intermediates (NCHW, NLC, normed, with prefix tokens) and dynamic_img_size outputs."""
    import timm

    variants = {
        "intermediates": dict(indices=[0, 1], output_fmt="NCHW", intermediates_only=True),
        "intermediates_nlc": dict(indices=[0, 1], output_fmt="NLC", intermediates_only=True),
        "intermediates_norm": dict(indices=[0, 1], output_fmt="NCHW", intermediates_only=True, norm=True),
    }
    with torch.no_grad():
        for key, kwargs in variants.items():
            maps = model.forward_intermediates(batch, **kwargs)
            out[f"{case}/{key}"] = np.stack([numpy(m) for m in maps])  # (index, B, C, H, W) or (index, B, L, C)
        prefix_kwargs = dict(indices=[0, 1], output_fmt="NCHW", intermediates_only=True, return_prefix_tokens=True)
        pairs = model.forward_intermediates(batch, **prefix_kwargs)
        out[f"{case}/intermediates_prefix"] = np.stack([numpy(prefix) for _, prefix in pairs])  # (index, B, P, C)
        if out[f"{case}/intermediates_prefix"].shape[2] != model.num_prefix_tokens:
            raise AssertionError("unexpected prefix-token count")
    args = dict(variants, intermediates_prefix=dict(prefix_kwargs, stored="prefix tokens of each pair"))
    args["layout"] = {"intermediates": "stack over indices of NCHW maps: (index, B, C, H, W)",
                      "intermediates_nlc": "(index, B, L, C), prefix tokens removed",
                      "intermediates_norm": "NCHW, each intermediate passed through model.norm",
                      "intermediates_prefix": "(index, B, num_prefix_tokens, C), cls then registers"}
    out[f"{case}/intermediates_args"] = json.dumps(args)

    dynamic = timm.create_model(arch, pretrained=False, dynamic_img_size=True, **model_args).eval()
    timm.models.load_checkpoint(dynamic, weights, strict=True)
    height, width = DYNAMIC_SIZE
    images = rng.uniform(-1, 1, size=(2, height, width, 3)).astype(np.float32)
    with torch.no_grad():
        dynamic_batch = batch_of(images)
        out[f"{case}/dynamic_images"] = images
        out[f"{case}/dynamic_outputs"] = numpy(dynamic(dynamic_batch))
        out[f"{case}/dynamic_features"] = numpy(dynamic.forward_features(dynamic_batch))
        if not np.allclose(numpy(dynamic(batch)), numpy(model(batch)), atol=1e-5):
            raise AssertionError("dynamic_img_size changed outputs at the table's own size")
    out[f"{case}/dynamic_args"] = json.dumps({
        "dynamic_img_size": True, "table_img_size": model_args["img_size"],
        "table_grid": list(model.patch_embed.grid_size), "patch_size": model_args["patch_size"],
        "image_hw": [height, width], "grid_hw": [height // model_args["patch_size"], width // model_args["patch_size"]],
        "resample": "timm.layers.resample_abs_pos_embed defaults (bicubic, antialias=True), "
                    "num_prefix_tokens=0 because no_embed_class",
    })


def write_timm(cases):
    import timm

    print(f"timm {timm.__version__}, torch {torch.__version__}")
    path = os.path.join(FIXTURES, "timm_family_reference.npz")
    out = {}
    if cases != list(CASES) and os.path.exists(path):  # rewriting some cases keeps the others
        with np.load(path) as existing:
            out = {key: existing[key] for key in existing.files if key.split("/")[0] not in cases}
    for seed, (case, (arch, model_args)) in enumerate(CASES.items()):
        if case in cases:
            write_timm_case(case, arch, model_args, seed, out)
    out["timm_version"] = timm.__version__
    np.savez(path, **out)
    print(f"timm family: {len(out)} arrays in {path}")


def randomise_transformers(model, generator, scale=0.2):
    """As `randomise`: layer norms around 1, layer-scale lambdas around 0.5, the rest around 0."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator) * scale
            if ("norm" in name) and name.endswith("weight"):
                noise = noise + 1.0
            elif name.endswith("lambda1"):
                noise = noise * 0.5 + 0.5
            parameter.copy_(noise)


def save_transformers_folder(model, case):
    """`model` written by its own `save_pretrained` to `tests/fixtures/<case>/`, only `KEEP` kept; the folder."""
    folder = os.path.join(FIXTURES, case)
    shutil.rmtree(folder, ignore_errors=True)
    model.save_pretrained(folder)
    for stale in set(os.listdir(folder)) - KEEP:
        os.remove(os.path.join(folder, stale))
    return folder


def keep_outputs(case, images, result, result_again, out):
    """Keep a transformers model's outputs in `out`, after checking that its files read back to the same."""
    out[f"{case}/images"] = images
    for field in ("last_hidden_state", "pooler_output"):
        if getattr(result, field) is None:  # a SigLIP tower without its head (vision_use_head: false) pools nothing
            continue
        if not np.array_equal(numpy(getattr(result, field)), numpy(getattr(result_again, field))):
            raise AssertionError(f"{case}: transformers read its own files back differently ({field})")
        out[f"{case}/{field}"] = numpy(getattr(result, field))
    return result


def write_transformers():
    import transformers

    print(f"transformers {transformers.__version__}")
    common = dict(image_size=32, patch_size=8, hidden_size=24, num_hidden_layers=2, num_attention_heads=3,
                  mlp_ratio=2, layerscale_value=1.0)
    cases = {
        "transformers_dinov2": ("Dinov2Config", "Dinov2Model", {}),
        "transformers_dinov2_registers": ("Dinov2WithRegistersConfig", "Dinov2WithRegistersModel",
                                          dict(num_register_tokens=4)),
    }
    out = {}
    for seed, (case, (config_name, model_name, extra)) in enumerate(cases.items()):
        if not hasattr(transformers, model_name):
            print(f"{case}: transformers {transformers.__version__} has no {model_name}; skipped")
            continue
        generator = torch.Generator().manual_seed(200 + seed)
        rng = np.random.default_rng(200 + seed)
        config = getattr(transformers, config_name)(**common, **extra)
        model_class = getattr(transformers, model_name)
        model = model_class(config).eval()
        randomise_transformers(model, generator)
        folder = save_transformers_folder(model, case)
        again = model_class.from_pretrained(folder).eval()
        images = rng.uniform(-1, 1, size=(2, 32, 32, 3)).astype(np.float32)  # exactly image_size: no interpolation
        with torch.no_grad():
            batch = batch_of(images)
            result = keep_outputs(case, images, model(pixel_values=batch), again(pixel_values=batch), out)
        out[f"{case}/state_dict_shapes"] = json.dumps({k: list(v.shape) for k, v in model.state_dict().items()})
        sizes = {name: os.path.getsize(os.path.join(folder, name)) for name in sorted(os.listdir(folder))}
        print(f"{case} ({model_name}): last_hidden_state {result.last_hidden_state.shape}, "
              f"pooler_output {result.pooler_output.shape}, files {sizes}")
    out["transformers_version"] = transformers.__version__
    path = os.path.join(FIXTURES, "transformers_dinov2_reference.npz")
    np.savez(path, **out)
    print(f"transformers dinov2: {len(out)} arrays in {path}")


# The vision-tower cases (`--only towers`, `--case` picks some).
TOWER_CASES = ("transformers_clip_vision", "transformers_siglip", "transformers_siglip_no_head")


def write_vision_towers(chosen=TOWER_CASES):
    """A `CLIPVisionModel`, a whole `SiglipModel` (text tower too) and a `SiglipVisionModel` without its head
    (`vision_use_head: false`, as PaliGemma's towers), each with its image processor's file."""
    import transformers

    vision = dict(image_size=32, patch_size=8, hidden_size=24, intermediate_size=48, num_hidden_layers=2,
                  num_attention_heads=3)
    text = dict(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                max_position_embeddings=16)
    cases = {
        "transformers_clip_vision": (lambda: transformers.CLIPVisionModel(transformers.CLIPVisionConfig(**vision)),
                                     transformers.CLIPImageProcessor),
        "transformers_siglip": (lambda: transformers.SiglipModel(transformers.SiglipConfig(
            text_config=text, vision_config=vision)), transformers.SiglipImageProcessor),
        "transformers_siglip_no_head": (lambda: transformers.SiglipVisionModel(transformers.SiglipVisionConfig(
            **vision, vision_use_head=False)), transformers.SiglipImageProcessor),
    }
    path = os.path.join(FIXTURES, "transformers_vision_towers_reference.npz")
    out = {}
    if os.path.exists(path):  # rewriting some cases keeps the others
        with np.load(path) as existing:
            out = {key: existing[key] for key in existing.files if key.split("/")[0] not in chosen}
    for seed, (case, (build, processor_class)) in enumerate(cases.items()):
        if case not in chosen:
            continue
        generator = torch.Generator().manual_seed(300 + seed)
        rng = np.random.default_rng(300 + seed)
        model = build().eval()
        randomise_transformers(model, generator)
        folder = os.path.join(FIXTURES, case)
        shutil.rmtree(folder, ignore_errors=True)
        model.save_pretrained(folder)
        processor = processor_class(size={"height": 32, "width": 32} if "siglip" in case else {"shortest_edge": 32},
                                    crop_size={"height": 32, "width": 32})
        processor.save_pretrained(folder)
        for stale in set(os.listdir(folder)) - KEEP - {"preprocessor_config.json"}:
            os.remove(os.path.join(folder, stale))
        again = type(model).from_pretrained(folder).eval()
        # keras_vit's input, [-1, 1], and what the image processor's statistics make of it for transformers.
        images = rng.uniform(-1, 1, size=(2, 32, 32, 3)).astype(np.float32)
        mean, std = np.array(processor.image_mean), np.array(processor.image_std)
        pixels = (((images + 1) / 2 - mean) / std).astype(np.float32)
        with torch.no_grad():
            towers = [getattr(m, "vision_model", m) for m in (model, again)]
            result = keep_outputs(case, images, *(tower(pixel_values=batch_of(pixels)) for tower in towers), out)
        sizes = {name: os.path.getsize(os.path.join(folder, name)) for name in sorted(os.listdir(folder))}
        print(f"{case} ({type(model).__name__}): last_hidden_state {result.last_hidden_state.shape}, pooler_output "
              f"{None if result.pooler_output is None else result.pooler_output.shape}, mean {mean}, files {sizes}")
    out["transformers_version"] = transformers.__version__
    np.savez(path, **out)
    print(f"transformers vision towers: {len(out)} arrays in {path}")


# (height, width) of the resize references: twice the fixtures' 4x4 grid, a smaller grid (where antialias
# matters), a non-square one and a 2x8 one (as many patches as 4x4: interpolated all the same).
RESIZE_SIZES = ((64, 64), (24, 24), (48, 24), (16, 64))
RESIZE_CASES = {  # case -> (model class, whether the folder is a whole image-text model)
    "transformers_vit": ("ViTForImageClassification", False),
    "transformers_dinov2": ("Dinov2Model", False),
    "transformers_dinov2_registers": ("Dinov2WithRegistersModel", False),
    "transformers_clip_vision": ("CLIPVisionModel", False),
    "transformers_siglip": ("SiglipModel", True),
}


def write_resize_references():
    """The fixture folders' outputs at other sizes, with transformers' own position interpolation."""
    import transformers

    print(f"transformers {transformers.__version__}")
    out, rng = {}, np.random.default_rng(400)  # one image per size, shared by the cases
    for case, (model_name, whole) in RESIZE_CASES.items():
        folder = os.path.join(FIXTURES, case)
        model = getattr(transformers, model_name).from_pretrained(folder).eval()
        tower = model.vision_model if whole else model
        processor = os.path.join(folder, "preprocessor_config.json")
        mean, std = 0.5, 0.5  # keras_vit's [-1, 1] input is transformers' pixels where a folder names no statistics
        if os.path.exists(processor):
            with open(processor) as f:
                statistics = json.load(f)
            mean, std = np.array(statistics["image_mean"]), np.array(statistics["image_std"])
        for height, width in RESIZE_SIZES:
            images = out.setdefault(f"images/{height}x{width}",
                                    rng.uniform(-1, 1, size=(1, height, width, 3)).astype(np.float32))
            pixels = batch_of((((images + 1) / 2 - mean) / std).astype(np.float32))
            # DINOv2 always interpolates; the others only when asked.
            kwargs = {} if "dinov2" in case else dict(interpolate_pos_encoding=True)
            with torch.no_grad():
                result = tower(pixel_values=pixels, **kwargs)
            outputs = result.logits if model_name.endswith("ForImageClassification") else result.pooler_output
            out[f"{case}/{height}x{width}"] = numpy(outputs)
            print(f"{case} at {height}x{width}: outputs {tuple(outputs.shape)}")
    out["transformers_version"] = transformers.__version__
    path = os.path.join(FIXTURES, "transformers_resize_reference.npz")
    np.savez(path, **out)
    print(f"transformers resize: {len(out)} arrays in {path}")


def write_config_fields():
    """Each config class's own fields with their defaults, and PreTrainedConfig's shared ones."""
    import dataclasses

    import transformers

    def plain(value):
        return value if isinstance(value, (bool, int, float, str, type(None), list)) else repr(value)

    names = ("ViTConfig", "Dinov2Config", "Dinov2WithRegistersConfig", "CLIPVisionConfig", "CLIPConfig",
             "SiglipVisionConfig", "SiglipConfig")
    classes = {name: getattr(transformers, name) for name in names}
    out = {
        "transformers_version": transformers.__version__,
        "PreTrainedConfig": [field.name for field in dataclasses.fields(transformers.PreTrainedConfig)],
        **{cls.model_type: {name.lstrip("_"): plain(getattr(cls, name, None)) for name in cls.__annotations__}
           for cls in classes.values()},
    }
    path = os.path.join(FIXTURES, "transformers_config_fields.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"transformers config fields: {', '.join(cls.model_type for cls in classes.values())} in {path}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["timm", "transformers", "towers", "resize", "fields", "timm_hybrid"],
                        help="write only these fixtures")
    parser.add_argument("--case", nargs="+", choices=list(CASES) + list(TOWER_CASES),
                        help="rewrite only these timm (or, with --only towers, vision-tower) cases")
    args = parser.parse_args()
    os.makedirs(TIMM_FOLDER, exist_ok=True)
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    if args.only in (None, "timm"):
        write_timm([case for case in args.case if case in CASES] if args.case else list(CASES))
    if args.only in (None, "transformers"):
        write_transformers()
    if args.only in (None, "towers"):
        write_vision_towers([case for case in args.case if case in TOWER_CASES] if args.case else TOWER_CASES)
    if args.only in (None, "resize"):
        write_resize_references()
    if args.only in (None, "fields"):
        write_config_fields()
    if args.only in (None, "timm_hybrid"):
        from timm_hybrid_fixtures import write_timm_hybrid  # tools/timm_hybrid_fixtures.py

        write_timm_hybrid(save_timm_folder, record_case)


if __name__ == "__main__":
    main()
