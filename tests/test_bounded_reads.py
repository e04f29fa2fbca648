"""Files that would hang a reader or exhaust memory are refused quickly, before they are opened or decompressed."""

import os
import time
import zipfile

import numpy as np
import pytest

from keras_vit import CheckpointError, checkpoints

# File-header and size checks that refuse a file before any of it reaches a model.
pytestmark = pytest.mark.backend_independent

SUFFIXES = (".npz", ".keras", ".weights.h5")


def read(path):
    return checkpoints.read_weights(str(path), None, (32, 32))


@pytest.fixture
def quickly():
    """Assert the block ends within two seconds (a hang or a 300 MB read would not)."""
    started = time.monotonic()
    yield
    assert time.monotonic() - started < 2


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_refuses_a_fifo_instead_of_blocking_on_it(tmp_path, suffix, quickly):
    fifo = tmp_path / f"weights{suffix}"
    os.mkfifo(fifo)
    with pytest.raises(CheckpointError, match=f"{fifo} is a FIFO \\(named pipe\\), not a regular file"):
        read(fifo)


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_refuses_a_symlink_to_dev_zero_instead_of_reading_it_forever(tmp_path, suffix, quickly):
    link = tmp_path / f"x{suffix}"
    os.symlink("/dev/zero", link)
    with pytest.raises(CheckpointError, match=f"{link} \\(-> /dev/zero\\) is a character device, not a regular file"):
        read(link)


def test_readers_refuse_a_fifo_when_called_directly(tmp_path, quickly):
    for suffix, reader in zip(SUFFIXES, (checkpoints.read_npz, checkpoints.read_keras, checkpoints.read_weights_h5)):
        fifo = tmp_path / f"direct{suffix}"
        os.mkfifo(fifo)
        with pytest.raises(CheckpointError, match="is a FIFO"):
            reader(str(fifo))


def write_bomb(path, extra=()):
    """A zip holding one 300 MB `.npy` array of zeros, deflated to about 1.3 MB (written in slices)."""
    count = 75_000_000
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
        for name, text in extra:
            archive.writestr(name, text)
        with archive.open("a.npy" if not extra else "model.weights.h5", "w", force_zip64=True) as f:
            np.lib.format.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False, "shape": (count,)})
            block = bytes(1 << 22)
            for _ in range(count * 4 // len(block)):
                f.write(block)
            f.write(bytes(count * 4 % len(block)))
    return os.path.getsize(path)


@pytest.fixture(scope="module")
def bombs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bombs")
    npz, keras_file = folder / "bomb.npz", folder / "bomb.keras"
    write_bomb(npz)
    write_bomb(keras_file, extra=[("config.json", "{}"), ("metadata.json", "{}")])
    return npz, keras_file


def test_refuses_a_decompression_bomb_npz_before_decompressing(bombs, quickly):
    npz, _ = bombs
    size = os.path.getsize(npz)
    assert size < 2_000_000
    with pytest.raises(CheckpointError, match=f"{npz} declares 300,000,128 bytes of arrays in a {size:,}-byte file, "
                                              "more than 64x its size plus 64 MiB: a decompression bomb"):
        read(npz)


def test_refuses_a_decompression_bomb_keras_file_before_decompressing(bombs, quickly):
    _, keras_file = bombs
    with pytest.raises(CheckpointError, match=f"{keras_file} declares 300,000,[0-9]+ bytes of entries in a "
                                              "[0-9,]+-byte file.*decompression bomb"):
        read(keras_file)


TINY = dict(image_size=32, patch_size=8, hidden_size=64, num_layers=2, num_heads=4, mlp_dim=128, classes=10)
TINY_MODEL = "a ViT of hidden size 64, 2 blocks and MLP size 128"


def write_oversized(archive, name, megabytes=90):
    """An entry of `megabytes` MB that deflate stores in about 1 MB: too little to be a bomb, too much for TINY."""
    rng = np.random.default_rng(0)
    with archive.open(name, "w", force_zip64=True) as f:
        if name.endswith(".npy"):
            np.lib.format.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False,
                                                     "shape": (megabytes * 250_000,)})
        f.write(rng.bytes(1 << 20))
        f.write(bytes(megabytes * 1_000_000 - (1 << 20)))


