"""timm's layout: a `VisionTransformer` state dict, and reading it (`writer` writes it).

timm stores PyTorch tensors under its module names (`blocks.0.attn.qkv.weight`,
...): dense kernels as `(out, in)`, the patch convolution as `(out, in, h, w)`.
A bare state dict is a `.safetensors` file (or a `.bin`/`.pth` file, read
only through `torch.load(weights_only=True)`); timm's Hub folders add a
`config.json` with the model's arguments and preprocessing, which
`read_timm` reads too (`folders.read_timm_folder` picks the reader of each class). Every switch of timm's plain-ViT family that
keras_vit's `Architecture` has (registers, `no_embed_class`, layer scale,
`norm_pre`, `fc_norm`, attention pooling, q/k norms, optional biases, SwiGLU,
DeiT's distillation token and head)
is read from the tensors; what they cannot show comes from `model_args` or
the architecture's family (`families`). timm's ResNet hybrids
(`patch_embed.backbone.*`) are read by `hybrid`.

Example:
>>> from keras_vit import checkpoints
>>> source = checkpoints.read_timm("model.safetensors")  # doctest: +SKIP
"""

import dataclasses
import logging

import numpy as np

from keras_vit.checkpoints.source import (
    CheckpointError,
    architecture_from_state,
    class_names_in_order,
    preview,
    source_from_state,
)
from keras_vit.checkpoints.state_dict_files import read_state_dict
from keras_vit.checkpoints.tensor_layout import BlockRule, TensorLayout, keras_to_torch, settings, torch_to_keras
from keras_vit.checkpoints.timm.config import (
    check_head,
    check_tensors_agree,
    checked_sizes,
    configured_eval_transform,
    configured_pixel_statistics,
    configured_switches,
    grid_of_config,
    model_args_of,
)
from keras_vit.checkpoints.timm.families import (
    DEFAULT_RESIZE,
    SWITCH_KEYWORDS,
    timm_architecture,
    timm_switches_to_architecture,
)
from keras_vit.checkpoints.timm.hybrid import BACKBONE, backbone_from_timm, backbone_origins, check_backbone_agrees
from keras_vit.data import preprocessing
from keras_vit.model.architecture import Architecture
from keras_vit.model.description import conv_stem_widths_of, mbconv_of, resnet_layers_of
from keras_vit.model.variants import CONV_STEM_STRIDE, MBCONV_PATCH_SIZE, mbconv_stride, resnet_stride

logger = logging.getLogger("keras_vit")

def _sequential(path):
    """`path` in a plain block (timm's Block, ResPostBlock), which has a parallel block's counterpart."""
    return path, lambda architecture: not architecture.parallel


def _parallel(path, differential=None):
    """`path` in a parallel block (timm's ParallelScalingBlock; with `differential`, only in DiffParallelScalingBlock
    or only in the other)."""
    return path, lambda a: a.parallel and differential in (None, a.differential_attention)


# timm name (after "blocks.{i}.") -> keras_vit name (after "encoderblock_{i}/").
_BLOCK = {
    "norm1.weight": _sequential("attention_norm/gamma"),
    "norm1.bias": _sequential("attention_norm/beta"),
    "attn.qkv.weight": _sequential("qkv/kernel"),
    "attn.qkv.bias": _sequential("qkv/bias"),
    "attn.proj.weight": _sequential("attention_output/kernel"),
    "attn.proj.bias": _sequential("attention_output/bias"),
    "norm2.weight": "mlp_norm/gamma",
    "norm2.bias": "mlp_norm/beta",
    "mlp.fc1.weight": _sequential("mlp_hidden/kernel"),
    "mlp.fc1.bias": _sequential("mlp_hidden/bias"),
    "mlp.fc2.weight": _sequential("mlp_output/kernel"),
    "mlp.fc2.bias": "mlp_output/bias",
    "ls1.gamma": "attention_layer_scale",
    "ls2.gamma": "mlp_layer_scale",
    "attn.q_norm.weight": _sequential("query_norm/gamma"),
    "attn.q_norm.bias": _sequential("query_norm/beta"),
    "attn.k_norm.weight": _sequential("key_norm/gamma"),
    "attn.k_norm.bias": _sequential("key_norm/beta"),
    "attn.norm.weight": "attention_output_norm/gamma",
    "attn.norm.bias": "attention_output_norm/beta",
    "mlp.norm.weight": "mlp_hidden_norm/gamma",
    "mlp.norm.bias": "mlp_hidden_norm/beta",
    "attn.lambda_q1": _sequential("lambda_q1"),
    "attn.lambda_k1": _sequential("lambda_k1"),
    "attn.lambda_q2": _sequential("lambda_q2"),
    "attn.lambda_k2": _sequential("lambda_k2"),
    "attn.sub_norm.weight": _sequential("attention_sub_norm/gamma"),
    # timm's parallel blocks: one norm, one input projection (MLP first, then q, k, v), the attention's and the
    # MLP's outputs summed under one layer scale.
    "in_norm.weight": _parallel("attention_norm/gamma"),
    "in_norm.bias": _parallel("attention_norm/beta"),
    "mlp_bias": ("mlp_hidden/bias", lambda a: a.parallel and not a.qkv_bias),  # else in in_proj.bias
    "attn_out_proj.weight": _parallel("attention_output/kernel", differential=False),
    "mlp_out_proj.weight": _parallel("mlp_output/kernel", differential=False),
    "out_proj.bias": _parallel("attention_output/bias", differential=True),
    "ls.gamma": "layer_scale",
    "q_norm.weight": _parallel("query_norm/gamma"),
    "q_norm.bias": _parallel("query_norm/beta"),
    "k_norm.weight": _parallel("key_norm/gamma"),
    "k_norm.bias": _parallel("key_norm/beta"),
    "lambda_q1": _parallel("lambda_q1"),
    "lambda_k1": _parallel("lambda_k1"),
    "lambda_q2": _parallel("lambda_q2"),
    "lambda_k2": _parallel("lambda_k2"),
    "sub_norm.weight": _parallel("attention_sub_norm/gamma"),
}


