"""NaFlex batches: each image keeps its aspect ratio and gets as many patches as a budget allows (numpy only).

SigLIP 2's "native flexible" ViT takes a batch of images of different shapes
as one padded sequence of patches. `naflex_batch` makes it:

    {"patches":    float32 (batch, length, patch*patch*3): each patch's pixels in (row, column, channel) order,
                   in [-1, 1] (the model normalises them itself); zeros where padded,
     "patch_grid": int32 (batch, 2): each image's (rows, columns) of patches,
     "patch_mask": bool (batch, length): True for the first rows*columns positions (the image's patches in
                   row-major order), False for the padding}

the layout of transformers' `Siglip2ImageProcessor` (`pixel_values`,
`spatial_shapes`, `pixel_attention_mask`) and timm's `NaFlexCollator`
(`patches`, `patch_coord`, `patch_valid`). A NaFlex model and
`check_naflex_batch` take the processor's dict as it comes too
(`TRANSFORMERS_LAYOUT`: its names, an int mask, int64 grids, and
`pixel_values` normalised by the processor's statistics, which the model
reads as its own input normalisation's).

Sizes (`naflex_image_size`): the largest scale whose sides, each rounded up
to whole patches (at least one), give at most `max_patches` patches, found by
the binary search both libraries run (transformers'
`get_image_size_for_max_num_patches`, timm's `get_image_size_for_seq`, used
by its NaFlex eval transform `ResizeToSequence`). The two rules give the same
size for every image; timm refuses a scale of 1e-5 or less. They differ in
their filter (`DEFAULT_INTERPOLATION`): SigLIP 2 bilinear, timm's NaFlexVit
configs bicubic.

Pixels: uint8 images are resized by Pillow, as transformers' Pillow backend
(`Siglip2ImageProcessorPil`, transformers 4's `Siglip2ImageProcessor`) and
timm's eval transform resize them, bit for bit. transformers 5's default
`Siglip2ImageProcessor` resizes with torchvision, whose uint8 filter differs
from Pillow's by one 8-bit level in about 0.3% of the values.

Sequence lengths (`bucket_length`): a batch is padded to the smallest bucket
that holds its longest image, so XLA compiles once per bucket, not once per
image shape. The default buckets are timm's NaFlex loader's sequence lengths,
`(128, 256, 576, 784, 1024)`; `max_patches` is always a bucket, and buckets
above it are never used (a 256-patch budget pads to 128 or 256).

Example:
>>> import numpy as np
>>> images = [np.zeros((375, 500, 3), "uint8"), np.zeros((640, 333, 3), "uint8")]
>>> batch = naflex_batch(images, patch_size=16, max_patches=256)
>>> batch["patches"].shape, batch["patch_grid"].tolist(), batch["patch_mask"].sum(1).tolist()
((2, 256, 768), [[14, 18], [22, 11]], [252, 242])
"""

import math
import os

import numpy as np

from keras_vit.data.arrays import decode_image, minus_one_to_one
from keras_vit.data.preprocessing import PILLOW_FILTERS

# Each rule's filter: transformers' Siglip2ImageProcessor resamples bilinear; timm's NaFlexVit pretrained configs
# say bicubic (its create_naflex_loader's own default is bilinear).
DEFAULT_INTERPOLATION = {"siglip2": "bilinear", "timm": "bicubic"}
# timm's create_naflex_loader(train_seq_lens=...) and NaFlexMapDatasetWrapper(seq_lens=...).
DEFAULT_BUCKETS = (128, 256, 576, 784, 1024)
# How keras_vit cuts a photo for a NaFlex model it built or trained (a checkpoint's reader records its library's):
# naflex_batch's keywords.
KERAS_VIT_PREPROCESSING = {"rule": "siglip2", "max_patches": 256, "interpolation": "bilinear"}
# The binary search's threshold on the scale, as both libraries set it.
_EPS = 1e-5
# What each key holds, for the refusals: keras_vit's layout, and transformers' Siglip2ImageProcessor's (the same
# three in the same order).
LAYOUT = {
    "patches": "float32 (batch, length, patch*patch*3) patches in [-1, 1]",
    "patch_grid": "int32 (batch, 2), each image's (rows, columns) of patches",
    "patch_mask": "bool (batch, length), True for each image's first rows*columns positions",
}
TRANSFORMERS_LAYOUT = {
    "pixel_values": "float32 (batch, length, patch*patch*3) patches, normalised by the model's processor",
    "spatial_shapes": "integer (batch, 2), each image's (rows, columns) of patches",
    "pixel_attention_mask": "integer or bool (batch, length), 1 for each image's first rows*columns positions",
}
_LAYOUTS = (f"keras_vit's {list(LAYOUT)} (as keras_vit.data.naflex_batch makes them) or transformers' "
            f"Siglip2ImageProcessor's {list(TRANSFORMERS_LAYOUT)}, the three keys of one layout")


