"""timm's `Gemma4VitEncoder` and `Gemma4VitClassifier` (Gemma 4's vision tower): architectures and layout, read and
written.

Gemma 4's tower projects each patch (flattened channel, then row, then
column: `patch_embed.input_proj`, no bias) and adds a learned table per axis
(`position_embedding_table`, `(2, size, D)`, read at the column and the row).
Its blocks have RMSNorms before and after each branch (`norm1`-`norm4`),
separate q, k and v projections with RMSNorms on the queries and keys (and
one without a gain on the values), 2-D RoPE (theta 100, each axis over its
half of the head) and attention scale 1, and a tanh-GELU gated MLP
(`gate_proj`, `up_proj`, `down_proj`), nothing with a bias. The 167M
model's projections clamp their inputs and outputs (`input_min`, ...,
`output_max` of each). The encoder (`gemma4_vit_*_enc`) gives its soft
tokens (`global_pool='soft'`: 3x3 cells, times sqrt(D), the 570M model's
standardised by `std_bias`/`std_scale`); the classifier averages the patch
tokens, then an RMSNorm without a gain and `head`. keras_vit builds it with
`axis_position_table`, `sandwich_norm`, `value_norm`, `attention_scale`,
`rope_axis_halves`, `clipped_linears`, `soft_token_pool` and `final_norm_scale`.

The model scales pixels itself, `2 * (x - 0.5)` of the input timm
normalises by its `pretrained_cfg` mean and std (0 and 1): keras_vit's
[-1, 1] input is that already, so a mean `m` and std `s` are statistics
`m + s / 2` and `s / 2` here.

Example:
>>> GEMMA4_ARCHITECTURES["gemma4_vit_570m_enc"].switches["global_pool"]
'soft'
"""

import numpy as np

from keras_vit.checkpoints.source import CheckpointError, source_from_state
from keras_vit.checkpoints.state_dict_files import read_state_dict
from keras_vit.checkpoints.tensor_layout import BlockRule, TensorLayout, check_shape, settings
from keras_vit.checkpoints.timm.class_common import gives_tokens, state_without_adapters
from keras_vit.checkpoints.timm.config import (
    check_head,
    configured_eval_transform,
    configured_image_sizes,
    configured_pixel_statistics,
    model_args_of,
)
from keras_vit.checkpoints.timm.families import INFERENCE_NEUTRAL_KEYWORDS, TimmArchitecture
from keras_vit.model.architecture import Architecture
from keras_vit.model.description import architecture_of, native_image_size

ENCODER, CLASSIFIER = "Gemma4VitEncoder", "Gemma4VitClassifier"
# The keywords of both classes that keras_vit computes, as model_args spell them (the classifier's
# encoder_pool and final_norm, the encoder's global_pool 'soft').
GEMMA4_KEYWORDS = ("global_pool", "encoder_pool", "final_norm", "standardize", "use_clipped_linears", "norm_eps",
                   "rope_theta", "position_embedding_size", "pooling_kernel_size", "num_kv_heads")
GEMMA4_SIZES = ("img_size", "patch_size", "in_chans", "num_classes", "embed_dim", "depth", "num_heads", "head_dim",
                "intermediate_size")
GEMMA4_ARGUMENTS = frozenset({*GEMMA4_KEYWORDS, *GEMMA4_SIZES, *INFERENCE_NEUTRAL_KEYWORDS})
# timm's defaults of both classes' keywords.
DEFAULTS = dict(patch_size=16, norm_eps=1e-6, rope_theta=100.0, position_embedding_size=10240, pooling_kernel_size=3,
                standardize=False, use_clipped_linears=False, final_norm=True, encoder_pool="", num_kv_heads=None)


