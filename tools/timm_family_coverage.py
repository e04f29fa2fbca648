"""Measure how many of timm's pretrained plain-ViT architectures keras_vit loads with timm's outputs.

Run in the separate timm venv of tools/make_fixtures.py, with Keras and this
package added (nothing is downloaded: every model is built with `pretrained=False`):

    /tmp/timm-venv/bin/pip install keras h5py
    /tmp/timm-venv/bin/pip install -e . --no-deps
    KERAS_BACKEND=torch /tmp/timm-venv/bin/python tools/timm_family_coverage.py \
        [--json /tmp/timm_coverage.json] [--only REGEX] [--budget-minutes 25] [--naflex] [--untagged]

It groups `timm.list_pretrained()` by architecture (the name before the
first '.') and builds each with `timm.create_model(arch, pretrained=False,
depth=1)`: one block keeps it fast (where timm sets a setting per block,
which one block cannot take, Sapiens2's `num_kv_heads`: three blocks, with
the first, a middle and the last block's settings), and everything else (image size, patch,
width, heads, MLP, activation, norms, pooling, classes: those of the
architecture's default pretrained tag) is the architecture's own. Only
models of the classes in `IN_SCOPE` (VisionTransformer, DeiT distilled, Eva,
Beit, VisionTransformerRelPos, Cait, VisionTransformerSAM, Gemma4VitEncoder and
Gemma4VitClassifier) are in scope; the classes of the others (NaFlexVit, ...) are
counted separately, as are the
architectures that do not take `depth=` at all (CNNs and the like).

For each in-scope architecture, every parameter gets random values (norm
weights 1 + 0.1 N(0, 1), layer-scale gammas 0.5 + 0.1 N(0, 1), everything
else 0.02 N(0, 1)), the model is written with timm's own
`save_for_hf(..., safe_serialization=True)` and three checks run on one
random image of the model's default input size:

  1. `keras_vit.from_pretrained(folder, classifier_activation=None)` gives
     timm's `model(x)` (logits, pooled features without a head, Gemma 4's soft
     tokens) to 1e-4 of their scale (of 1 where they are smaller);
  2. the same with `model_args` removed from `config.json` but for `depth` (and the per-block
     settings of a three-block build), as in the Hub's
     own timm configs (the architecture name and `pretrained_cfg` remain);
  3. for an architecture that passes 1, a round trip: `checkpoints.save_timm`
     of the Keras model, read by a fresh `timm.create_model(arch,
     pretrained=False, depth=1)` (or the three-block keywords) with `timm.models.load_checkpoint(...,
     strict=True)`, gives timm's outputs to 1e-4 of their scale.

With `--naflex`, timm's `NaFlexVit` class instead: all 14 architectures
(pretrained or not), each at depth 1 with random values, written by
`save_for_hf`, on one NaFlex batch from timm's own eval pipeline (three
aspect ratios at 64 and 144 patches); `from_pretrained(folder)` must give
timm's outputs, and `save_timm` into a fresh `timm.create_model(arch,
**config.json's model_args)` (strict load) the same again. It prints
"NaFlexVit: N/14 architectures, M/11 tags" and the failures by cause.

Every exception is caught per architecture and kept by its first line. A
failing output comparison is explained, where possible, by the switches
timm built that keras_vit read differently (head count, activation,
epsilon, pooling, ...) or that keras_vit's ViT does not model. The summary
groups the failures by cause; the full result goes to `--json`. Tags are
counted through their architecture (each architecture is tested once, with
its default tag's configuration).
"""

import argparse
import collections
import dataclasses
import functools
import gc
import json
import logging
import os
import re
import shutil
import sys
import tempfile
import time
import traceback
import warnings
import zlib

os.environ.setdefault("KERAS_BACKEND", "torch")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

TOLERANCE = 1e-4


# The classes measured: timm's plain ViT, its DeiT-distilled subclass, its RoPE ViTs (Eva), BEiT (Beit), its
# relative-position ViTs (VisionTransformerRelPos), CaiT (Cait), SAM's encoder (VisionTransformerSAM) and Gemma 4's
# vision tower (Gemma4VitEncoder, Gemma4VitClassifier).
IN_SCOPE = ("timm.models.vision_transformer.VisionTransformer", "timm.models.deit.VisionTransformerDistilled",
            "timm.models.eva.Eva", "timm.models.beit.Beit",
            "timm.models.vision_transformer_relpos.VisionTransformerRelPos", "timm.models.cait.Cait",
            "timm.models.vision_transformer_sam.VisionTransformerSAM", "timm.models.gemma4_vit.Gemma4VitEncoder",
            "timm.models.gemma4_vit.Gemma4VitClassifier")


