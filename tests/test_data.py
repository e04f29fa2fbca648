import os

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
tfds = pytest.importorskip("tensorflow_datasets")

from keras_vit import data  # noqa: E402

# tf.data input pipelines, folder listing and labelling: TensorFlow's whatever the Keras backend. The Keras
# augmentation layers inside them are tested per backend in test_augmentation.py.
pytestmark = pytest.mark.backend_independent


@pytest.fixture(scope="module")
def digits():
    return data.digits(image_size=16)


def test_digits_are_real_images_split_per_class(digits):
    (x, y), (x_test, y_test) = digits
    assert x.shape == (1437, 16, 16, 3) and x_test.shape == (360, 16, 16, 3)
    assert x.dtype == np.uint8 and x.max() == 255 and x.min() == 0
    assert np.array_equal(x[..., 0], x[..., 2])
    assert set(np.bincount(y_test)) <= {35, 36, 37}


def test_training_batches_are_deterministic_per_seed_and_epoch(digits):
    source = data.from_arrays(*digits[0])

    def first(seed, epoch):
        batch = next(iter(data.make_dataset(source, 16, 32, training=True, seed=seed, epoch=epoch)))
        return batch[0].numpy(), batch[1].numpy()

    a, b, c, d = first(0, 0), first(0, 0), first(0, 1), first(1, 0)
    np.testing.assert_array_equal(a[0], b[0])
    assert not np.array_equal(a[1], c[1]) and not np.array_equal(a[1], d[1])
    assert a[0].min() >= -1.0 and a[0].max() <= 1.0 and a[0].dtype == np.float32


def test_stream_resumed_at_an_epoch_equals_the_uninterrupted_stream(digits):
    source = data.from_arrays(*digits[0])
    steps = data.steps_per_epoch(source, 64)
    whole = [x.numpy() for x, _ in data.training_stream(source, 16, 64, epochs=3, seed=5)]
    resumed = [x.numpy() for x, _ in data.training_stream(source, 16, 64, epochs=3, initial_epoch=2, seed=5)]
    assert len(whole) == 3 * steps and len(resumed) == steps
    for a, b in zip(whole[2 * steps:], resumed):
        np.testing.assert_array_equal(a, b)


def test_full_area_crop_without_flip_is_a_plain_resize():
    image = np.arange(8 * 8 * 3, dtype="uint8").reshape(1, 8, 8, 3)
    source = data.from_arrays(image, [0])
    batch = next(iter(data.make_dataset(source, 8, 1, training=True, min_crop_area=1.0, flip=False)))
    np.testing.assert_allclose(batch[0].numpy(), image / 127.5 - 1.0, atol=1e-6)


def test_evaluation_resize_and_central_crop():
    image = np.zeros((1, 10, 10, 3), "uint8")
    image[:, 2:8, 2:8] = 255
    source = data.from_arrays(image, [0])
    batch = next(iter(data.make_dataset(source, 6, 1, training=False, crop_fraction=0.6)))[0].numpy()
    assert batch.shape == (1, 6, 6, 3)
    np.testing.assert_allclose(batch, 1.0, atol=1e-6)  # the crop is the white centre


def test_image_folder_source(tmp_path):
    rng = np.random.default_rng(0)
    for class_name, count in (("cat", 3), ("dog", 2)):
        (tmp_path / class_name).mkdir()
        for i in range(count):
            pixels = rng.integers(0, 256, (20 + i, 24, 3), dtype=np.uint8)
            tf.io.write_file(str(tmp_path / class_name / f"{i}.png"), tf.io.encode_png(pixels))
    (tmp_path / "dog" / "notes.txt").write_text("not an image")
    source = data.load_source(str(tmp_path), "train", holdout_fraction=None)  # the whole folder
    assert (source.num_examples, source.num_classes, source.class_names) == (5, 2, ("cat", "dog"))
    assert data.load_source(str(tmp_path), "train", holdout_fraction=0.2).num_examples == 3
    labels = [int(y) for _, y in source.dataset]
    assert labels == [0, 0, 0, 1, 1]
    batches = list(data.make_dataset(source, 16, 2, training=False))
    assert [b[0].shape[0] for b in batches] == [2, 2, 1]
    sharded = data.from_folder(str(tmp_path), shard=(1, 2))
    assert sharded.num_examples == 2


