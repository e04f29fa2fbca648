"""Each checkpoint's own evaluation preprocessing: how its library resizes and crops a photo for the model.

timm, transformers and the paper's vit_jax evaluate their checkpoints each
their own way, and a model is only as accurate as the pixels it is given:

- timm (`resolve_data_config` + `create_transform`): the shorter side to
  `floor(size / crop_pct)` with Pillow's filter (antialiased), then the
  centre crop, its offset rounded half to even (torchvision's `CenterCrop`);
  `crop_mode="squash"` resizes both sides instead.
- transformers' image processors: `size` (`shortest_edge`, or `height` and
  `width`) with Pillow's `resample` filter, then `crop_size` from the
  centre, its offset floored.
- vit_jax (the paper's `.npz` files) and keras_vit's own training: both
  sides to the model's size with `tf.image.resize`'s bilinear filter, not
  antialiased (`keras_vit.data.arrays.resize`, bit-equal on the tf.data path).

An `EvalTransform` holds one such rule. The checkpoint readers build it from
the file's config (`from_timm_config`, `from_preprocessor_config`), the
model keeps it (`model.eval_transform`, saved in its `.keras` file), and
`predict`, `evaluate`, `inspect` and the data pipelines' evaluation apply
it. Images come out as the model takes them: float32 in [-1, 1]; the
checkpoint's mean and std are applied inside the model.

Example:
>>> import numpy as np
>>> transform = EvalTransform(image_size=(224, 224), crop_fraction=0.875, interpolation="bicubic",
...                           convention="timm")
>>> transform.plan(375, 500)  # resized (height, width), then the crop's (top, left)
((256, 341), (16, 58))
>>> transform.summary()
"timm's: the shorter side resized (bicubic, antialiased), then the centre 224x224 (crop_pct 0.875)"
>>> transform(np.zeros((375, 500, 3), "uint8")).shape
(224, 224, 3)
"""

import dataclasses
import math

import numpy as np

from keras_vit.data import arrays

# Pillow's filter ids (`Image.Resampling`), which transformers stores as `resample`.
PILLOW_FILTERS = {"nearest": 0, "lanczos": 1, "bilinear": 2, "bicubic": 3, "box": 4, "hamming": 5}
CROP_MODES = ("center", "squash")
# Whose arithmetic decides the sizes and offsets: timm rounds the crop's offset half to even (torchvision's
# CenterCrop) and floors `size / crop_fraction`; transformers floors the offset; vit_jax and keras_vit floor the
# offset and round `size / crop_fraction`.
CONVENTIONS = ("timm", "transformers", "vit_jax", "keras_vit")

# timm's `PretrainedCfg` fields. Those that change the pixels are computed; the rest are about weights and labels.
TIMM_COMPUTED = ("input_size", "interpolation", "crop_pct", "crop_mode", "mean", "std")
TIMM_OTHER = ("url", "file", "state_dict", "hf_hub_id", "hf_hub_filename", "source", "architecture", "tag",
              "custom_load", "min_input_size", "fixed_input_size", "num_classes", "label_offset", "label_names",
              "label_descriptions", "pool_size", "test_pool_size", "first_conv", "classifier", "license",
              "description", "origin_url", "paper_name", "paper_ids", "notes",
              # used only by `resolve_data_config(use_test_size=True)`, which is not its default
              "test_input_size", "test_crop_pct")
# transformers' image-processor fields keras_vit computes, and those that name the processor.
TRANSFORMERS_COMPUTED = ("do_resize", "size", "resample", "do_center_crop", "crop_size", "do_rescale",
                         "rescale_factor", "do_normalize", "image_mean", "image_std", "do_convert_rgb")
TRANSFORMERS_NAMES = ("image_processor_type", "feature_extractor_type", "processor_class")
# Fields of processors that change segmentation maps alone, never the image (BeitImageProcessor's).
TRANSFORMERS_LABELS_ONLY = ("do_reduce_labels",)
# transformers' Siglip2ImageProcessor fields: a NaFlex processor (no size or crop: a patch budget per image).
SIGLIP2_COMPUTED = ("do_resize", "resample", "do_rescale", "rescale_factor", "do_normalize", "image_mean",
                    "image_std", "do_convert_rgb", "patch_size", "max_num_patches")
