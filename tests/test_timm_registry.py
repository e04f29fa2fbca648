"""The family table audited against timm's registry: every entry is what timm's model function sets.

`fixtures/timm_registry.json` was written by `tools/make_timm_registry.py` from timm's own model functions
(timm's `build_model_with_cfg` stubbed out, nothing built). These tests read that file and keras_vit's table
alone: no model is built.
"""

import json

import pytest
from conftest import fixture

from keras_vit import CheckpointError
from keras_vit.checkpoints.timm import families as timm_families
from keras_vit.checkpoints.timm.eva_families import EVA_ARCHITECTURES
from keras_vit.checkpoints.timm.families import ARCHITECTURES, timm_architecture

pytestmark = pytest.mark.backend_independent

with open(fixture("timm_registry.json")) as f:
    REGISTRY = json.load(f)
TIMM = REGISTRY["architectures"]
SIZES = ("patch_size", "embed_dim", "depth", "num_heads", "mlp_ratio", "img_size")
# Keywords with no effect on a forward pass at the model's own size, or on loading.
NEUTRAL = ("dynamic_img_size", "pretrained_strict")
# timm's SwiGLUPacked: GluMlp with SiLU, the gate in the first half.
SWIGLU_PACKED = {"act_layer": "SiLU", "gate_last": False, "partial": "GluMlp"}
# timm's plain-ViT classes: VisionTransformer and its subclass for DeiT distilled (a distillation token and head).
PLAIN_CLASSES = ("VisionTransformer", "VisionTransformerDistilled")
# timm's norm classes -> keras_vit's normalization.
NORMS = {"LayerNorm": "layer_norm", "RmsNorm": "rms_norm"}


def timm_backbone(kwargs):
    """`(units per stage, stem width)` of a hybrid's ResNetV2 (`()` for its stem alone), `(None, None)` for a plain
    ViT, or None for another backbone."""
    embed = kwargs.get("embed_layer")
    if embed is None:
        return None, None
    if embed == {"partial": "HybridEmbed", "backbone": "ConvStem", "proj": False}:  # MobileCLIP's, as timm builds it
        return "ConvStem", None
    if embed == {"partial": "HybridEmbed", "backbone": "MbConvStages", "proj": False}:  # ViTamin's (its VitCfg unrecorded)
        return "MbConvStages", None
    backbone = embed.get("backbone") if isinstance(embed, dict) and embed.get("partial") == "HybridEmbed" else None
    if not isinstance(backbone, dict) or set(embed) != {"partial", "backbone"}:
        return None
    return tuple(backbone["stage_blocks"]), backbone["stem_width"]


def timm_switches(kwargs):
    """What a model function sets beyond the sizes, in the table's spelling; None where keras_vit cannot compute it."""
    if timm_backbone(kwargs) is None:
        return None
    switches = {key: value for key, value in kwargs.items() if key not in SIZES + NEUTRAL + ("embed_layer",)}
    norm = switches.pop("norm_layer", None)
    if norm is not None:
        if norm == "rmsnorm":  # timm's get_norm_layer: RmsNorm at its default epsilon 1e-6
            switches["norm_layer"] = "rms_norm"
        elif isinstance(norm, dict) and norm.get("partial") in NORMS and set(norm) == {"partial", "eps"}:
            switches["norm_eps"] = norm["eps"]
            if NORMS[norm["partial"]] != "layer_norm":
                switches["norm_layer"] = NORMS[norm["partial"]]
        else:
            return None
    embed_norm = switches.pop("embed_norm_layer", None)
    if embed_norm is not None:
        if not (isinstance(embed_norm, dict) and NORMS.get(embed_norm.get("partial")) == switches.get("norm_layer")
                and embed_norm.get("eps") == switches.get("norm_eps")):
            return None
        switches["embed_norm_layer"] = switches["norm_layer"]
    mlp = switches.pop("mlp_layer", None)
    if mlp is not None:
        if mlp not in (SWIGLU_PACKED, "SwiGLU", "GeGluMlp"):
            return None
        switches["mlp_layer"] = "swiglu_packed" if mlp == SWIGLU_PACKED else {"SwiGLU": "swiglu",
                                                                               "GeGluMlp": "geglu"}[mlp]
        if switches.get("act_layer") in ("SiLU", "silu"):
            del switches["act_layer"]
    if set(switches) - set(timm_families.SWITCH_KEYWORDS) or switches.get("block_fn", "Block") not in timm_families.BLOCKS:
        return None
    return switches


def sizes_differ(entry, timm):
    """How a table entry's sizes differ from timm's registry record, or None."""
    kwargs = timm["kwargs"]
    expected = (kwargs.get("patch_size", 16), tuple(timm["input_size"][1:]), kwargs["embed_dim"], kwargs["depth"],
                kwargs["num_heads"], float(kwargs.get("mlp_ratio", 4.0)))
    found = (entry.patch_size, entry.image_size, entry.embed_dim, entry.depth, entry.num_heads, float(entry.mlp_ratio))
    return f"sizes {found}, timm {expected}" if found != expected else None


