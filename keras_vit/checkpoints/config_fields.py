"""The kind of every config field keras_vit reads from timm's `model_args` and transformers' `config.json`: one table.

`FIELD_KINDS` maps each field a reader takes from a config file (timm's
`VisionTransformer` and `Eva` keywords, the fields of transformers'
config classes) to its kind: a positive int, a count, a positive number,
true or false, an image size, ... `checked_fields` refuses a value of
another kind, before anything is built, with one line naming the file, the
field, the value and what is expected, and gives the value as the readers
use it (an image size as `(height, width)`, a square patch as its side).
A check that relates fields to each other or to the tensors stays with its
reader, but for the one rule every reader shares: which stated image size a
position table fits (`image_size_of_grid`, `check_table_fits`).

Example:
>>> checked_fields({"img_size": 224, "rope_temperature": 100}, "config.json", "model_args.")
{'img_size': (224, 224), 'rope_temperature': 100}
>>> checked_fields({"rope_temperature": [100]}, "config.json", "model_args.")
Traceback (most recent call last):
...
keras_vit.checkpoints.source.CheckpointError: config.json: model_args.rope_temperature is [100]; expected a finite \
number > 0.
"""

import math
import typing

from keras_vit.checkpoints.source import CheckpointError


class Kind(typing.NamedTuple):
    """A kind of config value: what it is in words, whether a JSON value is one, and the value keras_vit uses."""

    expected: str
    accepts: typing.Callable
    value: typing.Callable = lambda value: value

    def or_null(self, expected=None):
        """This kind, or null (timm's `None` default), in words `expected` (default: "<this kind> or null")."""
        return Kind(expected or f"{self.expected} or null", lambda value: value is None or self.accepts(value),
                    lambda value: None if value is None else self.value(value))


def _int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _pair(value):
    return isinstance(value, (list, tuple)) and len(value) == 2 and all(_int(side) and side > 0 for side in value)


def _sides(value):
    return (value, value) if _int(value) else tuple(value)


POSITIVE_INT = Kind("a positive int", lambda value: _int(value) and value > 0)
COUNT = Kind("a whole number >= 0", lambda value: _int(value) and value >= 0)
POSITIVE_NUMBER = Kind("a finite number > 0", lambda value: _number(value) and value > 0)
NUMBER = Kind("a finite number", _number)
EPSILON = Kind("a small positive number", lambda value: _number(value) and 0 < value < 1)
FLAG = Kind("true or false", lambda value: isinstance(value, bool))
OPTIONAL_FLAG = "true, false or null"
NAME = Kind("a name", lambda value: isinstance(value, str))
OBJECT = Kind("an object of fields", lambda value: isinstance(value, dict))
IMAGE_SIZE = Kind("a positive int or [height, width]", lambda value: (_int(value) and value > 0) or _pair(value),
                  _sides)
PATCH_SIZE = Kind("a positive int or [side, side]", lambda value: (_int(value) and value > 0) or (
    _pair(value) and value[0] == value[1]), lambda value: _sides(value)[0])
# timm's init_values: LayerScale's initial value (the file holds the learned one).
LAYER_SCALE = Kind("a finite number >= 0", lambda value: _number(value) and value >= 0)


# timm's Eva num_kv_heads: one count for every block, or a list of one per block (Sapiens2's), where null is the
# block's full attention (timm's AttentionRope takes `num_kv_heads or num_heads`).
KV_HEADS = Kind("a positive int, a list of them or nulls (one per block) or null", lambda value: value is None or (
    _int(value) and value > 0) or (isinstance(value, (list, tuple)) and len(value) > 0
                                    and all(count is None or (_int(count) and count > 0) for count in value)),
    lambda value: tuple(value) if isinstance(value, (list, tuple)) else value)


def one_of(*choices):
    """The kind of a field that takes one of `choices`."""
    return Kind("one of " + ", ".join(map(repr, choices)), lambda value: value in choices and isinstance(value, str))