# Processors whose integer `size` is the shorter side (`default_to_square=False`), and whose crop is on by default.
_SHORTEST_EDGE_PROCESSORS = ("CLIPImageProcessor", "BitImageProcessor", "CLIPFeatureExtractor")


@dataclasses.dataclass(frozen=True)
class EvalTransform:
    """How one checkpoint's library turns a photo into the model's input at evaluation.

    Args:
        image_size: `(height, width)` of the model's input (the crop); None
            takes the model's (`fitted_to`).
        crop_fraction: the centre crop's share of the resized image (timm's
            `crop_pct`): the resize goes to `image_size / crop_fraction`.
        resize_size: the resize's own target, where the config names one
            (transformers' `shortest_edge`, or `(height, width)` to squash
            to); it takes the place of `crop_fraction`.
        crop_mode: `"center"` keeps the aspect ratio (the shorter side is
            resized) and crops the centre; `"squash"` resizes both sides.
            None: center for timm's and transformers' conventions, else squash.
        interpolation: Pillow's filter, `"bilinear"`, `"bicubic"`,
            `"lanczos"`, `"nearest"`, `"box"` or `"hamming"`.
        antialias: True resizes with Pillow (antialiased, as timm and
            transformers do); False computes `tf.image.resize`'s bilinear
            (vit_jax and keras_vit's own training). None: True for timm's and
            transformers' conventions and for filters other than bilinear.
        convention: whose size and offset arithmetic to follow (`CONVENTIONS`).
        patch_budget: `(max_patches, patch_size, pooling_kernel_size)`:
            Gemma 4's processor, which resizes each image, its aspect ratio
            kept, to the largest size of at most `max_patches` patches whose
            sides are multiples of `patch_size * pooling_kernel_size`
            (`patch_budget_size`), and crops nothing: the model takes every
            size (`image_size=(None, None)`). None: a resize and crop to
            `image_size`.
    """

    image_size: tuple = None
    crop_fraction: float = 1.0
    resize_size: object = None
    crop_mode: str = None
    interpolation: str = "bilinear"
    antialias: bool = None
    convention: str = "keras_vit"
    patch_budget: tuple = None

    def __post_init__(self):
        if self.patch_budget is not None:
            budget = tuple(self.patch_budget) if isinstance(self.patch_budget, (list, tuple)) else ()
            if len(budget) != 3 or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in budget):
                raise ValueError(f"patch_budget must be (max_patches, patch_size, pooling_kernel_size), three "
                                 f"positive ints, got {self.patch_budget!r}.")
            object.__setattr__(self, "patch_budget", budget)
        if self.crop_mode is None:
            object.__setattr__(self, "crop_mode", "center" if self.convention in ("timm", "transformers") else "squash")
        if self.antialias is None:  # Pillow for timm's and transformers' rules and for filters tf's has no twin of
            object.__setattr__(self, "antialias", self.convention in ("timm", "transformers")
                               or self.interpolation != "bilinear")
        if self.image_size is not None:
            size = tuple(int(s) for s in np.broadcast_to(self.image_size, (2,)))
            if min(size) < 1:
                raise ValueError(f"EvalTransform image_size must be positive, got {self.image_size!r}.")
            object.__setattr__(self, "image_size", size)
        if not isinstance(self.crop_fraction, (int, float)) or not 0.0 < self.crop_fraction <= 1.0:
            raise ValueError(f"crop_fraction must be in (0, 1], got {self.crop_fraction!r} (timm's crop_pct: 0.875 "
                             "keeps the central 87.5% of the resized image).")
        object.__setattr__(self, "crop_fraction", float(self.crop_fraction))
        if isinstance(self.resize_size, (list, tuple)):
            object.__setattr__(self, "resize_size", tuple(int(s) for s in self.resize_size))
        if self.crop_mode not in CROP_MODES:
            raise ValueError(f"crop_mode must be one of {CROP_MODES}, got {self.crop_mode!r}.")
        if self.interpolation not in PILLOW_FILTERS:
            raise ValueError(f"interpolation must be one of {tuple(PILLOW_FILTERS)}, got {self.interpolation!r}.")
        if not self.antialias and self.interpolation != "bilinear":
            raise ValueError(f"antialias=False computes tf.image.resize's bilinear only, not {self.interpolation!r}; "
                             "pass antialias=True for Pillow's filters.")
        if self.convention not in CONVENTIONS:
            raise ValueError(f"convention must be one of {CONVENTIONS}, got {self.convention!r}.")

    def replace(self, **overrides):
        """A copy with `overrides` (`image_size`, `crop_fraction`, `interpolation`, ...); None leaves a field.

        A new `crop_fraction` or `image_size` drops a config's own
        `resize_size`, which was meant for its own crop size; a Pillow filter
        other than bilinear turns `antialias` on.
        """
        overrides = {name: value for name, value in overrides.items() if value is not None}
        unknown = sorted(set(overrides) - {field.name for field in dataclasses.fields(self)})
        if unknown:
            raise TypeError(f"EvalTransform has no field {unknown[0]!r}; its fields are "
                            f"{[field.name for field in dataclasses.fields(self)]}.")
        if "crop_fraction" in overrides:
            overrides.setdefault("resize_size", None)
        if "image_size" in overrides and self.resize_size is not None and "resize_size" not in overrides:
            size = tuple(int(s) for s in np.broadcast_to(overrides["image_size"], (2,)))
            if self.image_size is not None and size != self.image_size:
                overrides["resize_size"] = None
                overrides.setdefault("crop_fraction", self._resize_share())
        if overrides.get("interpolation", "bilinear") != "bilinear":
            overrides.setdefault("antialias", True)
        elif "interpolation" in overrides:
            overrides.setdefault("antialias", self.antialias)
        return dataclasses.replace(self, **overrides)

    def fitted_to(self, image_size):
        """This transform for a model that takes `image_size`: its own size where it states none, else kept."""
        image_size = tuple(int(s) for s in image_size)
        if self.image_size == image_size:
            return self
        return self.replace(image_size=image_size)

    def _resize_share(self):
        """The crop's share of a `resize_size` resize, as a crop fraction (for a model of another size)."""
        target = self.resize_size if isinstance(self.resize_size, tuple) else (self.resize_size, self.resize_size)
        return min(1.0, max(crop / resized for crop, resized in zip(self.image_size, target)))

    # === The arithmetic ===
    def plan(self, height, width):
        """`((resized height, resized width), (crop top, crop left))` for a `height` x `width` image."""
        if self.patch_budget is not None:  # Gemma 4's: the image whole, at its size within the budget
            return patch_budget_size(height, width, *self.patch_budget), (0, 0)
        if self.image_size is None:
            raise ValueError("This EvalTransform has no image_size: use model.eval_transform, or "
                             "transform.fitted_to((height, width)).")
        crop_h, crop_w = self.image_size
        if self.resize_size is not None:
            scale = self.resize_size
        elif self.convention in ("timm", "transformers"):
            scale = tuple(math.floor(size / self.crop_fraction) for size in self.image_size)
        else:
            scale = tuple(int(round(size / self.crop_fraction)) for size in self.image_size)
        if self.crop_mode == "squash":
            resized = scale if isinstance(scale, tuple) else (scale, scale)
        elif isinstance(scale, int) or scale[0] == scale[1]:
            shortest = scale if isinstance(scale, int) else scale[0]
            short, long = (width, height) if width <= height else (height, width)
            longer = int(shortest * long / short)  # torchvision's Resize(int) and transformers' shortest_edge
            resized = (longer, shortest) if width <= height else (shortest, longer)
        else:  # timm's ResizeKeepRatio: the side that needs the least scaling meets its target
            ratio = min(height / scale[0], width / scale[1])
            resized = (round(height / ratio), round(width / ratio))
        if resized[0] < crop_h or resized[1] < crop_w:
            raise ValueError(f"A {height}x{width} image resized to {resized[0]}x{resized[1]} is smaller than the "
                             f"{crop_h}x{crop_w} crop; keras_vit does not pad. Use a crop_fraction <= 1.")
        if self.convention == "timm":  # torchvision's CenterCrop: int(round(margin / 2)), half to even
            offsets = (int(round((resized[0] - crop_h) / 2.0)), int(round((resized[1] - crop_w) / 2.0)))
        else:
            offsets = ((resized[0] - crop_h) // 2, (resized[1] - crop_w) // 2)
        return tuple(resized), offsets

    def pixels(self, image):
        """A uint8 `(height, width, 3)` image (or a Pillow image) as the model's `(h, w, 3)` pixels in [0, 255].

        uint8 where Pillow resizes (`antialias=True`; it takes uint8 only),
        float32 where `tf.image.resize`'s bilinear is computed.
        """
        pil_image = _as_pillow(image) if self.antialias else None
        array = None if self.antialias else _as_array(image)
        height, width = (pil_image.height, pil_image.width) if pil_image is not None else array.shape[:2]
        (resized_h, resized_w), (top, left) = self.plan(height, width)
        crop_h, crop_w = (resized_h, resized_w) if self.patch_budget is not None else self.image_size
        if pil_image is None:
            resized = arrays.resize(array, (resized_h, resized_w))
            return resized[top:top + crop_h, left:left + crop_w]
        if (resized_h, resized_w) != (height, width):
            pil_image = pil_image.resize((resized_w, resized_h), resample=PILLOW_FILTERS[self.interpolation])
        return np.asarray(pil_image.crop((left, top, left + crop_w, top + crop_h)))

    def __call__(self, image):
        """One uint8 image `(height, width, 3)` as the model's input: float32 `(h, w, 3)` in [-1, 1]."""
        return arrays.minus_one_to_one(self.pixels(image))

    def load(self, path):
        """An image file decoded by Pillow (RGB) and transformed: float32 `(h, w, 3)` in [-1, 1]."""
        return self(arrays.open_rgb(path) if self.antialias else arrays.decode_image(path))

    def summary(self):
        """This rule in one line, whose it is first (the module's example shows one)."""
        owner = self.convention + ("': " if self.convention.endswith("s") else "'s: ")
        how = f"({self.interpolation}, {'antialiased' if self.antialias else 'tf.image.resize'})"
        size = "the model size" if self.image_size is None else "x".join(map(str, self.image_size))
        if self.patch_budget is not None:
            return f"{owner}each photo resized whole {how} to its budget of {self.patch_budget[0]} patches"
        if self.crop_mode == "squash" and self.crop_fraction == 1.0 and self.resize_size is None:
            return f"{owner}both sides to {size} {how}"
        crop = f"crop_pct {self.crop_fraction:g}" if self.resize_size is None else f"resized to {self.resize_size}"
        sides = "the shorter side" if self.crop_mode == "center" else "both sides"
        return f"{owner}{sides} resized {how}, then the centre {size} ({crop})"

    @property
    def computed_by_tf_image_resize(self):
        """Whether `tf.image.resize` computes it in a tf.data graph (squash, bilinear, no antialias)."""
        return not self.antialias and self.crop_mode == "squash" and self.resize_size is None \
            and self.convention in ("keras_vit", "vit_jax")

    # === Serialization ===
    def get_config(self):
        config = dataclasses.asdict(self)
        for field in ("image_size", "resize_size", "patch_budget"):
            if isinstance(config[field], tuple):
                config[field] = list(config[field])
        if config["patch_budget"] is None:
            del config["patch_budget"]  # as keras_vit before it wrote them, which reads this config
        return config

    @classmethod
    def from_config(cls, config):
        known = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(config) - known)
        if unknown:
            raise ValueError(f"An eval_transform config has fields keras_vit does not compute: {unknown}; "
                             f"it knows {sorted(known)}.")
        return cls(**config)


