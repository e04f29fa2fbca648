"""timm's layout: a `VisionTransformer` state dict, read and written.

timm stores PyTorch tensors under its module names (`blocks.0.attn.qkv.weight`,
...): dense kernels as `(out, in)`, the patch convolution as `(out, in, h, w)`.
A bare state dict is a `.safetensors` file (or a `.bin`/`.pth` file, read
only through `torch.load(weights_only=True)`); timm's Hub folders add a
`config.json` with the model's arguments and preprocessing, which
`read_timm_folder` reads too. Every switch of timm's plain-ViT family that
keras_vit's `Architecture` has (registers, `no_embed_class`, layer scale,
`norm_pre`, `fc_norm`, attention pooling, q/k norms, optional biases, SwiGLU)
is read from the tensors; what they cannot show comes from `model_args` or
the architecture's family (`timm_families`).

Example:
>>> from keras_vit import checkpoints
>>> source = checkpoints.read_timm("model.safetensors")  # doctest: +SKIP
>>> checkpoints.save_timm(model, "vit.safetensors")  # doctest: +SKIP
"""

import json
import logging
import math
import os
import struct

import keras
import numpy as np

from keras_vit.checkpoints.source import (
    CheckpointError,
    architecture_from_state,
    architecture_of,
    class_names_in_order,
    pixel_statistics,
    positive_int_field,
    preview,
    require_regular_file,
    source_from_state,
    warn_unkept_pixel_statistics,
)
from keras_vit.checkpoints.timm_families import NOT_PLAIN_BLOCKS, PREFIXES, timm_family
from keras_vit.files import atomic_path

logger = logging.getLogger("keras_vit")

# timm name (after "blocks.{i}.") -> keras_vit name (after "encoderblock_{i}/").
_BLOCK = {
    "norm1.weight": "attention_norm/gamma",
    "norm1.bias": "attention_norm/beta",
    "attn.qkv.weight": "qkv/kernel",
    "attn.qkv.bias": "qkv/bias",
    "attn.proj.weight": "attention_output/kernel",
    "attn.proj.bias": "attention_output/bias",
    "norm2.weight": "mlp_norm/gamma",
    "norm2.bias": "mlp_norm/beta",
    "mlp.fc1.weight": "mlp_hidden/kernel",
    "mlp.fc1.bias": "mlp_hidden/bias",
    "mlp.fc2.weight": "mlp_output/kernel",
    "mlp.fc2.bias": "mlp_output/bias",
    "ls1.gamma": "attention_layer_scale",
    "ls2.gamma": "mlp_layer_scale",
    "attn.q_norm.weight": "query_norm/gamma",
    "attn.q_norm.bias": "query_norm/beta",
    "attn.k_norm.weight": "key_norm/gamma",
    "attn.k_norm.bias": "key_norm/beta",
}
_TOP = {
    "cls_token": "class_token/cls",
    "pos_embed": "position_embedding/pos_embedding",
    "patch_embed.proj.weight": "embedding/kernel",
    "patch_embed.proj.bias": "embedding/bias",
    "norm.weight": "encoder_norm/gamma",
    "norm.bias": "encoder_norm/beta",
    "head.weight": "head/kernel",
    "head.bias": "head/bias",
    "reg_token": "register_tokens/registers",
    "norm_pre.weight": "pre_norm/gamma",
    "norm_pre.bias": "pre_norm/beta",
    "fc_norm.weight": "fc_norm/gamma",
    "fc_norm.bias": "fc_norm/beta",
    "attn_pool.latent": "attention_pool/probe",
    "attn_pool.q.weight": "attention_pool/query/kernel",
    "attn_pool.q.bias": "attention_pool/query/bias",
    "attn_pool.kv.weight": "attention_pool/key_value/kernel",
    "attn_pool.kv.bias": "attention_pool/key_value/bias",
    "attn_pool.proj.weight": "attention_pool/attention_output/kernel",
    "attn_pool.proj.bias": "attention_pool/attention_output/bias",
    "attn_pool.norm.weight": "attention_pool/mlp_norm/gamma",
    "attn_pool.norm.bias": "attention_pool/mlp_norm/beta",
    "attn_pool.mlp.fc1.weight": "attention_pool/mlp_hidden/kernel",
    "attn_pool.mlp.fc1.bias": "attention_pool/mlp_hidden/bias",
    "attn_pool.mlp.fc2.weight": "attention_pool/mlp_output/kernel",
    "attn_pool.mlp.fc2.bias": "attention_pool/mlp_output/bias",
}
# Parts of timm's ViT family that keras_vit's model does not have, and what they are.
_UNSUPPORTED = {
    "patch_embed.backbone.": "a convolutional stem before the patches (a hybrid's ResNet, which keras_vit reads "
                             "from the original .npz, or another backbone such as MobileCLIP's MCI stem)",
    "patch_embed.norm.": "a normalised patch embedding",
    ".mlp.norm.": "a LayerNorm inside the MLP (scale_mlp_norm)",
    ".attn.norm.": "a LayerNorm inside attention (scale_attn_norm)",
    ".mlp.fc1_g.": "an unpacked SwiGLU MLP (fc1_g, fc1_x)",
    "attn_pool.q_norm.": "query/key normalisation in attention pooling",
    "attn_pool.pos_embed": "position embeddings in attention pooling",
    "head_dist.": "a distillation head (DeiT distilled)",
    "dist_token": "a distillation token (DeiT distilled)",
}
_SAFETENSORS_DTYPES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
                       "BOOL": 1}
