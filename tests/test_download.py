"""Named checkpoints download over real HTTP (a server on 127.0.0.1), cache and verify."""

import functools
import hashlib
import http.server
import os
import shutil
import threading
import uuid

import numpy as np
import pytest

import keras_vit
from conftest import SMALL, fixture, predict, reference
from keras_vit import Checkpoint, CheckpointError, checkpoints

VARIANT = "ViT_TestS8"


class CountingHandler(http.server.SimpleHTTPRequestHandler):
    requests = []

    def do_GET(self):
        CountingHandler.requests.append(self.path)
        super().do_GET()

    def log_message(self, *args):
        pass


@pytest.fixture
def server(tmp_path, monkeypatch):
    """Serve tmp_path/www on an ephemeral 127.0.0.1 port; yields (base_url, www, stop)."""
    www = tmp_path / "www"
    www.mkdir()
    shutil.copy(fixture("vit_token.npz"), www / "vit_token.npz")
    handler = functools.partial(CountingHandler, directory=str(www))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    CountingHandler.requests = []
    # Make the small fixture sizes a named variant, so the named-weights path runs for real.
    monkeypatch.setitem(keras_vit.VARIANTS, VARIANT, keras_vit.Variant(**SMALL))
    stopped = []

    def stop():
        if not stopped:
            httpd.shutdown()
            httpd.server_close()
            stopped.append(True)

    yield f"http://127.0.0.1:{httpd.server_address[1]}", www, stop
    stop()


def register(url, file_hash=None, image_size=32):
    name = f"test-{uuid.uuid4().hex[:8]}"
    checkpoint = Checkpoint(name, VARIANT, image_size, url, classes=10, file_hash=file_hash)
    checkpoints.register(checkpoint)
    return checkpoint


def sha256(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def build(name, **kwargs):
    return keras_vit.ViT(image_size=32, **SMALL, classifier_activation=None, weights=name, **kwargs)


def test_downloads_once_then_loads_from_cache_offline(server):
    base, _, stop = server
    checkpoint = register(f"{base}/vit_token.npz")
    images, logits = reference("vit_token")
    model = build(checkpoint.name)
    np.testing.assert_allclose(predict(model, images), logits, atol=1e-5)
    assert CountingHandler.requests == ["/vit_token.npz"]
    cached = os.path.join(checkpoints.cache_dir(), checkpoint.filename)
    assert os.path.exists(cached)
    stop()  # offline from here on
    again = build(checkpoint.name)
    np.testing.assert_allclose(predict(again, images), logits, atol=1e-5)
    assert CountingHandler.requests == ["/vit_token.npz"]


def test_verifies_known_hash(server):
    base, www, _ = server
    good = register(f"{base}/vit_token.npz", file_hash=sha256(www / "vit_token.npz"))
    assert build(good.name).output_shape == (None, 10)
    bad = register(f"{base}/vit_token.npz", file_hash="0" * 64)
    with pytest.raises(CheckpointError, match=f"weights '{bad.name}' .* does not match its known sha256 0+ "):
        build(bad.name)
    assert not os.path.exists(os.path.join(checkpoints.cache_dir(), bad.filename))


def test_offline_without_cache_names_the_url_and_the_way_out(server):
    base, _, stop = server
    stop()
    checkpoint = register(f"{base}/vit_token.npz")
    with pytest.raises(CheckpointError, match=f"from {base}/vit_token.npz: .*If this machine is offline, download the file"):
        build(checkpoint.name)
    cached = os.path.join(checkpoints.cache_dir(), checkpoint.filename)
    assert not os.path.exists(cached)


def test_missing_remote_file_is_a_clear_error(server):
    base, _, _ = server
    checkpoint = register(f"{base}/absent.npz")
    with pytest.raises(CheckpointError, match="404"):
        build(checkpoint.name)


def test_corrupt_download_is_reported_with_its_cache_path(server):
    base, www, _ = server
    (www / "corrupt.npz").write_bytes(os.urandom(2048))
    checkpoint = register(f"{base}/corrupt.npz")
    with pytest.raises(CheckpointError, match=f"{checkpoint.filename} is not a readable .npz checkpoint"):
        build(checkpoint.name)


def test_picks_the_checkpoint_for_the_requested_resolution(server):
    base, www, _ = server
    shutil.copy(fixture("vit_nonsquare.npz"), www / "other.npz")
    at_32 = register(f"{base}/vit_token.npz", image_size=32)
    checkpoints.register(Checkpoint(at_32.name, VARIANT, 48, f"{base}/other.npz", classes=10))
    assert checkpoints.find_checkpoint(VARIANT, at_32.name, (32, 32)).image_size == 32
    assert checkpoints.find_checkpoint(VARIANT, at_32.name, (48, 48)).image_size == 48
    assert checkpoints.find_checkpoint(VARIANT, at_32.name, (64, 64)).image_size == 48
    assert keras_vit.available_weights(VARIANT)[at_32.name] == [32, 48]


def test_published_checkpoints_are_registered():
    table = keras_vit.available_weights()
    assert table["ViT_L16"]["imagenet21k+imagenet2012"] == [224, 384]
    assert table["ViT_H14"]["imagenet21k"] == [224]
    assert table["ViT_B8"]["augreg-imagenet21k+imagenet2012"] == [224]
    chosen = checkpoints.find_checkpoint("ViT_L16", "imagenet21k+imagenet2012", (384, 384))
    assert chosen.url == "https://storage.googleapis.com/vit_models/imagenet21k+imagenet2012/ViT-L_16.npz"
    i21k = checkpoints.find_checkpoint("ViT_B16", "imagenet21k", (224, 224))
    assert (i21k.classes, i21k.representation_size) == (21843, 768)
    augreg = checkpoints.find_checkpoint("ViT_S16", "augreg-imagenet21k+imagenet2012", (384, 384))
    assert augreg.url.endswith(
        "augreg/S_16-i21k-300ep-lr_0.001-aug_light1-wd_0.03-do_0.0-sd_0.0--imagenet2012-steps_20k-lr_0.03-res_384.npz"
    )


def test_bad_arguments_fail_before_downloading(server):
    base, _, _ = server
    checkpoint = register(f"{base}/vit_token.npz")
    with pytest.raises(ValueError, match=r"image_size \(30, 30\) is not divisible by patch_size 8"):
        keras_vit.ViT(image_size=30, **SMALL, weights=checkpoint.name)
    with pytest.raises(ValueError, match="pooling applies only with include_top=False"):
        keras_vit.ViT(image_size=32, **SMALL, weights=checkpoint.name, pooling="gap")
    assert CountingHandler.requests == []


def test_readme_checkpoint_table_matches_the_registry():
    import re

    readme = open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")).read()
    table = readme[readme.index("| name | what | variants (px) |"):]
    table = table[: table.index("\n\n")]
    claimed = {}
    for name, variants in re.findall(r"^\| `([^`]+)` \|[^|]*\| ([^|]+) \|$", table, re.MULTILINE):
        for group, sizes in re.findall(r"([\w, ]+?) \(([\d, ]+)\)", variants):
            for variant in group.strip("; ").split(", "):
                claimed.setdefault(f"ViT_{variant.strip()}", {})[name] = [int(s) for s in sizes.split(", ")]
    published = {}
    for checkpoint in checkpoints.registry.published():
        published.setdefault(checkpoint.variant, {}).setdefault(checkpoint.name, []).append(checkpoint.image_size)
    assert claimed == {v: {n: sorted(s) for n, s in names.items()} for v, names in published.items()}
