"""What a ViT is made of besides its sizes: one description, read by the model, the readers and the writers.

The paper's ViT, DeiT, DeiT-III, DINOv2, CLIP's and SigLIP's image towers
and timm's register models are one Transformer encoder with a few
switches: which prefix tokens it has (a class token, register tokens) and
whether they get position embeddings, a LayerNorm before the blocks, the
MLP's activation, optional biases, layer scale, query/key normalisation,
how the tokens are pooled for the head and where the final LayerNorm sits.
`Architecture` holds those switches; `Variant` (in `keras_vit.model.variants`)
holds the sizes. The options each switch takes are
declared by the layer that computes it (`keras_vit.layers`).

Example:
>>> dinov2_reg = Architecture(register_tokens=4, class_token_position_embedding=False, layer_scale=1e-5,
...                           mlp_activation="gelu")
>>> dinov2_reg.num_prefix_tokens, dinov2_reg.position_prefix_rows
(5, 0)
"""

import dataclasses
import difflib

from keras_vit.layers.blocks import BlockSwitches
from keras_vit.layers.relative_position import relative_position_form
from keras_vit.layers.resnet import RESNET_EPSILONS

# "token": the class token; "gap": the mean of the patch tokens (prefix tokens excluded); "map": multi-head
# attention pooling with a learned probe (SigLIP, timm's AttentionPoolLatent).
POOLINGS = ("token", "gap", "map")
# The pixel statistics of the paper's checkpoints (images scaled to [-1, 1]), and ImageNet's (DeiT, DINOv2).
PAPER_PIXEL_STATISTICS = (0.5, 0.5, 0.5)
IMAGENET_PIXEL_STATISTICS = {"input_mean": (0.485, 0.456, 0.406), "input_std": (0.229, 0.224, 0.225)}