def _as_pillow(image):
    from PIL import Image

    if isinstance(image, Image.Image):
        return image if image.mode == "RGB" else image.convert("RGB")
    return Image.fromarray(_as_uint8_array(image), "RGB")


def _as_array(image):
    if hasattr(image, "convert") and hasattr(image, "mode"):  # a Pillow image
        return np.asarray(image.convert("RGB"))
    array = np.asarray(image)
    if array.ndim != 3 or array.shape[-1] != 3:
        raise ValueError(f"EvalTransform takes one RGB image (height, width, 3), got shape {array.shape}.")
    return array


def _as_uint8_array(image):
    array = _as_array(image)
    if array.dtype != np.uint8:
        raise ValueError(f"EvalTransform takes uint8 pixels (0..255), as decoded from a file; got {array.dtype}. "
                         "Convert with np.clip(np.round(image), 0, 255).astype('uint8').")
    return array


# === The configs of each library ===
def vit_jax():
    """The rule of the paper's `.npz` checkpoints: both sides to the model's size, `tf.image.resize`'s bilinear."""
    return EvalTransform(convention="vit_jax")


def keras_vit(crop_fraction=None):
    """keras_vit's own evaluation: `tf.image.resize`'s bilinear (not antialiased), optionally centre-cropped."""
    return EvalTransform(crop_fraction=crop_fraction or 1.0, convention="keras_vit")