_MAX_HEADER_BYTES = 100 << 20


def torch_to_keras(name, value):
    """A PyTorch tensor under `name` as keras_vit's array: dense `(out, in)` to `(in, out)`, a convolution to HWIO."""
    if value.ndim == 4 and name.endswith(".weight"):
        return value.transpose(2, 3, 1, 0)
    return value.T if name.endswith(".weight") and value.ndim == 2 else value


def keras_to_torch(name, value):
    """The inverse of `torch_to_keras`."""
    if value.ndim == 4 and name.endswith(".weight"):
        return value.transpose(3, 2, 0, 1)
    return value.T if name.endswith(".weight") and value.ndim == 2 else value


def from_timm(tensors, description="checkpoint"):
    """keras_vit's state `{path: array}` from a timm ViT state dict of numpy arrays."""
    for marker, what in _UNSUPPORTED.items():
        found = sorted(name for name in tensors if marker in name or name.startswith(marker))
        if found:
            raise CheckpointError(
                f"{description} is a timm ViT with {what} ({preview(found, 3)}), which keras_vit's ViT does not have."
            )
    state, unknown = {}, []
    for name, value in tensors.items():
        value = np.asarray(value)
        if name in _TOP:
            state[_TOP[name]] = torch_to_keras(name, value)
            continue
        parts = name.split(".", 2)
        if parts[0] == "blocks" and len(parts) == 3 and parts[1].isdigit() and parts[2] in _BLOCK:
            state[f"encoderblock_{int(parts[1])}/{_BLOCK[parts[2]]}"] = torch_to_keras(name, value)
        else:
            unknown.append(name)
    if unknown:
        raise CheckpointError(
            f"{description} has {len(unknown)} tensors that are not in timm's VisionTransformer layout: "
            f"{preview(unknown, 5)}; keras_vit reads timm ViT state dicts (blocks.N.attn.qkv.weight, ...)."
        )
    if "embedding/kernel" not in state or "position_embedding/pos_embedding" not in state:
        raise CheckpointError(f"{description} lacks a patch or position embedding (patch_embed.proj.weight, pos_embed).")
    return state


def to_timm(model):
    """A keras_vit model's weights as a timm ViT state dict of numpy arrays (refuses what timm cannot express)."""
    names = {v.path for v in model.weights}
    if any(name.startswith("conv_root") for name in names):
        raise CheckpointError("save_timm writes plain ViTs; a hybrid's ResNet has no timm VisionTransformer layout "
                              "here (save it with checkpoints.save_npz instead).")
    if "pre_logits/kernel" in names:
        raise CheckpointError("timm's VisionTransformer has no pre-logits layer (representation_size); "
                              "build the model with representation_size=0, or save it with checkpoints.save_npz.")
    ours = {value: key for key, value in _TOP.items()}
    block_names = {value: key for key, value in _BLOCK.items()}
    tensors = {}
    for variable in model.weights:
        path, value = variable.path, keras.ops.convert_to_numpy(variable)
        block, _, rest = path.partition("/")
        if block.startswith("encoderblock_") and rest in block_names:
            name = f"blocks.{block.removeprefix('encoderblock_')}.{block_names[rest]}"
        elif path in ours:
            name = ours[path]
        else:
            raise CheckpointError(f"save_timm: the model's weight {path!r} has no place in timm's layout.")
        tensors[name] = np.ascontiguousarray(keras_to_torch(name, value).astype("float32"))
    return tensors