def write_photos(folder, count=6):
    """Small colour JPEGs (4:2:0, as cameras write them), a grey JPEG and a PNG, in two class folders."""
    from PIL import Image

    rng = np.random.default_rng(3)
    for index in range(count + 2):
        height, width = int(rng.integers(40, 72)), int(rng.integers(40, 72))
        ramp = np.linspace(0, 255, width)[None, :, None] * rng.uniform(0.2, 1.0, (1, 1, 3))
        pixels = np.clip(ramp + rng.normal(0, 40, (height, width, 3)), 0, 255).astype("uint8")
        image, name = Image.fromarray(pixels), f"{index}.jpg"
        if index == count:
            image = image.convert("L")
        elif index == count + 1:
            name = f"{index}.png"
        (folder / f"c{index % 2}").mkdir(exist_ok=True)
        image.save(folder / f"c{index % 2}" / name, quality=85)


def test_training_decodes_only_the_crop_window_with_the_pixels_of_a_whole_decode(tmp_path):
    from keras_vit.data import tf_data_steps

    write_photos(tmp_path)
    for path in sorted(tmp_path.glob("*/*")):
        encoded = tf.io.read_file(str(path))
        for index in range(12):
            seed = tf.constant([7, index], tf.int64)
            partial = tf_data_steps.decode_and_inception_crop(encoded, (16, 16), seed, (0.05, 1.0))
            whole = tf_data_steps.inception_crop(tf.io.decode_image(encoded, channels=3), (16, 16), seed)
            np.testing.assert_array_equal(partial.numpy(), whole.numpy(), err_msg=f"{path.name}, crop {index}")


def test_a_folder_trains_on_its_files_with_the_batches_of_whole_images_and_resumes_them(tmp_path, monkeypatch):
    write_photos(tmp_path)
    source = data.from_folder(str(tmp_path))
    options = dict(image_size=16, batch_size=2, epochs=2, seed=3)
    whole = [x.numpy() for x, _ in data.training_stream(source, **options)]
    resumed = [x.numpy() for x, _ in data.training_stream(source, initial_epoch=1, **options)]
    monkeypatch.setattr(tf.io, "is_jpeg", lambda encoded: tf.constant(False))  # every file decoded whole, then cut
    first_decoded = [x.numpy() for x, _ in data.training_stream(source, **options)]
    assert len(whole) == 8 and len(resumed) == 4
    np.testing.assert_array_equal(np.stack(whole), np.stack(first_decoded))
    np.testing.assert_array_equal(np.stack(whole[4:]), np.stack(resumed))


def test_folder_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="Image folder not found"):
        data.from_folder(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"has one class folder \('empty'\)"):
        data.from_folder(str(tmp_path))
    with pytest.raises(ValueError, match="No images found under"):
        data.from_folder(str(tmp_path / "empty"))


def test_tfds_source_with_mock_data():
    with tfds.testing.mock_data(num_examples=12):
        source = data.load_source("cifar10", "train")
        assert (source.num_examples, source.num_classes) == (12, 10)
        images, labels = next(iter(data.make_dataset(source, 24, 4, training=True)))
        assert images.shape == (4, 24, 24, 3)
        grey = data.load_source("mnist", "test")
        assert next(iter(grey.dataset))[0].shape[-1] == 3


def test_tfds_training_decodes_only_each_jpeg_crop_window_with_the_pixels_of_tfds_whole_decode(monkeypatch):
    # Training decoded every tensorflow-datasets image whole, then cropped it; a folder's JPEGs had their window only.
    windows = []
    decode_and_crop = tf.image.decode_and_crop_jpeg
    monkeypatch.setattr(tf.image, "decode_and_crop_jpeg", lambda *args, **kwargs: windows.append(args[1]) or
                        decode_and_crop(*args, **kwargs))
    options = dict(image_size=24, batch_size=4, epochs=2, seed=3)
    with tfds.testing.mock_data(num_examples=8):
        source = data.load_source("imagenette", "train")  # stores JPEG files
        assert all(tf.io.is_jpeg(encoded) for encoded, _ in source.encoded)
        partial = [x.numpy() for x, _ in data.training_stream(source, **options)]
        assert windows  # traced into the training map: the crop window decoded from the bytes
        # The reference: the split as tensorflow-datasets decodes it, cropped after the whole decode (`decoders={}`:
        # mock_data encodes its random pixels as the set's JPEG files too, and tfds decodes them).
        decoded = tfds.builder("imagenette").as_dataset(split="train", as_supervised=True, shuffle_files=False,
                                                        read_config=tfds.ReadConfig(shuffle_seed=0), decoders={})
        whole = [x.numpy() for x, _ in data.training_stream(data.Source(decoded, 8, 10), **options)]
    assert len(partial) == 4
    np.testing.assert_array_equal(np.stack(partial), np.stack(whole))