def _refuse_unknown(config, known, where, what):
    unknown = sorted(key for key in config if key not in known)
    if unknown:
        raise ValueError(f"{where}: {what} {unknown[0]!r} is not one keras_vit computes, so its evaluation "
                         f"preprocessing cannot be reproduced (it knows {', '.join(sorted(known))}).")


def from_timm_config(pretrained_cfg, where):
    """The eval transform of a timm `pretrained_cfg` (config.json), as `resolve_data_config` + `create_transform`.

    A field timm's `PretrainedCfg` does not have, a `crop_mode` other than
    center or squash, or an interpolation Pillow does not name is refused
    by name.
    """
    _refuse_unknown(pretrained_cfg, TIMM_COMPUTED + TIMM_OTHER, where, "pretrained_cfg field")
    input_size = pretrained_cfg.get("input_size") or (3, 224, 224)
    crop_mode = pretrained_cfg.get("crop_mode") or "center"
    interpolation = pretrained_cfg.get("interpolation") or "bicubic"
    if crop_mode not in CROP_MODES:
        raise ValueError(f"{where}: pretrained_cfg.crop_mode {crop_mode!r} is not one keras_vit computes "
                         f"({', '.join(CROP_MODES)}).")
    if interpolation not in PILLOW_FILTERS:
        raise ValueError(f"{where}: pretrained_cfg.interpolation {interpolation!r} is not one keras_vit computes "
                         f"({', '.join(PILLOW_FILTERS)}).")
    crop_pct = pretrained_cfg.get("crop_pct") or 0.875  # timm's DEFAULT_CROP_PCT
    try:
        return EvalTransform(tuple(input_size[-2:]), crop_pct, None, crop_mode, interpolation, True, "timm")
    except (TypeError, ValueError) as error:
        raise ValueError(f"{where}: pretrained_cfg does not describe an evaluation keras_vit computes: {error}") \
            from None