@functools.lru_cache(maxsize=None)
def build_keywords(arch):
    """The keywords with which `arch` is built small: `depth=1`, or where timm's model function sets a setting per
    block that one block cannot take (Sapiens2's num_kv_heads, full attention in the first and last 8 blocks),
    three blocks with the settings of its first, middle and last."""
    import timm

    try:
        with torch.device("meta"):
            timm.create_model(arch, pretrained=False, depth=1)
        return {"depth": 1}
    except Exception:  # noqa: BLE001 - any failure: try the per-block settings, else report depth=1's own
        pass
    try:
        with torch.device("meta"):
            full = timm.create_model(arch, pretrained=False)
        kv_heads = [block.attn.num_kv_heads for block in full.blocks]
    except Exception:  # noqa: BLE001
        return {"depth": 1}
    return {"depth": 3, "num_kv_heads": (kv_heads[0], kv_heads[len(kv_heads) // 2], kv_heads[-1])}


def first_line(error):
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"


def randomise(model, generator):
    """Random values in every parameter: norm weights around 1, layer-scale gammas around 0.5, the rest around 0; and
    in Gemma 4's buffers: its clamps' bounds, +-(1.5 to 2) on the inputs (normalised) and +-(0.5 to 0.8) on the
    outputs, which bind now and then, its soft tokens' std_bias around 0 and std_scale around 1."""
    from timm.layers import LayerScale, RmsNorm

    norm_weights, gammas = set(), set()
    for name, module in model.named_modules():
        prefix = f"{name}." if name else ""
        if isinstance(module, (nn.LayerNorm, RmsNorm, nn.GroupNorm, nn.BatchNorm2d)) \
                and getattr(module, "weight", None) is not None:
            norm_weights.add(prefix + "weight")
        if isinstance(module, LayerScale):
            gammas.add(prefix + "gamma")
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator)
            if name in norm_weights:
                value = 1.0 + 0.1 * noise
            elif name in gammas:
                value = 0.5 + 0.1 * noise
            else:
                value = 0.02 * noise
            parameter.copy_(value.to(parameter.dtype))
        for name, buffer in model.named_buffers():
            noise = torch.rand(buffer.shape, generator=generator)
            bound = (1.5 + 0.5 * noise) if "input_" in name else (0.5 + 0.3 * noise)
            if name.endswith(("input_min", "output_min")):
                buffer.copy_(-bound)
            elif name.endswith(("input_max", "output_max")):
                buffer.copy_(bound)
            elif name.endswith("std_bias"):
                buffer.copy_(0.1 * torch.randn(buffer.shape, generator=generator))
            elif name.endswith("std_scale"):
                buffer.copy_(1.0 + 0.1 * torch.randn(buffer.shape, generator=generator))


def _norm(module):
    if module is None or isinstance(module, nn.Identity):
        return None
    return type(module).__name__


def _activation(mlp):
    kind = type(mlp).__name__
    act = getattr(mlp, "act", None)
    act_name = type(act).__name__ if act is not None else None
    if act_name == "GELU":
        act_name = "gelu_tanh" if getattr(act, "approximate", "none") == "tanh" else "gelu"
    else:
        act_name = {"GELUTanh": "gelu_tanh", "QuickGELU": "quick_gelu", "SiLU": "silu"}.get(act_name, act_name)
    if kind == "GluMlp":
        if act_name == "silu" and not getattr(mlp, "gate_last", True):
            return "swiglu"
        return f"GluMlp({act_name}, gate_last={getattr(mlp, 'gate_last', None)})"
    if kind == "SwiGLU":
        return f"SwiGLU(unpacked, {act_name})"
    if kind != "Mlp":
        return f"{kind}({act_name})"
    return act_name


def timm_switches(model):
    """What timm built, in keras_vit's terms where it has them (the rest under their timm names)."""
    block = model.blocks[0]
    attn, mlp = getattr(block, "attn", None), getattr(block, "mlp", None)
    proj = getattr(model.patch_embed, "proj", None)
    pools = {"token": "token", "avg": "gap", "map": "map"}
    norms = sorted({type(m).__name__ for m in model.modules()
                    if isinstance(m, nn.LayerNorm) or "Norm" in type(m).__name__})
    eps = sorted({float(m.eps) for m in model.modules() if hasattr(m, "eps") and isinstance(m, nn.Module)
                  and "Norm" in type(m).__name__})
    info = dict(
        class_token=model.cls_token is not None,
        register_tokens=int(model.num_reg_tokens),
        class_token_position_embedding=not model.no_embed_class,
        classifier=pools.get(model.global_pool, model.global_pool),
        fc_norm=_norm(model.fc_norm) is not None,
        norm_pre=_norm(model.norm_pre) is not None,
        encoder_norm=_norm(model.norm) is not None,
        patch_bias=getattr(proj, "bias", None) is not None,
        qkv_bias=getattr(getattr(attn, "qkv", None), "bias", None) is not None,
        qk_norm=_norm(getattr(attn, "q_norm", None)) is not None,
        layer_scale=not isinstance(getattr(block, "ls1", nn.Identity()), nn.Identity),
        mlp_activation=_activation(mlp),
        layer_norm_epsilon=eps,
        num_heads=int(getattr(attn, "num_heads", 0)),
        attention_pool_heads=int(model.attn_pool.num_heads) if model.attn_pool is not None else None,
        # Parts that keras_vit's Architecture has no switch for (their plain-ViT values are
        # proj_bias=True, mlp_bias=True, pos_embed=True, pool_include_prefix=False, norm_types=[LayerNorm]).
        block_type=type(block).__name__,
        attn_type=type(attn).__name__,
        proj_bias=getattr(getattr(attn, "proj", None), "bias", None) is not None,
        mlp_bias=getattr(getattr(mlp, "fc1", None), "bias", None) is not None,
        pos_embed=model.pos_embed is not None,
        pool_include_prefix=bool(getattr(model, "pool_include_prefix", False)),
        patch_embed=type(model.patch_embed).__name__,
        patch_embed_norm=_norm(getattr(model.patch_embed, "norm", None)),
        attn_norm=_norm(getattr(attn, "norm", None)),
        mlp_norm=_norm(getattr(mlp, "norm", None)),
        norm_types=norms,
        num_classes=int(model.num_classes),
        img_size=list(model.patch_embed.img_size) if getattr(model.patch_embed, "img_size", None) else None,
        patch_size=list(model.patch_embed.patch_size) if hasattr(model.patch_embed, "patch_size") else None,
        dynamic_img_size=bool(getattr(model, "dynamic_img_size", False)),
    )
    return info


def keras_switches(kmodel):
    from keras_vit.model.description import architecture_of

    architecture = dataclasses.asdict(architecture_of(kmodel))
    names = {layer.name for layer in kmodel.layers}
    block = kmodel.get_layer("encoderblock_0")
    architecture.update(
        layer_scale=architecture["layer_scale"] is not None,
        layer_norm_epsilon=[float(architecture["layer_norm_epsilon"])],
        encoder_norm="encoder_norm" in names,
        num_heads=int(block.num_heads),
        attention_pool_heads=int(kmodel.get_layer("attention_pool").num_heads) if "attention_pool" in names
        else None,
    )
    return architecture


_COMPARED = ("class_token", "register_tokens", "class_token_position_embedding", "classifier", "fc_norm",
             "norm_pre", "encoder_norm", "patch_bias", "qkv_bias", "qk_norm", "layer_scale", "mlp_activation",
             "layer_norm_epsilon", "num_heads", "attention_pool_heads")
_PLAIN = dict(proj_bias=True, mlp_bias=True, pos_embed=True, pool_include_prefix=False, patch_embed_norm=None,
              attn_norm=None, mlp_norm=None, block_type="Block", attn_type="Attention", patch_embed="PatchEmbed")


def explain(timm_info, keras_info):
    """Why the outputs may differ: switches keras_vit read differently, and timm parts it does not model."""
    if "introspection_error" in timm_info:
        return [f"timm model not described: {timm_info['introspection_error']}"]
    reasons = []
    for key in _COMPARED:
        if keras_info is not None and timm_info.get(key) != keras_info.get(key):
            reasons.append(f"{key}: timm {timm_info.get(key)!r}, keras_vit {keras_info.get(key)!r}")
    for key, plain in _PLAIN.items():
        if timm_info.get(key) != plain:
            reasons.append(f"timm {key}={timm_info.get(key)!r} (not modelled)")
    if timm_info.get("norm_types") not in (["LayerNorm"], []):
        reasons.append(f"timm norm types {timm_info.get('norm_types')} (not modelled)")
    return reasons


def to_numpy(value):
    import keras

    if isinstance(value, torch.Tensor):
        return value.detach().float().cpu().numpy()
    return np.asarray(keras.ops.convert_to_numpy(value), dtype=np.float32)


def compare(reference, output):
    if reference.shape != output.shape:
        return dict(passed=False, error=f"output shape {list(output.shape)} != timm's {list(reference.shape)}")
    diff = float(np.max(np.abs(reference - output))) if reference.size else 0.0
    if not np.isfinite(diff):
        diff = float("inf")
    scale = float(np.max(np.abs(reference))) if reference.size else 0.0
    # 1e-4 of the outputs' scale, of 1 where they are smaller: Gemma 4's soft tokens are pooled times sqrt(D).
    return dict(passed=bool(diff <= TOLERANCE * max(1.0, scale)), max_abs_diff=diff, max_abs_output=scale)


def keras_check(folder, images_nhwc, reference):
    """from_pretrained on `folder` and its output against timm's; returns (result, keras model or None)."""
    import keras_vit

    try:
        kmodel = keras_vit.from_pretrained(folder, classifier_activation=None)
    except Exception as error:  # noqa: BLE001 - every failure is a result
        return dict(passed=False, stage="from_pretrained", error=first_line(error)), None
    try:
        with torch.no_grad():
            output = to_numpy(kmodel(images_nhwc, training=False))
    except Exception as error:  # noqa: BLE001
        check = dict(passed=False, stage="forward", error=first_line(error))
        height, width = (kmodel.input_shape[1:3] if isinstance(kmodel.input_shape, tuple) else (None, None))
        if height and width and (height, width) != images_nhwc.shape[1:3] \
                and height <= images_nhwc.shape[1] and width <= images_nhwc.shape[2]:
            # timm's patch convolution drops the rows and columns past the last whole patch: is that the only gap?
            try:
                with torch.no_grad():
                    cropped = to_numpy(kmodel(images_nhwc[:, :height, :width], training=False))
                check["cropped"] = dict(compare(reference, cropped), size=[int(height), int(width)])
            except Exception as crop_error:  # noqa: BLE001
                check["cropped"] = dict(passed=False, error=first_line(crop_error))
        return check, kmodel
    return dict(compare(reference, output), stage="compare"), kmodel


def bare_file_check(folder, images_nhwc, reference, info):
    """Diagnostic for a refused folder: its `model.safetensors` alone (no config.json), with timm's head count."""
    import keras_vit

    try:
        kmodel = keras_vit.from_pretrained(os.path.join(folder, "model.safetensors"),
                                           num_heads=info.get("num_heads") or None, classifier_activation=None)
        with torch.no_grad():
            output = to_numpy(kmodel(images_nhwc, training=False))
    except Exception as error:  # noqa: BLE001
        return dict(passed=False, error=first_line(error))
    check = compare(reference, output)
    if not check["passed"]:
        check["reasons"] = explain(info, keras_switches(kmodel))
    return check


def check_architecture(arch, work):
    """All three checks for one in-scope architecture; returns its result dict."""
    import keras
    import timm
    from timm.models._hub import save_for_hf

    import keras_vit.checkpoints

    result = dict(arch=arch)
    seed = zlib.crc32(arch.encode())
    model = kmodel = kmodel2 = m2 = None
    try:
        model = timm.create_model(arch, pretrained=False, **build_keywords(arch))
        randomise(model, torch.Generator().manual_seed(seed))
        model.eval()
        try:
            info = timm_switches(model)
        except Exception as error:  # noqa: BLE001 - a model this does not know how to describe
            info = dict(introspection_error=first_line(error))
        result["timm"] = info
        data = timm.data.resolve_model_data_config(model)
        folder = os.path.join(work, "with_model_args")
        save_for_hf(model, folder, safe_serialization=True)
        with open(os.path.join(folder, "config.json")) as f:
            config = json.load(f)
        result["model_args"] = config.get("model_args")
        # The size the written file states: timm's vitamin_xlarge_336 is built under vitamin_xlarge_256's
        # pretrained_cfg, so the live model's data config says 256 where its file (and the Hub's) says 336.
        size = tuple(int(n) for n in config.get("pretrained_cfg", {}).get("input_size", data["input_size"])[1:])
        result["input_size"] = list(size)
        images = torch.randn((1, 3, *size), generator=torch.Generator().manual_seed(seed + 1))
        with torch.no_grad():
            reference = to_numpy(model(images))
        images_nhwc = images.permute(0, 2, 3, 1).contiguous().numpy()
        # keras_vit takes [-1, 1] images and a folder's pretrained_cfg statistics normalise them inside the model:
        # the images that become timm's input exactly. (A bare state dict has no statistics: timm's input as is.)
        mean, std = (np.array(data[key], dtype=np.float64) for key in ("mean", "std"))
        keras_images = ((images_nhwc * std + mean) * 2 - 1).astype(np.float32)
    except Exception as error:  # noqa: BLE001
        result["setup_error"] = first_line(error)
        result["with_model_args"] = dict(passed=False, stage="timm", error=result["setup_error"])
        result["without_model_args"] = dict(passed=False, stage="timm", error=result["setup_error"])
        return result

    check, kmodel = keras_check(folder, keras_images, reference)
    if check.get("stage") == "from_pretrained" and "not a plain timm ViT" in check.get("error", ""):
        check["bare_file"] = bare_file_check(folder, images_nhwc, reference, info)
        keras.backend.clear_session()
    keras_info = keras_switches(kmodel) if kmodel is not None else None
    if kmodel is not None:
        result["keras"] = keras_info
    if not check["passed"] and check.get("stage") != "from_pretrained":
        check["reasons"] = explain(info, keras_info)
    result["with_model_args"] = check

    bare = os.path.join(work, "without_model_args")
    shutil.copytree(folder, bare)
    # As the Hub's own configs, but for what this tool shrinks: keras_vit refuses tensors that disagree with the
    # name's sizes.
    given = config.pop("model_args", None) or {}
    if "depth" in given:
        config["model_args"] = {key: given[key] for key in build_keywords(arch) if key in given}
    with open(os.path.join(bare, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    check2, kmodel2 = keras_check(bare, keras_images, reference)
    if not check2["passed"] and check2.get("stage") != "from_pretrained":
        check2["reasons"] = explain(info, keras_switches(kmodel2) if kmodel2 is not None else None)
    result["without_model_args"] = check2
    del kmodel2

    if check["passed"]:
        path = os.path.join(work, "round_trip.safetensors")
        try:
            keras_vit.checkpoints.save_timm(kmodel, path, architecture=arch)
            m2 = timm.create_model(arch, pretrained=False, **build_keywords(arch))
            timm.models.load_checkpoint(m2, path, strict=True)
            m2.eval()
            with torch.no_grad():
                result["round_trip"] = compare(reference, to_numpy(m2(images)))
        except Exception as error:  # noqa: BLE001
            result["round_trip"] = dict(passed=False, error=first_line(error))
    del model, kmodel, m2
    keras.backend.clear_session()
    gc.collect()
    return result


def scan(only, untagged=False):
    """`(tags by architecture, class name by architecture)`: every pretrained architecture (with `untagged`, every
    registered one) built small (`build_keywords`)."""
    import timm

    tags = collections.OrderedDict()
    for name in timm.list_pretrained():
        tags.setdefault(name.split(".")[0], []).append(name)
    for name in timm.list_models() if untagged else ():
        tags.setdefault(name, [])
    classes = {}
    for arch in tags:
        if only and not re.search(only, arch):
            continue
        try:  # On the meta device (no memory, no init time); where that fails, for real.
            try:
                with torch.device("meta"):
                    model = timm.create_model(arch, pretrained=False, **build_keywords(arch))
            except Exception:  # noqa: BLE001
                model = timm.create_model(arch, pretrained=False, **build_keywords(arch))
            classes[arch] = f"{type(model).__module__}.{type(model).__name__}"
            del model
        except Exception as error:  # noqa: BLE001
            classes[arch] = f"<no depth=1 build: {type(error).__name__}>"
    gc.collect()
    return tags, classes


def cause_of(check):
    """A group key for a failed check: its error with the specifics taken out, or its explanation."""
    if "error" in check:
        text = check["error"]
        found = re.search(r"is a timm ViT with (.*?) \(", text)
        if found:
            return f"unsupported in keras_vit: {found.group(1)}"
        found = re.search(r"tensors that are not in timm's VisionTransformer layout: (.*?); keras_vit", text)
        if found:
            names = sorted({re.sub(r"\.\d+\.", ".N.", name) for name in re.findall(r"'([^']+)'", found.group(1))})
            return f"tensors outside keras_vit's timm layout: {', '.join(names) or found.group(1)}"
        text = re.sub(r"/tmp/\S+", "<file>", text)
        text = re.sub(r"holds timm's '[^']*'", "holds timm's '<arch>'", text)
        text = re.sub(r"\b\d+(\.\d+)?(e-?\d+)?\b", "N", text)
        return f"{check.get('stage', 'error')}: {text}"
    reasons = check.get("reasons") or []
    if reasons:
        return "outputs differ; " + "; ".join(reasons)
    return "outputs differ (every compared switch agrees)"


def describe(check, width=240):
    if "error" in check:
        text = re.sub(r"/tmp/timm_coverage_[^/\s]+/[^/\s]+/", "", check["error"])
        text = text if len(text) <= width else text[:width - 3] + "..."
    else:
        text = f"max abs diff {check['max_abs_diff']:.3g} (max abs output {check['max_abs_output']:.3g})"
    if "cropped" in check:
        cropped = check["cropped"]
        text += (f" [cropped to {cropped.get('size')}: {'PASS' if cropped['passed'] else 'FAIL'} "
                 f"{describe(cropped, 120)}]")
    if "bare_file" in check:
        bare = check["bare_file"]
        text += (f" [model.safetensors alone, timm's num_heads: {'PASS' if bare['passed'] else 'FAIL'} "
                 f"{describe(bare, 160)}" + (f"; {'; '.join(bare['reasons'])}" if bare.get("reasons") else "") + "]")
    return text


def print_groups(title, failures):
    groups = collections.defaultdict(list)
    for arch, check in failures:
        groups[cause_of(check)].append((arch, check))
    print(f"\n=== {title}: {len(failures)} architectures fail, {len(groups)} causes ===")
    for cause, members in sorted(groups.items(), key=lambda item: (-len(item[1]), item[0])):
        print(f"\n-- [{len(members)}] {cause}")
        for arch, check in members:
            print(f"   {arch}: {describe(check)}")
    return {cause: [arch for arch, _ in members] for cause, members in groups.items()}


NAFLEX_CLASS = "timm.models.naflexvit.NaFlexVit"


def naflex_batch(patch, mean, std, seed):
    """`(timm's NaFlex batch, keras_vit's)`: three aspect ratios at two budgets, by timm's eval pipeline."""
    from timm.data.naflex_dataset import NaFlexCollator
    from timm.data.naflex_transforms import Patchify, ResizeToSequence

    generator = torch.Generator().manual_seed(seed)
    images = [torch.rand((3, *shape), generator=generator) for shape in ((320, 144), (112, 360), (224, 224))]
    samples = [(Patchify(patch)(ResizeToSequence(patch, budget, interpolation="bicubic")(image)), 0)
               for budget in (64, 144) for image in images]
    batch, _ = NaFlexCollator(max_seq_len=144)(samples)
    mean, std = (torch.tensor(values).repeat(patch * patch) for values in (mean, std))
    grid = (batch["patch_coord"].amax(1) + 1).numpy().astype("int32")
    ours = {"patches": (batch["patches"].numpy() * 2 - 1).astype("float32"), "patch_grid": grid,
            "patch_mask": batch["patch_valid"].numpy()}
    return {"patches": (batch["patches"] - mean) / std, "patch_coord": batch["patch_coord"],
            "patch_valid": batch["patch_valid"]}, ours


def check_naflex_architecture(arch, work):
    """timm's NaFlexVit `arch` at depth 1, random values: from_pretrained's outputs on a NaFlex batch, and the round
    trip through save_timm into timm (strict load)."""
    import keras
    import timm
    from timm.models._hub import save_for_hf

    import keras_vit

    result = dict(arch=arch)
    seed = zlib.crc32(arch.encode())
    try:
        model = timm.create_model(arch, pretrained=False, depth=1)
        randomise(model, torch.Generator().manual_seed(seed))
        model.eval()
        data = timm.data.resolve_model_data_config(model)
        theirs, ours = naflex_batch(model.embeds.patch_size[0], data["mean"], data["std"], seed)
        with torch.no_grad():
            reference = to_numpy(model(theirs))
        folder = os.path.join(work, "folder")
        save_for_hf(model, folder, safe_serialization=True)
    except Exception as error:  # noqa: BLE001
        result["with_model_args"] = dict(passed=False, stage="timm", error=first_line(error))
        return result
    try:
        kmodel = keras_vit.from_pretrained(folder, classifier_activation=None)
        result["with_model_args"] = dict(compare(reference, to_numpy(kmodel(ours))), stage="compare")
    except Exception as error:  # noqa: BLE001
        result["with_model_args"] = dict(passed=False, stage="from_pretrained", error=first_line(error))
        return result
    if result["with_model_args"]["passed"]:
        path = os.path.join(work, "saved", "model.safetensors")
        os.makedirs(os.path.dirname(path))
        try:
            keras_vit.checkpoints.save_timm(kmodel, path, architecture=arch)
            with open(os.path.join(os.path.dirname(path), "config.json")) as f:
                config = json.load(f)
            rebuilt = timm.create_model(arch, pretrained=False, **config["model_args"]).eval()
            timm.models.load_checkpoint(rebuilt, path, strict=True)
            with torch.no_grad():
                result["round_trip"] = compare(reference, to_numpy(rebuilt(theirs)))
        except Exception as error:  # noqa: BLE001
            result["round_trip"] = dict(passed=False, error=first_line(error))
    keras.backend.clear_session()
    gc.collect()
    return result


def naflex_main(tags, classes):
    """`--naflex`: every NaFlexVit architecture timm registers (pretrained or not), and the summary line."""
    import timm

    archs = [name for name in timm.list_models("naflexvit_*")]
    pretrained_tags = {arch: tags.get(arch, []) for arch in archs}
    results = {}
    with tempfile.TemporaryDirectory(prefix="timm_coverage_") as root:
        for arch in archs:
            work = os.path.join(root, arch)
            os.makedirs(work)
            results[arch] = check_naflex_architecture(arch, work)
            result = results[arch]
            parts = [f"{label} {'PASS' if result[key]['passed'] else 'FAIL'} {describe(result[key])}"
                     for key, label in (("with_model_args", "load"), ("round_trip", "round-trip")) if key in result]
            print(f"{arch}: " + " | ".join(parts), flush=True)
    passed = [arch for arch, result in results.items() if result["with_model_args"]["passed"]]
    round_trip = [arch for arch in passed if results[arch].get("round_trip", {}).get("passed")]
    total_tags = sum(len(found) for found in pretrained_tags.values())
    print(f"\nNaFlexVit: {len(passed)}/{len(archs)} architectures, "
          f"{sum(len(pretrained_tags[arch]) for arch in passed)}/{total_tags} tags load with timm's outputs "
          f"(tolerance {TOLERANCE:g}); round trip (save_timm -> timm strict load, same outputs): "
          f"{len(round_trip)}/{len(passed)}")
    print_groups("NaFlexVit", [(arch, result["with_model_args"]) for arch, result in results.items()
                               if not result["with_model_args"]["passed"]])
    print_groups("NaFlexVit round trip", [(arch, result["round_trip"]) for arch, result in results.items()
                                          if "round_trip" in result and not result["round_trip"]["passed"]])
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--naflex", action="store_true",
                        help="timm's NaFlexVit class instead (all 14 architectures, on mixed-aspect NaFlex batches)")
    parser.add_argument("--untagged", action="store_true",
                        help="the registered architectures without pretrained tags too")
    parser.add_argument("--json", default="/tmp/timm_coverage.json", help="where the full result goes")
    parser.add_argument("--only", default=None, help="a regular expression: only architectures it finds")
    parser.add_argument("--budget-minutes", type=float, default=None,
                        help="start no new architecture after this long (the rest are listed as not run)")
    args = parser.parse_args(argv)

    warnings.filterwarnings("ignore")
    logging.getLogger("timm").setLevel(logging.ERROR)
    logging.getLogger("keras_vit").setLevel(logging.ERROR)
    torch.set_num_threads(os.cpu_count() or 1)
    import keras
    import timm

    import keras_vit  # noqa: F401 - fail early if the package is not importable

    start = time.time()
    if args.naflex:
        tags = collections.defaultdict(list)
        for name in timm.list_pretrained("naflexvit_*"):
            tags[name.split(".")[0]].append(name)
        results = naflex_main(tags, None)
        with open(args.json, "w") as f:
            json.dump(dict(timm=timm.__version__, keras=keras.__version__, backend=keras.backend.backend(),
                           tolerance=TOLERANCE, results=results), f, indent=1, default=str)
        return 0
    tags, classes = scan(args.only, args.untagged)
    scan_seconds = time.time() - start
    in_scope = [arch for arch, cls in classes.items() if cls in IN_SCOPE]
    print(f"scanned {len(classes)} pretrained architectures in {scan_seconds:.0f}s; "
          f"{len(in_scope)} are of the classes in scope", flush=True)

    results, not_run = {}, []
    summary = {}

    def write():
        payload = dict(timm=timm.__version__, torch=torch.__version__, keras=keras.__version__,
                       backend=keras.backend.backend(), tolerance=TOLERANCE, scan_seconds=scan_seconds,
                       seconds=time.time() - start, classes=classes,
                       tags={arch: tags[arch] for arch in classes}, results=results, not_run=not_run,
                       summary=summary)
        with open(args.json, "w") as f:
            json.dump(payload, f, indent=1, default=str)

    with tempfile.TemporaryDirectory(prefix="timm_coverage_") as root:
        for index, arch in enumerate(in_scope):
            if args.budget_minutes is not None and time.time() - start > 60 * args.budget_minutes:
                not_run.extend(in_scope[index:])
                print(f"budget spent: {len(not_run)} architectures not run", flush=True)
                break
            began = time.time()
            work = os.path.join(root, arch)
            os.makedirs(work)
            try:
                result = check_architecture(arch, work)
            except Exception as error:  # noqa: BLE001 - a bug here must not stop the survey
                result = dict(arch=arch, crash=first_line(error), traceback=traceback.format_exc())
                for key in ("with_model_args", "without_model_args"):
                    result.setdefault(key, dict(passed=False, stage="crash", error=result["crash"]))
            shutil.rmtree(work, ignore_errors=True)
            result["seconds"] = time.time() - began
            results[arch] = result
            parts = []
            for key, label in (("with_model_args", "args"), ("without_model_args", "no-args"),
                               ("round_trip", "round-trip")):
                check = result.get(key)
                if check is not None:
                    parts.append(f"{label} {'PASS' if check['passed'] else 'FAIL'} {describe(check)}")
            print(f"[{index + 1}/{len(in_scope)}] {arch} ({result['seconds']:.1f}s): " + " | ".join(parts),
                  flush=True)
            if index % 10 == 0:
                write()

    def passing(key):
        return [arch for arch, result in results.items() if result.get(key, {}).get("passed")]

    def tag_count(archs):
        return sum(len(tags[arch]) for arch in archs)

    other = collections.Counter(cls for cls in classes.values()
                                if cls != "timm.models.vision_transformer.VisionTransformer")
    with_args, without_args, round_trip = passing("with_model_args"), passing("without_model_args"), \
        passing("round_trip")
    summary.update(
        pretrained_architectures=len(classes), pretrained_tags=tag_count(classes),
        vision_transformer_architectures=len(in_scope), vision_transformer_tags=tag_count(in_scope),
        run=len(results), not_run=len(not_run),
        pass_with_model_args=dict(architectures=len(with_args), tags=tag_count(with_args)),
        pass_without_model_args=dict(architectures=len(without_args), tags=tag_count(without_args)),
        round_trip_strict=dict(architectures=len(round_trip), tags=tag_count(round_trip),
                               of=len(with_args)),
        other_classes={cls: n for cls, n in other.most_common()},
        seconds=time.time() - start,
    )

    print("\n=== Summary ===")
    print(f"timm {timm.__version__}, torch {torch.__version__}, keras {keras.__version__} "
          f"({keras.backend.backend()}), tolerance {TOLERANCE:g}")
    print(f"pretrained architectures: {len(classes)} ({tag_count(classes)} tags)")
    print(f"of the classes in scope: {len(in_scope)} architectures ({tag_count(in_scope)} tags); "
          f"run {len(results)}, not run {len(not_run)}")
    print("classes other than VisionTransformer:")
    for cls, n in other.most_common():
        print(f"   {n:4d}  {cls}")
    print(f"load with timm's outputs, with model_args:    {len(with_args)}/{len(results)} architectures "
          f"({tag_count(with_args)}/{tag_count(results)} tags)")
    print(f"load with timm's outputs, without model_args: {len(without_args)}/{len(results)} architectures "
          f"({tag_count(without_args)}/{tag_count(results)} tags)")
    print(f"round trip (save_timm -> timm strict load, same outputs): {len(round_trip)}/{len(with_args)} "
          f"architectures ({tag_count(round_trip)} tags)")

    groups = {}
    groups["with_model_args"] = print_groups(
        "With model_args",
        [(arch, result["with_model_args"]) for arch, result in results.items()
         if not result["with_model_args"]["passed"]])
    groups["without_model_args_only"] = print_groups(
        "Without model_args (architectures that pass with model_args)",
        [(arch, result["without_model_args"]) for arch, result in results.items()
         if result["with_model_args"]["passed"] and not result["without_model_args"]["passed"]])
    groups["round_trip"] = print_groups(
        "Round trip (architectures that pass with model_args)",
        [(arch, result["round_trip"]) for arch, result in results.items()
         if "round_trip" in result and not result["round_trip"]["passed"]])
    if not_run:
        print(f"\nnot run ({len(not_run)}): {', '.join(not_run)}")
    summary["failures_by_cause"] = groups
    summary["seconds"] = time.time() - start
    print(f"\ntook {summary['seconds']:.0f}s (scan {scan_seconds:.0f}s); full result in {args.json}")
    write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
