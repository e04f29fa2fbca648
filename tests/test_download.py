"""Named checkpoints download over real HTTP (a server on 127.0.0.1), cache and verify."""

import dataclasses
import functools
import hashlib
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
import zipfile

import numpy as np
import pytest
from conftest import SMALL, fixture, predict, reference

import keras_vit
from keras_vit import Checkpoint, CheckpointError, checkpoints
from keras_vit.checkpoints import source

# Download, verification and cache logic: the file a reader gets cannot depend on the backend (the
from keras_vit.checkpoints.hub import download

# loaded model's logits are checked on every backend in test_checkpoints.py).
pytestmark = pytest.mark.backend_independent

VARIANT = "ViT_TestS8"


class CountingHandler(http.server.SimpleHTTPRequestHandler):
    """Serves files, or misbehaves as `faults[path]` says (HTTP/1.0: the connection closes after each answer)."""

    requests = []
    faults = {}
    HTML = b"<!DOCTYPE html><html><body>Sign in to continue</body></html>"

    def do_GET(self):
        CountingHandler.requests.append(self.path)
        fault = CountingHandler.faults.get(self.path)
        if fault is None:
            return super().do_GET()
        body = open(self.translate_path(self.path), "rb").read()
        if fault == "silent":  # Accepts the connection, never answers.
            time.sleep(1.5)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/html" if fault == "html" else "application/octet-stream")
        if fault in ("html", "html-as-binary"):
            body = self.HTML
        if fault not in ("short", "slow"):  # "short" has no Content-Length: only the file itself can tell.
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if fault in ("short", "short-length"):
            body = body[: len(body) // 2]
        if fault == "stall":
            self.wfile.flush()
            time.sleep(1.5)
            return
        step = len(body) // 10 + 1 if fault == "slow" else len(body)
        for start in range(0, len(body), step):
            self.wfile.write(body[start:start + step])
            if fault == "slow":
                self.wfile.flush()
                time.sleep(0.1)

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
    CountingHandler.faults = {}
    monkeypatch.setattr(download, "BACKOFF", 0.01)
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


@pytest.mark.parametrize("verbose", [None, 0])
def test_a_download_shows_its_bytes_in_a_progress_bar_unless_verbose_is_0(server, capsys, monkeypatch, verbose):
    """Read in small chunks: the bar counts the bytes up to the file's size; verbose=0 prints nothing."""
    base, www, _ = server
    monkeypatch.setattr(download, "CHUNK", 4096)
    size = os.path.getsize(www / "vit_token.npz")
    checkpoint = register(f"{base}/vit_token.npz")
    source = checkpoints.read_weights(checkpoint.name, VARIANT, (32, 32), verbose=verbose)
    assert source.state["embedding/kernel"].shape[-1] == SMALL["hidden_size"]
    out = capsys.readouterr().out
    if verbose == 0:
        assert out == ""
    else:
        assert f"{size}/{size}" in out and "byte" in out
        assert out.count(f"/{size}") >= 2  # updated while the bytes arrived, not once at the end


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


@pytest.mark.parametrize("handle,whole", [("hf://timm/vit_test/sub", "hf://timm/vit_test"),
                                          ("hf://org/name/a/b@refs/pr/1", "hf://org/name@refs/pr/1")])
def test_an_hf_handle_with_a_subfolder_is_refused_before_the_hub_or_its_cache_is_asked(monkeypatch, handle, whole):
    # It was "not an hf://org/name handle", without saying that subfolders are not read, and only after huggingface_hub
    # was imported: without it installed, the error asked to install it.
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # any use of the Hub or its cache fails otherwise
    subfolder = handle.split("/", 4)[4].split("@")[0]
    with pytest.raises(CheckpointError) as refused:
        keras_vit.from_pretrained(handle)
    assert str(refused.value) == (f"{handle} names a subfolder ({subfolder}), and hf:// handles take none: pass {whole} "
                                  "(the form hf://org/name[@revision]), or download the subfolder and pass its local "
                                  "path.")


def test_documented_checkpoint_table_matches_the_registry():
    import re

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    readme = open(os.path.join(root, "docs", "checkpoints.md")).read()
    table = readme[readme.index("| name | what | variants (px) |"):]
    table = table[: table.index("\n\n")]
    claimed = {}
    for name, variants in re.findall(r"^\| `([^`]+)` \|[^|]*\| ([^|]+) \|$", table, re.MULTILINE):
        for group, sizes in re.findall(r"([\w, ]+?) \(([\d, ]+)\)", variants):
            for variant in group.strip("; ").split(", "):
                claimed.setdefault(f"ViT_{variant.strip()}", {})[name] = [int(s) for s in sizes.split(", ")]
    published = {}
    for checkpoint in checkpoints.hub.registry.published():
        published.setdefault(checkpoint.variant, {}).setdefault(checkpoint.name, []).append(checkpoint.image_size)
    assert claimed == {v: {n: sorted(s) for n, s in names.items()} for v, names in published.items()}


def cache_entries(checkpoint):
    """What the cache holds for `checkpoint`, the lock file aside."""
    folder = checkpoints.cache_dir()
    return sorted(f for f in os.listdir(folder) if f.startswith(checkpoint.filename) and not f.endswith(".lock"))


def half_of(path):
    return f"{os.path.getsize(path) // 2:,} of {os.path.getsize(path):,} bytes"


@pytest.mark.parametrize("fault, message", [
    ("html", r"served an HTML page \(Content-Type text/html\), not a checkpoint"),
    ("html-as-binary", r"is not a readable .npz checkpoint: it starts with b'<!DOCTYPE html>.*\(an HTML or text page\?\)"),
    ("short", r"is not a readable .npz checkpoint: it is no zip archive \(truncated"),
    ("short-length", "ended after {half}"),
])
def test_bad_download_never_reaches_the_cache_and_the_fixed_server_is_used_next(server, fault, message):
    base, www, _ = server
    checkpoint = register(f"{base}/vit_token.npz")
    CountingHandler.faults["/vit_token.npz"] = fault
    message = message.format(half=half_of(www / "vit_token.npz"))
    with pytest.raises(CheckpointError, match=f"from {base}/vit_token.npz: .*{message}.*Nothing was cached"):
        build(checkpoint.name)
    assert cache_entries(checkpoint) == []
    CountingHandler.faults.clear()  # The server is fixed: the next load downloads again and works.
    images, logits = reference("vit_token")
    np.testing.assert_allclose(predict(build(checkpoint.name), images), logits, atol=1e-5)
    assert cache_entries(checkpoint) == [checkpoint.filename, checkpoint.filename + ".sha256"]


@pytest.mark.parametrize("fault, message", [
    ("stall", r"timed out after 0\.3 s without data \(2 attempts\)"),
    ("silent", r"timed out after 0\.3 s connecting or waiting for an answer \(2 attempts\)"),
])
def test_stalled_download_times_out_is_retried_and_never_cached(server, monkeypatch, fault, message):
    base, _, _ = server
    monkeypatch.setattr(download, "CONNECT_TIMEOUT", 0.3)
    monkeypatch.setattr(download, "READ_TIMEOUT", 0.3)
    monkeypatch.setattr(download, "RETRIES", 1)
    checkpoint = register(f"{base}/vit_token.npz")
    CountingHandler.faults["/vit_token.npz"] = fault
    started = time.monotonic()
    with pytest.raises(CheckpointError, match=f"from {base}/vit_token.npz: the download {message}"):
        checkpoints.fetch(checkpoint)
    assert time.monotonic() - started < 3
    assert CountingHandler.requests == ["/vit_token.npz"] * 2
    assert cache_entries(checkpoint) == []
    CountingHandler.faults.clear()
    assert checkpoints.read_npz(checkpoints.fetch(checkpoint)).classes == 10


CHILD = """
import dataclasses, json, os, sys, time
from keras_vit import checkpoints
checkpoint = checkpoints.Checkpoint(**json.loads(sys.argv[2]))
print("READY", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.02)
try:
    path = checkpoints.fetch(checkpoint)
    print("REPORT " + json.dumps(["loaded", path, checkpoints.read_npz(path).classes]))
except Exception as error:
    print("REPORT " + json.dumps(["failed", repr(error)]))
"""


class Child:
    """A real process that fetches `checkpoint` once `go()` is called, and reports what it got."""

    def __init__(self, checkpoint, tmp_path):
        self.flag = tmp_path / f"go-{uuid.uuid4().hex[:6]}"
        arguments = json.dumps(dataclasses.asdict(checkpoint))
        self.process = subprocess.Popen([sys.executable, "-c", CHILD, str(self.flag), arguments],
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.process.stdout.readline().strip() == "READY"  # Imported: ready to race.

    def go(self):
        self.flag.touch()

    def report(self):
        out, err = self.process.communicate(timeout=120)
        assert "REPORT " in out, err[-2000:]
        return tuple(json.loads(out.split("REPORT ", 1)[1].splitlines()[0]))


def test_concurrent_processes_download_once_and_never_read_a_partial_file(server, tmp_path):
    base, _, _ = server
    checkpoint = register(f"{base}/vit_token.npz")
    CountingHandler.faults["/vit_token.npz"] = "slow"  # One second: the second process arrives mid-download.
    workers = [Child(checkpoint, tmp_path), Child(checkpoint, tmp_path)]
    for worker in workers:
        worker.go()
    reports = [worker.report() for worker in workers]
    cached = os.path.join(checkpoints.cache_dir(), checkpoint.filename)
    assert reports == [("loaded", cached, 10)] * 2
    assert CountingHandler.requests == ["/vit_token.npz"]


def test_download_killed_midway_leaves_nothing_that_is_used(server, tmp_path):
    base, _, _ = server
    checkpoint = register(f"{base}/vit_token.npz")
    CountingHandler.faults["/vit_token.npz"] = "stall"
    worker = Child(checkpoint, tmp_path)
    worker.go()
    process = worker.process
    deadline = time.monotonic() + 20
    while not any(f.endswith(".part") for f in cache_entries(checkpoint)) and time.monotonic() < deadline:
        time.sleep(0.05)
    process.kill()  # SIGKILL, mid-download
    process.wait(10)
    assert [f for f in cache_entries(checkpoint) if not f.endswith(".part")] == []
    CountingHandler.faults.clear()
    assert checkpoints.read_npz(checkpoints.fetch(checkpoint)).classes == 10
    assert cache_entries(checkpoint) == [checkpoint.filename, checkpoint.filename + ".sha256"]


def test_cached_file_changed_after_download_is_refused(server):
    base, _, _ = server
    checkpoint = register(f"{base}/vit_token.npz")
    cached = checkpoints.fetch(checkpoint)
    shutil.copy(fixture("vit_nonsquare.npz"), cached)  # A valid checkpoint, but not the one downloaded.
    with pytest.raises(CheckpointError, match=f"The cached file {cached} changed since it was downloaded from "
                                              f"{base}/vit_token.npz .* Delete it \\(rm {cached} "):
        build(checkpoint.name)


def test_unverified_bad_cache_entry_from_an_older_version_is_downloaded_again(server):
    base, _, _ = server
    checkpoint = register(f"{base}/vit_token.npz")
    cached = os.path.join(checkpoints.cache_dir(), checkpoint.filename)
    with open(cached, "wb") as f:  # What keras.utils.get_file left behind for an HTML answer.
        f.write(CountingHandler.HTML)
    assert checkpoints.read_npz(checkpoints.fetch(checkpoint)).classes == 10
    assert CountingHandler.requests == ["/vit_token.npz"]


def test_refuses_a_world_writable_keras_home_and_its_planted_file(server, tmp_path, monkeypatch):
    base, www, _ = server
    shared = tmp_path / "shared"
    (shared / "models" / "keras_vit").mkdir(parents=True)
    os.chmod(shared, 0o777)
    checkpoint = register(f"{base}/vit_token.npz")
    shutil.copy(www / "vit_token.npz", shared / "models" / "keras_vit" / checkpoint.filename)
    monkeypatch.setenv("KERAS_HOME", str(shared))
    with pytest.raises(CheckpointError, match=f"Refusing the checkpoint cache folder {shared}: it is writable by "
                                              r"every user \(mode 777\).*Set KERAS_HOME to a folder only you"):
        build(checkpoint.name)
    assert CountingHandler.requests == []


def test_creates_the_cache_folder_private(tmp_path, monkeypatch):
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "home"))
    folder = checkpoints.cache_dir()
    assert folder == str(tmp_path / "home" / "models" / "keras_vit")
    for path in (tmp_path / "home", tmp_path / "home" / "models", folder):
        assert os.stat(path).st_mode & 0o777 == 0o700


def test_downloaded_decompression_bomb_never_enters_the_cache(server, monkeypatch):
    base, www, _ = server
    with zipfile.ZipFile(www / "bomb.npz", "w", zipfile.ZIP_DEFLATED) as archive:
        with archive.open("a.npy", "w") as f:  # 4 MB of zeros in a few KB; refused with the limits lowered.
            np.lib.format.write_array(f, np.zeros(1 << 20, "float32"))
    monkeypatch.setattr(source, "DECOMPRESSION_SLACK", 1 << 20)
    checkpoint = register(f"{base}/bomb.npz")
    with pytest.raises(CheckpointError, match=f"from {base}/bomb.npz: the download was refused: .*declares 4,194,432 "
                                              "bytes of arrays in a [0-9,]+-byte file.*decompression bomb"):
        checkpoints.fetch(checkpoint)
    assert cache_entries(checkpoint) == []