def to_timm_config(transform):
    """`(fields, exact)`: the timm `pretrained_cfg` fields nearest `transform`, and whether they are exactly it.

    The fields are `input_size`, `interpolation`, `crop_pct` and
    `crop_mode`, which `from_timm_config` reads back. Only timm's own rule
    is exact: another library's rounding, a resize to a stated size or
    `tf.image.resize`'s unantialiased bilinear has no timm field.
    """
    crop_pct = transform.crop_fraction if transform.resize_size is None else transform._resize_share()
    fields = {"input_size": [3, *transform.image_size], "interpolation": transform.interpolation,
              "crop_pct": crop_pct, "crop_mode": transform.crop_mode}
    exact = transform.convention == "timm" and transform.antialias and transform.resize_size is None \
        and transform.patch_budget is None
    return fields, exact


def _size_field(config, key, shortest_edge_default, where):
    """transformers' `size` or `crop_size`: an int (square or shorter side) or a dict, as `(kind, value)`."""
    value = config.get(key)
    if isinstance(value, int) and not isinstance(value, bool):
        return ("shortest_edge", value) if shortest_edge_default else ("square", (value, value))
    if isinstance(value, dict):
        if set(value) == {"shortest_edge"}:
            return "shortest_edge", int(value["shortest_edge"])
        if set(value) == {"height", "width"}:
            return "square", (int(value["height"]), int(value["width"]))
    raise ValueError(f"{where}: {key} {value!r} is not one keras_vit computes (an int, {{\"shortest_edge\": n}} or "
                     "{\"height\": h, \"width\": w}).")