def timm_arguments(model):
    """The keyword arguments of timm's `VisionTransformer` for the switches of a keras_vit `model`.

    Example:
    >>> import keras_vit
    >>> model = keras_vit.ViT(image_size=32, patch_size=8, hidden_size=24, num_layers=1, num_heads=3,
    ...                       mlp_dim=48, register_tokens=2, class_token_position_embedding=False)
    >>> timm_arguments(model)["reg_tokens"], timm_arguments(model)["no_embed_class"]
    (2, True)
    """
    architecture = architecture_of(model)
    pools = {"token": "token", "gap": "avg", "map": "map"}
    activations = {"gelu": "gelu", "gelu_tanh": "gelu_tanh", "quick_gelu": "quick_gelu", "swiglu": "silu"}
    arguments = dict(
        class_token=architecture.class_token, reg_tokens=architecture.register_tokens,
        no_embed_class=not architecture.class_token_position_embedding, global_pool=pools[architecture.classifier],
        fc_norm=architecture.fc_norm, final_norm=architecture.final_norm, pre_norm=architecture.norm_pre, qkv_bias=architecture.qkv_bias,
        qk_norm=architecture.qk_norm, init_values=architecture.layer_scale,
        act_layer=activations[architecture.mlp_activation],
    )
    if not architecture.patch_bias:
        arguments["patch_bias"] = False  # timm: not pre_norm; named here so a caller can check it
    return arguments


def save_timm(model, path):
    """Write `model` as a timm `VisionTransformer` state dict (`.safetensors`) that timm loads with `strict=True`.

    Build the timm model with the same sizes and the switches of
    `timm_arguments(model)` (class token, registers, `no_embed_class`,
    `global_pool`, layer scale, norms, biases, activation), then
    `timm.models.load_checkpoint(model, path, strict=True)`.

    Example:
    >>> import keras_vit
    >>> model = keras_vit.ViT(image_size=32, patch_size=8, hidden_size=24, num_layers=1, num_heads=3,
    ...                       mlp_dim=48, classes=5)
    >>> save_timm(model, "/tmp/vit.safetensors")  # doctest: +SKIP
    """
    if not str(path).endswith(".safetensors"):
        raise CheckpointError(f"save_timm writes a .safetensors file; got {path}.")
    tensors = to_timm(model)
    if architecture_of(model).approximate_gelu:
        logger.warning(
            "%s computes the tanh-approximated GELU but timm's VisionTransformer computes exact GELU: build the "
            "timm model with act_layer='gelu_tanh' for equal logits.",
            model.name,
        )
    warn_unkept_pixel_statistics(model, "timm reads them from the folder's config.json (pretrained_cfg mean and "
                                        "std), and so does keras_vit.from_pretrained")
    save_file = _safetensors().save_file
    with atomic_path(os.fspath(path)) as temporary:
        save_file(tensors, temporary, metadata={"format": "pt"})
    return path


def _safetensors():
    try:
        import safetensors.numpy
    except ImportError as error:
        raise CheckpointError(
            "Reading or writing .safetensors files needs the safetensors package: pip install "
            "'keras-vision-transformer[hub]' (or pip install safetensors)."
        ) from error
    return safetensors.numpy