# Every field keras_vit reads from a config file, by the name timm's model_args or transformers' config.json gives
# it. Fields that do not change a loaded model's outputs (dropout, initialisation, training-time augmentations) are
# not read, so not listed.
FIELD_KINDS = {
    # timm's VisionTransformer and Eva: sizes (the keywords of both).
    "img_size": IMAGE_SIZE, "patch_size": PATCH_SIZE, "embed_dim": POSITIVE_INT, "depth": POSITIVE_INT,
    "num_heads": POSITIVE_INT, "mlp_ratio": POSITIVE_NUMBER, "num_classes": COUNT, "in_chans": POSITIVE_INT,
    # timm's VisionTransformer switches.
    "class_token": FLAG, "reg_tokens": COUNT, "no_embed_class": FLAG, "global_pool": NAME,
    "fc_norm": FLAG.or_null(OPTIONAL_FLAG), "pre_norm": FLAG, "final_norm": FLAG, "qkv_bias": FLAG, "qk_norm": FLAG,
    "init_values": LAYER_SCALE.or_null(), "act_layer": NAME.or_null(), "scale_attn_norm": FLAG,
    "scale_mlp_norm": FLAG, "pool_include_prefix": FLAG, "proj_bias": FLAG, "attn_layer": one_of("", "attn", "diff"),
    # timm's Eva switches.
    "num_reg_tokens": COUNT, "use_abs_pos_emb": FLAG, "use_fc_norm": FLAG.or_null(OPTIONAL_FLAG),
    "use_post_transformer_norm": FLAG.or_null(OPTIONAL_FLAG), "use_pre_transformer_norm": FLAG, "qkv_fused": FLAG,
    "swiglu_mlp": FLAG, "swiglu_align_to": COUNT.or_null(), "scale_mlp": FLAG, "scale_attn_inner": FLAG,
    "attn_type": NAME, "use_post_norm": FLAG, "use_rot_pos_emb": FLAG, "rope_type": one_of("cat", "mixed", "dinov3"),
    "rope_temperature": POSITIVE_NUMBER, "rope_grid_offset": NUMBER, "rope_grid_indexing": one_of("ij", "xy"),
    "rope_rotate_half": FLAG, "ref_feat_shape": IMAGE_SIZE.or_null("a positive int, [height, width] or null"),
    "attn_pool_num_heads": POSITIVE_INT.or_null(), "attn_pool_mlp_ratio": POSITIVE_NUMBER.or_null(),
    "attn_only_layer_scale": FLAG, "num_kv_heads": KV_HEADS,
    # timm's Gemma4VitEncoder and Gemma4VitClassifier (and transformers' Gemma 4 vision config).
    "head_dim": POSITIVE_INT, "norm_eps": EPSILON, "position_embedding_size": POSITIVE_INT,
    "pooling_kernel_size": POSITIVE_INT, "standardize": FLAG, "use_clipped_linears": FLAG, "encoder_pool": NAME,
    "rms_norm_eps": EPSILON, "num_key_value_heads": POSITIVE_INT, "attention_bias": FLAG.or_null(OPTIONAL_FLAG),
    "hidden_activation": NAME,
    # timm's pretrained_cfg.
    "input_size": Kind("[channels, height, width]", lambda value: isinstance(value, (list, tuple)) and len(value) == 3
                       and all(_int(side) and side > 0 for side in value), tuple).or_null("[channels, height, width]"),
    # transformers' ViT, DINOv2, DINOv3, CLIP, SigLIP and SigLIP 2 configs.
    "hidden_size": POSITIVE_INT, "num_hidden_layers": POSITIVE_INT, "num_attention_heads": POSITIVE_INT,
    "intermediate_size": POSITIVE_INT, "hidden_act": NAME, "layer_norm_eps": EPSILON, "image_size": IMAGE_SIZE,
    "num_channels": POSITIVE_INT, "pooler_output_size": POSITIVE_INT.or_null(), "pooler_act": NAME,
    "use_swiglu_ffn": FLAG, "num_register_tokens": COUNT, "vision_use_head": FLAG, "rope_theta": POSITIVE_NUMBER,
    "query_bias": FLAG, "key_bias": FLAG, "value_bias": FLAG, "mlp_bias": FLAG, "use_gated_mlp": FLAG,
    "vision_config": OBJECT.or_null(), "vision_config_dict": OBJECT.or_null(), "num_patches": POSITIVE_INT,
}


def checked_fields(fields, where, prefix=""):
    """`fields` (a parsed config's, or its `model_args`) with each one `FIELD_KINDS` lists as keras_vit uses it.

    A value of another kind is a `CheckpointError` naming the file
    (`where`), the field (`prefix + name`), the value and its kind. Fields
    the table does not list are passed on as they are.
    """
    checked = dict(fields)
    for name, value in fields.items():
        kind = FIELD_KINDS.get(name)
        if kind is None:
            continue
        if not kind.accepts(value):
            raise CheckpointError(f"{where}: {prefix}{name} is {value!r}; expected {kind.expected}.")
        checked[name] = kind.value(value)
    return checked


def image_size_of_grid(image_sizes, patch, patches):
    """The first `(height, width)` of `image_sizes` whose patch grid gives the table's `patches` rows, or None.

    The one config-grid rule of every reader: the sizes a config states, in
    the order it is trusted; None where none fits (a file resized after
    training), for the table's own square grid. A size that patches do not
    divide counts by its whole patches (timm's so400m/14 at 384 px).

    Example:
    >>> image_size_of_grid([(224, 224), (32, 48)], 16, 6)
    (32, 48)
    """
    return next((tuple(size) for size in image_sizes if (size[0] // patch) * (size[1] // patch) == patches), None)


def check_table_fits(rows, prefix_rows, image_size, patch, field):
    """Refuse a position table of `rows` rows (`prefix_rows` of them the prefix tokens') that the `image_size` a
    config builds its model at does not fit; `field` names the file and the field.

    Example:
    >>> check_table_fits(17, 1, (64, 64), 16, "config.json: image_size")
    """
    grid, patches = (image_size[0] // patch, image_size[1] // patch), rows - prefix_rows
    if grid[0] * grid[1] == patches:
        return
    side = int(round(max(patches, 0) ** 0.5))
    square = f" (a {side}x{side} grid: {side * patch} px)" if side and side * side == patches else ""
    raise CheckpointError(f"{field} is {list(image_size)}, a {grid[0]}x{grid[1]} grid of {patch}-pixel patches, but "
                          f"the file's position table has {rows} rows, {patches} of them for patches{square}; set it "
                          "to the size the table was trained at. Nothing was loaded.")
