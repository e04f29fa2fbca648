"""timm's optimizer parameter groups for a keras_vit model: each variable's layer-wise rate scale and weight decay.

timm's `create_optimizer_v2(model, opt, weight_decay=wd, layer_decay=d)`
(`param_groups_layer_decay`) gives each parameter

- a layer id from its class's `group_matcher`: the stem (patch embedding
  and the tables and tokens the class lists with it) 0, block `i` `i + 1`,
  the final norm with the last block, and everything the matcher leaves
  out (the head, `fc_norm`, attention pooling, SAM's neck, ...) one past
  the last; the ids are then numbered densely, so the rate scale is
  `d ** (last id - id)`;
- no weight decay where the tensor has one dimension or fewer, or where
  its class's `no_weight_decay()` names it.

Each timm class draws those lines differently (RelPos leaves its shared
bias to the head's rate, SAM decays its offset tables, Eva's mixed RoPE
frequencies take the head's rate), so each has one rule here, `TIMM_RULES`,
written in keras_vit's variable names; `timm_class` says which class a
model is.

Example:
>>> import keras_vit
>>> model = keras_vit.ViT(image_size=32, patch_size=8, hidden_size=24, num_layers=2, num_heads=3, mlp_dim=48,
...                       classes=5)
>>> groups = parameter_groups(model, layer_decay=0.5)
>>> groups["embedding/kernel"], groups["encoderblock_1/qkv/bias"], groups["head/kernel"]
((0.125, True), (0.5, False), (1.0, True))
"""

import dataclasses
import re

from keras_vit.checkpoints.timm.beit import BEIT_ARCHITECTURES
from keras_vit.checkpoints.timm.eva_families import EVA_ARCHITECTURES, eva_unpacked_swiglu
from keras_vit.checkpoints.timm.relpos import RELPOS_ARCHITECTURES
from keras_vit.model.description import architecture_of, is_naflex

# A keras_vit variable's top-level layer -> the timm module it is part of, for the rules below.
_KINDS = (
    (r"embedding|patch_norm|conv_root|gn_root|block\d+_unit\d+|conv_stem_\d+(_norm)?|mbconv_.*", "patch_embed"),
    (r"position_embedding", "pos_embed"),
    (r"axis_position_embedding", "patch_embed"),  # Gemma 4's tables are timm's patch_embed.position_embedding_table
    (r"class_token", "cls_token"),
    (r"register_tokens", "reg_token"),
    (r"distillation_token", "dist_token"),
    (r"pre_norm", "norm_pre"),
    (r"relative_position_bias", "shared_relative_position"),
    (r"encoderblock_(\d+)", "blocks"),
    (r"class_attention_(\d+)", "blocks_token_only"),
    (r"encoder_norm", "norm"),
)


@dataclasses.dataclass(frozen=True)
class TimmRule:
    """One timm class's `group_matcher` and `no_weight_decay()`, in keras_vit's terms.

    stem: the module kinds (`_KINDS`) its matcher puts with the patch
        embedding (layer 0); every other kind but the blocks and the final
        norm goes with the head.
    no_decay: the kinds its `no_weight_decay()` names (and `rope_frequencies`:
        Eva's `rope.freqs`; `pos_table`: NaFlexVit's one table; `axis_table`:
        Gemma 4's tables).
    no_decay_tables: whether it names every relative position bias table
        (BEiT's), per block and shared.
    norm_with_blocks: whether the final norm joins the last block (else the head's rate: Gemma 4's classifier).
    """

    stem: tuple
    no_decay: tuple
    no_decay_tables: bool = False
    norm_with_blocks: bool = True


_VIT_STEM = ("cls_token", "reg_token", "pos_embed", "patch_embed", "norm_pre")
TIMM_RULES = {  # timm 1.0.31's group_matcher / no_weight_decay of each class keras_vit reads
    "VisionTransformer": TimmRule(_VIT_STEM, ("pos_embed", "cls_token", "reg_token", "dist_token")),
    "VisionTransformerDistilled": TimmRule(("cls_token", "pos_embed", "patch_embed", "dist_token"),
                                           ("pos_embed", "cls_token", "reg_token", "dist_token")),
    "Eva": TimmRule(_VIT_STEM, ("pos_embed", "cls_token", "reg_token", "rope_frequencies")),
    "Beit": TimmRule(("cls_token", "pos_embed", "patch_embed", "shared_relative_position"), ("pos_embed", "cls_token"),
                     no_decay_tables=True),
    "VisionTransformerRelPos": TimmRule(("cls_token", "patch_embed"), ("cls_token",)),
    "Cait": TimmRule(("cls_token", "pos_embed", "patch_embed"), ("pos_embed", "cls_token")),
    "VisionTransformerSAM": TimmRule(("pos_embed", "patch_embed"), ("pos_embed", "dist_token")),
    "Gemma4VitEncoder": TimmRule(("patch_embed",), ("axis_table",)),
    "Gemma4VitClassifier": TimmRule(("patch_embed",), ("axis_table",), norm_with_blocks=False),
    # NaFlexVit's `embeds` module holds the patch embedding, its tables and tokens; norm_pre is outside it, and
    # its no_weight_decay() names `embeds.pos_embed` only, not the factorized `pos_embed_y` / `pos_embed_x`.
    "NaFlexVit": TimmRule(("cls_token", "reg_token", "pos_embed", "patch_embed"), ("pos_table", "cls_token",
                                                                                   "reg_token")),
}


