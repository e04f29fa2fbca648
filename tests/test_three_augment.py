"""DeiT III's 3-Augment and colour jitter (keras_vit.data.three_augment) and timm's repeated augmentation
(`aug_repeats`): each op equals timm's for timm's own draws, the draws follow timm's distributions, and both
pipelines give an example the same pixels and repeats. Nothing here depends on the Keras backend."""

import json
import os

import numpy as np
import pytest
from PIL import Image
from scipy import stats

from keras_vit import data
from keras_vit.data import array_batches, three_augment
from keras_vit.data.three_augment import Draws, ThreeAugment

pytestmark = pytest.mark.backend_independent
FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "timm_augmentation")
PHOTO = os.path.join(os.path.dirname(__file__), "fixtures", "photos", "landscape.jpg")


def test_each_example_equals_timms_3a_and_color_jitter_for_timms_draws():
    # tools/make_augmentation_fixtures.py: timm 1.0.31's `--aa 3a` then torchvision's ColorJitter(0.3, 0.3, 0.3),
    # with the op, radius, order and factors timm drew for each image.
    cases = np.load(os.path.join(FIXTURES, "three_augment.npz"))
    assert set(cases["ops"]) == set(three_augment.OPS)  # every op is checked
    for image, expected, op, radius, order, factors in zip(cases["images"], cases["outputs"], cases["ops"],
                                                           cases["radii"], cases["orders"], cases["factors"]):
        draws = Draws(three_augment.OPS.index(op), float(radius), tuple(int(i) for i in order),
                      tuple(float(f) for f in factors))
        ours = np.asarray(three_augment.pillow_ops(Image.fromarray(image), draws, 0.3))
        np.testing.assert_array_equal(ours, expected, err_msg=f"{op}, radius {radius}, order {order}")


def test_draws_follow_timms_distributions():
    policy = ThreeAugment(0.3)
    assert policy.draws(1, 2, 3) == policy.draws(1, 2, 3) != policy.draws(1, 2, 4) != policy.draws(1, 3, 3)
    draws = [policy.draws(0, 0, position) for position in range(6000)]
    # random.choice of three sub-policies, each 2000 ± 37 (binomial); the six jitter orders of torch.randperm.
    assert stats.chisquare(np.bincount([d.op for d in draws], minlength=3)).pvalue > 1e-3
    assert stats.chisquare(np.bincount([three_augment.ORDERS.index(d.order) for d in draws], minlength=6)).pvalue > 1e-3
    # random.uniform(0.1, 2.0) for the blur, torch's uniform_(0.7, 1.3) for each factor.
    assert stats.kstest([d.radius for d in draws], stats.uniform(0.1, 1.9).cdf).pvalue > 1e-3
    for index in range(3):
        assert stats.kstest([d.factors[index] for d in draws], stats.uniform(0.7, 0.6).cdf).pvalue > 1e-3
    assert all(d.factors == (1.0, 1.0, 1.0) for d in (ThreeAugment(0.0).draws(0, 0, p) for p in range(5)))


def test_a_float_crop_is_rounded_and_no_jitter_leaves_the_op_alone():
    image = np.random.default_rng(0).uniform(0, 255, (12, 16, 3))
    policy = ThreeAugment(0.0)
    for position in range(6):
        draws = policy.draws(0, 0, position)
        expected = three_augment.pillow_ops(Image.fromarray(np.rint(image).astype("uint8")), draws, 0.0)
        np.testing.assert_array_equal(policy.apply(image, 0, 0, position), np.asarray(expected))