def from_preprocessor_config(config, where):
    """The eval transform of a transformers `preprocessor_config.json` (its image processor's `__call__`).

    Fields keras_vit does not compute, and values it does not (no rescale
    to [0, 1], a `longest_edge`, no normalisation), are refused by name.
    """
    _refuse_unknown(config, TRANSFORMERS_COMPUTED + TRANSFORMERS_NAMES + TRANSFORMERS_LABELS_ONLY, where, "field")
    processor = config.get("image_processor_type") or config.get("feature_extractor_type") or ""
    shortest_default = processor.removesuffix("Fast").removesuffix("Pil") in _SHORTEST_EDGE_PROCESSORS
    interpolation = _pixel_filter(config, where)
    if "size" not in config:  # the processor's default size: the model's, as its own config states none
        mode = "center" if shortest_default else "squash"
        return EvalTransform(None, 1.0, None, mode, interpolation, True, "transformers")
    resize_kind, resize_size = _size_field(config, "size", shortest_default, where)
    if config.get("do_resize", True) is not True:
        raise ValueError(f"{where}: do_resize {config.get('do_resize')!r}: keras_vit resizes every image to the "
                         "model's size.")
    if config.get("do_center_crop", shortest_default):
        _, crop_size = _size_field(dict(config, crop_size=config.get("crop_size", 224)), "crop_size", False, where)
    else:
        crop_size = resize_size if resize_kind == "square" else (resize_size, resize_size)
        if resize_kind == "shortest_edge":
            raise ValueError(f"{where}: size {config.get('size')!r} without a centre crop gives images of every "
                             "aspect ratio; keras_vit computes a fixed input size (size height/width, or a crop).")
    mode = "center" if resize_kind == "shortest_edge" else "squash"
    return EvalTransform(tuple(crop_size), 1.0, resize_size, mode, interpolation, True, "transformers")


def _pixel_filter(config, where):
    """The Pillow filter name of a transformers image processor's `config`, after refusing pixel steps keras_vit
    does not compute (no rescale by 1/255, no normalisation, no RGB conversion)."""
    for key, expected in (("do_rescale", True), ("do_normalize", True), ("do_convert_rgb", True)):
        if config.get(key, expected) is not expected and not (key == "do_convert_rgb" and config.get(key) is None):
            raise ValueError(f"{where}: {key} {config.get(key)!r} is not one keras_vit computes: its models take "
                             f"RGB pixels rescaled by 1/255 and normalised by the image_mean and image_std.")
    factor = config.get("rescale_factor", 1 / 255)
    if not isinstance(factor, (int, float)) or abs(factor * 255 - 1) > 1e-6:
        raise ValueError(f"{where}: rescale_factor {factor!r} is not 1/255, the only one keras_vit computes.")
    resample = config.get("resample", 2)
    filters = {number: name for name, number in PILLOW_FILTERS.items()}
    if resample not in filters:
        raise ValueError(f"{where}: resample {resample!r} is not a Pillow filter keras_vit computes "
                         f"({', '.join(f'{n} ({name})' for n, name in filters.items())}).")
    return filters[resample]


def naflex_from_preprocessor_config(config, where, patch_size):
    """`naflex_batch`'s keywords (`WeightsSource.naflex_preprocessing`) of a transformers `Siglip2ImageProcessor`'s
    `preprocessor_config.json` (`{}`: its defaults), for a model of `patch_size`.

    It resizes every image to its own grid of at most `max_num_patches` patches of `patch_size` (which must be
    the model's) by the SigLIP 2 rule, with its `resample` filter. Fields it does not have are refused by name.
    """
    _refuse_unknown(config, SIGLIP2_COMPUTED + TRANSFORMERS_NAMES, where, "field")
    interpolation = _pixel_filter(config, where)
    if config.get("do_resize", True) is not True:
        raise ValueError(f"{where}: do_resize {config.get('do_resize')!r}: a NaFlex model takes each image resized "
                         "to its patch budget (max_num_patches).")
    patch = config.get("patch_size", patch_size)
    if patch != patch_size:
        raise ValueError(f"{where}: patch_size is {patch!r}, but the model's patches are {patch_size} pixels: the "
                         "processor would cut patches the model cannot embed; set it to the model's.")
    budget = config.get("max_num_patches", 256)
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise ValueError(f"{where}: max_num_patches is {budget!r}; expected a positive int.")
    return {"rule": "siglip2", "max_patches": budget, "interpolation": interpolation}