def test_every_table_entry_is_what_timms_model_function_sets():
    wrong = {}
    for name, entry in ARCHITECTURES.items():
        timm = TIMM.get(name)
        if timm is None or timm["class"] not in PLAIN_CLASSES:
            wrong[name] = "not a VisionTransformer architecture in timm's registry"
            continue
        if entry.distilled != (timm["class"] == "VisionTransformerDistilled"):
            wrong[name] = f"distilled {entry.distilled}, timm's class {timm['class']}"
        kwargs = timm["kwargs"]
        if differs := sizes_differ(entry, timm):
            wrong[name] = differs
        if entry.switches != timm_switches(kwargs):
            wrong[name] = f"switches {entry.switches}, timm {timm_switches(kwargs)}"
        backbone = ("ConvStem", None) if entry.conv_stem else ("MbConvStages", None) if entry.mbconv else (
            entry.resnet_layers, entry.resnet_width)
        if backbone != timm_backbone(kwargs):
            wrong[name] = f"backbone {backbone}, timm {timm_backbone(kwargs)}"
        resize = timm["resize"]
        if entry.resize != (resize["interpolation"], resize["antialias"], bool(resize.get("align_corners"))):
            wrong[name] = f"resize {entry.resize}, timm {resize}"
    assert not wrong


def test_the_table_holds_every_architecture_keras_vit_can_compute():
    computable = {name for name, timm in TIMM.items() if timm["class"] in PLAIN_CLASSES
                  and timm_switches(timm["kwargs"]) is not None}
    assert computable == set(ARCHITECTURES)
    assert len(ARCHITECTURES) >= 184
    assert sum(len(TIMM[name]["tags"]) for name in ARCHITECTURES) >= 347
    assert sum(timm["class"] == "VisionTransformerDistilled" for timm in TIMM.values()) == 4


def test_base_patch32_plus_has_timms_14_heads():
    assert timm_architecture("vit_base_patch32_plus_256").num_heads == 14


# Every Eva, Beit, VisionTransformerRelPos, Cait, VisionTransformerSAM and Gemma4Vit architecture is in its table.
@pytest.mark.parametrize("timm_class", ["VisionTransformer"])
def test_every_other_timm_name_is_refused_with_a_reason(timm_class):
    refused = [name for name, timm in TIMM.items() if timm["class"] == timm_class and name not in ARCHITECTURES
               and name not in EVA_ARCHITECTURES]
    assert refused
    for name in refused:
        with pytest.raises(CheckpointError) as error:
            timm_architecture(name, where="x/config.json")
        message = str(error.value)
        assert message.startswith(f"x/config.json: timm's {name!r}")
        # A named reason, not the catch-all, for every architecture of timm's own ViT classes.
        assert "is not one of the" not in message, message


def eva_switches(kwargs):
    """What an Eva model function sets beyond the sizes, in the table's spelling."""
    switches = {key: value for key, value in kwargs.items() if key not in SIZES + NEUTRAL}
    if isinstance(switches.get("num_kv_heads"), list):  # Sapiens2's, one per block
        switches["num_kv_heads"] = tuple(switches["num_kv_heads"])
    norm = switches.pop("norm_layer", None)
    if norm is not None:
        switches["norm_eps"] = norm["eps"]
        if NORMS[norm["partial"]] != "layer_norm":
            switches["norm_layer"] = NORMS[norm["partial"]]
    if "ref_feat_shape" in switches:
        switches["ref_feat_shape"] = tuple(switches["ref_feat_shape"])
    return switches


def test_every_eva_table_entry_is_what_timms_model_function_sets():
    wrong = {}
    for name, entry in EVA_ARCHITECTURES.items():
        timm = TIMM.get(name)
        if timm is None or timm["class"] != "Eva":
            wrong[name] = "not an Eva architecture in timm's registry"
            continue
        kwargs = timm["kwargs"]
        if differs := sizes_differ(entry, timm):
            wrong[name] = differs
        if entry.switches != eva_switches(kwargs):
            wrong[name] = f"switches {entry.switches}, timm {eva_switches(kwargs)}"
    assert not wrong


def test_the_eva_table_holds_every_eva_architecture_keras_vit_can_compute():
    assert {name for name, timm in TIMM.items() if timm["class"] == "Eva"} == set(EVA_ARCHITECTURES)
    assert len(EVA_ARCHITECTURES) == 65
    assert sum(len(TIMM[name]["tags"]) for name in EVA_ARCHITECTURES) == 83