def test_unknown_data_set_and_missing_data_dir(tmp_path):
    with pytest.raises(ValueError, match="Unknown data set 'no_such_set_xyz'"):
        data.load_source("no_such_set_xyz", "train")
    with pytest.raises(FileNotFoundError, match="Data directory not found"):
        data.load_source("imagenet2012", "train", data_dir=str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match="splits 'train' and 'test', not 'validation'"):
        data.load_source("digits", "validation")


def test_batch_larger_than_data_is_an_error(digits):
    with pytest.raises(ValueError, match="Batch size 4096 is larger than the 1437 training examples"):
        data.steps_per_epoch(data.from_arrays(*digits[0]), 4096)


def write_images(folder, counts, size=(12, 12)):
    rng = np.random.default_rng(0)
    for class_name, count in counts.items():
        os.makedirs(folder / class_name, exist_ok=True)
        for i in range(count):
            pixels = rng.integers(0, 256, (*size, 3), dtype=np.uint8)
            tf.io.write_file(str(folder / class_name / f"{i}.png"), tf.io.encode_png(pixels))


def labels_by_file(source):
    return [int(y) for _, y in source.dataset]


def test_test_split_labels_follow_the_training_split_classes(tmp_path):
    write_images(tmp_path / "train", {"a": 2, "b": 2, "c": 2})
    write_images(tmp_path / "test", {"a": 1, "c": 1})
    test = data.load_source(str(tmp_path), "test")
    assert test.class_names == ("a", "b", "c") and test.num_classes == 3
    assert labels_by_file(test) == [0, 2]  # 'c' keeps label 2, not 1
    assert labels_by_file(data.load_source(str(tmp_path / "test"), "test", class_names=["a", "b", "c"],
                                           holdout_fraction=None)) == [0, 2]
    with pytest.raises(ValueError, match=r"has class folders \['a', 'c'\] that the model does not know; its 2 classes"):
        data.from_folder(str(tmp_path / "test"), class_names=["x", "y"])


@pytest.mark.parametrize("name", ["val", "validation"])
def test_val_and_validation_folders_are_the_test_split(tmp_path, name):
    write_images(tmp_path / "train", {"a": 2, "b": 2})
    write_images(tmp_path / name, {"a": 1, "b": 1})
    assert data.load_source(str(tmp_path), "test").num_examples == 2
    (tmp_path / "other").mkdir()
    with pytest.raises(ValueError, match=r"has split folders \['train', '.*'\] but none for the 'extra' split"):
        data.load_source(str(tmp_path), "extra")


def test_a_folder_without_splits_holds_out_a_stratified_deterministic_part(tmp_path, caplog):
    write_images(tmp_path, {"a": 10, "b": 5})
    train = data.load_source(str(tmp_path), "train", holdout_fraction=0.2)
    test = data.load_source(str(tmp_path), "test", holdout_fraction=0.2)
    assert "no train/test sub-folders" in caplog.text and "--holdout-fraction" in caplog.text
    assert sorted(labels_by_file(test)) == [0, 0, 1]  # 20% of each class
    assert train.num_examples + test.num_examples == 15
    files = lambda s: set(s.examples[0])  # noqa: E731
    assert not files(train) & files(test)
    assert files(test) == files(data.load_source(str(tmp_path), "test", holdout_fraction=0.2))
    assert data.load_source(str(tmp_path), "test", holdout_fraction=0.5).num_examples == 8
    with pytest.raises(ValueError, match="holdout_fraction must be between 0 and 1, got 1.0"):
        data.load_source(str(tmp_path), "test", holdout_fraction=1.0)


