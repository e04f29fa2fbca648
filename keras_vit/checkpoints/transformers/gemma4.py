"""transformers' Gemma 4 vision tower: `Gemma4VisionModel` folders (`model_type: "gemma4_vision"`), and the tower of a
whole Gemma 4 model's folder (`"gemma4"`, its `vision_config`, its tensors under `model.vision_tower.`), read.

The same tower as timm's `Gemma4VitEncoder` (`keras_vit.checkpoints.timm.gemma4`),
named otherwise (`patch_embedder.`, `encoder.layers.N.input_layernorm`,
`post_attention_layernorm`, `pre_feedforward_layernorm`,
`post_feedforward_layernorm`, `self_attn.q_proj.linear`, ...), with one
difference that matters: transformers' processor flattens each patch
channel-last (row, column, channel) and its `input_proj` reads it so, where
timm flattens it channel-first. Its output, `last_hidden_state`, is the soft
tokens (the `pooling_kernel_size` cells pooled, times sqrt(D), standardised
with `standardize`): keras_vit's model without a top gives them, a batch of
`(images, tokens, D)` where transformers concatenates every image's.

Example:
>>> from keras_vit import checkpoints
>>> source = checkpoints.read_gemma4_vision_folder("gemma-4-vision", config)  # doctest: +SKIP
"""

import os

from keras_vit.checkpoints.config_fields import checked_fields
from keras_vit.checkpoints.source import CheckpointError, pixel_statistics, read_json_object, source_from_state
from keras_vit.checkpoints.state_dict_files import folder_weights, read_state_dict
from keras_vit.checkpoints.tensor_layout import TensorLayout, check_shape, settings
from keras_vit.checkpoints.timm import gemma4 as timm_gemma4
from keras_vit.checkpoints.transformers.clip import vision_config
from keras_vit.data import preprocessing
from keras_vit.model.architecture import Architecture

MODEL_TYPES = ("gemma4_vision", "gemma4")
# Gemma4VisionConfig's fields that the reader computes or checks, with transformers' defaults.
CONFIG_DEFAULTS = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=16, num_attention_heads=12,
                       num_key_value_heads=12, head_dim=64, hidden_activation="gelu_pytorch_tanh", rms_norm_eps=1e-6,
                       patch_size=16, position_embedding_size=10240, pooling_kernel_size=3, use_clipped_linears=False,
                       standardize=False, rope_parameters=None)
# The tensors of a whole Gemma 4 model besides its vision tower, left aside.
OTHER_PARTS = ("model.language_model.", "model.audio_tower.", "model.embed_vision.", "model.embed_audio.", "lm_head.")


def _layout():
    """timm's table (`timm_gemma4.LAYOUT`) in transformers' names."""
    timm = timm_gemma4.LAYOUT
    names = {"norm1": "input_layernorm", "norm2": "post_attention_layernorm", "norm3": "pre_feedforward_layernorm",
             "norm4": "post_feedforward_layernorm", "attn.": "self_attn."}

    def renamed(name):
        for old, new in names.items():
            name = name.replace(old, new) if name.startswith(old) else name
        return name

    return TensorLayout(
        "transformers' Gemma 4 vision layout",
        top={"patch_embedder.position_embedding_table": "axis_position_embedding/table",
             "std_bias": "soft_tokens/std_bias", "std_scale": "soft_tokens/std_scale"},
        block_prefix="encoder.layers.", block={renamed(name): path for name, path in timm.block.items()},
        strip=("model.vision_tower.", "vision_tower."), other_model=OTHER_PARTS,
        qkv={renamed(name): part for name, part in timm.qkv.items()},
        packed={renamed(name): piece for name, piece in timm.packed.items()},
        rules=timm_gemma4.clamp_rules("self_attn."),
        reshaped={"patch_embedder.input_proj.weight": (lambda value: {"embedding/kernel": value},
                                                       ("embedding/kernel",))},
        grouped=True, hint="; keras_vit reads Gemma4VisionModel folders (encoder.layers.N.self_attn.q_proj.linear."
                           "weight, patch_embedder.position_embedding_table, ...)")


LAYOUT = _layout()


