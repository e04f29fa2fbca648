"""NaFlex batches (`keras_vit.data.naflex`) against transformers' and timm's own NaFlex preprocessing.

tests/fixtures/naflex_reference.json (tools/make_naflex_fixtures.py, in the side venv) holds the sizes both
libraries' rules give, and what transformers' `Siglip2ImageProcessor` (both backends) and timm's NaFlex eval
transform and collator make of three photo-sized images the tests generate from the same seeds.
"""

import doctest
import json
import os
import re
import zlib

import numpy as np
import pytest

from keras_vit.data import bucket_length, check_naflex_batch, naflex, naflex_batch, naflex_image_size, patchify

pytestmark = pytest.mark.backend_independent  # numpy and Pillow only

with open(os.path.join(os.path.dirname(__file__), "fixtures", "naflex_reference.json")) as f:
    REFERENCE = json.load(f)
BATCHES = {(case["source"], case["patch_size"], case["max_patches"]): case for case in REFERENCE["batches"]}


def reference_images():
    images = []
    for spec in REFERENCE["images"]:
        image = np.random.default_rng(spec["seed"]).integers(0, 256, (spec["height"], spec["width"], 3), "uint8")
        assert zlib.crc32(image.tobytes()) == spec["crc32"], "not the images the reference libraries were given"
        images.append(image)
    return images


def levels(values):
    return np.round((values.astype("float64") + 1.0) * 127.5).astype("uint8")