def naflex_image_size(height, width, patch_size, max_patches, rule="siglip2"):
    """The `(height, width)` in pixels a `height` x `width` image is resized to: whole patches, at most `max_patches`.

    `rule` is `"siglip2"` (transformers' `Siglip2ImageProcessor`) or `"timm"`
    (timm's NaFlex transforms); see the module's docstring.

    Example:
    >>> naflex_image_size(375, 500, patch_size=16, max_patches=256)
    (224, 288)
    """
    _check_rule(rule)
    height, width = _positive(height, "height"), _positive(width, "width")
    patch, budget = _positive(patch_size, "patch_size"), _positive(max_patches, "max_patches")

    def side(scale, size):
        return max(patch, math.ceil(size * scale / patch) * patch)

    low, high = _EPS / 10, 100.0
    while high - low >= _EPS:
        scale = (low + high) / 2
        if (side(scale, height) // patch) * (side(scale, width) // patch) <= budget:
            low = scale
        else:
            high = scale
    size = side(low, height), side(low, width)
    if size[0] * size[1] > budget * patch * patch:  # transformers returns it, and pads to fewer patches than it has
        raise ValueError(f"A {height}x{width} image takes more than {budget} patches of {patch} pixels even at scale "
                         f"{low:.2g}, the least the {rule!r} rule tries; crop it or raise max_patches.")
    if rule == "timm" and low <= _EPS:  # as timm's get_image_size_for_seq refuses
        raise ValueError(f"A {height}x{width} image fits {budget} patches of {patch} pixels only at scale {low:.2g}, "
                         f"at or below the least the 'timm' rule takes ({_EPS}); crop it or raise max_patches.")
    return size


def patchify(image, patch_size):
    """`(patches, (rows, columns))` of an `(height, width, channels)` image of whole patches.

    `patches` is `(rows * columns, patch_size * patch_size * channels)`, the
    patches in row-major order, each patch's pixels in (row, column, channel)
    order.

    Example:
    >>> patches, grid = patchify(np.arange(4 * 6 * 3).reshape(4, 6, 3), patch_size=2)
    >>> patches.shape, grid, patches[1, :3].tolist()
    ((6, 12), (2, 3), [6, 7, 8])
    """
    image = np.asarray(image)
    patch = _positive(patch_size, "patch_size")
    if image.ndim != 3:
        raise ValueError(f"patchify takes one (height, width, channels) image, got shape {image.shape}.")
    height, width, channels = image.shape
    if height % patch or width % patch:
        raise ValueError(f"A {height}x{width} image is not whole {patch}-pixel patches; resize it to "
                         f"naflex_image_size({height}, {width}, {patch}, max_patches) first.")
    rows, columns = height // patch, width // patch
    patches = image.reshape(rows, patch, columns, patch, channels).transpose(0, 2, 1, 3, 4)
    return patches.reshape(rows * columns, patch * patch * channels), (rows, columns)


def bucket_length(valid_lengths, buckets=DEFAULT_BUCKETS):
    """The smallest of `buckets` (increasing sequence lengths) that holds the longest of `valid_lengths`.

    Example:
    >>> bucket_length([200, 252, 242]), bucket_length([100, 90]), bucket_length([600], buckets=(256, 1024))
    (256, 128, 1024)
    """
    buckets = _checked_buckets(buckets)
    lengths = np.asarray(valid_lengths).reshape(-1)
    if lengths.size == 0:
        raise ValueError("bucket_length needs the valid lengths of at least one image.")
    longest = int(lengths.max())
    for bucket in buckets:
        if bucket >= longest:
            return bucket
    raise ValueError(f"The longest image has {longest} patches, more than the largest bucket {buckets[-1]}; "
                     f"add a bucket of at least {longest} or lower max_patches.")


def sequence_lengths(max_patches, buckets=None):
    """The lengths NaFlex batches of a `max_patches` budget pad to: `buckets` below it (None:
    `DEFAULT_BUCKETS`), and the budget.

    Example:
    >>> sequence_lengths(256), sequence_lengths(600), sequence_lengths(256, buckets=())
    ((128, 256), (128, 256, 576, 600), (256,))
    """
    budget = _positive(max_patches, "max_patches")
    buckets = DEFAULT_BUCKETS if buckets is None else buckets
    return tuple(b for b in _checked_buckets(buckets, allow_empty=True) if b < budget) + (budget,)


def naflex_resize(image, patch_size, max_patches, rule="siglip2", interpolation=None, index=0):
    """`image` resized as `naflex_batch` resizes it before cutting it: to the largest grid of whole patches within
    `max_patches` that keeps its aspect ratio (`naflex_image_size`), by Pillow's `interpolation`."""
    _check_rule(rule)
    interpolation = DEFAULT_INTERPOLATION[rule] if interpolation is None else interpolation
    if interpolation not in PILLOW_FILTERS:
        raise ValueError(f"interpolation must be one of {tuple(PILLOW_FILTERS)}, got {interpolation!r}.")
    image = _rgb_image(image, index)
    size = naflex_image_size(image.shape[0], image.shape[1], patch_size, max_patches, rule)
    return _resized(image, size, interpolation)


def naflex_batch(images, patch_size, max_patches, rule="siglip2", interpolation=None, buckets=None):
    """A NaFlex batch (the module's layout) of `images`, uint8 or float `(height, width, 3)` arrays of any shapes
    (or image files' paths).

    Each image is resized to `naflex_image_size(..., rule)` with Pillow's
    `interpolation` (None: the rule's, `DEFAULT_INTERPOLATION`; float pixels
    in [0, 255] are resized channel by channel, neither rounded nor
    clipped; float images on another scale, [0, 1] included, are refused),
    scaled to [-1, 1], cut into patches and padded with zeros to
    `bucket_length` of the sequence lengths: `buckets` below `max_patches`
    (None: `DEFAULT_BUCKETS`, timm's NaFlex loader's) and `max_patches`.
    `buckets=()` pads every batch to `max_patches`, as transformers does.
    """
    patch, budget = _positive(patch_size, "patch_size"), _positive(max_patches, "max_patches")
    lengths = sequence_lengths(budget, buckets)
    cut, grids = [], []
    for index, image in enumerate(images):
        patches, grid = patchify(naflex_resize(image, patch, budget, rule, interpolation, index), patch)
        cut.append(patches)
        grids.append(grid)
    if not cut:
        raise ValueError("naflex_batch needs at least one image.")
    valid = np.array([len(patches) for patches in cut])
    length = bucket_length(valid, lengths)
    batch = np.zeros((len(cut), length, patch * patch * 3), "float32")
    for row, patches in zip(batch, cut):
        row[: len(patches)] = minus_one_to_one(patches)
    return {"patches": batch, "patch_grid": np.array(grids, "int32"),
            "patch_mask": np.arange(length)[None, :] < valid[:, None]}


def naflex_preprocessing(preprocessing=None, max_patches=None, interpolation=None):
    """`naflex_batch`'s keywords `{"rule", "max_patches", "interpolation"}`: `preprocessing` (a model's; None:
    `KERAS_VIT_PREPROCESSING`) with `max_patches` or `interpolation` in place of its own where given, checked.

    Example:
    >>> naflex_preprocessing(max_patches=576)
    {'rule': 'siglip2', 'max_patches': 576, 'interpolation': 'bilinear'}
    """
    chosen = dict(KERAS_VIT_PREPROCESSING if preprocessing is None else preprocessing)
    if set(chosen) != set(KERAS_VIT_PREPROCESSING):
        raise ValueError(f"NaFlex preprocessing takes the keys {sorted(KERAS_VIT_PREPROCESSING)}, got "
                         f"{sorted(chosen)}.")
    chosen.update({key: value for key, value in (("max_patches", max_patches), ("interpolation", interpolation))
                   if value is not None})
    _check_rule(chosen["rule"])
    chosen["max_patches"] = _positive(chosen["max_patches"], "max_patches")
    if chosen["interpolation"] not in PILLOW_FILTERS:
        raise ValueError(f"interpolation must be one of {tuple(PILLOW_FILTERS)}, got {chosen['interpolation']!r}.")
    return chosen


def naflex_keys(batch):
    """The batch's names for `(patches, patch_grid, patch_mask)`: keras_vit's (`LAYOUT`) or transformers'
    (`TRANSFORMERS_LAYOUT`); a batch that is not a dict, lacks a key of its layout or mixes the two is refused in
    one line.

    Example:
    >>> naflex_keys({"pixel_values": 0, "spatial_shapes": 0, "pixel_attention_mask": 0})
    ('pixel_values', 'spatial_shapes', 'pixel_attention_mask')
    """
    if not hasattr(batch, "keys"):
        raise ValueError(f"A NaFlex batch is a dict, got {type(batch).__name__}; pass {_LAYOUTS}.")
    keys = set(batch.keys())
    if keys & set(LAYOUT) and keys & set(TRANSFORMERS_LAYOUT):
        problem = "mixes keras_vit's keys and transformers'"
    else:
        names = tuple(TRANSFORMERS_LAYOUT if keys & set(TRANSFORMERS_LAYOUT) else LAYOUT)
        missing = [name for name in names if name not in keys]
        if not missing:
            return names
        problem = f"has no {' nor '.join(repr(name) for name in missing)}"
    raise ValueError(f"The NaFlex batch {problem} (its keys: {sorted(map(str, keys))}); pass {_LAYOUTS}.")


def check_naflex_shapes(batch, patch_size):
    """`check_naflex_batch` on the keys, shapes and dtypes alone: arrays, tensors or `keras.KerasTensor`s.

    An unknown size (None, as a traced or symbolic tensor has) passes; returns the batch's names for `(patches,
    patch_grid, patch_mask)` (`naflex_keys`). `patch_size` may be a tuple of the sizes a model takes
    (`naflex_patch_sizes`); None takes any square size.
    """
    names = naflex_keys(batch)
    ours = names == tuple(LAYOUT)
    holds = dict(zip(names, (LAYOUT if ours else TRANSFORMERS_LAYOUT).values()))
    patches_name, grid_name, mask_name = names
    patches, grid, mask = (batch[key] if hasattr(batch[key], "shape") else np.asarray(batch[key]) for key in names)
    (shape, dtype), (grid_shape, grid_dtype), (mask_shape, mask_dtype) = (_shape_and_dtype(x) for x in
                                                                          (patches, grid, mask))
    sizes = None if patch_size is None else tuple(
        _positive(size, "patch_size") for size in (patch_size if isinstance(patch_size, (tuple, list)) else
                                                   (patch_size,)))
    if len(shape) != 3 or not np.issubdtype(dtype, np.floating):
        raise ValueError(f"{patches_name} must be {holds[patches_name]}, got {dtype} of shape {shape}.")
    side = None if shape[-1] is None else math.isqrt(shape[-1] // 3)
    if sizes is None and side is not None and 3 * side * side != shape[-1]:
        raise ValueError(f"{patches_name} hold {shape[-1]} values each, which no square patch of 3 channels has "
                         "(patch_size * patch_size * 3); cut the images with keras_vit.data.naflex_batch.")
    if sizes is not None and side is not None and shape[-1] not in [size * size * 3 for size in sizes]:
        seen = f" (patches of {side} pixels)" if 3 * side * side == shape[-1] else ""
        patch = sizes[0]
        if len(sizes) == 1:
            raise ValueError(f"{patches_name} hold {shape[-1]} values each{seen} but patch_size {patch} takes "
                             f"{patch * patch * 3} ({patch}x{patch} pixels x 3 channels); cut the images with "
                             f"patch_size={patch} or use a model of the patch size they were cut with.")
        raise ValueError(f"{patches_name} hold {shape[-1]} values each{seen} but the model takes patches of "
                         f"{', '.join(str(size) for size in sizes)} pixels (patch_size * patch_size * 3 values); cut "
                         f"the images with one of them.")
    if not _same_shape(grid_shape, (shape[0], 2)) or not np.issubdtype(grid_dtype, np.integer):
        images = "" if shape[0] is None else f" for {shape[0]} images"
        raise ValueError(f"{grid_name} must be {holds[grid_name]}{images}, got {grid_dtype} of shape {grid_shape}.")
    if not _same_shape(mask_shape, shape[:2]) or not (mask_dtype == bool or (
            not ours and np.issubdtype(mask_dtype, np.integer))):
        raise ValueError(f"{mask_name} must be {holds[mask_name]} of shape {shape[:2]} as {patches_name}, got "
                         f"{mask_dtype} of shape {mask_shape}" + ("; a 0/1 mask is mask.astype(bool)." if ours else
                                                                  "."))
    return names


def _shape_and_dtype(x):
    """`(shape with None for unknown sizes, numpy dtype)` of an array, a tensor of any backend or a KerasTensor."""
    shape = tuple(d if isinstance(d, (int, np.integer)) else None for d in x.shape)
    dtype = x.dtype if isinstance(x.dtype, np.dtype) else getattr(x.dtype, "name", None) or str(x.dtype)
    return tuple(None if d is None else int(d) for d in shape), np.dtype(str(dtype).removeprefix("torch."))


def _same_shape(found, expected):
    return len(found) == len(expected) and all(f is None or e is None or f == e for f, e in zip(found, expected))


def check_naflex_batch(batch, patch_size):
    """Raise a one-line ValueError naming what is wrong with a NaFlex batch (the module's layout, or transformers'
    processor's), and the fix."""
    names = check_naflex_shapes(batch, patch_size)
    patches, grid, mask = (np.asarray(batch[key]) for key in names)
    _, grid_name, mask_name = names
    on, off = ("True", "False") if mask.dtype == bool else ("1", "0")
    if mask.dtype != bool and not np.isin(mask, (0, 1)).all():
        raise ValueError(f"{mask_name} holds values other than 0 and 1 ({np.unique(mask)[:5].tolist()}); it is 1 on "
                         "each image's patches and 0 on the padding.")
    length = patches.shape[1]
    for index, ((rows, columns), flags) in enumerate(zip(grid.tolist(), mask.astype(bool))):
        count, marked = rows * columns, int(flags.sum())
        if rows < 1 or columns < 1:
            raise ValueError(f"{grid_name} of image {index} is ({rows}, {columns}); each image has at least one row "
                             "and one column of patches.")
        if count > length:
            raise ValueError(f"{grid_name} of image {index} is ({rows}, {columns}), {count} patches, more than the "
                             f"sequence's {length} positions; pad the batch to at least {count} or resize the image "
                             "to fewer patches (naflex_image_size).")
        if marked != count:
            raise ValueError(f"{mask_name} of image {index} marks {marked} valid patches but its {grid_name} "
                             f"({rows}, {columns}) has {count}; the first rows*cols positions must be {on} and the "
                             f"rest {off}.")
        if not flags[:count].all():
            raise ValueError(f"{mask_name} of image {index} marks {marked} valid patches, as its {grid_name} "
                             f"({rows}, {columns}) says, but not the first {count} positions; the first rows*cols "
                             f"positions must be {on} and the rest {off}.")


def _check_rule(rule):
    if rule not in DEFAULT_INTERPOLATION:
        raise ValueError(f"rule must be one of {tuple(DEFAULT_INTERPOLATION)}, got {rule!r}.")


def _positive(value, name):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}.")
    return int(value)


def _checked_buckets(buckets, allow_empty=False):
    buckets = tuple(buckets)
    if (not buckets and not allow_empty) or any(
            isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b < 1 for b in buckets) \
            or list(buckets) != sorted(set(buckets)):
        raise ValueError(f"buckets must be increasing positive sequence lengths, e.g. {DEFAULT_BUCKETS}; "
                         f"got {buckets!r}.")
    return tuple(int(b) for b in buckets)


def _rgb_image(image, index):
    if isinstance(image, (str, os.PathLike)):  # an image file, decoded as every keras_vit tool decodes it
        image = decode_image(image)
    image = np.asarray(image)
    if image.ndim != 3 or image.shape[-1] != 3:
        raise ValueError(f"Image {index} has shape {image.shape}; naflex_batch takes (height, width, 3) RGB images.")
    if image.dtype != np.uint8 and not np.issubdtype(image.dtype, np.floating):
        raise ValueError(f"Image {index} has {image.dtype} pixels; pass uint8 (0..255) or float pixels in [0, 255].")
    if image.dtype != np.uint8 and image.size:
        low, high = float(image.min()), float(image.max())
        if not 0 <= low <= high <= 255:  # NaN too
            raise ValueError(f"Image {index} has float pixels from {low:g} to {high:g}; naflex_batch takes pixels in "
                             "[0, 255] (uint8, or float on that scale) and scales them to [-1, 1] itself.")
        if 0 < high <= 1:  # transformers' processor warns of this ("already rescaled images"); a [0, 255] photo is not
            raise ValueError(f"Image {index} has float pixels in [0, 1] (at most {high:g}); naflex_batch takes pixels "
                             "in [0, 255]: pass image * 255.")
    return image


def _resized(image, size, interpolation):
    """`image` at `size` (height, width) by Pillow's filter: uint8 as one RGB image, floats one channel at a time."""
    from PIL import Image

    target, resample = (size[1], size[0]), PILLOW_FILTERS[interpolation]
    if image.dtype == np.uint8:
        return np.asarray(Image.fromarray(np.ascontiguousarray(image), "RGB").resize(target, resample=resample))
    return np.stack([np.asarray(Image.fromarray(np.ascontiguousarray(image[..., c], "float32"), "F")
                                .resize(target, resample=resample)) for c in range(3)], axis=-1)