def timm_class(model):
    """The timm class whose parameter groups `model` takes: the one it was read as, else the one its structure is."""
    found = architecture_of(model)
    paths = {variable.path for variable in model.weights}
    if is_naflex(model):
        return "NaFlexVit"
    if found.axis_position_table:
        return "Gemma4VitClassifier" if "head/kernel" in paths else "Gemma4VitEncoder"
    if found.class_attention_blocks or found.talking_heads:
        return "Cait"
    if found.window_size or found.global_attention_blocks or found.neck_channels is not None \
            or found.decomposed_relative_position:
        return "VisionTransformerSAM"
    if found.relative_position_tables:
        if model.name in RELPOS_ARCHITECTURES:
            return "VisionTransformerRelPos"
        # BEiT's attention has no key bias (its q_bias and v_bias), timm's relpos models a full qkv bias
        return "Beit" if model.name in BEIT_ARCHITECTURES or not found.key_bias else "VisionTransformerRelPos"
    if found.rope or not found.key_bias or not found.position_embedding:
        return "Eva"
    if found.distillation_token:
        return "VisionTransformerDistilled"
    return "VisionTransformer"


def _kind(path):
    """`(kind, index)` of a variable path: the timm module it belongs to, and its block index where it has one."""
    top = path.split("/")[0]
    for pattern, kind in _KINDS:
        match = re.fullmatch(pattern, top)
        if match:
            return kind, int(match.group(1)) if kind.startswith("blocks") else None
    return "head", None


def layer_ids(model, rule=None):
    """`{variable path: layer id}` of `model`'s trainable variables as timm's `group_matcher` numbers them."""
    rule = rule or TIMM_RULES[timm_class(model)]
    depth = sum(layer.name.startswith("encoderblock_") for layer in model.layers)
    token_only = sum(layer.name.startswith("class_attention_") for layer in model.layers)
    keys = {}
    for variable in model.trainable_weights:
        kind, index = _kind(variable.path)
        if kind == "blocks" and variable.path.endswith("/rope_frequencies"):
            kind = "head"  # Eva's rope.freqs is one model-level module in timm, which its matcher leaves out
        if kind in rule.stem:
            key = (0.0,)
        elif kind == "blocks":
            key = (1.0, float(index))
        elif kind == "blocks_token_only":  # CaiT: with the last blocks, as its matcher overlaps them
            key = (1.0, float(index + depth - token_only))
        elif kind == "norm" and rule.norm_with_blocks:
            key = (1.0, float(depth - 1))
        else:
            key = (float("inf"),)
        keys[variable.path] = key
    ids = {key: number for number, key in enumerate(sorted(set(keys.values())))}
    return {path: ids[key] for path, key in keys.items()}


def decays(variable, rule):
    """Whether timm decays `variable` (1-D or smaller never; then what the class's `no_weight_decay()` names)."""
    if len(variable.shape) <= 1:
        return False
    kind, _ = _kind(variable.path)
    name = variable.path.rsplit("/", 1)[-1]
    if kind == "pos_embed" and "pos_table" in rule.no_decay:
        return name != "pos_embedding"  # NaFlexVit names its one table, not the factorized pair
    if kind == "patch_embed" and "axis_table" in rule.no_decay and variable.path.startswith("axis_position"):
        return False
    if rule.no_decay_tables and name == "relative_position_bias_table":
        return False
    if name == "rope_frequencies" and "rope_frequencies" in rule.no_decay:
        return False
    return kind not in rule.no_decay


def parameter_groups(model, layer_decay=None, timm_class_name=None):
    """`{variable path: (rate scale, decays)}` for `model`'s trainable variables, as timm's
    `create_optimizer_v2(model, ..., layer_decay=layer_decay)` groups them (every scale 1.0 without a decay).

    `timm_class_name`: the class of `TIMM_RULES` to follow (default: `timm_class(model)`).
    """
    if layer_decay is not None and not 0 < layer_decay <= 1:
        raise ValueError(f"layer_decay must be in (0, 1] (timm's --layer-decay: 0.65 for BEiT and MAE base, 0.75 "
                         f"for large), got {layer_decay!r}.")
    name = timm_class_name or timm_class(model)
    if name not in TIMM_RULES:
        raise ValueError(f"Unknown timm class {name!r}; expected one of {sorted(TIMM_RULES)}.")
    rule = TIMM_RULES[name]
    ids = layer_ids(model, rule)
    last = max(ids.values(), default=0)
    return {variable.path: (1.0 if layer_decay is None else float(layer_decay) ** (last - ids[variable.path]),
                            decays(variable, rule)) for variable in model.trainable_weights}


def split_tensors(model):
    """Why timm holds some of `model`'s variables as several tensors, or None.

    keras_vit fuses what some timm classes keep apart: Gemma 4's q, k and v
    and its gate and up projections, BEiT's and EVA-02's two SwiGLU layers,
    and the q, k and v of Eva models built with `qkv_fused=False`. AdamW
    steps each element alike, so it does not care; LAMB's trust ratio is
    one norm per tensor, which a fused variable would share.
    """
    name = timm_class(model)
    found = architecture_of(model)
    gated = found.mlp_activation in ("swiglu", "geglu")
    if name.startswith("Gemma4"):
        return "Gemma 4's q, k and v and its gate and up projections"
    if name == "Beit" and gated:
        return "BEiT's two SwiGLU layers (mlp.fc1_g and mlp.fc1_x)"
    if name == "Eva":
        entry = EVA_ARCHITECTURES.get(model.name)
        if gated and (entry is None or eva_unpacked_swiglu(entry.switches) or found.mlp_hidden_norm):
            return "Eva's two SwiGLU layers (mlp.fc1_g and mlp.fc1_x, where it scales the MLP or names none)"
        if entry is None or not entry.switches.get("qkv_fused", True):
            return ("an Eva model's q, k and v (timm's qkv_fused=False" +
                    (")" if entry is not None else f", or {model.name!r} is not a name that says otherwise)"))
    return None