@pytest.mark.parametrize("name", ["vit_base_resnet26d_224", "vit_small_resnet50d_s16_224"])
def test_a_resnet_d_hybrid_is_refused_by_its_backbone(name):
    """timm's untagged ResNet-D hybrids, which its registry stub does not record (their builder is the hybrids')."""
    with pytest.raises(CheckpointError) as error:
        timm_architecture(name, where="c.json")
    assert str(error.value) == (f"c.json: timm's {name!r} is a ViT with a ResNet-D backbone (timm's resnet26d or "
                                "resnet50d, not the ResNetV2 of the hybrids keras_vit computes).")


def test_a_name_timm_does_not_have_is_refused_by_the_catch_all():
    with pytest.raises(CheckpointError, match=r"^c.json: timm's 'vit_made_up_patch16_224' is not one of the 197 timm "
                                              r"ViT architectures keras_vit computes"):
        timm_architecture("vit_made_up_patch16_224", where="c.json")


def test_naflex_table_is_timms_naflexvit_registry():
    """Every NaFlexVit architecture timm registers, with its model function's NaFlexVitCfg and pretrained tags."""
    from keras_vit.checkpoints.timm.naflex import CFG_DEFAULTS, NAFLEX_ARCHITECTURES

    assert CFG_DEFAULTS == REGISTRY["defaults"]["NaFlexVit"]
    timm = {name: entry for name, entry in TIMM.items() if entry["class"] == "NaFlexVit"}
    assert sorted(NAFLEX_ARCHITECTURES) == sorted(timm) and len(timm) == 14
    for name, entry in timm.items():
        assert set(entry["kwargs"]) == {"cfg"}, name
        assert NAFLEX_ARCHITECTURES[name].cfg == {**CFG_DEFAULTS, **entry["kwargs"]["cfg"]["NaFlexVitCfg"]}, name
        assert sorted(NAFLEX_ARCHITECTURES[name].tags) == entry["tags"], name
    assert sum(len(entry.tags) for entry in NAFLEX_ARCHITECTURES.values()) == 11


@pytest.mark.parametrize("timm_class, module, table, architectures, tags", [
    ("Beit", "beit", "BEIT_ARCHITECTURES", 7, 13),
    ("VisionTransformerRelPos", "relpos", "RELPOS_ARCHITECTURES", 14, 9),
    ("Cait", "cait", "CAIT_ARCHITECTURES", 10, 10),
    ("VisionTransformerSAM", "sam", "SAM_ARCHITECTURES", 4, 3),
])
def test_class_table_is_timms_registry(timm_class, module, table, architectures, tags):
    """Every architecture of timm's class that timm registers, with its sizes, the keywords its model function sets
    and its pretrained tags."""
    import importlib

    entries = getattr(importlib.import_module(f"keras_vit.checkpoints.timm.{module}"), table)
    timm = {name: entry for name, entry in TIMM.items() if entry["class"] == timm_class}
    assert sorted(entries) == sorted(timm) and len(timm) == architectures
    for name, entry in timm.items():
        assert not sizes_differ(entries[name], entry), name
        assert entries[name].switches == {key: value for key, value in entry["kwargs"].items() if key not in SIZES}, name
    assert sum(len(entry["tags"]) for entry in timm.values()) == tags


def test_beit_table_has_the_position_resize_of_timms_checkpoint_filter():
    from keras_vit.checkpoints.timm.beit import BEIT_ARCHITECTURES, RESIZE

    for name in BEIT_ARCHITECTURES:
        assert (TIMM[name]["resize"]["interpolation"], TIMM[name]["resize"]["antialias"]) == RESIZE[:2], name


def test_gemma4_table_is_timms_gemma4_registry():
    """Each Gemma 4 tower's sizes and switches as its model function sets them, its class, and its pretrained tag."""
    from keras_vit.checkpoints.timm.gemma4 import DEFAULTS, GEMMA4_ARCHITECTURES, timm_class_of

    gemma4 = {name: timm for name, timm in TIMM.items() if timm["class"] in ("Gemma4VitEncoder", "Gemma4VitClassifier")}
    assert set(gemma4) == set(GEMMA4_ARCHITECTURES)
    for name, entry in GEMMA4_ARCHITECTURES.items():
        kwargs = {key: value for key, value in gemma4[name]["kwargs"].items() if key != "kwargs_filter"}
        ours = dict(entry.switches, embed_dim=entry.embed_dim, depth=entry.depth, num_heads=entry.num_heads)
        assert {key: value for key, value in ours.items() if DEFAULTS.get(key, object()) != value
                or key in kwargs} == kwargs, name
        assert gemma4[name]["class"] == timm_class_of(name)
        assert (entry.patch_size, entry.image_size) == (16, tuple(gemma4[name]["input_size"][1:]))
        assert len(gemma4[name]["tags"]) == 1
    for timm_class in ("Gemma4VitEncoder", "Gemma4VitClassifier"):
        defaults = REGISTRY["defaults"][timm_class]
        assert {key: defaults[key] for key in DEFAULTS if key in defaults} == {
            key: value for key, value in DEFAULTS.items() if key in defaults}, timm_class
