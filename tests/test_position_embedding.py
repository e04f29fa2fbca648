import keras
import numpy as np
import pytest
import scipy.ndimage
from conftest import fixture

from keras_vit import resize_patch_embedding, resize_position_embeddings
from keras_vit.layers.position_embedding import interpolation_matrix


@pytest.fixture(scope="module")
def references():
    with np.load(fixture("resize_reference.npz")) as data:
        return dict(data)


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
@pytest.mark.parametrize("antialias", [False, True])
@pytest.mark.parametrize("new", [(12, 12), (5, 9), (3, 3)])
def test_half_pixel_resize_matches_torch_interpolate(references, mode, antialias, new):
    expected = references[f"torch_{mode}_aa{int(antialias)}_{new[0]}x{new[1]}"]
    resized = resize_position_embeddings(
        references["table"], new, interpolation=mode, align_corners=False, antialias=antialias
    )
    np.testing.assert_allclose(resized, expected, atol=1e-5)


@pytest.mark.parametrize("new", [12, 5])
def test_align_corners_bilinear_matches_scipy_zoom_fixture(references, new):
    resized = resize_position_embeddings(references["table"], new, interpolation="bilinear", align_corners=True)
    np.testing.assert_allclose(resized, references[f"scipy_zoom_{new}"], atol=1e-5)


@pytest.mark.parametrize("old,new", [((7, 7), (24, 24)), ((14, 14), (24, 32)), ((4, 6), (9, 3))])
def test_align_corners_bilinear_matches_scipy_zoom_live(old, new):
    rng = np.random.default_rng(0)
    table = rng.normal(size=(1, 1 + old[0] * old[1], 3))
    resized = resize_position_embeddings(table, new, old, interpolation="bilinear", align_corners=True)
    grid = table[0, 1:].reshape(*old, 3)
    zoomed = scipy.ndimage.zoom(grid, (new[0] / old[0], new[1] / old[1], 1), order=1)
    assert zoomed.shape[:2] == new
    np.testing.assert_allclose(resized[0, 1:].reshape(*new, 3), zoomed, atol=1e-5)


def test_matches_live_torch_when_installed():
    torch = pytest.importorskip("torch")
    table = np.random.default_rng(1).normal(size=(1, 2 + 6 * 5, 4)).astype("float32")
    grid = torch.from_numpy(table[:, 2:].reshape(1, 6, 5, 4).transpose(0, 3, 1, 2))
    for mode in ("bilinear", "bicubic"):
        for antialias in (False, True):
            expected = torch.nn.functional.interpolate(grid, size=(4, 11), mode=mode, align_corners=False, antialias=antialias)
            expected = expected.numpy().transpose(0, 2, 3, 1).reshape(1, -1, 4)
            resized = resize_position_embeddings(table, (4, 11), (6, 5), num_prefix_tokens=2,
                                                 interpolation=mode, antialias=antialias)
            np.testing.assert_allclose(resized[:, 2:], expected, atol=1e-5)


def test_prefix_tokens_are_untouched_and_dtype_kept():
    table = np.random.default_rng(2).normal(size=(1, 3 + 16, 5)).astype("float16")
    resized = resize_position_embeddings(table, 6, num_prefix_tokens=3)
    assert resized.shape == (1, 3 + 36, 5) and resized.dtype == np.float16
    np.testing.assert_array_equal(resized[:, :3], table[:, :3])


def test_same_grid_is_identity():
    table = np.random.default_rng(3).normal(size=(1, 1 + 12, 2)).astype("float32")
    np.testing.assert_array_equal(resize_position_embeddings(table, (3, 4), (3, 4)), table)


def test_bicubic_is_the_default():
    table = np.random.default_rng(4).normal(size=(1, 1 + 9, 2)).astype("float32")
    default = resize_position_embeddings(table, 5)
    np.testing.assert_allclose(default, resize_position_embeddings(table, 5, interpolation="bicubic"))
    assert np.abs(default - resize_position_embeddings(table, 5, interpolation="bilinear")).max() > 1e-3


def test_interpolation_rows_sum_to_one():
    for args in [(7, 12, "bicubic", False, False), (12, 5, "bilinear", False, True), (5, 9, "bicubic", True, True)]:
        np.testing.assert_allclose(interpolation_matrix(*args).sum(1), 1.0, atol=1e-12)