def _split_in_projection(parts, block):
    """A parallel block's `in_proj` (MLP input rows, then q, k and v) as keras_vit's `mlp_hidden` and `qkv`."""
    width = block["in_proj.weight"].shape[1]
    state = {}
    for name, kind in (("in_proj.weight", "kernel"), ("in_proj.bias", "bias")):
        if name in parts:
            mlp, qkv = np.split(torch_to_keras(name, parts[name]), [parts[name].shape[0] - 3 * width], axis=-1)
            state.update({f"mlp_hidden/{kind}": mlp, f"qkv/{kind}": qkv})
    return state


def _join_in_projection(state):
    return {f"in_proj.{kind}": keras_to_torch(f"in_proj.{kind}", np.concatenate(
        [state[f"mlp_hidden/{name}"], state[f"qkv/{name}"]], -1)) for kind, name in (("weight", "kernel"),
                                                                                    ("bias", "bias"))
            if f"qkv/{name}" in state}


def _split_out_projection(parts, block):
    """DiffParallelScalingBlock's one `out_proj` (attention columns, then the MLP's) as keras_vit's two."""
    width = parts["out_proj.weight"].shape[0]
    attention, mlp = np.split(torch_to_keras("out_proj.weight", parts["out_proj.weight"]), [width], axis=0)
    return {"attention_output/kernel": attention, "mlp_output/kernel": mlp}


# Where the file keeps block weights otherwise than one tensor per weight.
_RULES = (
    BlockRule({"in_proj.weight": ("mlp_hidden/kernel", "qkv/kernel")}, _split_in_projection, _join_in_projection,
              when=lambda a: a.parallel),
    BlockRule({"in_proj.bias": ("mlp_hidden/bias", "qkv/bias")}, _split_in_projection, _join_in_projection,
              when=lambda a: a.parallel and a.qkv_bias, needs=("in_proj.weight",)),
    # ParallelScalingBlock's two output biases act as one: keras_vit keeps their sum, and writes it back whole.
    BlockRule({"attn_out_proj.bias": ("attention_output/bias",), "mlp_out_proj.bias": ("attention_output/bias",)},
              lambda parts, block: {"attention_output/bias": parts["attn_out_proj.bias"] + parts["mlp_out_proj.bias"]},
              lambda state: {"attn_out_proj.bias": state["attention_output/bias"],
                             "mlp_out_proj.bias": np.zeros_like(state["attention_output/bias"])},
              when=lambda a: a.parallel and not a.differential_attention and a.projection_bias),
    BlockRule({"out_proj.weight": ("attention_output/kernel", "mlp_output/kernel")}, _split_out_projection,
              lambda state: {"out_proj.weight": keras_to_torch("out_proj.weight", np.concatenate(
                  [state["attention_output/kernel"], state["mlp_output/kernel"]], 0))},
              when=lambda a: a.parallel and a.differential_attention),
)
_TOP = {
    "cls_token": "class_token/cls",
    "pos_embed": "position_embedding/pos_embedding",
    "patch_embed.proj.weight": "embedding/kernel",
    "patch_embed.proj.bias": "embedding/bias",
    "patch_embed.norm.weight": "patch_norm/gamma",
    "patch_embed.norm.bias": "patch_norm/beta",
    "norm.weight": "encoder_norm/gamma",
    "norm.bias": "encoder_norm/beta",
    "head.weight": "head/kernel",
    "head.bias": "head/bias",
    "dist_token": "distillation_token/dist",
    "head_dist.weight": "head_dist/kernel",
    "head_dist.bias": "head_dist/bias",
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
    "attn_pool.q_norm.": "query/key normalisation in attention pooling",
    "attn_pool.pos_embed": "position embeddings in attention pooling",
}
# timm's unpacked SwiGLU (AIMv2): the gate's and the value's halves of keras_vit's first MLP layer.
_SWIGLU_PIECES = {"mlp.fc1_g.weight": ("mlp_hidden/kernel", 0, 2), "mlp.fc1_x.weight": ("mlp_hidden/kernel", 1, 2),
                  "mlp.fc1_g.bias": ("mlp_hidden/bias", 0, 2), "mlp.fc1_x.bias": ("mlp_hidden/bias", 1, 2)}