def _gemma4(embed_dim, depth, num_heads, intermediate_size, **switches):
    return TimmArchitecture(16, (768, 768), embed_dim, depth, num_heads, intermediate_size / embed_dim,
                            dict(head_dim=embed_dim // num_heads, intermediate_size=intermediate_size, **switches))


_167M = dict(embed_dim=768, depth=16, num_heads=12, intermediate_size=3072, standardize=False, use_clipped_linears=True)
_570M = dict(embed_dim=1152, depth=27, num_heads=16, intermediate_size=4304, standardize=True)
GEMMA4_ARCHITECTURES = {
    "gemma4_vit_167m": _gemma4(**_167M, final_norm=True),
    "gemma4_vit_167m_enc": _gemma4(**_167M, global_pool="soft"),
    "gemma4_vit_570m": _gemma4(**_570M, final_norm=True),
    "gemma4_vit_570m_enc": _gemma4(**_570M, global_pool="soft"),
}


def timm_class_of(name):
    """`Gemma4VitEncoder` for the `_enc` names, else `Gemma4VitClassifier`."""
    return ENCODER if name.endswith("_enc") else CLASSIFIER


def gemma4_switches_to_architecture(switches, timm_class):
    """`(Architecture fields, pooling)` of a Gemma 4 tower with timm's keywords `switches` (the name's, over
    `DEFAULTS`): `pooling` is what the model gives without a head (None: its tokens, soft or not)."""
    switches = {**DEFAULTS, **switches}
    pool = switches.get("global_pool", "soft" if timm_class == ENCODER else "avg")
    soft = (pool if timm_class == ENCODER else switches["encoder_pool"]) == "soft"
    final_norm = timm_class == CLASSIFIER and bool(switches["final_norm"])
    fields = dict(
        class_token=False, position_embedding=False, patch_bias=False, qkv_bias=False, projection_bias=False,
        normalization="rms_norm", layer_norm_epsilon=float(switches["norm_eps"]), qk_norm=True, value_norm=True,
        attention_scale=1.0, rope="axial", rope_temperature=float(switches["rope_theta"]), rope_rotate_half=True,
        rope_axis_halves=True, rope_grid_indexing="xy", sandwich_norm=True, mlp_activation="geglu_tanh",
        clipped_linears=bool(switches["use_clipped_linears"]),
        axis_position_table=int(switches["position_embedding_size"]),
        soft_token_pool=int(switches["pooling_kernel_size"]) if soft else 0,
        soft_token_standardize=bool(switches["standardize"]) and soft,
        classifier="gap", final_norm=final_norm, fc_norm=final_norm, final_norm_scale=not final_norm,
        num_kv_heads=switches["num_kv_heads"])
    return fields, None if timm_class == ENCODER and pool != "avg" else "gap"


def _pools(switches, timm_class, where):
    """Refuse the pools keras_vit does not compute: a classifier's head on every token, an unknown pool."""
    pool = switches.get("global_pool", "soft" if timm_class == ENCODER else "avg")
    allowed = ("soft", "avg", "none", "") if timm_class == ENCODER else ("avg",)
    if pool not in allowed:
        raise CheckpointError(f"{where}: global_pool is {pool!r}; keras_vit computes timm's {timm_class} with "
                              + " or ".join(repr(name) for name in allowed) + " (a classifier's head on every "
                              "token, unpooled, is not computed).")
    if switches.get("encoder_pool", "") not in ("", "none", "soft"):
        raise CheckpointError(f"{where}: encoder_pool is {switches['encoder_pool']!r}; timm's {CLASSIFIER} takes '', "
                              "'none' or 'soft'.")


def configured_gemma4_architecture(config, where):
    """`(entry, model_args, switches, pretrained_cfg, Architecture)` of a timm `config.json` (parsed, read from
    `where`) naming one of `GEMMA4_ARCHITECTURES`: the model it describes, before any tensor is read."""
    name = config.get("architecture")
    entry, timm_class = GEMMA4_ARCHITECTURES[name], timm_class_of(name)
    args = model_args_of(config, where, timm_class, GEMMA4_ARGUMENTS)
    switches = {**entry.switches, **{key: args[key] for key in GEMMA4_KEYWORDS if key in args}}
    if "global_pool" not in args and "global_pool" in config and timm_class == ENCODER:
        switches["global_pool"] = config["global_pool"]
    _pools(switches, timm_class, where)
    if isinstance(args.get("num_kv_heads"), tuple):  # Eva's num_kv_heads takes one per block; Gemma 4's one count
        raise CheckpointError(f"{where}: model_args.num_kv_heads is {list(args['num_kv_heads'])}; timm's {timm_class} "
                              "takes one positive int, every block's (or null: as many as num_heads).")
    embed, heads = args.get("embed_dim", entry.embed_dim), args.get("num_heads", entry.num_heads)
    head_dim = args.get("head_dim", entry.switches["head_dim"])
    if heads * head_dim != embed:
        raise CheckpointError(f"{where}: head_dim {head_dim} times num_heads {heads} is not embed_dim {embed}; "
                              "keras_vit's heads split the width evenly, as every Gemma 4 tower's do.")
    pretrained, statistics = configured_pixel_statistics(config, where)
    fields, _ = gemma4_switches_to_architecture(switches, timm_class)
    try:
        architecture = Architecture(**fields, **model_statistics(statistics))
    except ValueError as error:
        raise CheckpointError(f"{where}: timm's {name!r} with these model_args is no model keras_vit can build: "
                              f"{error}") from None
    return entry, args, switches, pretrained, architecture


def model_statistics(statistics):
    """keras_vit's `input_mean`/`input_std` of a Gemma 4 file whose pipeline normalises by `statistics` (timm's):
    the model's own `2 * (x - 0.5)` after them makes them `m + s / 2` and `s / 2`. Unstated, they are timm's 0 and 1:
    the paper's 0.5 and 0.5, keras_vit's input as it is."""
    if not statistics:
        return {}
    mean = np.asarray(statistics.get("input_mean", (0.0,) * 3), "float64")
    std = np.asarray(statistics.get("input_std", (1.0,) * 3), "float64")
    return {"input_mean": tuple((mean + std / 2).tolist()), "input_std": tuple((std / 2).tolist())}


def timm_statistics(architecture):
    """The inverse of `model_statistics`: timm's `(mean, std)` of a Gemma 4 model's `architecture`."""
    mean, std = np.asarray(architecture.input_mean, "float64"), np.asarray(architecture.input_std, "float64")
    return (mean - std).tolist(), (2 * std).tolist()


def clamp_rule(projections, path):
    """A `BlockRule` for clamped projections (`attn.q_proj`, ...) of one keras_vit weight `path`: their four
    scalars each, `(input_min, input_max, output_min, output_max)`, stacked in order."""
    scalars = ("input_min", "input_max", "output_min", "output_max")
    names = [f"{projection}.{scalar}" for projection in projections for scalar in scalars]

    def read(parts, block):
        return {path: np.asarray([[parts[f"{projection}.{scalar}"] for scalar in scalars]
                                  for projection in projections], "float32")}

    def write(state):
        rows = np.asarray(state[path], "float32").reshape(len(projections), 4)
        return {f"{projection}.{scalar}": rows[row, column] for row, projection in enumerate(projections)
                for column, scalar in enumerate(scalars)}

    return BlockRule(dict.fromkeys(names, (path,)), read, write, when=lambda a: a.clipped_linears,
                     shapes=lambda width: dict.fromkeys(names, ()))


def clamp_rules(attention):
    """The `clamp_rule` of every clamped projection of a block whose attention's names start with `attention`."""
    return (clamp_rule(tuple(f"{attention}{part}_proj" for part in "qkv"), "qkv_clip"),
            clamp_rule((f"{attention}o_proj",), "attention_output_clip"),
            clamp_rule(("mlp.gate_proj", "mlp.up_proj"), "mlp_hidden_clip"),
            clamp_rule(("mlp.down_proj",), "mlp_output_clip"))


LAYOUT = TensorLayout(
    "timm's Gemma4Vit layout",
    top={"patch_embed.position_embedding_table": "axis_position_embedding/table",
         "std_bias": "soft_tokens/std_bias", "std_scale": "soft_tokens/std_scale",
         "head.weight": "head/kernel", "head.bias": "head/bias"},
    block_prefix="blocks.",
    block={"norm1.weight": "attention_norm/gamma", "norm2.weight": "attention_branch_norm/gamma",
           "norm3.weight": "mlp_norm/gamma", "norm4.weight": "mlp_branch_norm/gamma",
           "attn.q_norm.weight": "query_norm/gamma", "attn.k_norm.weight": "key_norm/gamma",
           "attn.o_proj.linear.weight": "attention_output/kernel", "mlp.down_proj.linear.weight": "mlp_output/kernel"},
    strip=("encoder.",),
    qkv={"attn.q_proj.linear.weight": ("query", "weight"), "attn.k_proj.linear.weight": ("key", "weight"),
         "attn.v_proj.linear.weight": ("value", "weight")},
    packed={"mlp.gate_proj.linear.weight": ("mlp_hidden/kernel", 0, 2),
            "mlp.up_proj.linear.weight": ("mlp_hidden/kernel", 1, 2)},
    rules=clamp_rules("attn."),
    reshaped={"patch_embed.input_proj.weight": (lambda value: {"embedding/kernel": value}, ("embedding/kernel",))},
    grouped=True,
    hint="; keras_vit reads timm Gemma4VitEncoder and Gemma4VitClassifier state dicts (blocks.N.attn.q_proj.linear."
         "weight, patch_embed.position_embedding_table, ...)")


def patch_kernel(weight, patch, channel_order):
    """A linear patch projection `(D, 3 * P * P)` as keras_vit's `(P, P, 3, D)` patch kernel; the file flattens a
    patch channel-first (`"cpp"`: timm's) or channel-last (`"ppc"`: transformers')."""
    width = int(weight.shape[0])
    grid = (width, 3, patch, patch) if channel_order == "cpp" else (width, patch, patch, 3)
    kernel = np.asarray(weight).reshape(grid)
    return kernel.transpose(2, 3, 1, 0) if channel_order == "cpp" else kernel.transpose(1, 2, 3, 0)


def patch_weight(kernel, channel_order):
    """The inverse of `patch_kernel`."""
    kernel = np.asarray(kernel)
    ordered = kernel.transpose(3, 2, 0, 1) if channel_order == "cpp" else kernel.transpose(3, 0, 1, 2)
    return ordered.reshape(kernel.shape[-1], -1)


def check_patch_projection(weight, patch, name, path):
    """Refuse a patch projection `name` whose input is not 3 * `patch`**2 pixels."""
    weight = np.asarray(weight)
    if weight.ndim != 2 or weight.shape[1] != 3 * patch * patch:
        raise CheckpointError(f"{path}: {name} has shape {tuple(weight.shape)}, but RGB patches of {patch} pixels "
                              f"take {3 * patch * patch} inputs. Nothing was loaded.")


def read_timm_gemma4(path, budget, config, where):
    """Read a timm `Gemma4VitEncoder` or `Gemma4VitClassifier` state dict whose `config.json` (parsed as `config`,
    read from `where`) names one of `GEMMA4_ARCHITECTURES` into a `WeightsSource`."""
    name = config.get("architecture")
    entry, args, switches, pretrained, architecture = configured_gemma4_architecture(config, where)
    transform = configured_eval_transform(config, where)
    tensors = read_state_dict(path, budget)
    if switches.get("standardize") and not architecture.soft_token_standardize:
        for buffer in ("std_bias", "encoder.std_bias", "std_scale", "encoder.std_scale"):  # timm keeps them unused
            tensors.pop(buffer, None)
    patch = args.get("patch_size", entry.patch_size)
    projection = next((key for key in ("patch_embed.input_proj.weight", "encoder.patch_embed.input_proj.weight")
                       if key in tensors), None)
    if projection is None or not any(key.endswith("blocks.0.mlp.down_proj.linear.weight") for key in tensors):
        raise CheckpointError(f"{path} lacks timm's patch projection or first block (patch_embed.input_proj.weight, "
                              "blocks.0.mlp.down_proj.linear.weight). Nothing was loaded.")
    check_patch_projection(tensors[projection], patch, projection, path)
    depth = args.get("depth", entry.depth)
    LAYOUT.check_complete(list(tensors), architecture, depth, settings(dict(
        architecture=name, depth=depth, **{key: switches.get(key, DEFAULTS.get(key)) for key in (
            "use_clipped_linears", "standardize")}), "architecture", "depth", "use_clipped_linears", "standardize"),
        path)
    tensors[projection] = patch_kernel(tensors[projection], patch, "cpp")
    state = LAYOUT.read(tensors, path)
    _check_sizes(state, entry, args, switches, path)
    check_head(state, args.get("num_classes", config.get("num_classes")), path, where)
    size = configured_image_sizes(args, pretrained, entry, where)[0]
    size = (size, size) if isinstance(size, int) else tuple(size)
    grid, cell = (size[0] // patch, size[1] // patch), architecture.soft_token_pool
    if cell and (grid[0] % cell or grid[1] % cell):
        raise CheckpointError(f"{where}: model_args.pooling_kernel_size {cell} does not divide the {grid[0]}x{grid[1]} "
                              f"patch grid of its image size {list(size)}: Gemma 4's soft tokens pool {cell}x{cell} "
                              "cells of patches. Nothing was loaded.")
    heads = args.get("num_heads", entry.num_heads)
    source = source_from_state(path, state, grid, heads, architecture)
    source.layout = {"pooling": gemma4_switches_to_architecture(switches, timm_class_of(name))[1]}
    source.origins = LAYOUT.origins(tensors)
    source.eval_transform = transform
    return source


def _check_sizes(state, entry, args, switches, path):
    """Refuse tensors whose width, MLP, table or head widths are not the config's."""
    embed = args.get("embed_dim", entry.embed_dim)
    intermediate = args.get("intermediate_size", entry.switches["intermediate_size"])
    table = int(switches.get("position_embedding_size", DEFAULTS["position_embedding_size"]))
    model = f"the config's embed_dim {embed}, intermediate_size {intermediate}"
    check_shape(path, "patch_embed.input_proj.weight", state["embedding/kernel"].shape[-1:], (embed,), model)
    check_shape(path, "patch_embed.position_embedding_table", state["axis_position_embedding/table"].shape,
                (2, table, embed), f"{model} and position_embedding_size {table}")
    check_shape(path, "blocks.0.mlp.gate_proj.linear.weight", state["encoderblock_0/mlp_hidden/kernel"].shape,
                (embed, 2 * intermediate), model)


def gemma4_arguments(model, architecture):
    """The keywords of `timm.create_model(architecture, **kwargs)` with the sizes and switches of `model`, for a name
    of `GEMMA4_ARCHITECTURES` (`writer.timm_arguments` checks that they rebuild it)."""
    if timm_class_of(architecture) == CLASSIFIER and gives_tokens(model):
        raise CheckpointError(f"{model.name} gives its token sequence (no head and no pooling), which timm's "
                              f"classifier {architecture!r} does not: save it under the encoder's name "
                              f"({architecture}_enc), whose global_pool gives them, or with its head.")
    found = architecture_of(model)
    block = model.get_layer("encoderblock_0")
    kernel = model.get_layer("embedding").kernel
    embed = int(kernel.shape[-1])
    head = [layer for layer in model.layers if layer.name == "head"]
    arguments = dict(img_size=native_image_size(model, tuple(kernel.shape[:2])), patch_size=int(kernel.shape[0]),
                     embed_dim=embed, depth=sum(layer.name.startswith("encoderblock_") for layer in model.layers),
                     num_heads=int(block.num_heads), head_dim=embed // int(block.num_heads),
                     intermediate_size=int(block.mlp_dim) // 2, norm_eps=found.layer_norm_epsilon,
                     rope_theta=found.rope_temperature, position_embedding_size=found.axis_position_table,
                     use_clipped_linears=found.clipped_linears, num_kv_heads=_one_kv_head_count(model, found))
    standardized = found.soft_token_standardize or GEMMA4_ARCHITECTURES[architecture].switches["standardize"]
    arguments["standardize"] = bool(standardized)
    if found.soft_token_pool:
        arguments["pooling_kernel_size"] = found.soft_token_pool
    if timm_class_of(architecture) == ENCODER:
        pooled = "soft" if found.soft_token_pool else "avg" if any(layer.name == "pool" for layer in model.layers) \
            else "none"
        return dict(arguments, global_pool=pooled)
    return dict(arguments, num_classes=int(head[0].kernel.shape[-1]) if head else 0, global_pool="avg",
                encoder_pool="soft" if found.soft_token_pool else "", final_norm=found.fc_norm)


def _one_kv_head_count(model, found):
    """timm's Gemma 4 `num_kv_heads`: one count for every block (None: as many as the heads)."""
    counts = found.num_kv_heads
    if counts is None:
        return None
    if len(set(counts)) > 1:
        raise CheckpointError(f"{model.name} has {list(counts)} key/value heads in its blocks; timm's Gemma 4 takes one "
                              "num_kv_heads for every block, so it cannot build this model.")
    return int(counts[0])


def to_timm_gemma4(model, architecture):
    """`model`'s weights as the state dict of timm's Gemma 4 `architecture` (numpy arrays, PyTorch's shapes).

    A classifier of the 570M model keeps timm's unused `std_bias` and
    `std_scale` (timm's initial zeros and ones: keras_vit's model has none).
    """
    state = state_without_adapters(model, timm_class_of(architecture))
    found = architecture_of(model)
    kernel = state.pop("embedding/kernel")
    width = int(kernel.shape[-1])
    split = {}
    for path in [path for path in state if path.endswith("/qkv/kernel")]:  # q, k and v apart, as timm keeps them
        index = path.split("/")[0].removeprefix("encoderblock_")
        fused = state.pop(path)
        keys = (fused.shape[-1] - width) // 2
        for part, piece in zip(("q", "k", "v"), np.split(fused, [width, width + keys], axis=-1)):
            split[f"blocks.{index}.attn.{part}_proj.linear.weight"] = piece.T
    tensors = {**LAYOUT.write(state, unpacked=True, architecture=found), **split}
    tensors["patch_embed.input_proj.weight"] = patch_weight(kernel, "cpp")
    if GEMMA4_ARCHITECTURES[architecture].switches["standardize"] and not found.soft_token_standardize:
        tensors.update(std_bias=np.zeros(width, "float32"), std_scale=np.ones(width, "float32"))
    if timm_class_of(architecture) == CLASSIFIER:
        tensors = {name if name.startswith("head.") else f"encoder.{name}": value for name, value in tensors.items()}
    return {name: np.require(value, "float32", "C") for name, value in tensors.items()}  # the clamps stay 0-d
