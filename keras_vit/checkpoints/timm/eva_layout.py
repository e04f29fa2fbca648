"""timm's `Eva` layout: the state dict of its RoPE ViTs (EVA-02, PE, DINOv3, ...), read and written.

Besides timm's plain-ViT names, an `Eva` file has EVA's attention biases
(`attn.q_bias` and `attn.v_bias`, no key bias), q, k and v apart
(`attn.q_proj`, ...; with Sapiens2's grouped-query attention, `k_proj` and
`v_proj` narrower, by each block's `num_kv_heads`), layer scales as `gamma_1`/`gamma_2`, and for mixed
RoPE the learned frequencies of every block in one tensor (`rope.freqs`,
`(2, depth, heads, head_dim / 2)`). RoPE's other settings are not in the
tensors: they come from the architecture's name (`eva_families`) and
`model_args`, and the tensors must agree with them.

Example:
>>> from keras_vit import checkpoints
>>> source = checkpoints.read_timm_folder("vit_base_patch16_dinov3", config)  # doctest: +SKIP
>>> checkpoints.save_timm(model, "eva.safetensors", architecture="eva02_small_patch14_224")  # doctest: +SKIP
"""

import numpy as np

from keras_vit.checkpoints.source import CheckpointError, refuse_non_float, source_from_state, state_of
from keras_vit.checkpoints.state_dict_files import read_state_dict
from keras_vit.checkpoints.tensor_layout import BlockRule, TensorLayout, settings
from keras_vit.checkpoints.timm.config import (
    check_head,
    configured_eval_transform,
    configured_image_sizes,
    configured_pixel_statistics,
    configured_switches,
    grid_of_config,
    model_args_of,
)
from keras_vit.checkpoints.timm.eva_families import (
    EVA_ARCHITECTURES,
    EVA_KEYWORDS,
    TRAINING_ONLY_KEYWORDS,
    eva_switches_to_architecture,
    eva_unpacked_swiglu,
)
from keras_vit.checkpoints.timm.families import INFERENCE_NEUTRAL_KEYWORDS, SIZE_KEYWORDS, timm_mlp_dim, timm_mlp_ratio
from keras_vit.model.architecture import Architecture
from keras_vit.model.description import architecture_of, native_image_size


def _pairs(prefix, path):
    return {f"{prefix}.weight": f"{path}/gamma", f"{prefix}.bias": f"{path}/beta"}


def _dense(prefix, path):
    return {f"{prefix}.weight": f"{path}/kernel", f"{prefix}.bias": f"{path}/bias"}


_TOP = {
    "cls_token": "class_token/cls",
    "reg_token": "register_tokens/registers",
    "pos_embed": "position_embedding/pos_embedding",
    "patch_embed.proj.weight": "embedding/kernel",
    "patch_embed.proj.bias": "embedding/bias",
    **_pairs("norm_pre", "pre_norm"),
    **_pairs("norm", "encoder_norm"),
    **_pairs("fc_norm", "fc_norm"),
    **_dense("head", "head"),
    "attn_pool.latent": "attention_pool/probe",
    **_dense("attn_pool.q", "attention_pool/query"),
    **_dense("attn_pool.kv", "attention_pool/key_value"),
    **_dense("attn_pool.proj", "attention_pool/attention_output"),
    **_pairs("attn_pool.norm", "attention_pool/mlp_norm"),
    **_dense("attn_pool.mlp.fc1", "attention_pool/mlp_hidden"),
    **_dense("attn_pool.mlp.fc2", "attention_pool/mlp_output"),
}
_BLOCK = {
    **_pairs("norm1", "attention_norm"),
    "attn.qkv.weight": "qkv/kernel",
    "attn.qkv.bias": ("qkv/bias", lambda a: a.key_bias),  # timm's AttentionRope: all three biases
    **_pairs("attn.q_norm", "query_norm"),
    **_pairs("attn.k_norm", "key_norm"),
    **_pairs("attn.norm", "attention_output_norm"),
    **_dense("attn.proj", "attention_output"),
    "gamma_1": "attention_layer_scale",
    "gamma_2": "mlp_layer_scale",
    **_pairs("norm2", "mlp_norm"),
    **_dense("mlp.fc1", "mlp_hidden"),
    **_pairs("mlp.norm", "mlp_hidden_norm"),
    **_dense("mlp.fc2", "mlp_output"),
}
_QKV = {"attn.q_proj.weight": ("query", "weight"), "attn.k_proj.weight": ("key", "weight"),
        "attn.v_proj.weight": ("value", "weight")}