LAYOUT = TensorLayout("timm's VisionTransformer layout", top=_TOP, block_prefix="blocks.", block=_BLOCK,
                      packed=_SWIGLU_PIECES, rules=_RULES,
                      hint="; keras_vit reads timm ViT state dicts (blocks.N.attn.qkv.weight, ...)")
# ViTamin's GeGluMlp: a norm on its input (`mlp.norm`, BEiT-3's hidden norm elsewhere), then `w0` (the gate) and
# `w1`, the halves of keras_vit's first MLP layer, and `w2`.
GEGLU_LAYOUT = dataclasses.replace(
    LAYOUT, name="timm's VisionTransformer layout with GeGluMlp MLPs (ViTamin)",
    block={**{name: ours for name, ours in _BLOCK.items() if not name.startswith("mlp.")},
           "mlp.norm.weight": "mlp_input_norm/gamma", "mlp.norm.bias": "mlp_input_norm/beta",
           "mlp.w2.weight": "mlp_output/kernel", "mlp.w2.bias": "mlp_output/bias"},
    packed={f"mlp.{name}.{field}": (f"mlp_hidden/{kind}", part, 2) for part, name in enumerate(("w0", "w1"))
            for field, kind in (("weight", "kernel"), ("bias", "bias"))})


def layout_of(names, architecture=None):
    """The layout of timm tensor `names`, or of a model of `architecture`: with GeGluMlp MLPs, or the plain one."""
    if architecture is not None:
        return GEGLU_LAYOUT if architecture.mlp_activation == "geglu" else LAYOUT
    return GEGLU_LAYOUT if any(name.endswith(".mlp.w0.weight") for name in names) else LAYOUT


def from_timm(tensors, description="checkpoint", position_tables=None):
    """keras_vit's state `{path: array}` from a timm ViT state dict of numpy arrays; `position_tables`: keras_vit
    paths and arrays of position tables read beside the layout (NaFlexVit's factorized ones)."""
    for marker, what in _UNSUPPORTED.items():
        found = sorted(name for name in tensors if marker in name or name.startswith(marker))
        if found:
            raise CheckpointError(
                f"{description} is a timm ViT with {what} ({preview(found, 3)}), which keras_vit's ViT does not have."
            )
    backbone = backbone_from_timm(tensors, description, torch_to_keras)
    state = layout_of(tensors).read({name: value for name, value in tensors.items() if not name.startswith(BACKBONE)},
                                    description)
    state.update(backbone)
    state.update(position_tables or {})
    # timm's pos_embed='none' is ViTamin XL's alone among the VisionTransformers keras_vit reads.
    if "embedding/kernel" not in state or (not any(path.startswith("position_embedding/") for path in state)
                                           and mbconv_of(state) is None):
        raise CheckpointError(f"{description} lacks a patch or position embedding (patch_embed.proj.weight, pos_embed).")
    return state