@pytest.mark.parametrize("rule", ["siglip2", "timm"])
def test_image_size_is_the_reference_rules_size_over_many_shapes_and_budgets(rule):
    for height, width, patch, budget, siglip2, timm in REFERENCE["sizes"]["cases"]:
        expected = siglip2 if rule == "siglip2" else timm
        over_budget = (expected[0] // patch) * (expected[1] // patch) > budget if isinstance(expected, list) else 0
        if isinstance(expected, str) or over_budget:  # timm refuses; transformers gives more than its budget
            with pytest.raises(ValueError, match=f"^A {height}x{width} image "):
                naflex_image_size(height, width, patch, budget, rule)
        else:
            assert list(naflex_image_size(height, width, patch, budget, rule)) == expected, (height, width, patch)


@pytest.mark.parametrize("source, patch_size, max_patches", [key for key in BATCHES if key[0] != "siglip2_torchvision"])
def test_batch_is_the_reference_pipelines_patches_grids_and_masks(source, patch_size, max_patches):
    reference = BATCHES[source, patch_size, max_patches]
    batch = naflex_batch(reference_images(), patch_size, max_patches, rule=source)
    check_naflex_batch(batch, patch_size)
    assert batch["patches"].shape == (3, reference["length"], patch_size * patch_size * 3)
    assert batch["patches"].dtype == np.float32 and batch["patch_grid"].dtype == np.int32
    assert batch["patch_grid"].tolist() == reference["grids"]
    assert batch["patch_mask"].sum(1).tolist() == reference["valid"]
    for index, patches in enumerate(batch["patches"]):
        valid = patches[batch["patch_mask"][index]]
        assert zlib.crc32(levels(valid).tobytes()) == reference["levels_crc32"][index], index
        np.testing.assert_allclose(valid.astype("float64").sum(), reference["sums"][index], atol=1e-6 * valid.size)
        assert not patches[len(valid):].any()  # zero padding
    for index, patch, values in reference["windows"]:
        np.testing.assert_allclose(batch["patches"][index, patch, :12], values, rtol=0, atol=1e-5)


def test_batch_is_within_one_level_of_transformers_torchvision_backend():
    # transformers 5's default Siglip2ImageProcessor resizes with torchvision, whose uint8 filter rounds a few values
    # one 8-bit level away from Pillow's (which transformers' Pillow backend and timm use, and keras_vit).
    reference = BATCHES["siglip2_torchvision", 16, 256]
    batch = naflex_batch(reference_images(), 16, 256)
    assert batch["patch_grid"].tolist() == reference["grids"]
    assert batch["patch_mask"].sum(1).tolist() == reference["valid"]
    assert reference["max_level_difference"] == 1
    for index, patch, hex_levels in reference["patch_levels"]:
        theirs = np.frombuffer(bytes.fromhex(hex_levels), "uint8").astype(int)
        assert np.abs(levels(batch["patches"][index, patch]).astype(int) - theirs).max() <= 1


def test_patches_are_row_major_with_pixels_in_row_column_channel_order():
    image = np.arange(6 * 9 * 3).reshape(6, 9, 3)
    patches, grid = patchify(image, 3)
    assert grid == (2, 3)
    for index, (row, column) in enumerate(np.ndindex(*grid)):
        np.testing.assert_array_equal(patches[index], image[3 * row:3 * row + 3, 3 * column:3 * column + 3].ravel())


def test_sequences_pad_to_the_smallest_bucket_that_holds_the_longest_image():
    tiny, photo = np.zeros((1, 1, 3), "uint8"), np.zeros((375, 500, 3), "uint8")
    # A 1x1 image is scaled 100 times at most: 7x7 patches of 16 pixels.
    assert naflex_batch([tiny], 16, 1024)["patches"].shape[1] == 128
    assert naflex_batch([tiny, photo], 16, 1024)["patches"].shape[1] == 1024
    assert naflex_batch([tiny, photo], 16, 300)["patches"].shape[1] == 300  # max_patches is always a bucket
    assert naflex_batch([tiny], 16, 1024, buckets=())["patches"].shape[1] == 1024  # transformers' padding
    assert naflex_batch([tiny], 16, 1024, buckets=(64, 512))["patches"].shape[1] == 64
    assert bucket_length([49, 700]) == 784 and bucket_length([128]) == 128 and bucket_length([129]) == 256


def test_float_images_give_the_uint8_images_patches_within_one_level():
    # Pillow rounds a uint8 image to whole levels after each of its two passes (bilinear: half a level each).
    image = np.random.default_rng(3).integers(0, 256, (50, 70, 3), "uint8")
    as_uint8, as_float = (naflex_batch([x], 8, 40)["patches"] for x in (image, image.astype("float32")))
    assert 0 < np.abs(as_float - as_uint8).max() <= 1 / 127.5 + 1e-6


@pytest.mark.parametrize("call, message", [
    (lambda: naflex_image_size(375, 500, 16, 0), "max_patches must be a positive integer, got 0."),
    (lambda: naflex_image_size(375, 500, 16, 256, rule="big_vision"),
     "rule must be one of ('siglip2', 'timm'), got 'big_vision'."),
    (lambda: patchify(np.zeros((20, 32, 3)), 16),
     "A 20x32 image is not whole 16-pixel patches; resize it to naflex_image_size(20, 32, 16, max_patches) first."),
    (lambda: bucket_length([300], (128, 256)),
     "The longest image has 300 patches, more than the largest bucket 256; add a bucket of at least 300 or lower "
     "max_patches."),
    (lambda: bucket_length([30], (256, 128)),
     "buckets must be increasing positive sequence lengths, e.g. (128, 256, 576, 784, 1024); got (256, 128)."),
    (lambda: naflex_batch([np.zeros((8, 8), "uint8")], 4, 16),
     "Image 0 has shape (8, 8); naflex_batch takes (height, width, 3) RGB images."),
    (lambda: naflex_batch([np.zeros((8, 8, 3), "int64")], 4, 16),
     "Image 0 has int64 pixels; pass uint8 (0..255) or float pixels in [0, 255]."),
    (lambda: naflex_batch([], 4, 16), "naflex_batch needs at least one image."),
    (lambda: naflex_batch([np.zeros((8, 8, 3)), np.full((8, 8, 3), 0.75, "float32")], 4, 16),
     "Image 1 has float pixels in [0, 1] (at most 0.75); naflex_batch takes pixels in [0, 255]: pass image * 255."),
    (lambda: naflex_batch([np.full((8, 8, 3), -0.5)], 4, 16),
     "Image 0 has float pixels from -0.5 to -0.5; naflex_batch takes pixels in [0, 255] (uint8, or float on that "
     "scale) and scales them to [-1, 1] itself."),
    (lambda: naflex_batch([np.zeros((8, 8, 3), "uint8")], 4, 16, interpolation="area"),
     "interpolation must be one of ('nearest', 'lanczos', 'bilinear', 'bicubic', 'box', 'hamming'), got 'area'."),
])
def test_refuses_bad_arguments_in_one_line(call, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        call()


def small_batch():
    """Two images of 2x2 and 3x5 patches of 4 pixels, in a sequence of 16."""
    return {"patches": np.zeros((2, 16, 48), "float32"), "patch_grid": np.array([[2, 2], [3, 5]], "int32"),
            "patch_mask": np.arange(16)[None] < np.array([[4], [15]])}


def changed(**changes):
    batch = small_batch()
    for key, change in changes.items():
        batch[key] = change(batch[key])
    return batch


def without(key):
    return {name: value for name, value in small_batch().items() if name != key}


def shifted_mask(mask):
    mask = mask.copy()
    mask[1, 0], mask[1, 15] = False, True
    return mask


def processor_batch(**changes):
    """`small_batch` as transformers' Siglip2ImageProcessor gives one: its names, int64 grids, an int32 mask."""
    batch = small_batch()
    batch = {"pixel_values": batch["patches"], "spatial_shapes": batch["patch_grid"].astype("int64"),
             "pixel_attention_mask": batch["patch_mask"].astype("int32")}
    for key, change in changes.items():
        batch[key] = change(batch[key])
    return {key: value for key, value in batch.items() if value is not None}


# Either layout's refusal names both layouts.
LAYOUTS = ("pass keras_vit's ['patches', 'patch_grid', 'patch_mask'] (as keras_vit.data.naflex_batch makes them) or "
           "transformers' Siglip2ImageProcessor's ['pixel_values', 'spatial_shapes', 'pixel_attention_mask'], the "
           "three keys of one layout.")


@pytest.mark.parametrize("batch, message", [
    (without("patch_grid"), f"The NaFlex batch has no 'patch_grid' (its keys: ['patch_mask', 'patches']); {LAYOUTS}"),
    ({"patches": small_batch()["patches"], "patch_grid": small_batch()["patch_grid"],
      "pixel_attention_mask": small_batch()["patch_mask"]},
     "The NaFlex batch mixes keras_vit's keys and transformers' (its keys: ['patch_grid', 'patches', "
     f"'pixel_attention_mask']); {LAYOUTS}"),
    (processor_batch(spatial_shapes=lambda g: None),
     f"The NaFlex batch has no 'spatial_shapes' (its keys: ['pixel_attention_mask', 'pixel_values']); {LAYOUTS}"),
    (small_batch()["patches"], f"A NaFlex batch is a dict, got ndarray; {LAYOUTS}"),
    (processor_batch(pixel_attention_mask=lambda m: m * 2),
     "pixel_attention_mask holds values other than 0 and 1 ([0, 2]); it is 1 on each image's patches and 0 on the "
     "padding."),
    (processor_batch(spatial_shapes=lambda g: np.array([[2, 2], [3, 4]])),
     "pixel_attention_mask of image 1 marks 15 valid patches but its spatial_shapes (3, 4) has 12; the first "
     "rows*cols positions must be 1 and the rest 0."),
    (processor_batch(pixel_attention_mask=lambda m: m.astype("float32")),
     "pixel_attention_mask must be integer or bool (batch, length), 1 for each image's first rows*columns positions "
     "of shape (2, 16) as pixel_values, got float32 of shape (2, 16)."),
    (changed(patches=lambda p: np.zeros((2, 16, 27), "float32")),
     "patches hold 27 values each (patches of 3 pixels) but patch_size 4 takes 48 (4x4 pixels x 3 channels); cut the "
     "images with patch_size=4 or use a model of the patch size they were cut with."),
    (changed(patch_grid=lambda g: np.array([[2, 2], [4, 5]], "int32")),
     "patch_grid of image 1 is (4, 5), 20 patches, more than the sequence's 16 positions; pad the batch to at least "
     "20 or resize the image to fewer patches (naflex_image_size)."),
    (changed(patch_grid=lambda g: np.array([[2, 2], [3, 4]], "int32")),
     "patch_mask of image 1 marks 15 valid patches but its patch_grid (3, 4) has 12; the first rows*cols positions "
     "must be True and the rest False."),
    (changed(patch_mask=shifted_mask),
     "patch_mask of image 1 marks 15 valid patches, as its patch_grid (3, 5) says, but not the first 15 positions; "
     "the first rows*cols positions must be True and the rest False."),
    (changed(patch_mask=lambda m: m.astype("int32")),
     "patch_mask must be bool (batch, length), True for each image's first rows*columns positions of shape (2, 16) "
     "as patches, got int32 of shape (2, 16); a 0/1 mask is mask.astype(bool)."),
])
def test_check_naflex_batch_names_the_problem_and_the_fix_in_one_line(batch, message):
    check_naflex_batch(small_batch(), 4)
    check_naflex_batch(processor_batch(), 4)
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        check_naflex_batch(batch, 4)


def test_check_naflex_batch_takes_transformers_processor_output_as_it_comes():
    # What Siglip2ImageProcessor gave (tools/make_naflex_hf_fixtures.py): float32 pixel_values, int64 spatial_shapes,
    # an int32 pixel_attention_mask; its patches flattened in (row, column, channel) order, as keras_vit's.
    with np.load(os.path.join(os.path.dirname(__file__), "fixtures", "transformers_siglip2_reference.npz")) as data:
        batch = {key: data[f"transformers_siglip2_vision/11/{key}"] for key in ("pixel_values", "spatial_shapes",
                                                                              "pixel_attention_mask")}
    assert [str(batch[key].dtype) for key in batch] == ["float32", "int64", "int32"]
    check_naflex_batch(batch, 4)
    with pytest.raises(ValueError, match="^pixel_values hold 48 values each"):
        check_naflex_batch(batch, 8)


def test_docstring_examples_run():
    assert doctest.testmod(naflex).failed == 0


@pytest.mark.backend_independent
def test_naflex_batch_takes_image_files_as_their_decoded_pixels(tmp_path):
    from PIL import Image

    pixels = np.random.default_rng(0).integers(0, 256, (30, 50, 3)).astype("uint8")
    Image.fromarray(pixels).save(tmp_path / "photo.png")
    from_file = naflex.naflex_batch([str(tmp_path / "photo.png")], 4, 32)
    from_array = naflex.naflex_batch([pixels], 4, 32)
    for key in from_array:
        np.testing.assert_array_equal(from_file[key], from_array[key])