def read_gemma4_vision_folder(folder, config, budget=None):
    """A transformers `Gemma4VisionModel` folder, or a whole Gemma 4 model's (its `vision_config`), as a
    `WeightsSource`."""
    where = os.path.join(folder, "config.json")
    if config.get("model_type") == "gemma4":
        config, where = vision_config(folder, config)
    weights = folder_weights(folder, "transformers")
    fields = checked_fields({key: default if config.get(key) is None else config[key]
                             for key, default in CONFIG_DEFAULTS.items()}, where)
    if fields["hidden_activation"] not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise CheckpointError(f"{where}: hidden_activation is {fields['hidden_activation']!r}; Gemma 4's tower gates "
                              "its MLP by the tanh GELU ('gelu_pytorch_tanh'), which keras_vit computes.")
    rope = fields["rope_parameters"] or {"rope_type": "axial", "rope_theta": 100.0}
    if not isinstance(rope, dict) or rope.get("rope_type", "axial") != "axial":
        raise CheckpointError(f"{where}: rope_parameters is {rope!r}; Gemma 4's tower computes axial RoPE alone.")
    width, heads = fields["hidden_size"], fields["num_attention_heads"]
    if heads * fields["head_dim"] != width or heads % fields["num_key_value_heads"]:
        raise CheckpointError(f"{where}: head_dim {fields['head_dim']} and num_attention_heads {heads} do not split "
                              f"hidden_size {width} evenly, or num_key_value_heads {fields['num_key_value_heads']} "
                              "does not divide the heads; keras_vit computes neither.")
    switches = dict(norm_eps=fields["rms_norm_eps"], rope_theta=float(rope.get("rope_theta", 100.0)),
                    position_embedding_size=fields["position_embedding_size"],
                    pooling_kernel_size=fields["pooling_kernel_size"], standardize=fields["standardize"],
                    use_clipped_linears=fields["use_clipped_linears"], global_pool="soft",
                    num_kv_heads=None if fields["num_key_value_heads"] == heads else fields["num_key_value_heads"])
    fields_of, _ = timm_gemma4.gemma4_switches_to_architecture(switches, timm_gemma4.ENCODER)
    transform, statistics = _processor(folder, fields["patch_size"])
    architecture = Architecture(**fields_of, **statistics)
    tensors = read_state_dict(weights, budget)
    patch = fields["patch_size"]
    projection = next((name for name in tensors if LAYOUT.own_name(name) == "patch_embedder.input_proj.weight"), None)
    if projection is None:
        raise CheckpointError(f"{weights} holds no Gemma 4 vision tower (patch_embedder.input_proj.weight, under "
                              "model.vision_tower. in a whole model). Nothing was loaded.")
    timm_gemma4.check_patch_projection(tensors[projection], patch, projection, weights)
    tensors[projection] = timm_gemma4.patch_kernel(tensors[projection], patch, "ppc")
    state = LAYOUT.read(tensors, weights, expected=(architecture, fields["num_hidden_layers"], settings(
        fields, "num_hidden_layers", "use_clipped_linears", "standardize")))
    model = f"its config's hidden_size {width}, intermediate_size {fields['intermediate_size']}"
    check_shape(weights, "patch_embedder.position_embedding_table", state["axis_position_embedding/table"].shape,
                (2, fields["position_embedding_size"], width), model)
    check_shape(weights, "encoder.layers.0.mlp.gate_proj.linear.weight",
                state["encoderblock_0/mlp_hidden/kernel"].shape, (width, 2 * fields["intermediate_size"]), model)
    # Gemma 4's processor gives each photo its own size (its patch budget): the model takes any
    # (`image_size=(None, None)`), its RoPE and position tables read at each grid; 768 px is timm's size.
    source = source_from_state(weights, state, (768 // patch, 768 // patch), heads, architecture)
    source.origins = LAYOUT.origins(tensors)
    # Gemma4VisionModel's last_hidden_state: the soft tokens.
    source.layout = dict(include_top=False, pooling=None, image_size=(None, None))
    source.eval_transform = transform
    return source


def _processor(folder, patch):
    """`(EvalTransform, Architecture's pixel statistics)` of the folder's `preprocessor_config.json` (transformers'
    `Gemma4ImageProcessor` defaults without one): its patch budget, its filter, and the statistics its
    normalisation (none by default) and the model's own `2 * (x - 0.5)` make."""
    path = os.path.join(folder, "preprocessor_config.json")
    config = read_json_object(path, f"{path} is not a readable JSON file", "transformers writes an object "
                              "({\"max_soft_tokens\": 280, ...}).") if os.path.exists(path) else {}
    try:
        transform, normalisation = preprocessing.gemma4_from_preprocessor_config(config, path, patch)
    except ValueError as error:
        raise CheckpointError(str(error)) from None
    if normalisation is None:
        return transform, {}  # keras_vit's [-1, 1] input is the model's 2 * (x - 0.5) of [0, 1] pixels
    statistics = pixel_statistics(*normalisation, path, ("image_mean", "image_std"))
    return transform, timm_gemma4.model_statistics(statistics)
