"""What timm's model functions set for each architecture of its `Eva` class that keras_vit computes: one table.

timm's `Eva` class (timm/models/eva.py) holds the RoPE ViTs: EVA-02, EVA-01
giant, Perception Encoder, timm's SBB `vit_*_rope_reg*_gap_256`, Naver's
`vit_*_rope_*_224`, DINOv3, LingBot and Sapiens2. `EVA_ARCHITECTURES` holds, in
timm's own `Eva` keywords, what each model function sets beyond the sizes;
`eva_switches_to_architecture` turns them into keras_vit's `Architecture`.
`tests/test_timm_registry.py` audits the table against timm's registry.
The train-time RoPE coordinate augmentations (`rope_*_coords`) are kept in
the table but, as in timm at inference, not applied.

Example:
>>> entry = EVA_ARCHITECTURES["vit_base_patch16_dinov3"]
>>> architecture = eva_switches_to_architecture(entry.switches)
>>> architecture["rope"], architecture["register_tokens"], architecture["position_embedding"]
('dinov3', 4, False)
"""

from keras_vit.checkpoints.timm.families import DEFAULT_RESIZE, TimmArchitecture

# timm's Eva keywords that keras_vit computes, as model_args (and this table) spell them.
EVA_KEYWORDS = ("class_token", "num_reg_tokens", "no_embed_class", "use_abs_pos_emb", "global_pool", "use_fc_norm",
                "use_post_transformer_norm", "use_pre_transformer_norm", "qkv_bias", "qkv_fused", "qk_norm",
                "init_values", "swiglu_mlp", "swiglu_align_to", "scale_mlp", "scale_attn_inner", "attn_type",
                "use_post_norm", "use_rot_pos_emb", "rope_type", "rope_temperature", "rope_grid_offset",
                "rope_grid_indexing", "rope_rotate_half", "ref_feat_shape", "attn_pool_num_heads",
                "attn_pool_mlp_ratio", "norm_eps", "norm_layer", "num_kv_heads", "attn_only_layer_scale")
# Train-time RoPE coordinate augmentations: read and kept, not applied at inference (as in timm).
TRAINING_ONLY_KEYWORDS = ("rope_shift_coords", "rope_jitter_coords", "rope_rescale_coords")
ROPE_TYPES = {"cat": "axial", "mixed": "mixed", "dinov3": "dinov3"}
POOLS = {"token": "token", "avg": "gap", "map": "map"}


def _eva(patch_size, image_size, embed_dim, depth, num_heads, mlp_ratio=4.0, **switches):
    unknown = set(switches) - set(EVA_KEYWORDS) - set(TRAINING_ONLY_KEYWORDS)
    if unknown:
        raise TypeError(f"Not a switch of the Eva table: {sorted(unknown)}")
    sides = tuple(image_size) if isinstance(image_size, tuple) else (image_size, image_size)
    return TimmArchitecture(patch_size, sides, embed_dim, depth, num_heads, mlp_ratio, switches, DEFAULT_RESIZE)


def _sapiens2(embed_dim, depth, num_heads, num_kv_heads):
    """timm's `_sapiens2_args`: grouped-query attention but in the first and last 8 blocks, a layer scale on
    attention only, RMSNorms, 8 registers and DINOv3's RoPE."""
    kv_heads = tuple(num_heads if index < 8 or index >= depth - 8 else num_kv_heads for index in range(depth))
    return _eva(16, (1024, 768), embed_dim, depth, num_heads, attn_only_layer_scale=True, attn_type='rope',
                class_token=True, global_pool='token', init_values=1.0, norm_eps=1e-06, norm_layer='rms_norm',
                num_kv_heads=kv_heads, num_reg_tokens=8, qk_norm=True, qkv_bias=True, qkv_fused=False,
                rope_rescale_coords=2.0, rope_rotate_half=True, rope_temperature=100, rope_type='dinov3',
                swiglu_mlp=True, use_abs_pos_emb=False, use_fc_norm=False, use_rot_pos_emb=True)


def eva_unpacked_swiglu(switches):
    """Whether timm builds the SwiGLU as `fc1_g` and `fc1_x` (with `scale_mlp` or `swiglu_align_to`), not one `fc1`."""
    return bool(switches.get("swiglu_mlp")) and bool(switches.get("scale_mlp") or switches.get("swiglu_align_to"))


