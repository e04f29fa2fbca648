"""transformers' SAM vision encoder: `SamVisionModel` folders (`model_type: "sam_vision_model"`), read.

The same encoder as timm's `VisionTransformerSAM` (`keras_vit.checkpoints.timm.sam`): windowed blocks beside
global ones (`window_size`, `global_attn_indexes`), decomposed relative positions (`attn.rel_pos_h`,
`rel_pos_w`), a position table on the patch grid (`pos_embed` `(1, h, w, c)`) and the neck (`neck.conv1`,
`layer_norm1`, `conv2`, `layer_norm2`) to `output_channels`. The model's output is the neck's grid,
`last_hidden_state` (channels last in keras_vit). transformers' SAM takes its config's image size alone;
the pixel statistics are ImageNet's (SAM's image processor), unless the folder's
`preprocessor_config.json` says otherwise.

Example:
>>> from keras_vit import checkpoints
>>> source = checkpoints.read_sam_vision_folder("sam-vit-base", config)  # doctest: +SKIP
"""

import os

from keras_vit.checkpoints.source import CheckpointError, source_from_state
from keras_vit.checkpoints.state_dict_files import read_state_dict
from keras_vit.checkpoints.tensor_layout import TensorLayout, settings
from keras_vit.checkpoints.timm.sam import check_decomposed_tables
from keras_vit.checkpoints.transformers.vit import check_sizes, transformers_fields
from keras_vit.model.architecture import IMAGENET_PIXEL_STATISTICS, Architecture

MODEL_TYPES = ("sam_vision_model",)
# SamVisionConfig's fields that the reader computes or checks, with transformers' defaults.
CONFIG_DEFAULTS = dict(hidden_size=768, output_channels=256, num_hidden_layers=12, num_attention_heads=12,
                       num_channels=3, image_size=1024, patch_size=16, hidden_act="gelu", layer_norm_eps=1e-6,
                       qkv_bias=True, mlp_dim=None, mlp_ratio=4.0, use_abs_pos=True, use_rel_pos=True,
                       window_size=14, global_attn_indexes=(2, 5, 8, 11))
# SamVisionConfig's fields that do not change the encoder (the prompt encoder's, the initialisation).
OTHER_PARTS = ("num_pos_feats", "scale")


def _pairs(prefix, path):
    return {f"{prefix}.weight": f"{path}/gamma", f"{prefix}.bias": f"{path}/beta"}


def _dense(prefix, path):
    return {f"{prefix}.weight": f"{path}/kernel", f"{prefix}.bias": f"{path}/bias"}


LAYOUT = TensorLayout(
    "transformers' SAM vision layout",
    top={"pos_embed": "position_embedding/pos_embedding", **_dense("patch_embed.projection", "embedding"),
         "neck.conv1.weight": "neck/reduce/kernel", **_pairs("neck.layer_norm1", "neck/reduce_norm"),
         "neck.conv2.weight": "neck/mix/kernel", **_pairs("neck.layer_norm2", "neck/mix_norm")},
    block_prefix="layers.", strip=("vision_encoder.",),
    block={**_pairs("layer_norm1", "attention_norm"), **_dense("attn.qkv", "qkv"), **_dense("attn.proj",
                                                                                             "attention_output"),
           "attn.rel_pos_h": "rel_pos_h", "attn.rel_pos_w": "rel_pos_w", **_pairs("layer_norm2", "mlp_norm"),
           **_dense("mlp.lin1", "mlp_hidden"), **_dense("mlp.lin2", "mlp_output")},
    hint="; keras_vit reads SamVisionModel folders (vision_encoder.layers.N.attn.rel_pos_h, ...)")


def read_sam_vision_folder(folder, config, budget=None):
    """A transformers `SamVisionModel` folder (its parsed `config`) as a `WeightsSource`."""
    where = os.path.join(folder, "config.json")
    weights, fields = transformers_fields(folder, config, CONFIG_DEFAULTS)
    if fields["image_size"][0] != fields["image_size"][1]:
        raise CheckpointError(f"{where}: image_size is {list(fields['image_size'])}; transformers' SAM encoder is "
                              "square.")
    architecture = Architecture(
        class_token=False, classifier="gap", final_norm=False, position_embedding=bool(fields["use_abs_pos"]),
        qkv_bias=bool(fields["qkv_bias"]), mlp_activation=fields["hidden_act"],
        layer_norm_epsilon=fields["layer_norm_eps"], decomposed_relative_position=bool(fields["use_rel_pos"]),
        window_size=int(fields["window_size"]), global_attention_blocks=tuple(fields["global_attn_indexes"]),
        neck_channels=int(fields["output_channels"]), **IMAGENET_PIXEL_STATISTICS)
    tensors = read_state_dict(weights, budget)
    table = tensors.get("vision_encoder.pos_embed")
    if table is not None and table.ndim == 4:  # (1, h, w, c): keras_vit's table is the grid's rows in order
        tensors["vision_encoder.pos_embed"] = table.reshape(1, -1, table.shape[-1])
    state = LAYOUT.read(tensors, weights, expected=(architecture, fields["num_hidden_layers"], settings(
        fields, "num_hidden_layers", "use_abs_pos", "use_rel_pos", "qkv_bias")))
    mlp = fields["mlp_dim"] or int(fields["hidden_size"] * fields["mlp_ratio"])
    check_sizes(where, fields, state, ("mlp_dim", mlp, mlp))
    grid = tuple(side // fields["patch_size"] for side in fields["image_size"])
    if table is not None and tuple(table.shape[1:3]) != grid:
        raise CheckpointError(f"{weights}: vision_encoder.pos_embed is a {table.shape[1]}x{table.shape[2]} grid, but "
                              f"image_size {fields['image_size'][0]} and patch_size {fields['patch_size']} make "
                              f"{grid[0]}x{grid[1]}. Nothing was loaded.")
    origins = LAYOUT.origins(tensors)
    check_decomposed_tables(state, origins, architecture, grid, weights, where)
    source = source_from_state(weights, state, grid, fields["num_attention_heads"], architecture)
    source.origins = origins
    source.layout = dict(include_top=False, pooling=None)  # SamVisionModel's last_hidden_state: the neck's grid
    source.position_resize = ("bicubic", True)
    return source