@pytest.mark.parametrize("policy", [dict(randaugment=(3, 9)), dict(three_augment=True, color_jitter=0.4)])
def test_both_pipelines_augment_and_repeat_each_example_alike(tmp_path, monkeypatch, policy):
    # Four copies of one photo, full-area crops, no flip: the example at position p of a pass is the same crop on
    # both pipelines, so a policy keyed by (seed, epoch, p) gives the same pixels, and with repeated augmentation
    # the same rows: each file three times in a row, each time augmented on its own.
    pytest.importorskip("tensorflow")
    with Image.open(PHOTO) as photo:
        for index in range(4):
            (tmp_path / f"c{index}").mkdir()
            photo.convert("RGB").resize((48, 36)).save(tmp_path / f"c{index}" / f"{index}.png")
    augmenters = data.make_augmenters(**policy)

    def stream(aug_repeats):
        source = data.from_folder(str(tmp_path))
        return [(np.asarray(images), np.asarray(labels)) for images, labels in data.training_stream(
            source, 16, 2, 2, seed=5, augmenters=augmenters, min_crop_area=1.0, flip=False, workers=0,
            aug_repeats=aug_repeats, one_hot=False)]

    tf_data, tf_repeated = stream(0), stream(3)
    monkeypatch.setattr(data.source, "tensorflow_installed", lambda: False)
    numpy_path, numpy_repeated = stream(0), stream(3)
    for ours, theirs in ((tf_data, numpy_path), (tf_repeated, numpy_repeated)):
        assert len(ours) == len(theirs) == 4
        for (images, labels), (their_images, their_labels) in zip(ours, theirs):
            np.testing.assert_array_equal(images, their_images)
            np.testing.assert_array_equal(labels, their_labels)
    assert not np.array_equal(tf_data[0][0], tf_data[2][0])  # the epochs are augmented differently
    for epoch in (0, 1):  # 4 < 256 examples: the epoch keeps 4, the first file three times, then the next
        labels = np.concatenate([labels for _, labels in tf_repeated[2 * epoch:2 * epoch + 2]])
        order = array_batches.example_order(4, 5, epoch)
        np.testing.assert_array_equal(labels, order[[0, 0, 0, 1]])
        images = np.concatenate([images for images, _ in tf_repeated[2 * epoch:2 * epoch + 2]])
        assert not np.array_equal(images[0], images[1]) and not np.array_equal(images[1], images[2])


def test_repeats_lay_out_an_order_as_timms_repeat_sampler():
    # tools/make_augmentation_fixtures.py: timm's RepeatAugSampler(num_replicas=1, num_repeats=3) over 10 to 700
    # examples, with the permutation it drew; keras_vit lays out its own order the same way.
    with open(os.path.join(FIXTURES, "repeat_sampler.json")) as file:
        cases = json.load(file)["cases"]
    for case in cases:
        ours = array_batches.repeated(np.array(case["permutation"]), 3)
        assert ours.tolist() == case["indices"] and len(ours) == case["length"]
        assert array_batches.epoch_length(case["size"], 3) == case["length"]
        source = data.from_arrays(np.zeros((case["size"], 1, 1, 3), "uint8"), np.zeros(case["size"]))
        assert data.steps_per_epoch(source, 8, 3) == case["length"] // 8
    assert [case["length"] for case in cases] == [10, 255, 256, 256, 512]
    source = data.from_arrays(np.zeros((300, 1, 1, 3), "uint8"), np.zeros(300))
    with pytest.raises(ValueError) as error:
        data.steps_per_epoch(source, 280, 3)
    assert str(error.value) == ("Batch size 280 is larger than the 256 examples an epoch of repeated augmentation "
                                "keeps of 300 (a multiple of 256, as timm's); pass batch_size=256 or less.")


def test_repeated_rows_of_a_pass_on_both_pipelines(monkeypatch):
    # 300 arrays (the epoch cut to 256) through ArrayBatches and tf.data: the labels a batch really gets.
    pytest.importorskip("tensorflow")
    from keras_vit.data import tf_data_steps

    images = np.random.default_rng(0).integers(0, 256, (300, 8, 8, 3), dtype=np.uint8)
    source = data.from_arrays(images, np.arange(300) % 7)
    for epoch in (0, 3):
        np.testing.assert_array_equal(tf_data_steps.example_order(300, 2, epoch, 3).numpy(),
                                      array_batches.example_order(300, 2, epoch, 3))
    batches = array_batches.ArrayBatches(source, (8, 8), 32, True, seed=2, epoch=1, aug_repeats=3)
    assert len(batches) == 8
    rows = np.concatenate([batches.order[index * 32:(index + 1) * 32] for index in range(8)])
    assert len(rows) == 256 and (rows[:255].reshape(-1, 3) == rows[:255].reshape(-1, 3)[:, :1]).all()
    np.testing.assert_array_equal(np.concatenate([batches[index][1] for index in range(8)]), (rows % 7))


@pytest.mark.parametrize("call, message", [
    (lambda: ThreeAugment(1.5), "color_jitter must be in [0, 1] (0.3: DeiT III's; 0: none), got 1.5."),
    (lambda: data.make_augmenters(randaugment=(2, 9), three_augment=True),
     "RandAugment and 3-Augment are both on; timm's --aa takes one policy: give --randaugment or --three-augment."),
    (lambda: data.make_augmenters(color_jitter=0.3),
     "color_jitter 0.3 (--color-jitter) is applied with 3-Augment, as DeiT III's recipe and timm's --aa 3a apply it: "
     "add --three-augment, or leave --color-jitter out."),
])
def test_refusals(call, message):
    with pytest.raises(ValueError) as error:
        call()
    assert str(error.value) == message