# transformers' Gemma4ImageProcessor fields: an aspect-preserving resize to a patch budget, no crop.
GEMMA4_COMPUTED = ("do_resize", "resample", "do_rescale", "rescale_factor", "do_normalize", "image_mean", "image_std",
                   "do_convert_rgb", "patch_size", "max_soft_tokens", "pooling_kernel_size")


def patch_budget_size(height, width, max_patches, patch_size, pooling_kernel_size):
    """The size Gemma 4's processor resizes a `height` x `width` image to: the largest of at most `max_patches`
    patches, the aspect ratio kept, whose sides are multiples of `patch_size * pooling_kernel_size` (transformers'
    `get_aspect_ratio_preserving_size`, its edge cases included).

    Example:
    >>> patch_budget_size(3000, 4000, 2520, 16, 3)
    (672, 912)
    """
    side = pooling_kernel_size * patch_size
    target = max_patches * patch_size ** 2
    factor = math.sqrt(target / (height * width))
    rows, cols = int(math.floor(factor * height / side)) * side, int(math.floor(factor * width / side)) * side
    if rows == 0 and cols == 0:
        raise ValueError(f"A {height}x{width} image within {max_patches} patches is 0x0 at sides that are multiples "
                         f"of {side}: give a larger patch budget.")
    longest = (max_patches // pooling_kernel_size ** 2) * side
    if rows == 0:
        rows, cols = side, min(int(math.floor(width / height)) * side, longest)
    elif cols == 0:
        rows, cols = min(int(math.floor(height / width)) * side, longest), side
    if rows * cols > target:
        raise ValueError(f"A {height}x{width} image resized to {rows}x{cols} exceeds {max_patches} patches of "
                         f"{patch_size} pixels.")
    return rows, cols


def gemma4_from_preprocessor_config(config, where, patch_size):
    """`(EvalTransform, (mean, std))` of a transformers `Gemma4ImageProcessor`'s `preprocessor_config.json` (`{}`:
    its defaults), for a model of `patch_size`: its patch budget (`max_soft_tokens` soft tokens of
    `pooling_kernel_size` squared patches), its `resample` filter, and the pixel statistics it normalises by
    (None where it does not normalise). Fields it does not have are refused by name."""
    _refuse_unknown(config, GEMMA4_COMPUTED + TRANSFORMERS_NAMES, where, "field")
    interpolation = _pixel_filter({"resample": 3, **config, "do_normalize": True}, where)  # normalising is optional
    if config.get("do_resize", True) is not True:
        raise ValueError(f"{where}: do_resize {config.get('do_resize')!r}: keras_vit resizes every image to Gemma 4's "
                         "patch budget (max_soft_tokens).")
    if config.get("patch_size", patch_size) != patch_size:
        raise ValueError(f"{where}: patch_size is {config.get('patch_size')!r}, but the model's patches are "
                         f"{patch_size} pixels: set it to the model's.")
    tokens, kernel = config.get("max_soft_tokens", 280), config.get("pooling_kernel_size", 3)
    for name, value in (("max_soft_tokens", tokens), ("pooling_kernel_size", kernel)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{where}: {name} is {value!r}; expected a positive int.")
    transform = EvalTransform(None, 1.0, None, "squash", interpolation, True, "transformers",
                              (tokens * kernel ** 2, patch_size, kernel))
    statistics = (config.get("image_mean"), config.get("image_std")) if config.get("do_normalize", False) else None
    return transform, statistics