# timm's SwiGLU with separate gate and value layers (EVA-02 B/L, the aligned DINOv3 and LingBot widths).
_SWIGLU_PIECES = {"mlp.fc1_g.weight": ("mlp_hidden/kernel", 0, 2), "mlp.fc1_x.weight": ("mlp_hidden/kernel", 1, 2),
                  "mlp.fc1_g.bias": ("mlp_hidden/bias", 0, 2), "mlp.fc1_x.bias": ("mlp_hidden/bias", 1, 2)}


def _query_value_biases(query, value):
    """keras_vit's fused q/k/v bias from EVA's q and v biases: the key's is zero."""
    return {"qkv/bias": np.concatenate([query, np.zeros_like(query), value])}


def _split_query_value_biases(state, query_name, value_name):
    query, key, value = np.split(state["qkv/bias"], 3)
    if np.any(key):
        raise CheckpointError("the model's key bias is not zero, but timm's Eva attention has none (q and v biases "
                              "only); it cannot be written in timm's Eva layout.")
    return {query_name: query, value_name: value}


def _query_value_rule(query_name, value_name):
    """EVA's two biases as keras_vit's fused q/k/v bias, where the keys have none."""
    return BlockRule({query_name: ("qkv/bias",), value_name: ("qkv/bias",)},
                     lambda parts, block: _query_value_biases(parts[query_name], parts[value_name]),
                     lambda state: _split_query_value_biases(state, query_name, value_name),
                     when=lambda a: a.qkv_bias and not a.key_bias,
                     shapes=lambda width: {query_name: (width,), value_name: (width,)})


_HINT = "; keras_vit reads timm Eva state dicts (blocks.N.attn.qkv.weight, blocks.N.gamma_1, ...)"
# One layout for each of timm's q/k/v forms (its qkv_fused): one projection, or q_proj, k_proj and v_proj.
FUSED = TensorLayout("timm's Eva layout", top=_TOP, block_prefix="blocks.", block=_BLOCK, packed=_SWIGLU_PIECES,
                     rules=(_query_value_rule("attn.q_bias", "attn.v_bias"),), hint=_HINT)
# Its k_proj and v_proj may be narrower than q_proj (Sapiens2's grouped-query attention): `_check_kv_heads` checks
# each against the config's key/value heads.
SEPARATE = TensorLayout(
    "timm's Eva layout (q, k and v apart)", top=_TOP, block_prefix="blocks.",
    block={name: path for name, path in _BLOCK.items() if not name.startswith("attn.qkv.")},
    qkv={**_QKV, "attn.q_proj.bias": ("query", "bias"), "attn.k_proj.bias": ("key", "bias"),
         "attn.v_proj.bias": ("value", "bias")},
    packed=_SWIGLU_PIECES, rules=(), grouped=True, hint=_HINT)
# Where the keys have no bias, the q and v biases of separate projections are a rule, not a fusion.
SEPARATE_QUERY_VALUE_BIASES = TensorLayout(
    SEPARATE.name, top=_TOP, block_prefix="blocks.", block=SEPARATE.block, qkv=_QKV, packed=_SWIGLU_PIECES,
    rules=(_query_value_rule("attn.q_proj.bias", "attn.v_proj.bias"),), grouped=True, hint=_HINT)


def layout_of(switches, architecture):
    """The `TensorLayout` of an Eva architecture's file."""
    if switches.get("qkv_fused", True):
        return FUSED
    return SEPARATE_QUERY_VALUE_BIASES if architecture.qkv_bias and not architecture.key_bias else SEPARATE


# The model_args keywords of timm's Eva that keras_vit reads; norm_layer and norm_eps are classes in timm, which
# only a model function sets.
EVA_ARGUMENTS = frozenset({*EVA_KEYWORDS, *TRAINING_ONLY_KEYWORDS, *SIZE_KEYWORDS, *INFERENCE_NEUTRAL_KEYWORDS}
                           - {"norm_eps", "norm_layer"})