def safetensors_header(path, budget=None):
    """`{name: (dtype, shape)}` from a `.safetensors` header, checked against the file's size and `budget`.

    Reads only the header: a file whose tensors declare more bytes than it
    holds, or more than the model's `budget`, is refused before any tensor
    is read.
    """
    size = require_regular_file(path).st_size
    try:
        with open(path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            if length > min(_MAX_HEADER_BYTES, size - 8):
                raise CheckpointError(f"{path} is not a readable .safetensors file: its header claims {length:,} bytes.")
            header = json.loads(f.read(length))
    except (struct.error, ValueError, UnicodeDecodeError) as error:
        raise CheckpointError(f"{path} is not a readable .safetensors file (truncated or another format): {error}") \
            from error
    if not isinstance(header, dict):
        raise CheckpointError(f"{path} is not a readable .safetensors file: its header is a JSON "
                              f"{type(header).__name__}, not an object of tensors.")
    header.pop("__metadata__", None)
    declared, spans = {}, []
    total = 0
    for name, entry in header.items():
        try:
            dtype, shape, (start, stop) = entry["dtype"], tuple(entry["shape"]), entry["data_offsets"]
            if not all(isinstance(n, int) and n >= 0 for n in (*shape, start, stop)):
                raise ValueError(f"shape {list(shape)} and data_offsets {[start, stop]} must be whole numbers >= 0")
            nbytes = math.prod(shape) * _SAFETENSORS_DTYPES[dtype]
        except (KeyError, TypeError, ValueError) as error:
            raise CheckpointError(f"{path}: tensor {name!r} has an unreadable header entry: {error}") from error
        if stop - start != nbytes or stop > size - 8 - length:
            raise CheckpointError(f"{path}: tensor {name!r} declares {nbytes:,} bytes that the file does not hold; "
                                  "the file is truncated or corrupt.")
        declared[name] = (dtype, shape)
        spans.append((start, stop, name))
        total += nbytes
    spans.sort()
    for (_, stop, first), (start, _, second) in zip(spans, spans[1:]):
        if start < stop:
            raise CheckpointError(f"{path}: tensors {first!r} and {second!r} overlap in the file (data_offsets); "
                                  "the file is corrupt.")
    if budget is not None:
        budget.check(path, total, "tensors")
    return declared


def read_state_dict(path, budget=None):
    """A timm state dict file as `{name: numpy array}`: `.safetensors`, or `.bin`/`.pth` through torch."""
    if str(path).endswith(".safetensors"):
        safetensors_header(path, budget)
        try:
            with _safetensors_open(path) as f:
                return {name: f.get_tensor(name) for name in f.keys()}
        except CheckpointError:
            raise
        except Exception as error:  # safetensors' own SafetensorError, for what the header check let through.
            raise CheckpointError(f"{path} is not a readable .safetensors file: {error}") from error
    size = require_regular_file(path).st_size
    if budget is not None:
        budget.check(path, size, "data")
    try:
        import torch
    except ImportError as error:
        raise CheckpointError(
            f"{path} is a PyTorch pickle (.bin/.pth), which keras_vit reads only with torch installed "
            "(torch.load with weights_only=True): pip install torch, or convert it to .safetensors."
        ) from error
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises many types for a bad or unsafe pickle.
        raise CheckpointError(f"{path} is not a loadable PyTorch state dict (weights_only=True): {error}") from error
    for wrapper in ("state_dict", "model"):
        if isinstance(loaded, dict) and isinstance(loaded.get(wrapper), dict):
            loaded = loaded[wrapper]
    if not isinstance(loaded, dict):
        raise CheckpointError(f"{path} holds a {type(loaded).__name__}, not a state dict of tensors.")
    return {name: tensor.float().numpy() if tensor.is_floating_point() else tensor.numpy()
            for name, tensor in loaded.items()}


def _safetensors_open(path):
    _safetensors()
    from safetensors import safe_open

    return safe_open(path, framework="numpy")


def read_timm(path, budget=None, config=None, config_path=None):
    """Read a timm ViT state dict file into a `WeightsSource` (exact GELU; heads from `config` when given).

    `config` is the parsed `config.json` of a Hub folder, read from `config_path` (named in errors).
    """
    state = from_timm(read_state_dict(path, budget), description=path)
    grid = num_heads = None
    known = dict(mlp_activation="gelu")  # timm's default: exact GELU
    if config:
        where = config_path or path
        args = config.get("model_args") or {}
        if not isinstance(args, dict):
            raise CheckpointError(f"{where}: model_args is a JSON {type(args).__name__}; timm writes an object of "
                                  "VisionTransformer arguments ({\"num_heads\": 12, ...}).")
        num_heads = positive_int_field(args, "num_heads", where, "model_args.")
        patch = positive_int_field(args, "patch_size", where, "model_args.")
        patch = patch or int(state["embedding/kernel"].shape[0])
        size = args.get("img_size")
        if isinstance(size, int) and not isinstance(size, bool):
            size = (size, size)
        if size is not None:
            if not (isinstance(size, (list, tuple)) and len(size) == 2
                    and all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in size)):
                raise CheckpointError(f"{where}: model_args.img_size is {size!r}; expected a positive int or "
                                      "[height, width].")
            grid = (size[0] // patch, size[1] // patch)
        architecture = config.get("architecture")
        if isinstance(architecture, str):
            family = timm_family(architecture)
            num_heads = num_heads or family.pop("num_heads")
            known.update({key: value for key, value in family.items() if key != "num_heads"})
        activation = args.get("act_layer")
        if isinstance(activation, str):
            if activation not in _TIMM_ACTIVATIONS:
                raise CheckpointError(f"{where}: model_args.act_layer is {activation!r}; keras_vit computes "
                                      f"{sorted(_TIMM_ACTIVATIONS)}.")
            known["mlp_activation"] = _TIMM_ACTIVATIONS[activation]
        pretrained = config.get("pretrained_cfg") if isinstance(config.get("pretrained_cfg"), dict) else {}
        known.update(pixel_statistics(pretrained.get("mean", config.get("mean")), pretrained.get("std", config.get("std")),
                                      f"{where} (pretrained_cfg mean and std)"))
        pool = args.get("global_pool", config.get("global_pool"))
        if pool not in (None, "", "token", "avg", "map"):
            raise CheckpointError(f"{where}: global_pool is {pool!r}; keras_vit pools by 'token', 'avg' or 'map'.")
        if pool == "avg":
            known["classifier"] = "gap"
        if pool == "" and "class_token/cls" not in state:  # timm's no pooling: the sequence
            known["classifier"] = "gap"
    table = state["position_embedding/pos_embedding"]
    if grid is not None and table.shape[1] not in (grid[0] * grid[1], grid[0] * grid[1] + _prefix(state)):
        grid = None  # The config's image size is not the table's (a resized file): read the table's own.
    architecture = architecture_from_state(state, grid, **known)
    source = source_from_state(path, state, grid, num_heads, architecture)
    if config:  # Label ids (synsets) in head order, shown by their descriptions ("tench, Tinca tinca") where given.
        def field(key):
            pretrained = config.get("pretrained_cfg")
            return config.get(key) or (pretrained.get(key) if isinstance(pretrained, dict) else None)

        names, descriptions = class_names_in_order(field("label_names"), state), field("label_descriptions")
        if names and isinstance(descriptions, dict):
            names = [str(descriptions.get(name, name)) for name in names]
        source.class_names = names
    return source


_TIMM_ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_tanh", "quick_gelu": "quick_gelu"}


def _prefix(state):
    registers = state.get("register_tokens/registers")
    return int("class_token/cls" in state) + (0 if registers is None else int(registers.shape[1]))


def read_timm_folder(folder, config, budget=None):
    """A timm Hub folder (its parsed `config.json`, beside `model.safetensors`) as a `WeightsSource`."""
    architecture = config.get("architecture")
    if not isinstance(architecture, str):
        raise CheckpointError(f"{os.path.join(folder, 'config.json')}: architecture is {architecture!r}; expected "
                              "timm's model name (a string such as 'vit_base_patch16_224').")
    if not architecture.startswith(PREFIXES) or any(word in architecture for word in ("hybrid", "resnet",
                                                                                       "distilled")):
        raise CheckpointError(f"{folder} holds timm's {architecture or 'unnamed'!r}, not a plain timm ViT "
                              f"(architecture {', '.join(prefix + '*' for prefix in PREFIXES)}).")
    for marker, what in NOT_PLAIN_BLOCKS.items():
        if marker in architecture:
            raise CheckpointError(f"{folder} holds timm's {architecture!r}, a ViT with {what}, which keras_vit's "
                                  "pre-norm blocks do not compute.")
    weights = next((os.path.join(folder, name) for name in ("model.safetensors", "pytorch_model.bin")
                    if os.path.exists(os.path.join(folder, name))), None)
    if weights is None:
        raise CheckpointError(f"{folder} has a timm config.json but no model.safetensors or pytorch_model.bin.")
    return read_timm(weights, budget, config, os.path.join(folder, "config.json"))
