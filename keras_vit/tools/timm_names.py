"""timm's vocabulary over keras_vit: `list_models`, `create_model` and a model's `pretrained_cfg`.

A timm user writes `timm.create_model("beitv2_base_patch16_224.in1k_ft_in22k_in1k", pretrained=True,
num_classes=0)`; `create_model` takes the same words and gives keras_vit's model of that checkpoint, named as
timm names it, read from timm's own Hub repository (`hf://timm/<name>.<tag>`, with the `[hub]` extra) or from a
folder or file given as `pretrained`. `num_classes=0` gives timm's pooled features (its `fc_norm` included),
`global_pool=""` the token sequence, `features_only=True` the blocks' feature maps (channels last; timm's
`forward_intermediates`). `list_models` lists the architectures keras_vit computes, with timm's wildcards.

keras_vit builds a timm architecture from its checkpoint's files: `pretrained=False` (random weights) is refused
in one line, naming `keras_vit.ViT` for a model of any sizes.

Example:
>>> list_models("samvit_*")
['samvit_base_patch16', 'samvit_base_patch16_224', 'samvit_huge_patch16', 'samvit_large_patch16']
>>> model = create_model("vit_small_patch16_224.augreg_in21k_ft_in1k", pretrained=True)  # doctest: +SKIP
"""

import fnmatch

from keras_vit.applications.pretrained import from_pretrained
from keras_vit.checkpoints import CheckpointError
from keras_vit.checkpoints.timm.families import ARCHITECTURES
from keras_vit.checkpoints.timm.folders import READERS
from keras_vit.tools.features import feature_extractor
from keras_vit.utils.names import HF_PREFIX

# timm's global_pool -> keras_vit's pooling of a model without its head ("": the token sequence).
POOLINGS = {"": None, "token": "token", "avg": "gap", "map": "map"}


def list_models(filter="*"):  # noqa: A002 (timm's keyword)
    """The timm architecture names keras_vit computes that match `filter` (timm's wildcards: `"vit_*"`), sorted;
    `create_model` builds each from its checkpoint."""
    return sorted(fnmatch.filter({*ARCHITECTURES, *READERS}, filter))


def create_model(model_name, pretrained=False, num_classes=None, global_pool=None, features_only=False,
                 out_indices=None, **kwargs):
    """keras_vit's model of timm's `model_name` (`name` or `name.tag`), as `timm.create_model` makes it.

    Args:
        model_name: one of `list_models()`, with a pretrained tag after a dot.
        pretrained: True: timm's Hub repository `hf://timm/<model_name>` (the
            name with its tag); a path or an `hf://org/name` handle: that
            checkpoint, which must hold the named architecture.
        num_classes: None: the checkpoint's head; 0: none, its pooled
            features; N: a new head of N classes (logits).
        global_pool: with `num_classes=0`, timm's pooling over the tokens:
            "token", "avg", "map", or "" for the token sequence.
        features_only, out_indices: a model of the blocks' outputs as feature
            maps, channels last (`keras_vit.feature_extractor`); `out_indices`
            the blocks (an int n: the last n; default the last 3, timm's).
        **kwargs: `keras_vit.ViT`'s, `img_size` taken as its `image_size`.

    The model is named `model_name` without its tag.
    """
    name, _, tag = model_name.partition(".")
    if name not in list_models():
        close = list_models(f"*{name.split('_')[0]}*")[:8]
        raise CheckpointError(f"keras_vit computes no timm architecture {name!r}" + (
            f"; of this family it computes {close}" if close else "") + " (keras_vit.list_models(filter) lists them).")
    if pretrained is False or pretrained is None:
        raise CheckpointError(f"create_model({model_name!r}) builds a timm architecture from its checkpoint: pass "
                              "pretrained=True (timm's Hub repository) or a folder, file or hf:// handle; "
                              "keras_vit.ViT(...) builds a model of any sizes with random weights.")
    if pretrained is True:
        if not tag:
            raise CheckpointError(f"create_model({model_name!r}, pretrained=True): name its pretrained tag, "
                                  f"'{name}.<tag>' (timm.list_pretrained('{name}.*') lists them): keras_vit reads "
                                  "timm's Hub repository of that tag.")
        pretrained = f"{HF_PREFIX}timm/{model_name}"
    if "img_size" in kwargs:
        kwargs["image_size"] = kwargs.pop("img_size")
    if global_pool is not None:
        if global_pool not in POOLINGS or num_classes != 0:
            raise ValueError(f"global_pool={global_pool!r}: keras_vit takes one of {sorted(POOLINGS)} with "
                             "num_classes=0 (a head pools as its checkpoint does).")
        kwargs.update(include_top=False, pooling=POOLINGS[global_pool])
    elif num_classes is not None:
        kwargs["classes"] = num_classes
    model = from_pretrained(pretrained, **kwargs)
    if model.name != name:
        raise CheckpointError(
            f"{pretrained} holds timm's {model.name!r}, not {name!r}: name the architecture it holds, "
            f"create_model({model.name!r}, pretrained=...)." if model.name in list_models() else
            f"{pretrained} is no timm folder of {name!r} (its config.json names the architecture): "
            f"keras_vit.from_pretrained({str(pretrained)!r}) reads any checkpoint as its files describe it.")
    if features_only:
        depth = sum(layer.name.startswith("encoderblock_") for layer in model.layers)
        indices = out_indices if out_indices is not None else 3
        blocks = tuple(range(depth - indices, depth)) if isinstance(indices, int) else tuple(indices)
        return feature_extractor(model, blocks, name=f"{model.name}_features")
    return model