def checked_eva_sizes(state, entry, args, switches, name, path, where, resamples_patches=True):
    """The sizes of an `Eva` (or `Beit`, `VisionTransformerRelPos`, `Cait`, `VisionTransformerSAM`) file: the name's
    with `model_args` over them, each checked against the tensors. Where the class's load does not resample a
    patch kernel of another shape (`resamples_patches=False`: RelPos, Cait, SAM), both its sides are checked."""
    sizes = {key: args.get(key, default) for key, default in (
        ("patch_size", entry.patch_size), ("embed_dim", entry.embed_dim), ("depth", entry.depth),
        ("num_heads", entry.num_heads))}
    ratio = args.get("mlp_ratio", entry.mlp_ratio)
    sizes["mlp_dim"] = timm_mlp_dim(sizes["embed_dim"], ratio, switches)
    kernel = state["embedding/kernel"]
    square = resamples_patches or kernel.shape[0] == kernel.shape[1]
    found = dict(patch_size=(int(kernel.shape[0]) if square else tuple(int(side) for side in kernel.shape[:2]),
                             "patch_embed.proj.weight"),
                 embed_dim=(int(kernel.shape[-1]), "patch_embed.proj.weight"),
                 depth=(len({key.split("/")[0] for key in state if key.startswith("encoderblock_")}), "blocks.*"),
                 mlp_dim=(int(state["encoderblock_0/mlp_hidden/kernel"].shape[-1]), "blocks.0.mlp.fc1*"))
    for key, (value, tensor) in found.items():
        if value != sizes[key]:
            given = f"model_args.{key}" if key in args else f"timm's {name!r}"
            raise CheckpointError(f"{path}: {tensor} gives {key} {value}, but {given} has {sizes[key]} ({where}); "
                                  "the name, config and tensors disagree. Nothing was loaded.")
    pool_heads = switches.get("attn_pool_num_heads") if switches.get("global_pool") == "map" else None
    for key, heads in (("num_heads", sizes["num_heads"]), ("attn_pool_num_heads", pool_heads)):
        if heads and sizes["embed_dim"] % heads:
            given = f"model_args.{key}" if key in args else f"timm's {name!r} {key}"
            raise CheckpointError(f"{where}: {given} is {heads}, which does not divide the width "
                                  f"{sizes['embed_dim']} of {path}.")
    return sizes


def _check_kv_heads(tensors, architecture, sizes, fused, given, path):
    """Refuse a block whose key or value projection (`blocks.N.attn.k_proj.weight` and `v_proj.weight` each, or
    with `fused` q, k and v the keys' and values' share of `qkv.weight`) is not as wide as the key/value heads
    `architecture` gives it (`given` names the setting)."""
    width, heads, depth = sizes["embed_dim"], sizes["num_heads"], sizes["depth"]
    head_dim = width // heads
    for index, expected in enumerate(architecture.kv_heads_per_block(depth, heads)):
        prefix = f"blocks.{index}.attn."
        found = [(prefix + "qkv.weight", (tensors[prefix + "qkv.weight"].shape[0] - width) / 2 / head_dim)] if fused \
            else [(prefix + f"{part}.weight", tensors[prefix + f"{part}.weight"].shape[0] / head_dim)
                  for part in ("k_proj", "v_proj")]
        for name, count in found:
            if count == expected:
                continue
            if count != int(count) or count < 1 or heads % int(count):
                raise CheckpointError(f"{path}: {name} gives {count:g} key/value heads of width {head_dim}, which do "
                                      f"not divide num_heads {heads}: no timm Eva of these sizes holds it (check "
                                      "model_args.num_heads and embed_dim against the file). Nothing was loaded.")
            raise CheckpointError(f"{path}: {name} gives {count:g} key/value heads, but {given} has {expected} for "
                                  f"block {index}; the name, config and tensors disagree: set model_args.num_kv_heads "
                                  "to the file's, one per block. Nothing was loaded.")