def eva_switches_to_architecture(switches):
    """keras_vit `Architecture` fields for timm `Eva` keywords, with `Eva`'s defaults.

    Average pooling unless set, `fc_norm` where the pool is the average and
    the final norm otherwise (unless set), EVA's attention with q and v
    biases only (`attn_type="eva"`) or timm's `AttentionRope` with all
    three, exact GELU, LayerNorm epsilon 1e-6.
    """
    pool = switches.get("global_pool", "avg")
    class_token = switches.get("class_token", True)
    fc_norm = switches.get("use_fc_norm")
    fc_norm = pool == "avg" if fc_norm is None else fc_norm
    final_norm = switches.get("use_post_transformer_norm")
    final_norm = not fc_norm if final_norm is None else final_norm
    if fc_norm and final_norm:
        raise KeyError("use_fc_norm with use_post_transformer_norm (two final norms)")
    rope = ROPE_TYPES[switches.get("rope_type", "cat")] if switches.get("use_rot_pos_emb") else None
    reference = switches.get("ref_feat_shape") if rope == "axial" else None
    if isinstance(reference, int):
        reference = (reference, reference)
    pre_norm = bool(switches.get("use_pre_transformer_norm", False))
    return dict(
        class_token=bool(class_token),
        register_tokens=int(switches.get("num_reg_tokens", 0)),
        class_token_position_embedding=not switches.get("no_embed_class", False),
        position_embedding=bool(switches.get("use_abs_pos_emb", True)),
        classifier=POOLS[pool],
        fc_norm=bool(fc_norm),
        final_norm=bool(fc_norm or final_norm),
        norm_pre=pre_norm,
        patch_bias=not pre_norm,
        qkv_bias=bool(switches.get("qkv_bias", True)),
        key_bias=switches.get("attn_type", "eva") == "rope" or not switches.get("qkv_bias", True),
        qk_norm=bool(switches.get("qk_norm", False)),
        # Eva's blocks make gammas for any init_values but None (0.0 too); its post-norm blocks ignore it.
        layer_scale=None if switches.get("init_values") is None or switches.get("use_post_norm")
        else float(switches["init_values"]),
        attention_only_layer_scale=bool(switches.get("attn_only_layer_scale", False)),
        num_kv_heads=switches.get("num_kv_heads"),  # one per block, or one for all; None: full attention
        mlp_activation="swiglu" if switches.get("swiglu_mlp") else "gelu",
        normalization=switches.get("norm_layer", "layer_norm"),
        layer_norm_epsilon=float(switches.get("norm_eps", 1e-6)),
        post_norm=bool(switches.get("use_post_norm", False)),
        attention_output_norm=bool(switches.get("scale_attn_inner", False)),
        mlp_hidden_norm=bool(switches.get("scale_mlp", False)),
        rope=rope,
        rope_temperature=float(switches.get("rope_temperature", 10000.0)),
        # timm passes rope_grid_offset to its axial and DINOv3 RoPE, not to the mixed one.
        rope_grid_offset=0.0 if rope == "mixed" else float(switches.get("rope_grid_offset", 0.0)),
        rope_grid_indexing=switches.get("rope_grid_indexing", "ij"),
        rope_reference_grid=None if reference is None else tuple(reference),
        rope_rotate_half=bool(switches.get("rope_rotate_half", False)),
        # Eva's attention pool attends to every token; without prefix tokens there is nothing to include.
        pool_include_prefix=pool == "map" and bool(class_token or switches.get("num_reg_tokens", 0)),
        attention_pool_heads=switches.get("attn_pool_num_heads") if pool == "map" else None,
        attention_pool_mlp_ratio=switches.get("attn_pool_mlp_ratio") if pool == "map" else None,
    )