@dataclasses.dataclass(frozen=True)
class Architecture(BlockSwitches):
    """The switches of a plain ViT's encoder; the defaults are the paper's model.

    Its first fields are the blocks' switches, declared and documented
    once, by `keras_vit.layers.blocks.BlockSwitches` (`qkv_bias`, `rope`,
    `mlp_activation`, ...). The others:

    Attributes:
        class_token: prepend a learned [class] token.
        register_tokens: learned register tokens after the class token
            (Darcet et al., 2023), dropped by every pooling but attention.
        distillation_token: a learned distillation token after the class
            token, read by a second head, `head_dist`, whose logits the
            model averages with the class head's (DeiT distilled, timm's
            `VisionTransformerDistilled`); pooled as timm pools it, the
            mean of the two tokens (`keras_vit.model.graph.distillation_heads`
            gives both heads' logits, for distillation training).
        class_token_position_embedding: the prefix tokens get position
            embeddings too (the paper's); `False` is timm's
            `no_embed_class` (DeiT-III, FlexiViT, DINOv2 with registers).
        classifier: how the tokens are pooled for the head, one of
            `POOLINGS`.
        fc_norm: the final LayerNorm normalises the pooled vector instead
            of the tokens (timm's `fc_norm`, its default for average pooling).
        final_norm: there is a final LayerNorm at all (timm's `final_norm`;
            RADIO's and InternViT's have none).
        norm_pre: a LayerNorm before the first block (CLIP).
        patch_bias: the patch embedding has a bias (CLIP's has none).
        pool_include_prefix: average or attention pooling takes the prefix
            tokens too (timm's `pool_include_prefix`; `test_vit3`).
        patch_norm: a norm on the patch embeddings, before the position
            embeddings (timm's `embed_norm_layer`; AIMv2).
        position_embedding: a learned table of absolute position embeddings
            (timm's `use_abs_pos_emb`; most RoPE models have none).
        rope_grid_offset, rope_grid_indexing (`"ij"` or `"xy"`),
            rope_reference_grid (EVA-02's `ref_feat_shape`): where the RoPE
            positions sit, timm's `Eva` settings of the same names.
        attention_pool_heads, attention_pool_mlp_ratio: attention pooling's
            heads and MLP ratio where they are not the blocks' (Perception
            Encoder's 8 and 4).
        input_mean, input_std: the per-channel pixel normalisation the
            weights were trained with, on the [0, 1] scale (timm's
            `pretrained_cfg` `mean`/`std`). Every keras_vit model takes
            images in [-1, 1] (`preprocess_input`); other values than the
            paper's 0.5 add an `InputNormalization` layer that turns those
            into `(x - input_mean) / input_std`, so the same images suit
            every checkpoint (ImageNet's statistics for DeiT and DINOv2,
            OpenAI's for CLIP).
        num_kv_heads: grouped-query attention: each block's key/value
            heads, a divisor of `num_heads` (each key/value head serves
            `num_heads / num_kv_heads` query heads), as one number for every
            block or a tuple with one per block (Sapiens2's: full attention
            in the first and last 8 blocks); None for full attention.
        shared_relative_position_bias: one relative position bias for every
            block, of the forms `relative_position_bias` takes, added to each
            block's attention (and to the block's own, with
            `relative_position_bias`): BEiT's `use_shared_rel_pos_bias`,
            timm's `shared_rel_pos`. Either needs a fixed image size; a
            table takes the class token or no prefix token at all.
        class_attention_blocks: CaiT's class attention: the patches go
            through the blocks without the class token, which then enters
            and is updated alone by this many
            `keras_vit.layers.class_attention.ClassAttentionBlock`s (timm's
            `depth_token_only`); `class_attention_mlp_ratio` is their MLP's
            width over the hidden size (default: the blocks' MLP width).
        window_size, global_attention_blocks: SAM's windowed attention:
            every block but those of `global_attention_blocks` (indices)
            attends within `window_size`-patch square windows of the grid
            (`keras_vit.layers.windows`); 0 for none.
        neck_channels: SAM's convolutional neck (`keras_vit.layers.windows.SamNeck`)
            after the blocks, to this many channels, in place of the final
            norm (0: its one LayerNorm, timm's `neck_chans=None`); None for
            none.
        axis_position_table: Gemma 4's position embeddings
            (`keras_vit.layers.axis_positions`): a learned table per axis of
            this many entries, read at each patch's column and row, in place
            of `position_embedding`; 0 for none.
        soft_token_pool: Gemma 4's soft tokens
            (`keras_vit.layers.soft_tokens`): after the blocks, the patch
            grid's cells of this many patches a side averaged, times
            sqrt(hidden); `soft_token_standardize` standardises them with
            the checkpoint's `std_bias` and `std_scale` (the 31B model's); 0
            for none.
        final_norm_scale: the final norm has a learned gain (Gemma 4's
            classifier norm, an RMSNorm, has none).
        resnet_epsilons: for a hybrid, its ResNet's epsilons, a key of
            `RESNET_EPSILONS`: `"flax"` (the original `.npz` models') or
            `"timm"` (timm's `vit_*_r50_*` and `vit_*_r26_*` hybrids).
    """

    class_token: bool = True
    register_tokens: int = 0
    distillation_token: bool = False
    class_token_position_embedding: bool = True
    classifier: str = "token"
    fc_norm: bool = False
    final_norm: bool = True
    norm_pre: bool = False
    patch_bias: bool = True
    patch_norm: bool = False
    pool_include_prefix: bool = False
    position_embedding: bool = True
    rope_grid_offset: float = 0.0
    rope_grid_indexing: str = "ij"
    rope_reference_grid: tuple = None
    attention_pool_heads: int = None
    attention_pool_mlp_ratio: float = None
    input_mean: tuple = PAPER_PIXEL_STATISTICS
    input_std: tuple = PAPER_PIXEL_STATISTICS
    resnet_epsilons: str = "flax"
    num_kv_heads: tuple = None
    shared_relative_position_bias: str = None
    class_attention_blocks: int = 0
    class_attention_mlp_ratio: float = None
    window_size: int = 0
    global_attention_blocks: tuple = ()
    neck_channels: int = None
    axis_position_table: int = 0
    soft_token_pool: int = 0
    soft_token_standardize: bool = False
    final_norm_scale: bool = True

    def __post_init__(self):
        super().__post_init__()
        for field in ("input_mean", "input_std"):
            value = getattr(self, field)
            try:
                value = tuple(float(channel) for channel in value)
            except (TypeError, ValueError):
                value = ()
            if len(value) != 3 or (field == "input_std" and min(value) <= 0):
                raise ValueError(f"{field} must be three per-channel numbers on the [0, 1] pixel scale"
                                 f"{' (each > 0)' if field == 'input_std' else ''}, such as ImageNet's "
                                 f"{IMAGENET_PIXEL_STATISTICS[field]}; got {getattr(self, field)!r}.")
            object.__setattr__(self, field, value)  # a tuple of floats, as a JSON config gives back a list
        if self.classifier not in POOLINGS:
            raise ValueError(f"Unknown classifier {self.classifier!r}; expected one of {POOLINGS}.")
        if isinstance(self.register_tokens, bool) or not isinstance(self.register_tokens, int) \
                or self.register_tokens < 0:
            raise ValueError(f"register_tokens must be a whole number >= 0, got {self.register_tokens!r}.")
        if self.classifier == "token" and not self.class_token:
            raise ValueError("classifier='token' pools the class token, but class_token=False has none; use "
                             "classifier='gap' or 'map'.")
        if self.distillation_token and (self.classifier, self.register_tokens, self.fc_norm) != ("token", 0, False):
            raise ValueError("distillation_token=True reads the class and distillation tokens, as timm's "
                             "VisionTransformerDistilled: it needs classifier='token' (a class token), no register "
                             "tokens and no fc_norm.")
        if self.fc_norm and not self.final_norm:
            raise ValueError("fc_norm=True places the final LayerNorm after pooling, but final_norm=False has none.")
        if self.normalization == "rms_norm" and self.classifier == "map":
            raise ValueError("normalization='rms_norm' with classifier='map' is not supported: keras_vit's "
                             "attention pooling has a LayerNorm (no timm architecture combines the two).")
        if self.rope_grid_indexing not in ("ij", "xy"):
            raise ValueError(f"Unknown rope_grid_indexing {self.rope_grid_indexing!r}; expected 'ij' or 'xy'.")
        if self.rope_reference_grid is not None:
            sides = tuple(self.rope_reference_grid) if isinstance(self.rope_reference_grid, (list, tuple)) else ()
            if len(sides) != 2 or not all(isinstance(side, (int, float)) and not isinstance(side, bool) and side > 0
                                          and side == int(side) for side in sides):
                raise ValueError(f"rope_reference_grid must be (rows, columns), two positive whole numbers, or None; "
                                 f"got {self.rope_reference_grid!r}.")
            object.__setattr__(self, "rope_reference_grid", tuple(int(side) for side in sides))
        if self.num_kv_heads is not None:
            counts = self.num_kv_heads if isinstance(self.num_kv_heads, (list, tuple)) else (self.num_kv_heads,)
            if not counts or not all(isinstance(count, int) and not isinstance(count, bool) and count > 0
                                     for count in counts):
                raise ValueError(f"num_kv_heads must be a whole number > 0, a tuple of them (one per block) or "
                                 f"None; got {self.num_kv_heads!r}.")
            if isinstance(self.num_kv_heads, list):
                object.__setattr__(self, "num_kv_heads", tuple(self.num_kv_heads))
        object.__setattr__(self, "shared_relative_position_bias", relative_position_form(
            self.shared_relative_position_bias, "shared_relative_position_bias"))
        if "table" in (self.relative_position_bias, self.shared_relative_position_bias) and \
                self.num_prefix_tokens != int(self.class_token):
            raise ValueError("A relative position bias table has three rows for a class token and none for other "
                             "prefix tokens: it takes the class token alone, or no prefix token (no register or "
                             "distillation tokens).")
        if self.shared_relative_position_bias and self.differential_attention:
            raise ValueError("shared_relative_position_bias is not supported with differential_attention=True (no "
                             "timm architecture combines them).")
        if isinstance(self.class_attention_blocks, bool) or not isinstance(self.class_attention_blocks, int) \
                or self.class_attention_blocks < 0:
            raise ValueError(f"class_attention_blocks must be a whole number >= 0, got {self.class_attention_blocks!r}.")
        if self.class_attention_blocks and (not self.class_token or self.class_token_position_embedding
                                            or self.num_prefix_tokens != 1 or self.classifier == "map"):
            raise ValueError("class_attention_blocks (CaiT's) bring the class token in after the blocks: they need "
                             "class_token=True without a position embedding (class_token_position_embedding=False), "
                             "no register or distillation tokens, and classifier='token' or 'gap'.")
        object.__setattr__(self, "global_attention_blocks", tuple(int(i) for i in self.global_attention_blocks or ()))
        for field in ("window_size", "neck_channels"):
            value = getattr(self, field)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ValueError(f"{field} must be a whole number >= 0, got {value!r}.")
        if (self.window_size or self.neck_channels is not None) and self.num_prefix_tokens:
            raise ValueError("window_size and neck_channels (SAM's) take the patch grid alone: they need "
                             "class_token=False and no register or distillation tokens.")
        for field in ("axis_position_table", "soft_token_pool"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{field} must be a whole number >= 0, got {value!r}.")
        if (self.axis_position_table or self.soft_token_pool) and (self.num_prefix_tokens or self.position_embedding):
            raise ValueError("axis_position_table and soft_token_pool (Gemma 4's) take the patch grid alone: they need "
                             "class_token=False, no register or distillation tokens, and position_embedding=False.")
        if self.soft_token_standardize and not self.soft_token_pool:
            raise ValueError("soft_token_standardize standardises Gemma 4's soft tokens: it needs soft_token_pool.")
        if not self.final_norm_scale and self.normalization != "rms_norm":
            raise ValueError("final_norm_scale=False (Gemma 4's classifier norm) is an RMSNorm without a gain: it "
                             "needs normalization='rms_norm'.")
        if self.resnet_epsilons not in RESNET_EPSILONS:
            raise ValueError(f"Unknown resnet_epsilons {self.resnet_epsilons!r}; expected one of "
                             f"{tuple(RESNET_EPSILONS)}.")

    @property
    def num_prefix_tokens(self):
        """The tokens before the patch tokens in the sequence the blocks see: class token, then the distillation
        token or the registers."""
        return int(self.class_token) + int(self.distillation_token) + self.register_tokens

    @property
    def position_prefix_rows(self):
        """The rows of the position table that belong to prefix tokens (0 with `no_embed_class`)."""
        return self.num_prefix_tokens if self.class_token_position_embedding else 0

    @property
    def block_prefix_tokens(self):
        """The tokens before the patches in the encoder blocks: the prefix tokens, but none where the class token
        enters after them (CaiT's class attention)."""
        return 0 if self.class_attention_blocks else self.num_prefix_tokens

    @property
    def on_one_grid(self):
        """Whether the model's parts are built for one patch grid: relative positions (BEiT's, timm's relpos, SAM's),
        SAM's windows or its neck; such a model takes a fixed image size."""
        return bool(self.relative_position_bias or self.shared_relative_position_bias or self.window_size
                    or self.decomposed_relative_position or self.neck_channels is not None)

    def window_of(self, index):
        """Block `index`'s attention window (SAM's), or 0 where it attends to the whole grid."""
        return 0 if index in self.global_attention_blocks else self.window_size

    @property
    def relative_position_tables(self):
        """Whether attention adds a relative position bias, each block's own or a shared one (BEiT's, timm's relpos)."""
        return bool(self.relative_position_bias or self.shared_relative_position_bias)

    @property
    def normalizes_input(self):
        """Whether the model maps its [-1, 1] input to other pixel statistics than the paper's."""
        return (self.input_mean, self.input_std) != (PAPER_PIXEL_STATISTICS, PAPER_PIXEL_STATISTICS)

    def kv_heads_per_block(self, num_layers, num_heads):
        """Each block's key/value head count (`num_heads` where attention is full); a ValueError where
        `num_kv_heads` has not one count per block or a count does not divide `num_heads`."""
        counts = self.num_kv_heads if self.num_kv_heads is not None else num_heads
        counts = counts if isinstance(counts, tuple) else (counts,) * num_layers
        if len(counts) != num_layers:
            raise ValueError(f"num_kv_heads {counts} is for {len(counts)} blocks, but the model has {num_layers}: "
                             "give one count per block, or one number for every block.")
        wrong = next(((index, count) for index, count in enumerate(counts) if num_heads % count), None)
        if wrong is not None:
            raise ValueError(f"num_kv_heads {wrong[1]} (block {wrong[0]}) does not divide num_heads {num_heads}: "
                             "each key/value head serves num_heads / num_kv_heads query heads.")
        return counts

    def with_blocks(self, num_layers, num_heads):
        """This architecture as a model of `num_layers` blocks of `num_heads` heads carries it: `num_kv_heads`
        checked (`kv_heads_per_block`), one count per block, or None where every block's attention is full."""
        counts = self.kv_heads_per_block(num_layers, num_heads)
        return dataclasses.replace(self, num_kv_heads=None if set(counts) == {num_heads} else counts)

    def replace(self, **changes):
        """This architecture with `changes` (keywords that are `None` are left as they are)."""
        return dataclasses.replace(self, **{key: value for key, value in changes.items() if value is not None})

    def grid_of(self, table_rows):
        """The square `(side, side)` patch grid of a position table with `table_rows` rows, or None if not square."""
        patches = int(table_rows) - self.position_prefix_rows
        side = int(round(max(patches, 0) ** 0.5))
        return (side, side) if side * side == patches and side else None


def check_switches(switches, caller="ViT"):
    """Refuse keywords that name no field of `Architecture`, as Python refuses an unknown keyword, with the closest.

    Example:
    >>> check_switches({"qk_norm": True, "layer_scal": 1e-5})  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    TypeError: ViT() got an unexpected keyword argument 'layer_scal'; did you mean 'layer_scale'?
    """
    fields = [field.name for field in dataclasses.fields(Architecture) if field.name != "classifier"]
    for key in switches:
        if key not in fields:
            close = difflib.get_close_matches(key, fields, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else " (nor is it a field of keras_vit.Architecture)."
            raise TypeError(f"{caller}() got an unexpected keyword argument {key!r}{hint}")


def resolve_architecture(base, classifier, switches):
    """The `Architecture` to build: `base` (a checkpoint's, or None for the paper's) with the `switches` that are set.

    A classifier given alone decides the class token as before: `"token"`
    has one, `"gap"` and `"map"` none (`class_token=True` keeps one).

    Example:
    >>> resolve_architecture(None, "gap", {"register_tokens": 2}).num_prefix_tokens
    2
    """
    changes = {key: value for key, value in switches.items() if value is not None}
    if classifier is not None:
        changes.setdefault("class_token", classifier == "token")
        changes["classifier"] = classifier
    base = base or Architecture()
    if classifier is None and changes.get("class_token") is False and base.classifier == "token":
        changes["classifier"] = "gap"
    return dataclasses.replace(base, **changes)