def test_errors_name_the_problem():
    table = np.zeros((1, 1 + 15, 2), "float32")
    with pytest.raises(ValueError, match="Cannot infer a square grid from 15 patch positions"):
        resize_position_embeddings(table, 4)
    with pytest.raises(ValueError, match=r"old_grid_size \(4, 4\) has 16 positions but the table holds 15"):
        resize_position_embeddings(table, 4, old_grid_size=4)
    with pytest.raises(ValueError, match="Unknown interpolation 'nearest'"):
        resize_position_embeddings(table, 4, (3, 5), interpolation="nearest")
    with pytest.raises(ValueError, match=r"must have shape \(1, tokens, dim\)"):
        resize_position_embeddings(np.zeros((16, 2)), 4)


# --- FlexiViT's patch-embedding resize ---------------------------------------------


@pytest.fixture(scope="module")
def patch_references():
    with np.load(fixture("patch_resize_reference.npz")) as data:
        return {key: value.transpose(2, 3, 1, 0) for key, value in data.items()}  # timm (out, in, h, w) -> ours


@pytest.mark.parametrize("interpolation,antialias", [("bicubic", True), ("bilinear", False)])
@pytest.mark.parametrize("new", [(8, 8), (6, 5), (2, 2)])
def test_patch_resize_matches_timm_resample_patch_embed(patch_references, interpolation, antialias, new):
    expected = patch_references[f"{interpolation}_aa{int(antialias)}_{new[0]}x{new[1]}"]
    resized = resize_patch_embedding(patch_references["kernel"], new, interpolation, antialias)
    np.testing.assert_allclose(resized, expected, atol=1e-5)
    tensor = resize_patch_embedding(keras.ops.convert_to_tensor(patch_references["kernel"]), new, interpolation,
                                    antialias)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(tensor), expected, atol=1e-5)


@pytest.mark.parametrize("interpolation,antialias", [("bicubic", True), ("bicubic", False), ("bilinear", False)])
@pytest.mark.parametrize("old,new", [((4, 4), (8, 8)), ((3, 5), (7, 6))])
def test_upsampled_patch_keeps_its_embedding(interpolation, antialias, old, new):
    """FlexiViT's defining property: <x, w> == <resize(x), resize_patch_embedding(w)> when the patch grows."""
    rng = np.random.default_rng(0)
    kernel = rng.normal(size=(*old, 3, 6))
    patches = rng.normal(size=(5, *old, 3))
    options = dict(interpolation=interpolation, antialias=antialias)
    upsampled = np.einsum("ph,qw,nhwc->npqc", interpolation_matrix(old[0], new[0], **options),
                          interpolation_matrix(old[1], new[1], **options), patches)
    resized = resize_patch_embedding(kernel.astype("float32"), new, **options)
    np.testing.assert_allclose(np.einsum("npqc,pqcd->nd", upsampled, resized),
                               np.einsum("nhwc,hwcd->nd", patches, kernel), atol=1e-4)


def test_patch_resize_keeps_dtype_and_same_size_is_identity():
    kernel = np.ones((4, 4, 3, 2), "float16")
    assert resize_patch_embedding(kernel, 4) is kernel
    assert resize_patch_embedding(kernel, 6).dtype == np.float16


def test_patch_resize_errors_name_the_problem():
    with pytest.raises(ValueError, match=r"kernel must have shape \(patch_height, patch_width, channels, hidden\), "
                                         r"got \(16, 3, 8\)"):
        resize_patch_embedding(np.zeros((16, 3, 8)), 8)
    with pytest.raises(ValueError, match="new_patch_size must be positive, got 0"):
        resize_patch_embedding(np.zeros((4, 4, 3, 8)), 0)


@pytest.mark.backend_independent
def test_a_numpy_table_is_resized_in_float64_on_the_host_not_by_device_matrix_products(monkeypatch):
    """At load time a TPU's float32 einsum would be one bfloat16 pass: the table is resized in float64 numpy."""
    from keras_vit.layers import position_embedding

    def on_the_device(*args, **kwargs):
        raise AssertionError("a numpy table went through keras.ops.einsum")

    monkeypatch.setattr(position_embedding.ops, "einsum", on_the_device)
    rng = np.random.default_rng(21)
    table = (1000.0 + rng.normal(size=(1, 1 + 7 * 7, 6))).astype("float32")
    resized = resize_position_embeddings(table, (9, 11), interpolation="bicubic", antialias=True)
    rows = interpolation_matrix(7, 9, "bicubic", align_corners=False, antialias=True)
    cols = interpolation_matrix(7, 11, "bicubic", align_corners=False, antialias=True)
    grid = table[0, 1:].astype("float64").reshape(7, 7, 6)
    expected = np.einsum("ph,qw,hwd->pqd", rows, cols, grid).reshape(1, -1, 6)
    np.testing.assert_array_equal(resized[:, 1:], expected.astype("float32"))
    np.testing.assert_array_equal(resized[:, :1], table[:, :1])