EVA_ARCHITECTURES = {
    "eva02_base_patch14_224": _eva(14, 224, 768, 12, 12, mlp_ratio=2.6666666666666665, qkv_fused=False,
                                   ref_feat_shape=(16, 16), scale_mlp=True, swiglu_mlp=True, use_rot_pos_emb=True),
    "eva02_base_patch14_448": _eva(14, 448, 768, 12, 12, mlp_ratio=2.6666666666666665, qkv_fused=False,
                                   ref_feat_shape=(16, 16), scale_mlp=True, swiglu_mlp=True, use_rot_pos_emb=True),
    "eva02_base_patch16_clip_224": _eva(16, 224, 768, 12, 12, mlp_ratio=2.6666666666666665, global_pool='token',
                                        qkv_fused=False, ref_feat_shape=(16, 16), scale_attn_inner=True, scale_mlp=True,
                                        swiglu_mlp=True, use_rot_pos_emb=True),
    "eva02_enormous_patch14_clip_224": _eva(14, 224, 1792, 64, 16, mlp_ratio=8.571428571428571, global_pool='token',
                                            use_post_norm=True),
    "eva02_large_patch14_224": _eva(14, 224, 1024, 24, 16, mlp_ratio=2.6666666666666665, qkv_fused=False,
                                    ref_feat_shape=(16, 16), scale_mlp=True, swiglu_mlp=True, use_rot_pos_emb=True),
    "eva02_large_patch14_448": _eva(14, 448, 1024, 24, 16, mlp_ratio=2.6666666666666665, qkv_fused=False,
                                    ref_feat_shape=(16, 16), scale_mlp=True, swiglu_mlp=True, use_rot_pos_emb=True),
    "eva02_large_patch14_clip_224": _eva(14, 224, 1024, 24, 16, mlp_ratio=2.6666666666666665, global_pool='token',
                                         qkv_fused=False, ref_feat_shape=(16, 16), scale_attn_inner=True,
                                         scale_mlp=True, swiglu_mlp=True, use_rot_pos_emb=True),
    "eva02_large_patch14_clip_336": _eva(14, 336, 1024, 24, 16, mlp_ratio=2.6666666666666665, global_pool='token',
                                         qkv_fused=False, ref_feat_shape=(16, 16), scale_attn_inner=True,
                                         scale_mlp=True, swiglu_mlp=True, use_rot_pos_emb=True),
    "eva02_small_patch14_224": _eva(14, 224, 384, 12, 6, mlp_ratio=2.6666666666666665, ref_feat_shape=(16, 16),
                                    swiglu_mlp=True, use_rot_pos_emb=True),
    "eva02_small_patch14_336": _eva(14, 336, 384, 12, 6, mlp_ratio=2.6666666666666665, ref_feat_shape=(16, 16),
                                    swiglu_mlp=True, use_rot_pos_emb=True),
    "eva02_tiny_patch14_224": _eva(14, 224, 192, 12, 3, mlp_ratio=2.6666666666666665, ref_feat_shape=(16, 16),
                                   swiglu_mlp=True, use_rot_pos_emb=True),
    "eva02_tiny_patch14_336": _eva(14, 336, 192, 12, 3, mlp_ratio=2.6666666666666665, ref_feat_shape=(16, 16),
                                   swiglu_mlp=True, use_rot_pos_emb=True),
    "eva_giant_patch14_224": _eva(14, 224, 1408, 40, 16, mlp_ratio=4.363636363636363),
    "eva_giant_patch14_336": _eva(14, 336, 1408, 40, 16, mlp_ratio=4.363636363636363),
    "eva_giant_patch14_560": _eva(14, 560, 1408, 40, 16, mlp_ratio=4.363636363636363),
    "eva_giant_patch14_clip_224": _eva(14, 224, 1408, 40, 16, mlp_ratio=4.363636363636363, global_pool='token'),
    "vit_5b_patch16_sapiens2": _sapiens2(2432, 56, 32, 16),
    "vit_7b_patch16_dinov3": _eva(16, 256, 4096, 40, 32, mlp_ratio=2, init_values=1e-05, norm_eps=1e-05,
                                  num_reg_tokens=4, qkv_bias=False, rope_rotate_half=True, rope_temperature=100,
                                  rope_type='dinov3', swiglu_align_to=64, swiglu_mlp=True, use_abs_pos_emb=False,
                                  use_fc_norm=False, use_rot_pos_emb=True),
    "vit_base_patch16_dinov3": _eva(16, 256, 768, 12, 12, init_values=1e-05, norm_eps=1e-05, num_reg_tokens=4,
                                    qkv_bias=False, rope_rotate_half=True, rope_temperature=100, rope_type='dinov3',
                                    use_abs_pos_emb=False, use_fc_norm=False, use_rot_pos_emb=True),
    "vit_base_patch16_dinov3_qkvb": _eva(16, 256, 768, 12, 12, init_values=1e-05, norm_eps=1e-05, num_reg_tokens=4,
                                         qkv_bias=True, rope_rotate_half=True, rope_temperature=100, rope_type='dinov3',
                                         use_abs_pos_emb=False, use_fc_norm=False, use_rot_pos_emb=True),
    "vit_base_patch16_sapiens2": _sapiens2(768, 12, 12, 6),
    "vit_base_patch16_lingbot": _eva(16, 512, 768, 12, 12, global_pool='token', init_values=1e-05, norm_eps=1e-05,
                                     num_reg_tokens=4, qkv_bias=True, rope_rotate_half=True, rope_temperature=100,
                                     rope_type='dinov3', use_abs_pos_emb=False, use_fc_norm=False,
                                     use_rot_pos_emb=True),
    "vit_base_patch16_rope_224": _eva(16, 224, 768, 12, 12, attn_type='rope', class_token=True, global_pool='token',
                                      init_values=1e-05, qkv_bias=True, rope_grid_indexing='xy', rope_temperature=100.0,
                                      use_abs_pos_emb=False, use_fc_norm=False, use_rot_pos_emb=True),
    "vit_base_patch16_rope_ape_224": _eva(16, 224, 768, 12, 12, attn_type='rope', class_token=True, global_pool='token',
                                          init_values=1e-05, no_embed_class=True, qkv_bias=True,
                                          rope_grid_indexing='xy', rope_temperature=100.0, use_abs_pos_emb=True,
                                          use_rot_pos_emb=True),
    "vit_base_patch16_rope_mixed_224": _eva(16, 224, 768, 12, 12, attn_type='rope', class_token=True,
                                            global_pool='token', init_values=1e-05, qkv_bias=True,
                                            rope_grid_indexing='xy', rope_temperature=10.0, rope_type='mixed',
                                            use_abs_pos_emb=False, use_rot_pos_emb=True),
    "vit_base_patch16_rope_mixed_ape_224": _eva(16, 224, 768, 12, 12, attn_type='rope', class_token=True,
                                                global_pool='token', init_values=1e-05, no_embed_class=True,
                                                qkv_bias=True, rope_grid_indexing='xy', rope_temperature=10.0,
                                                rope_type='mixed', use_abs_pos_emb=True, use_rot_pos_emb=True),
    "vit_base_patch16_rope_reg1_gap_256": _eva(16, 256, 768, 12, 12, class_token=False, init_values=1e-05,
                                               num_reg_tokens=1, qkv_bias=True, qkv_fused=True, ref_feat_shape=(16, 16),
                                               use_abs_pos_emb=False, use_rot_pos_emb=True),
    "vit_betwixt_patch16_rope_reg4_gap_256": _eva(16, 256, 640, 12, 10, class_token=False, init_values=1e-05,
                                                  num_reg_tokens=4, qkv_bias=True, qkv_fused=True,
                                                  ref_feat_shape=(16, 16), use_abs_pos_emb=False, use_rot_pos_emb=True),
    "vit_giant_patch16_sapiens2": _sapiens2(1536, 40, 24, 12),
    "vit_giant_patch16_lingbot": _eva(16, 512, 1536, 40, 24, mlp_ratio=2.6666666666666665, global_pool='token',
                                      init_values=1e-05, norm_eps=1e-05, num_reg_tokens=4, qkv_bias=False,
                                      rope_rotate_half=True, rope_temperature=100, rope_type='dinov3',
                                      swiglu_align_to=8, swiglu_mlp=True, use_abs_pos_emb=False, use_fc_norm=False,
                                      use_rot_pos_emb=True),
    "vit_huge_patch16_sapiens2": _sapiens2(1280, 32, 16, 8),
    "vit_huge_plus_patch16_dinov3": _eva(16, 256, 1280, 32, 20, init_values=1e-05, norm_eps=1e-05, num_reg_tokens=4,
                                         qkv_bias=False, rope_rotate_half=True, rope_temperature=100,
                                         rope_type='dinov3', swiglu_align_to=8, swiglu_mlp=True, use_abs_pos_emb=False,
                                         use_fc_norm=False, use_rot_pos_emb=True),
    "vit_huge_plus_patch16_dinov3_qkvb": _eva(16, 256, 1280, 32, 20, init_values=1e-05, norm_eps=1e-05,
                                              num_reg_tokens=4, qkv_bias=True, rope_rotate_half=True,
                                              rope_temperature=100, rope_type='dinov3', swiglu_align_to=8,
                                              swiglu_mlp=True, use_abs_pos_emb=False, use_fc_norm=False,
                                              use_rot_pos_emb=True),
    "vit_large_patch16_dinov3": _eva(16, 256, 1024, 24, 16, init_values=1e-05, norm_eps=1e-05, num_reg_tokens=4,
                                     qkv_bias=False, rope_rotate_half=True, rope_temperature=100, rope_type='dinov3',
                                     use_abs_pos_emb=False, use_fc_norm=False, use_rot_pos_emb=True),
    "vit_large_patch16_dinov3_qkvb": _eva(16, 256, 1024, 24, 16, init_values=1e-05, norm_eps=1e-05, num_reg_tokens=4,
                                          qkv_bias=True, rope_rotate_half=True, rope_temperature=100,
                                          rope_type='dinov3', use_abs_pos_emb=False, use_fc_norm=False,
                                          use_rot_pos_emb=True),
    "vit_large_patch16_sapiens2": _sapiens2(1024, 24, 16, 8),
    "vit_large_patch16_lingbot": _eva(16, 512, 1024, 24, 16, global_pool='token', init_values=1e-05, norm_eps=1e-05,
                                      num_reg_tokens=4, qkv_bias=True, rope_rotate_half=True, rope_temperature=100,
                                      rope_type='dinov3', use_abs_pos_emb=False, use_fc_norm=False,
                                      use_rot_pos_emb=True),
    "vit_large_patch16_rope_224": _eva(16, 224, 1024, 24, 16, attn_type='rope', class_token=True, global_pool='token',
                                       init_values=1e-05, qkv_bias=True, rope_grid_indexing='xy',
                                       rope_temperature=100.0, use_abs_pos_emb=False, use_rot_pos_emb=True),
    "vit_large_patch16_rope_ape_224": _eva(16, 224, 1024, 24, 16, attn_type='rope', class_token=True,
                                           global_pool='token', init_values=1e-05, no_embed_class=True, qkv_bias=True,
                                           rope_grid_indexing='xy', rope_temperature=100.0, use_abs_pos_emb=True,
                                           use_rot_pos_emb=True),
    "vit_large_patch16_rope_mixed_224": _eva(16, 224, 1024, 24, 16, attn_type='rope', class_token=True,
                                             global_pool='token', init_values=1e-05, qkv_bias=True,
                                             rope_grid_indexing='xy', rope_temperature=10.0, rope_type='mixed',
                                             use_abs_pos_emb=False, use_rot_pos_emb=True),
    "vit_large_patch16_rope_mixed_ape_224": _eva(16, 224, 1024, 24, 16, attn_type='rope', class_token=True,
                                                 global_pool='token', init_values=1e-05, no_embed_class=True,
                                                 qkv_bias=True, rope_grid_indexing='xy', rope_temperature=10.0,
                                                 rope_type='mixed', use_abs_pos_emb=True, use_rot_pos_emb=True),
    "vit_medium_patch16_rope_reg1_gap_256": _eva(16, 256, 512, 12, 8, class_token=False, init_values=1e-05,
                                                 num_reg_tokens=1, qkv_bias=True, qkv_fused=True,
                                                 ref_feat_shape=(16, 16), use_abs_pos_emb=False, use_rot_pos_emb=True),
    "vit_mediumd_patch16_rope_reg1_gap_256": _eva(16, 256, 512, 20, 8, class_token=False, init_values=1e-05,
                                                  num_reg_tokens=1, qkv_bias=False, qkv_fused=True,
                                                  ref_feat_shape=(16, 16), use_abs_pos_emb=False, use_rot_pos_emb=True),
    "vit_pe_core_base_patch16_224": _eva(16, 224, 768, 12, 12, attn_pool_mlp_ratio=4.0, attn_pool_num_heads=8,
                                         attn_type='rope', global_pool='map', norm_eps=1e-05, ref_feat_shape=(14, 14),
                                         rope_grid_indexing='xy', rope_grid_offset=1.0, use_pre_transformer_norm=True,
                                         use_rot_pos_emb=True),
    "vit_pe_core_gigantic_patch14_448": _eva(14, 448, 1536, 50, 16, mlp_ratio=5.833333333333333,
                                             attn_pool_mlp_ratio=4.0, attn_pool_num_heads=8, attn_type='rope',
                                             class_token=False, global_pool='map', norm_eps=1e-05,
                                             ref_feat_shape=(32, 32), rope_grid_indexing='xy',
                                             use_pre_transformer_norm=True, use_rot_pos_emb=True),
    "vit_pe_core_large_patch14_336": _eva(14, 336, 1024, 24, 16, attn_pool_mlp_ratio=4.0, attn_pool_num_heads=8,
                                          attn_type='rope', global_pool='map', norm_eps=1e-05, ref_feat_shape=(24, 24),
                                          rope_grid_indexing='xy', rope_grid_offset=1.0, use_pre_transformer_norm=True,
                                          use_rot_pos_emb=True),
    "vit_pe_core_small_patch16_384": _eva(16, 384, 384, 12, 6, attn_pool_mlp_ratio=4.0, attn_pool_num_heads=8,
                                          attn_type='rope', global_pool='map', norm_eps=1e-05, ref_feat_shape=(24, 24),
                                          rope_grid_indexing='xy', rope_grid_offset=1.0, use_pre_transformer_norm=True,
                                          use_rot_pos_emb=True),
    "vit_pe_core_tiny_patch16_384": _eva(16, 384, 192, 12, 3, attn_pool_mlp_ratio=4.0, attn_pool_num_heads=8,
                                         attn_type='rope', global_pool='map', norm_eps=1e-05, ref_feat_shape=(24, 24),
                                         rope_grid_indexing='xy', rope_grid_offset=1.0, use_pre_transformer_norm=True,
                                         use_rot_pos_emb=True),
    "vit_pe_lang_gigantic_patch14_448": _eva(14, 448, 1536, 47, 16, mlp_ratio=5.833333333333333, attn_type='rope',
                                             class_token=False, init_values=0.1, norm_eps=1e-05,
                                             ref_feat_shape=(32, 32), rope_grid_indexing='xy', use_fc_norm=False,
                                             use_post_transformer_norm=False, use_pre_transformer_norm=True,
                                             use_rot_pos_emb=True),
    "vit_pe_lang_large_patch14_448": _eva(14, 448, 1024, 23, 16, attn_type='rope', class_token=True, init_values=0.1,
                                          norm_eps=1e-05, ref_feat_shape=(32, 32), rope_grid_indexing='xy',
                                          rope_grid_offset=1.0, use_fc_norm=False, use_post_transformer_norm=False,
                                          use_pre_transformer_norm=True, use_rot_pos_emb=True),
    "vit_pe_spatial_base_patch16_512": _eva(16, 512, 768, 12, 12, attn_type='rope', norm_eps=1e-05,
                                            ref_feat_shape=(32, 32), rope_grid_indexing='xy', rope_grid_offset=1.0,
                                            use_fc_norm=False, use_post_transformer_norm=False,
                                            use_pre_transformer_norm=True, use_rot_pos_emb=True),
    "vit_pe_spatial_gigantic_patch14_448": _eva(14, 448, 1536, 50, 16, mlp_ratio=5.833333333333333, attn_type='rope',
                                                class_token=False, init_values=0.1, norm_eps=1e-05,
                                                ref_feat_shape=(32, 32), rope_grid_indexing='xy', use_fc_norm=False,
                                                use_post_transformer_norm=False, use_pre_transformer_norm=True,
                                                use_rot_pos_emb=True),
    "vit_pe_spatial_large_patch14_448": _eva(14, 448, 1024, 24, 16, attn_type='rope', norm_eps=1e-05,
                                             ref_feat_shape=(32, 32), rope_grid_indexing='xy', rope_grid_offset=1.0,
                                             use_fc_norm=False, use_post_transformer_norm=False,
                                             use_pre_transformer_norm=True, use_rot_pos_emb=True),
    "vit_pe_spatial_small_patch16_512": _eva(16, 512, 384, 12, 6, attn_type='rope', norm_eps=1e-05,
                                             ref_feat_shape=(32, 32), rope_grid_indexing='xy', rope_grid_offset=1.0,
                                             use_fc_norm=False, use_post_transformer_norm=False,
                                             use_pre_transformer_norm=True, use_rot_pos_emb=True),
    "vit_pe_spatial_tiny_patch16_512": _eva(16, 512, 192, 12, 3, attn_type='rope', norm_eps=1e-05,
                                            ref_feat_shape=(32, 32), rope_grid_indexing='xy', rope_grid_offset=1.0,
                                            use_fc_norm=False, use_post_transformer_norm=False,
                                            use_pre_transformer_norm=True, use_rot_pos_emb=True),
    "vit_small_patch16_dinov3": _eva(16, 256, 384, 12, 6, init_values=1e-05, norm_eps=1e-05, num_reg_tokens=4,
                                     qkv_bias=False, rope_rotate_half=True, rope_temperature=100, rope_type='dinov3',
                                     use_abs_pos_emb=False, use_fc_norm=False, use_rot_pos_emb=True),
    "vit_small_patch16_dinov3_qkvb": _eva(16, 256, 384, 12, 6, init_values=1e-05, norm_eps=1e-05, num_reg_tokens=4,
                                          qkv_bias=True, rope_rotate_half=True, rope_temperature=100,
                                          rope_type='dinov3', use_abs_pos_emb=False, use_fc_norm=False,
                                          use_rot_pos_emb=True),
    "vit_small_patch16_lingbot": _eva(16, 512, 384, 12, 6, global_pool='token', init_values=1e-05, norm_eps=1e-05,
                                      num_reg_tokens=4, qkv_bias=True, rope_rotate_half=True, rope_temperature=100,
                                      rope_type='dinov3', use_abs_pos_emb=False, use_fc_norm=False,
                                      use_rot_pos_emb=True),
    "vit_small_patch16_rope_224": _eva(16, 224, 384, 12, 6, attn_type='rope', class_token=True, global_pool='token',
                                       init_values=1e-05, qkv_bias=True, rope_grid_indexing='xy',
                                       rope_temperature=100.0, use_abs_pos_emb=False, use_rot_pos_emb=True),
    "vit_small_patch16_rope_ape_224": _eva(16, 224, 384, 12, 6, attn_type='rope', class_token=True, global_pool='token',
                                           init_values=1e-05, no_embed_class=True, qkv_bias=True,
                                           rope_grid_indexing='xy', rope_temperature=100.0, use_abs_pos_emb=True,
                                           use_rot_pos_emb=True),
    "vit_small_patch16_rope_mixed_224": _eva(16, 224, 384, 12, 6, attn_type='rope', class_token=True,
                                             global_pool='token', init_values=1e-05, qkv_bias=True,
                                             rope_grid_indexing='xy', rope_temperature=10.0, rope_type='mixed',
                                             use_abs_pos_emb=False, use_rot_pos_emb=True),
    "vit_small_patch16_rope_mixed_ape_224": _eva(16, 224, 384, 12, 6, attn_type='rope', class_token=True,
                                                 global_pool='token', init_values=1e-05, no_embed_class=True,
                                                 qkv_bias=True, rope_grid_indexing='xy', rope_temperature=10.0,
                                                 rope_type='mixed', use_abs_pos_emb=True, use_rot_pos_emb=True),
    "vit_small_plus_patch16_dinov3": _eva(16, 256, 384, 12, 6, init_values=1e-05, norm_eps=1e-05, num_reg_tokens=4,
                                          qkv_bias=False, rope_rotate_half=True, rope_temperature=100,
                                          rope_type='dinov3', swiglu_align_to=8, swiglu_mlp=True, use_abs_pos_emb=False,
                                          use_fc_norm=False, use_rot_pos_emb=True),
    "vit_small_plus_patch16_dinov3_qkvb": _eva(16, 256, 384, 12, 6, init_values=1e-05, norm_eps=1e-05, num_reg_tokens=4,
                                               qkv_bias=True, rope_rotate_half=True, rope_temperature=100,
                                               rope_type='dinov3', swiglu_align_to=8, swiglu_mlp=True,
                                               use_abs_pos_emb=False, use_fc_norm=False, use_rot_pos_emb=True),
    "vit_tiny_patch16_dinov3_qkvb": _eva(16, 256, 192, 12, 3, init_values=1e-05, norm_eps=1e-05, num_reg_tokens=4,
                                         qkv_bias=True, rope_rotate_half=True, rope_temperature=100, rope_type='dinov3',
                                         use_abs_pos_emb=False, use_fc_norm=False, use_rot_pos_emb=True),
}