def test_npz_out_of_proportion_to_the_model_is_refused_before_reading(tmp_path):
    import keras_vit

    path = tmp_path / "huge.npz"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
        write_oversized(archive, "embedding/kernel.npy")
    with pytest.raises(CheckpointError, match=f"{path} declares 90,000,128 bytes of arrays, out of proportion to "
                                              f"{TINY_MODEL}, whose checkpoints hold at most"):
        keras_vit.ViT(weights=str(path), **TINY)


def test_keras_file_out_of_proportion_to_the_model_it_claims_is_refused(tmp_path):
    import keras_vit

    path = tmp_path / "padded.keras"
    keras_vit.ViT(**TINY).save(path)
    with zipfile.ZipFile(path, "a", zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
        write_oversized(archive, "assets/padding.bin")
    with pytest.raises(CheckpointError, match=f"{path} declares [0-9,]+ bytes of entries, out of proportion to "
                                              f"{TINY_MODEL}, whose"):
        read(path)  # No model given: the budget is the one its config.json claims.


def test_weights_h5_declaring_far_more_than_it_stores_is_refused(tmp_path, quickly):
    import h5py

    path = tmp_path / "bomb.weights.h5"
    with h5py.File(path, "w") as archive:  # Chunks never written take no space: 300 MB declared in a few KB.
        archive.create_dataset("layers/patch_embedding/vars/0", shape=(75_000_000,), dtype="f4",
                               chunks=(1 << 20,), compression="gzip")
    with pytest.raises(CheckpointError, match=f"{path} declares 300,000,000 bytes of arrays in a [0-9,]+-byte file"):
        read(path)


@pytest.fixture(scope="module")
def timm_file(tmp_path_factory):
    """A timm `.safetensors` file of a model whose largest tensor is a tenth of the file."""
    import keras_vit

    model = keras_vit.ViT(image_size=32, patch_size=8, hidden_size=192, num_layers=4, num_heads=3, mlp_dim=384,
                          classes=10)
    path = tmp_path_factory.mktemp("lean") / "model.safetensors"
    checkpoints.save_timm(model, path)
    return str(path)


def test_reads_a_safetensors_file_one_tensor_per_mapping(timm_file, monkeypatch):
    """Pages read through a mapping stay in memory until it closes: one mapping for every tensor holds the file twice."""
    pytest.importorskip("safetensors")
    from keras_vit.checkpoints import state_dict_files

    opened, read = state_dict_files._safetensors_open, []

    def counting(path):
        handle = opened(path)
        get_tensor, reads = handle.get_tensor, []
        read.append(reads)

        class Counted:
            def __enter__(self):
                handle.__enter__()
                return self

            def __exit__(self, *exc):
                return handle.__exit__(*exc)

            def __getattr__(self, name):
                return getattr(handle, name)

            def get_tensor(self, name):
                reads.append(name)
                return get_tensor(name)

        return Counted()

    monkeypatch.setattr(state_dict_files, "_safetensors_open", counting)
    state = state_dict_files.read_state_dict(timm_file)
    assert len(state) > 20
    assert max(map(len, read)) == 1


def test_loads_into_a_model_without_a_second_copy_of_the_state(timm_file):
    """The checked tensors are cast one at a time as each is assigned, never all held at once beside the state."""
    import tracemalloc

    import keras_vit
    from keras_vit.checkpoints import loading

    source = checkpoints.read_weights(timm_file, None, (32, 32))
    model = keras_vit.ViT(image_size=32, patch_size=8, hidden_size=192, num_layers=4, num_heads=3, mlp_dim=384,
                          classes=10)
    state_bytes = sum(np.asarray(value).nbytes for value in source.state.values())
    largest = max(np.asarray(value).nbytes for value in source.state.values())
    assert largest < state_bytes / 8
    tracemalloc.start()
    try:
        loading.load_into(model, source)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # A second copy of the state is state_bytes (the old code: 1.04x); a backend's own buffers for one tensor
    # come on top of the tensor cast (TensorFlow: 0.28x here).
    assert peak < state_bytes / 2, (peak, state_bytes)
    loaded = {variable.path: np.asarray(variable) for variable in model.weights}
    for key in ("encoderblock_0/qkv/kernel", "embedding/kernel", "head/bias"):
        np.testing.assert_array_equal(loaded[key], source.state[key])