def _split_frequencies(frequencies, architecture, sizes, path):
    """Mixed RoPE's `rope.freqs` `(2, depth, heads, head_dim / 2)` as each block's `rope_frequencies`."""
    if architecture.rope != "mixed":
        if frequencies is not None:
            raise CheckpointError(f"{path} has rope.freqs (learned mixed-RoPE frequencies), but its config.json "
                                  f"describes rope={architecture.rope!r}. Nothing was loaded.")
        return {}
    shape = (2, sizes["depth"], sizes["num_heads"], sizes["embed_dim"] // sizes["num_heads"] // 2)
    if frequencies is None or tuple(frequencies.shape) != shape:
        found = "lacks rope.freqs" if frequencies is None else f"has rope.freqs of shape {tuple(frequencies.shape)}"
        raise CheckpointError(f"{path} {found}, but the mixed-RoPE model its config.json describes has learned "
                              f"frequencies of shape {shape}. Nothing was loaded.")
    return {f"encoderblock_{index}/rope_frequencies": np.asarray(frequencies[:, index], "float32")
            for index in range(sizes["depth"])}


def configured_eva_architecture(config, where):
    """`(entry, model_args, switches, pretrained_cfg, Architecture)` of a timm `config.json` (parsed, read from
    `where`) naming one of `EVA_ARCHITECTURES`: the model it describes, before any tensor is read."""
    name = config.get("architecture")
    entry = EVA_ARCHITECTURES[name]
    args = model_args_of(config, where, "Eva", EVA_ARGUMENTS)
    switches = configured_switches(entry, args, config, (*EVA_KEYWORDS, *TRAINING_ONLY_KEYWORDS), "avg", where)
    if isinstance(switches.get("num_kv_heads"), tuple):  # a block's null is its full attention, as timm computes it
        heads = args.get("num_heads", entry.num_heads)
        switches["num_kv_heads"] = tuple(heads if count is None else count for count in switches["num_kv_heads"])
    if switches.get("rope_type") == "mixed" and switches.get("rope_rotate_half"):
        given = "model_args.rope_rotate_half" if "rope_rotate_half" in args else f"timm's {name!r} rope_rotate_half"
        raise CheckpointError(f"{where}: {given} is True with rope_type 'mixed'; expected false (timm's mixed RoPE "
                              "rotates interleaved pairs).")
    try:
        fields = eva_switches_to_architecture(switches)
    except KeyError as error:
        raise CheckpointError(f"{where}: {error} is not a setting keras_vit computes.") from None
    pretrained, statistics = configured_pixel_statistics(config, where)
    fields.update(statistics)
    try:
        architecture = Architecture(**fields)
    except ValueError as error:
        raise CheckpointError(f"{where}: timm's {name!r} with these model_args is no model keras_vit can build: "
                              f"{error}") from None
    return entry, args, switches, pretrained, _grouped(architecture, name, entry, args, switches, where)


def _kv_heads_setting(args, name):
    """Where a config's key/value heads come from, as the errors name it."""
    return "model_args.num_kv_heads" if "num_kv_heads" in args else f"timm's {name!r} num_kv_heads"


def _grouped(architecture, name, entry, args, switches, where):
    """`architecture` with each block's key/value heads, checked as timm's `Eva` and `AttentionRope` check them."""
    given = _kv_heads_setting(args, name)
    depth, heads = args.get("depth", entry.depth), args.get("num_heads", entry.num_heads)
    counts = switches.get("num_kv_heads")
    if isinstance(counts, tuple) and len(counts) != depth:
        raise CheckpointError(f"{where}: {given} is for {len(counts)} blocks, but depth is {depth}: timm takes one "
                              "count per block (or one number for all); list them in model_args.num_kv_heads. Nothing "
                              "was loaded.")
    for index, count in enumerate(counts if isinstance(counts, tuple) else (counts,) * depth):
        if count is not None and heads % count:
            raise CheckpointError(f"{where}: {given} is {count} for block {index}, which does not divide num_heads "
                                  f"{heads}; set it to a divisor of {heads} (each key/value head serves num_heads / "
                                  "num_kv_heads query heads). Nothing was loaded.")
    grouped = architecture.with_blocks(depth, heads)
    if grouped.num_kv_heads and (switches.get("qkv_fused", True) or switches.get("attn_type", "eva") != "rope"):
        raise CheckpointError(f"{where}: {given} groups the keys and values, which timm computes only with q, k and "
                              "v apart in its AttentionRope: set qkv_fused false and attn_type 'rope'. Nothing was "
                              "loaded.")
    return grouped


def read_timm_eva(path, budget, config, where):
    """Read a timm `Eva` state dict whose `config.json` (parsed as `config`, read from `where`) names its
    architecture, one of `eva_families.EVA_ARCHITECTURES`, into a `WeightsSource`."""
    name = config.get("architecture")
    entry, args, switches, pretrained, architecture = configured_eva_architecture(config, where)
    transform = configured_eval_transform(config, where)
    tensors = read_state_dict(path, budget)
    frequencies = tensors.pop("rope.freqs", None)
    if frequencies is not None:  # Read apart from the layout, which checks the others.
        refuse_non_float(path, {"rope.freqs": np.asarray(frequencies).dtype})
    layout = layout_of(switches, architecture)
    state = layout.read(tensors, path)
    if "embedding/kernel" not in state or "encoderblock_0/mlp_hidden/kernel" not in state:
        raise CheckpointError(f"{path} lacks timm's patch embedding or first block (patch_embed.proj.weight, "
                              "blocks.0.mlp.fc1*). Nothing was loaded.")
    sizes = checked_eva_sizes(state, entry, args, switches, name, path, where)
    unpacked = eva_unpacked_swiglu(switches)
    if unpacked != ("blocks.0.mlp.fc1_g.weight" in tensors) and architecture.mlp_activation == "swiglu":
        found, built = ("one packed SwiGLU layer (mlp.fc1)", "two (mlp.fc1_g, mlp.fc1_x)") if unpacked else \
            ("a SwiGLU in two layers (mlp.fc1_g, mlp.fc1_x)", "one (mlp.fc1)")
        raise CheckpointError(f"{path} holds {found}, but timm's {name!r} builds {built}. Nothing was loaded.")
    layout.check_complete(list(tensors), architecture, sizes["depth"],
                          settings(dict(sizes, architecture=name), "architecture", "depth"), path)
    _check_kv_heads(tensors, architecture, sizes, layout is FUSED, _kv_heads_setting(args, name), path)
    state.update(_split_frequencies(frequencies, architecture, sizes, path))
    check_head(state, args.get("num_classes", config.get("num_classes")), path, where)
    step = sizes["patch_size"]
    if architecture.position_embedding:
        grid, _ = grid_of_config(state, architecture, entry, args, pretrained, step, where)
    else:
        size = configured_image_sizes(args, pretrained, entry, where)[0]
        grid = (size[0] // step, size[1] // step)
    source = source_from_state(path, state, grid, sizes["num_heads"], architecture)
    source.origins = {**layout.origins(tensors), **{name: ("rope.freqs",) for name in state
                                                     if name.endswith("/rope_frequencies")}}
    source.position_resize = entry.resize[:2]
    source.eval_transform = transform
    return source


def eva_arguments(model, architecture):
    """The keywords of `timm.create_model(architecture, **kwargs)` with the sizes of `model`, for a name of timm's
    `Eva` class (`writer.timm_arguments` checks that they rebuild it)."""
    entry = EVA_ARCHITECTURES[architecture]
    block = model.get_layer("encoderblock_0")
    embed = int(model.get_layer("embedding").kernel.shape[-1])
    patch = tuple(model.get_layer("embedding").kernel.shape[:2])
    head = [layer for layer in model.layers if layer.name == "head"]
    blocks = [layer for layer in model.layers if layer.name.startswith("encoderblock_")]
    arguments = dict(img_size=native_image_size(model, patch), patch_size=patch[0], embed_dim=embed,
                     depth=len(blocks), num_heads=int(block.num_heads),
                     mlp_ratio=timm_mlp_ratio(embed, block.mlp_dim, entry.switches),
                     num_classes=int(head[0].kernel.shape[-1]) if head else 0)
    kv_heads = [int(getattr(layer, "num_kv_heads", layer.num_heads)) for layer in blocks]
    if "num_kv_heads" in entry.switches or kv_heads != [int(block.num_heads)] * len(blocks):
        arguments["num_kv_heads"] = kv_heads  # one per block: the name's own are for its own depth
    return arguments


def to_timm_eva(model, architecture):
    """`model`'s weights as the state dict of timm's `Eva` `architecture` (numpy arrays, PyTorch's shapes)."""
    entry = EVA_ARCHITECTURES[architecture]
    found = architecture_of(model)
    state = state_of(model)
    if any("lora_" in name for name in state):
        raise CheckpointError(f"{model.name} has LoRA adapters, which timm's Eva does not have: call "
                              "keras_vit.merge_lora(model) first, then save_timm.")
    frequencies = [state.pop(name) for name in sorted((name for name in state if name.endswith("/rope_frequencies")),
                                                       key=lambda name: int(name.split("/")[0].split("_")[1]))]
    layout = layout_of(entry.switches, found)
    tensors = {}
    if layout is not FUSED:  # q, k and v apart: split keras_vit's fused projection here
        queries = int(model.get_layer("embedding").kernel.shape[-1])
        for name in [name for name in state if name.endswith(("/qkv/kernel", "/qkv/bias"))]:
            block, _, rest = name.partition("/")
            prefix = f"blocks.{block.removeprefix('encoderblock_')}.attn."
            value = state.pop(name)
            kind = "weight" if rest.endswith("kernel") else "bias"
            keys = (value.shape[-1] - queries) // 2  # fewer than the queries with grouped-query attention
            for part, piece in zip("qkv", np.split(value, [queries, queries + keys], axis=-1)):
                if kind == "bias" and part == "k" and not found.key_bias:
                    if np.any(piece):
                        raise CheckpointError("the model's key bias is not zero, but timm's Eva attention has none.")
                    continue
                tensors[f"{prefix}{part}_proj.{kind}"] = np.ascontiguousarray(
                    (piece.T if kind == "weight" else piece).astype("float32"))
    tensors.update(layout.write(state, unpacked=eva_unpacked_swiglu(entry.switches), architecture=found))
    if frequencies:
        tensors["rope.freqs"] = np.ascontiguousarray(np.stack(frequencies, axis=1).astype("float32"))
    return tensors