def configured_architecture(config, where, resnet_epsilons=None):
    """`(entry, model_args, switches, pretrained_cfg, Architecture)` of a timm `config.json` (parsed, read from
    `where`) naming one of `families.ARCHITECTURES`: the model it describes, before any tensor is read."""
    name = config.get("architecture")
    entry = timm_architecture(name, where)
    args = model_args_of(config, where)
    switches = configured_switches(entry, args, config, SWITCH_KEYWORDS, "token", where)
    try:
        fields = timm_switches_to_architecture(switches)
    except KeyError as error:  # an act_layer or pool the checks above let through
        raise CheckpointError(f"{where}: {error} is not a setting keras_vit computes.") from None
    pretrained, statistics = configured_pixel_statistics(config, where)
    fields.update(statistics, distillation_token=entry.distilled)
    try:
        architecture = Architecture(**fields, **({} if resnet_epsilons is None else
                                                 {"resnet_epsilons": resnet_epsilons}))
    except ValueError as error:  # model_args that contradict the named architecture's switches
        raise CheckpointError(f"{where}: timm's {name!r} with these model_args is no model keras_vit can build: "
                              f"{error}") from None
    return entry, args, switches, pretrained, architecture


def read_timm(path, budget=None, config=None, config_path=None):
    """Read a timm ViT state dict file into a `WeightsSource`.

    A bare state dict shows its switches in its tensors (exact GELU, timm's
    default, and timm's epsilon). With `config`, the parsed `config.json` of
    a Hub folder (read from `config_path`, named in errors), the architecture
    it names must be one of `families.ARCHITECTURES`: that entry, with
    `model_args` over it, is the model, and the tensors must agree with it.
    """
    tensors = read_state_dict(path, budget)
    state = from_timm(tensors, description=path)
    resnet = resnet_layers_of(state)
    epsilons = None if resnet is None else "timm"
    if not config:
        gate = "geglu" if layout_of(tensors) is GEGLU_LAYOUT else "gelu"  # else SwiGLU where the MLP is gated
        architecture = architecture_from_state(state, None, mlp_activation=gate, resnet_epsilons=epsilons)
        source = source_from_state(path, state, None, None, architecture)
        source.origins = {**layout_of(tensors).origins(tensors), **backbone_origins(state)}
        source.position_resize = DEFAULT_RESIZE[:2]
        source.eval_transform = preprocessing.from_timm_config({}, path)  # timm's defaults, at the model's size
        return source
    where = config_path or path
    name = config.get("architecture")
    check_backbone_agrees(state, timm_architecture(name, where), name, path)
    entry, args, switches, pretrained, architecture = configured_architecture(config, where, epsilons)
    transform = configured_eval_transform(config, where)
    sizes = checked_sizes(state, entry, args, name, path, where)
    check_tensors_agree(state, architecture, name, path,
                        unpacked=(switches.get("mlp_layer") == "swiglu", "blocks.0.mlp.fc1_g.weight" in tensors))
    stem, mbconv = conv_stem_widths_of(state), mbconv_of(state)
    layout_of(tensors, architecture).check_complete(
        [name for name in tensors if not name.startswith(BACKBONE)], architecture, sizes["depth"],
        settings(dict(sizes, architecture=name), "architecture", "depth"), path,
        supplied=() if stem is None and mbconv is None else ("embedding/kernel", "embedding/bias"))
    num_classes = args.get("num_classes", config.get("num_classes"))
    check_head(state, num_classes, path, where)
    stride = 1 if resnet is None else resnet_stride(resnet)
    if stem is not None:  # timm's patch 1 over the whole ConvStem, whose last convolution is keras_vit's patches
        stride = CONV_STEM_STRIDE * int(state["embedding/kernel"].shape[0])
    if mbconv is not None:  # timm's patch 1 over the whole MbConvStages, whose pool.proj is keras_vit's patches
        stride = MBCONV_PATCH_SIZE * mbconv_stride(mbconv[1])
    step = sizes["patch_size"] * stride
    grid, image_size = grid_of_config(state, architecture, entry, args, pretrained, step, where)
    source = source_from_state(path, state, grid, sizes["num_heads"], architecture)
    source.origins = {**layout_of(tensors).origins(tensors), **backbone_origins(state)}
    if image_size is not None and (image_size[0] % step or image_size[1] % step):
        source.input_size = image_size  # timm's VALID convolution drops the rest (so400m/14 at 384 px)
    source.position_resize = entry.resize[:2]
    source.resize_align_corners = entry.resize[2]
    # Label ids (synsets) in head order, shown by their descriptions ("tench, Tinca tinca") where given.
    def field(key):
        return config.get(key) or pretrained.get(key)

    names, descriptions = class_names_in_order(field("label_names"), state), field("label_descriptions")
    if names and isinstance(descriptions, dict):
        names = [str(descriptions.get(name, name)) for name in names]
    source.class_names = names
    source.eval_transform = transform
    return source
