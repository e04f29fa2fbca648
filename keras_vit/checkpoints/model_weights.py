"""keras_vit's own weights, declared: each with the `Architecture` switch that gives a model it.

`MODEL_WEIGHTS` (outside the blocks) and `BLOCK_WEIGHTS` (in each block,
after `encoderblock_{i}/`) map every weight path a `keras_vit.ViT` builds
to the switch that gives a model it; `expected_weights` lists a model's,
CaiT's class-attention blocks included. Every checkpoint layout checks a
file against them (`tensor_layout.TensorLayout.check_complete`), so a file
holds exactly the tensors of the model its config describes.

Example:
>>> from keras_vit.model.architecture import Architecture
>>> sorted(expected_weights(Architecture(), 1))[:2]
['class_token/cls', 'embedding/bias']
"""

from keras_vit.layers.class_attention import class_attention_weights
from keras_vit.layers.relative_position import RelativePositions


def always(architecture):
    return True


def _pair(prefix, when, scale=always):
    """A norm's weights: an RMSNorm has no bias, and one without a gain (`scale`) none at all."""
    return {f"{prefix}/gamma": lambda a: when(a) and scale(a),
            f"{prefix}/beta": lambda a: when(a) and a.normalization == "layer_norm"}


def _final_norm_scale(architecture):
    return architecture.final_norm_scale


def _dense(prefix, when=always, bias=always):
    return {f"{prefix}/kernel": when, f"{prefix}/bias": lambda a: when(a) and bias(a)}


def _projection_bias(architecture):
    return architecture.projection_bias


def _sequential(architecture):
    return not architecture.parallel


def _attention_pooling(architecture):
    return architecture.classifier == "map"


# keras_vit's weights outside the blocks, each with the switch of `Architecture` that gives a model it.
MODEL_WEIGHTS = {
    "class_token/cls": lambda a: a.class_token,
    "register_tokens/registers": lambda a: a.register_tokens > 0,
    "distillation_token/dist": lambda a: a.distillation_token,
    "position_embedding/pos_embedding": lambda a: a.position_embedding,
    **{f"relative_position_bias/{name}": lambda a, name=name: name in RelativePositions.WEIGHTS.get(
        a.shared_relative_position_bias, ()) for name in RelativePositions.NAMES},
    **_dense("embedding", bias=lambda a: a.patch_bias),
    **_pair("patch_norm", lambda a: a.patch_norm),
    **_pair("pre_norm", lambda a: a.norm_pre),
    **_pair("encoder_norm", lambda a: a.final_norm and not a.fc_norm and a.neck_channels is None, _final_norm_scale),
    **_pair("fc_norm", lambda a: a.fc_norm, _final_norm_scale),
    "axis_position_embedding/table": lambda a: bool(a.axis_position_table),
    **{f"soft_tokens/{name}": lambda a: a.soft_token_standardize for name in ("std_bias", "std_scale")},
    "attention_pool/probe": _attention_pooling,
    **{name: when for part in ("query", "key_value", "attention_output", "mlp_hidden", "mlp_output")
       for name, when in _dense(f"attention_pool/{part}", _attention_pooling).items()},
    **_pair("attention_pool/mlp_norm", _attention_pooling),
    **{f"neck/{part}/{kind}": lambda a: bool(a.neck_channels) for part, kinds in (
        ("reduce", ("kernel",)), ("mix", ("kernel",)), ("reduce_norm", ("gamma", "beta")),
        ("mix_norm", ("gamma", "beta"))) for kind in kinds},
    **{f"neck/norm/{kind}": lambda a: a.neck_channels == 0 for kind in ("gamma", "beta")},
}
# keras_vit's weights in each block (after "encoderblock_{i}/"), the same way.
BLOCK_WEIGHTS = {
    **_pair("attention_norm", always),
    **_dense("qkv", bias=lambda a: a.qkv_bias),
    **_dense("attention_output", bias=_projection_bias),
    **_pair("mlp_norm", _sequential),
    # A parallel block's MLP input keeps its bias; its one output bias is the attention output's.
    **_dense("mlp_hidden", bias=lambda a: a.projection_bias or a.parallel),
    **_dense("mlp_output", bias=lambda a: a.projection_bias and not a.parallel),
    "attention_layer_scale": lambda a: a.layer_scale is not None and not a.parallel,
    "mlp_layer_scale": lambda a: a.layer_scale is not None and not a.parallel and not a.attention_only_layer_scale,
    "layer_scale": lambda a: a.layer_scale is not None and a.parallel,
    **_pair("query_norm", lambda a: a.qk_norm), **_pair("key_norm", lambda a: a.qk_norm),
    **_pair("attention_output_norm", lambda a: a.attention_output_norm),
    **_pair("mlp_hidden_norm", lambda a: a.mlp_hidden_norm),
    **_pair("mlp_input_norm", lambda a: a.mlp_input_norm),
    **_pair("attention_branch_norm", lambda a: a.sandwich_norm), **_pair("mlp_branch_norm", lambda a: a.sandwich_norm),
    **{f"{name}_clip": lambda a: a.clipped_linears for name in ("qkv", "attention_output", "mlp_hidden",
                                                                 "mlp_output")},
    **{name: lambda a, name=name: name in RelativePositions.WEIGHTS.get(a.relative_position_bias, ())
       for name in RelativePositions.NAMES},
    **{f"talking_heads_{stage}_{part}": lambda a: a.talking_heads for stage in ("logit", "weight")
       for part in ("kernel", "bias")},
    **{name: lambda a: a.decomposed_relative_position for name in ("rel_pos_h", "rel_pos_w")},
    "rope_frequencies": lambda a: a.rope == "mixed",  # learned; timm keeps all blocks' in one tensor
    **{name: lambda a: a.differential_attention for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2",
                                                            "attention_sub_norm/gamma")},
}
# Groups a file may hold or not, each whole: the classifier and the pre-logits layer; a distilled DeiT's second head
# comes with its first.
OPTIONAL_GROUPS = (("head/kernel", "head/bias"), ("pre_logits/kernel", "pre_logits/bias"))
DISTILLATION_HEAD = ("head_dist/kernel", "head_dist/bias")


def optional_groups(distilled):
    """`OPTIONAL_GROUPS`, with a distilled model's (`distilled`) two heads one group."""
    return ((OPTIONAL_GROUPS[0] + DISTILLATION_HEAD if distilled else OPTIONAL_GROUPS[0]),) + OPTIONAL_GROUPS[1:]


def expected_weights(architecture, depth):
    """The keras_vit weights a model of `architecture` and `depth` blocks has, besides `OPTIONAL_GROUPS`; CaiT's
    class-attention blocks (`class_attention_{i}`) too."""
    names = {name for name, when in MODEL_WEIGHTS.items() if when(architecture)}
    block = [name for name, when in BLOCK_WEIGHTS.items() if when(architecture)]
    return names | {f"encoderblock_{index}/{name}" for index in range(depth) for name in block} | {
        f"class_attention_{index}/{name}" for index in range(architecture.class_attention_blocks)
        for name in class_attention_weights(architecture.qkv_bias)}
