"""Write tests/fixtures/timm_registry.json: what timm's own model functions set, for the family-table audit.

Run in the side venv of tools/make_fixtures.py (timm installed there, never in the project's venv):

    /tmp/timm-venv/bin/python tools/make_timm_registry.py

For every architecture that timm registers, its model function is called with
`pretrained=False` while `build_model_with_cfg` is replaced by a stub that
records what it was handed and stops: the model class, the keyword arguments
the function sets (before the defaults of its pretrained config are applied),
and the position-table resize of its `pretrained_filter_fn`. Nothing is built
or downloaded. Each architecture also gets its default pretrained config's
input size and pixel statistics and its pretrained tags. Only the classes
keras_vit's family tables concern are kept: `VisionTransformer`, its subclass
`VisionTransformerDistilled` (DeiT distilled), `Eva` and
`NaFlexVit`, whose model functions hand over a `NaFlexVitCfg`: it is recorded
as the fields that differ from the dataclass's defaults (`{"NaFlexVitCfg":
{...}}`), and those defaults as the class's. Each class's constructor
keywords (NaFlexVit's with its config's fields) are recorded with the JSON
kinds their annotations admit (`keyword_kinds`): what a `config.json`'s
`model_args` may hold for timm to build the model (`tests/timm_class_checks.py`).
`tests/test_timm_registry_audit.py` reads this file and keras_vit's table alone.
"""

import dataclasses
import functools
import importlib
import inspect
import json
import os
import pkgutil
import typing
import warnings

import timm
import timm.models

OUTPUT = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "timm_registry.json")
CLASSES = ("VisionTransformer", "VisionTransformerDistilled", "Eva", "NaFlexVit", "Beit", "VisionTransformerRelPos", "Cait",
           "VisionTransformerSAM", "Gemma4VitEncoder", "Gemma4VitClassifier")


class _Captured(Exception):
    pass


def _stub(model_cls, variant, pretrained=False, **kwargs):
    raise _Captured(model_cls, kwargs)


def describe(value):
    """A JSON form of a keyword value: classes and functions by name, partials with their keywords, a config
    dataclass (NaFlexVitCfg) by the fields that differ from its defaults."""
    if dataclasses.is_dataclass(value) and not inspect.isclass(value):
        default = type(value)()
        return {type(value).__name__: {field.name: describe(getattr(value, field.name))
                                       for field in dataclasses.fields(value)
                                       if getattr(value, field.name) != getattr(default, field.name)}}
    if isinstance(value, functools.partial):
        return {"partial": describe(value.func), **{key: describe(v) for key, v in value.keywords.items()}}
    if inspect.isclass(value) or inspect.isfunction(value):
        return value.__name__
    if isinstance(value, (list, tuple)):
        return [describe(v) for v in value]
    if isinstance(value, dict):
        return {key: describe(v) for key, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return _backbone(value)


def _kinds(annotation):
    """The JSON kinds a keyword of this annotation takes, as a config.json's model_args holds it: "int", "number",
    "bool", "str", "list" (a tuple), "null"; "any" where the annotation is a callable, a class or none at all."""
    origin = typing.get_origin(annotation)
    if origin is typing.Union:
        return sorted({kind for argument in typing.get_args(annotation) for kind in _kinds(argument)})
    if origin is typing.Literal:
        return sorted({"null" if choice is None else "str" for choice in typing.get_args(annotation)})
    if origin in (tuple, list) or annotation in (tuple, list):
        return ["list"]
    simple = {type(None): "null", bool: "bool", int: "int", float: "number", str: "str"}
    return [simple[annotation]] if annotation in simple else ["any"]


def _backbone(module):
    """A hybrid's backbone (a module instance): its class, and for timm's ResNetV2 or its stem alone (a
    Sequential of a convolution and a norm) the blocks of each stage and the stem's width."""
    name = type(module).__name__
    if name == "ResNetV2":
        return {"module": name, "stage_blocks": [len(stage.blocks) for stage in module.stages],
                "stem_width": int(module.stem.conv.out_channels)}
    if name == "Sequential" and hasattr(module, "conv"):
        return {"module": name, "stage_blocks": [], "stem_width": int(module.conv.out_channels)}
    return name


def main():
    warnings.filterwarnings("ignore")
    for module in pkgutil.iter_modules(timm.models.__path__):
        try:
            loaded = importlib.import_module(f"timm.models.{module.name}")
        except Exception:  # an optional dependency of another family
            continue
        if hasattr(loaded, "build_model_with_cfg"):
            loaded.build_model_with_cfg = _stub
    defaults, keyword_kinds = {}, {}
    architectures = {}
    for name in timm.list_models():
        try:
            timm.models.model_entrypoint(name)(pretrained=False)
            continue
        except _Captured as captured:
            model_cls, kwargs = captured.args
        except Exception:
            continue
        if model_cls.__name__ not in CLASSES:
            continue
        config_class = type(kwargs.get("cfg")) if dataclasses.is_dataclass(kwargs.get("cfg")) else None
        defaults.setdefault(model_cls.__name__, {
            key: describe(parameter.default) for key, parameter in inspect.signature(model_cls).parameters.items()
            if parameter.default is not inspect.Parameter.empty} if config_class is None else {
            field.name: describe(getattr(config_class(), field.name)) for field in dataclasses.fields(config_class)})
        keyword_kinds.setdefault(model_cls.__name__, {
            key: _kinds(parameter.annotation) for key, parameter in
            [*inspect.signature(model_cls).parameters.items(),
             *([] if config_class is None else inspect.signature(config_class).parameters.items())]
            if parameter.kind is parameter.POSITIONAL_OR_KEYWORD or parameter.kind is parameter.KEYWORD_ONLY})
        resize = kwargs.pop("pretrained_filter_fn", None)
        keywords = resize.keywords if isinstance(resize, functools.partial) else {}
        resize_function = resize.func if isinstance(resize, functools.partial) else resize
        resize_defaults = {} if resize_function is None else {
            key: p.default for key, p in inspect.signature(resize_function).parameters.items()
            if key in ("interpolation", "antialias", "align_corners")}
        kwargs.pop("feature_cfg", None)
        cfg = timm.models.get_pretrained_cfg(name)
        architectures[name] = {
            "class": model_cls.__name__,
            "module": timm.models.model_entrypoint(name).__module__.rpartition(".")[2],
            "kwargs": describe(kwargs),
            "resize": {**resize_defaults, **keywords},
            "input_size": None if cfg is None else list(cfg.input_size),
            "mean": None if cfg is None else list(cfg.mean),
            "std": None if cfg is None else list(cfg.std),
            "tags": sorted(tag.partition(".")[2] for tag in timm.list_pretrained(name + ".*")),
        }
    with open(OUTPUT, "w") as f:
        json.dump({"timm_version": timm.__version__, "defaults": defaults, "keyword_kinds": keyword_kinds,
                   "architectures": architectures}, f, indent=0, sort_keys=True)
    counts = {cls: sum(entry["class"] == cls for entry in architectures.values()) for cls in CLASSES}
    tags = {cls: sum(len(entry["tags"]) for entry in architectures.values() if entry["class"] == cls)
            for cls in CLASSES}
    print(f"timm {timm.__version__}: {counts} architectures, {tags} tags -> {OUTPUT}")


if __name__ == "__main__":
    main()