def test_a_holdout_that_leaves_a_split_empty_says_so(tmp_path):
    """It said "No readable images" of a folder of readable images (before 2026-12-07)."""
    write_images(tmp_path, {"a": 3, "b": 5})
    with pytest.raises(ValueError) as error:
        data.load_source(str(tmp_path), "train", holdout_fraction=0.99)
    assert str(error.value) == (f"holdout_fraction 0.99 holds out all 3 images of class 'a' under {tmp_path}, which "
                                "leaves it none to train on; lower holdout_fraction (--holdout-fraction) or add images.")
    write_images(tmp_path / "single", {"a": 1, "b": 1})
    with pytest.raises(ValueError) as error:
        data.load_source(str(tmp_path / "single"), "test", holdout_fraction=0.5)
    assert str(error.value) == (f"The held-out 'test' split of {tmp_path / 'single'} is empty: a class of one image "
                                "keeps it for training; add images, or put them in train/ and test/ folders.")


def test_a_folder_without_splits_gives_the_api_the_commands_disjoint_split(tmp_path, caplog):
    from keras_vit import flags, training

    write_images(tmp_path, {"a": 10, "b": 5})
    train, test = data.load_source(str(tmp_path), "train"), data.load_source(str(tmp_path), "test")
    assert f"{tmp_path} has no train/test sub-folders: the 'test' split is a held-out 20% of each class's images" \
        in caplog.text
    files = lambda s: set(s.examples[0])  # noqa: E731
    assert (train.num_examples, test.num_examples) == (12, 3) and not files(train) & files(test)
    assert files(train) | files(test) == {str(path) for path in tmp_path.glob("*/*.png")}
    config = flags.parse_config(training.FinetuneConfig, ["--dataset", str(tmp_path)])  # the command's split
    command = training.load_sources(config.dataset, 16, config.train_split, config.eval_split,
                                    holdout_fraction=config.holdout_fraction)
    assert [files(source) for source in command] == [files(train), files(test)]
    assert data.load_source(str(tmp_path), "test", holdout_fraction=None).num_examples == 15  # whole, when asked


def test_hidden_folders_are_skipped_and_nested_images_counted(tmp_path):
    write_images(tmp_path, {"a": 1, "b": 1, ".ipynb_checkpoints": 1, "__MACOSX": 1, "a/nested": 2})
    (tmp_path / "a" / ".hidden.png").write_bytes((tmp_path / "a" / "0.png").read_bytes())
    source = data.from_folder(str(tmp_path))
    assert source.class_names == ("a", "b")
    assert labels_by_file(source) == [0, 0, 0, 1]


def test_empty_class_folders_and_single_classes_are_refused(tmp_path):
    write_images(tmp_path, {"a": 1})
    with pytest.raises(ValueError, match=r"has one class folder \('a'\); a classifier needs at least two"):
        data.from_folder(str(tmp_path))
    with pytest.raises(ValueError) as error:  # a folder given with its slash: no double slash (before 2026-12-07)
        data.from_folder(f"{tmp_path}/")
    assert str(error.value) == (f"{tmp_path}/ has one class folder ('a'); a classifier needs at least two (expected "
                                f"{tmp_path}/<class>/<images> with one folder per class).")
    (tmp_path / "b").mkdir()
    with pytest.raises(ValueError, match="Class folder .*/b holds no images"):
        data.from_folder(str(tmp_path))


def test_undecodable_images_are_skipped_and_named(tmp_path, caplog):
    write_images(tmp_path, {"a": 2, "b": 1}, size=(40, 40))
    whole = (tmp_path / "a" / "1.png").read_bytes()
    (tmp_path / "a" / "1.png").write_bytes(whole[: len(whole) // 2])
    (tmp_path / "b" / "bad.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    source = data.from_folder(str(tmp_path))
    assert source.num_examples == 2
    assert "Skipped 2 image files that cannot be decoded" in caplog.text
    assert "1.png" in caplog.text and "bad.jpg" in caplog.text
    assert len(list(data.make_dataset(source, 16, 2, training=False))) == 1  # the pipeline no longer fails
