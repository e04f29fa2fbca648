"""from_pretrained: the model a checkpoint holds, from a path or an hf:// handle in an offline Hugging Face cache."""

import json
import math
import os
import shutil
import subprocess
import sys
import weakref

import keras
import numpy as np
import pytest
from conftest import fixture, predict

import keras_vit
from keras_vit import CheckpointError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_sizes_head_and_gelu_come_from_the_files():
    with np.load(fixture("timm_hub_reference.npz")) as data:
        images, logits = data["images"], data["logits"]
    model = keras_vit.from_pretrained(fixture("timm_hub"), classifier_activation=None)
    block = model.get_layer("encoderblock_0")
    assert (model.input_shape, model.output_shape) == ((None, 32, 32, 3), (None, 5))
    assert (block.num_heads, block.mlp_dim, block.approximate_gelu) == (3, 48, False)
    np.testing.assert_allclose(predict(model, images), logits, atol=1e-5, rtol=0)
    original = keras_vit.from_pretrained(fixture("vit_token.npz"), classes=3)  # an override: a new head
    assert original.output_shape == (None, 3) and original.get_layer("encoderblock_0").approximate_gelu is True


@pytest.mark.backend_independent
def test_a_new_head_gives_logits_and_a_loss_of_the_other_kind_is_refused():
    """A new head, to train, gives logits as timm's and keras-hub's do; the file's own head keeps its softmax. A
    crossentropy that reads the outputs as the other kind is refused at compile (guide 02's loss read a softmax as
    logits, without a word, before 2026-12-07)."""
    new_head = keras_vit.from_pretrained(fixture("timm_hub"), classes=3)
    assert new_head.get_layer("predictions").activation.__name__ == "linear"
    own_head = keras_vit.from_pretrained(fixture("timm_hub"))
    assert own_head.get_layer("predictions").activation.__name__ == "softmax"
    asked = keras_vit.from_pretrained(fixture("timm_hub"), classes=3, classifier_activation="softmax")
    with pytest.raises(ValueError) as error:
        asked.compile(optimizer="sgd", loss=keras.losses.CategoricalCrossentropy(from_logits=True))
    assert str(error.value) == (
        f"{asked.name} ends in a softmax (classifier_activation='softmax'), but its loss CategoricalCrossentropy "
        "takes logits (from_logits=True): build the model with classifier_activation=None, or pass "
        "from_logits=False.")
    for loss in ("sparse_categorical_crossentropy", keras.losses.CategoricalCrossentropy()):
        with pytest.raises(ValueError, match=rf"^{new_head.name} gives logits \(classifier_activation=None\), but "
                                             r"its loss \w+ takes probabilities \(from_logits=False\): pass "
                                             r"from_logits=True, or build the model with "
                                             r"classifier_activation='softmax'\.$"):
            new_head.compile(optimizer="sgd", loss=loss)
    new_head.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    asked.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")


def hub_cache(root, repo, files):
    """A Hugging Face cache holding one snapshot of `repo`, laid out as huggingface_hub writes it."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    folder = root / f"models--{repo.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(commit)
    snapshot = folder / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for name in files:
        shutil.copy(fixture(os.path.join("timm_hub", name)), snapshot / name)
    return root


def run_offline(cache, code):
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "PYTHONPATH": ROOT,
           "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)


def test_hf_handle_loads_from_the_cache_with_no_network(tmp_path):
    pytest.importorskip("huggingface_hub")
    cache = hub_cache(tmp_path / "hub", "timm/vit_test_tiny", ["config.json", "model.safetensors"])
    code = (
        "import numpy as np, keras, keras_vit\n"
        f"data = np.load({fixture('timm_hub_reference.npz')!r})\n"
        "model = keras_vit.from_pretrained('hf://timm/vit_test_tiny', classifier_activation=None)\n"
        "gap = np.abs(keras.ops.convert_to_numpy(model(data['images'])) - data['logits']).max()\n"
        "print('GAP', float(gap))\n"
        # ViT(weights=) reads through the same entry point, so it takes a handle too.
        "sizes = {k: getattr(model.sizes, k) for k in ('patch_size', 'hidden_size', 'num_layers', 'num_heads', 'mlp_dim')}\n"
        "named = keras_vit.ViT(**sizes, image_size=model.input_shape[1:3], weights='hf://timm/vit_test_tiny',\n"
        "                      classes=model.output_shape[-1], classifier_activation=None)\n"
        "gap = np.abs(keras.ops.convert_to_numpy(named(data['images'])) - data['logits']).max()\n"
        "print('GAP', float(gap))\n"
    )
    done = run_offline(cache, code)
    assert done.returncode == 0, done.stderr[-3000:]
    gaps = [float(line.split()[-1]) for line in done.stdout.splitlines() if line.startswith("GAP")]
    assert len(gaps) == 2 and max(gaps) < 1e-5, gaps


@pytest.mark.backend_independent
def test_a_handle_downloads_every_file_the_folder_readers_open(monkeypatch):
    # Offline, snapshot_download hands back the whole cached folder: what it would fetch online is its
    # allow_patterns, checked here against the files of each kind of Hub folder keras_vit reads.
    huggingface_hub = pytest.importorskip("huggingface_hub")
    import fnmatch

    asked = {}
    monkeypatch.setattr(huggingface_hub, "snapshot_download",
                        lambda repo, revision=None, allow_patterns=None: asked.setdefault("patterns", allow_patterns))
    keras_vit.checkpoints.hub.huggingface.resolve_handle("hf://google/siglip-base-patch16-224")
    for folder in ("transformers_clip_vision", "transformers_siglip", "transformers_vit",
                   os.path.join("timm_family", "deit")):
        for name in os.listdir(fixture(folder)):
            assert any(fnmatch.fnmatch(name, pattern) for pattern in asked["patterns"]), (folder, name)


@pytest.mark.backend_independent
def test_offline_miss_names_the_handle_and_the_way_out(tmp_path):
    pytest.importorskip("huggingface_hub")
    code = "import keras_vit\nkeras_vit.from_pretrained('hf://google/not-cached')\n"
    done = run_offline(tmp_path / "empty", code)
    assert done.returncode != 0
    assert ("CheckpointError: hf://google/not-cached is not in the Hugging Face cache" in done.stderr
            and "download it once with network access, or pass a local path" in done.stderr), done.stderr[-2000:]


@pytest.mark.backend_independent
def test_bad_handles_and_missing_huggingface_hub_are_clear(monkeypatch):
    with pytest.raises(CheckpointError, match=r"hf://timm is not an hf://org/name handle"):
        keras_vit.from_pretrained("hf://timm")
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    with pytest.raises(CheckpointError, match=r"hf:// handles need huggingface_hub: pip install "
                                              r"'keras-vision-transformer\[hub\]'"):
        keras_vit.from_pretrained("hf://timm/vit_base_patch16_224")


def test_width_without_a_head_count_asks_for_one(tmp_path):
    config = json.load(open(fixture("timm_hub/config.json")))
    folder = tmp_path / "no_heads"
    shutil.copytree(fixture("timm_hub"), folder)
    del config["model_args"]["num_heads"]
    (folder / "config.json").write_text(json.dumps(config))
    # vit_tiny_*: timm's tiny family has 3 heads.
    assert keras_vit.from_pretrained(str(folder)).get_layer("encoderblock_0").num_heads == 3
    (folder / "config.json").write_text(json.dumps(dict(config, architecture="vit_unheard_patch8_32")))
    with pytest.raises(CheckpointError, match="timm's 'vit_unheard_patch8_32' is not one of the"):
        keras_vit.from_pretrained(str(folder))  # a name the family table does not hold: refused, not guessed
    bare = str(folder / "model.safetensors")  # no config at all: the width names no variant
    with pytest.raises(CheckpointError, match="does not store its head count and its width 24 is no named variant's; "
                                              "pass num_heads="):
        keras_vit.from_pretrained(bare)
    assert keras_vit.from_pretrained(bare, num_heads=3).get_layer("encoderblock_0").num_heads == 3


def test_loads_into_a_model_built_without_random_values_and_drops_each_tensor_once_held(monkeypatch):
    """No random initializer runs, and the tensors read and the variables given values never add up to the state twice:
    each variable's first value is its checkpoint tensor, which the state then drops."""
    import keras
    from keras.src.initializers.random_initializers import RandomInitializer

    from keras_vit.checkpoints import state_dict_files

    # (weakref, nbytes) of each tensor read; the initializers run; the bytes of the variables given values; their sum
    # with the tensors still held, at each value given.
    arrays, initializers, given, held = [], [], [], []
    read_tensor, initialize, initialize_with = (state_dict_files._read_tensor, keras.Variable._initialize,
                                                keras.Variable._initialize_with_initializer)

    def reading(path, name):
        value = owner = read_tensor(path, name)
        while isinstance(owner.base, np.ndarray):  # The array that owns the memory, which views keep alive.
            owner = owner.base
        arrays.append((weakref.ref(owner), value.nbytes))
        return value

    def initializing(variable, value):
        initialize(variable, value)
        given.append(math.prod(variable.shape) * np.dtype(variable.dtype).itemsize)
        held.append(sum(size for alive, size in arrays if alive() is not None) + sum(given))

    def initializing_with(variable, initializer):
        initializers.append(initializer)
        initialize_with(variable, initializer)

    monkeypatch.setattr(state_dict_files, "_read_tensor", reading)
    monkeypatch.setattr(keras.Variable, "_initialize", initializing)
    monkeypatch.setattr(keras.Variable, "_initialize_with_initializer", initializing_with)
    model = keras_vit.from_pretrained(fixture("timm_hub"))
    state = sum(size for _, size in arrays)
    largest = max(size for _, size in arrays)
    assert largest < state / 2 and len(given) == len(model.variables)
    assert not [type(each).__name__ for each in initializers if isinstance(each, RandomInitializer)]
    # The state and one tensor (JAX may keep a small tensor's buffer as its own); the old code built the model
    # beside the whole state: twice it.
    assert max(held) < 1.5 * state, (max(held), state)


def test_a_model_built_without_values_saves_as_one_built_with_them(monkeypatch, tmp_path):
    """The deferred build changes no config, `.keras` file or weight; a refused load leaves no variable waiting for a
    value in Keras' global list."""
    import keras
    from keras.src.backend.common import global_state

    from keras_vit.applications import vit as models

    images = np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    lean = keras_vit.from_pretrained(fixture("timm_hub"))
    with monkeypatch.context() as patched:
        patched.setattr(models, "build_without_values", lambda function: (function(), []))
        built = keras_vit.from_pretrained(fixture("timm_hub"))  # Built with random values, then assigned.
    assert lean.get_config() == built.get_config()
    config = json.loads(built.to_json())
    for ours, theirs in zip(lean.variables, built.variables, strict=True):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(ours), keras.ops.convert_to_numpy(theirs))
    lean.save(tmp_path / "lean.keras")
    reloaded = keras.saving.load_model(tmp_path / "lean.keras")
    assert json.loads(reloaded.to_json()) == config
    np.testing.assert_allclose(predict(reloaded, images), predict(built, images), atol=1e-6, rtol=0)
    waiting = list(global_state.get_global_attribute("uninitialized_variables", []))
    with pytest.raises(CheckpointError, match="has 2 encoder blocks but the model has 3"):
        keras_vit.ViT(weights=fixture("timm_hub"), image_size=32, patch_size=8, hidden_size=24, num_layers=3,
                      mlp_dim=48)
    assert global_state.get_global_attribute("uninitialized_variables", []) == waiting


FEATURES = dict(image_size=32, patch_size=8, hidden_size=24, num_layers=2, num_heads=3, mlp_dim=48, include_top=False)


@pytest.mark.parametrize("switches", [
    dict(classifier="map", pooling=None, position_embedding_interpolation="bilinear", position_embedding_antialias=True),
    dict(classifier="map", pooling="map"),
    dict(classifier="gap", register_tokens=4, fc_norm=True, pooling="gap"),
], ids=["map_tokens_bilinear", "map", "reg_gap_fc_norm"])
@pytest.mark.backend_independent
def test_a_keras_file_without_its_top_reloads_as_the_same_model(switches, tmp_path):
    from test_architecture import randomised

    model = randomised(keras_vit.ViT(**FEATURES, **switches))
    images = np.random.default_rng(1).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    model.save(tmp_path / "features.keras")
    reloaded = keras_vit.from_pretrained(str(tmp_path / "features.keras"))
    assert [layer.name for layer in reloaded.layers] == [layer.name for layer in model.layers]
    assert reloaded.output_shape == model.output_shape == ((None, 16, 24) if switches["pooling"] is None else (None, 24))
    np.testing.assert_allclose(predict(reloaded, images), predict(model, images), atol=1e-5, rtol=0)
    position = reloaded.get_layer("position_embedding")
    assert (position.interpolation, position.antialias) == (switches.get("position_embedding_interpolation", "bicubic"),
                                                            switches.get("position_embedding_antialias", False))


@pytest.mark.backend_independent
def test_a_map_model_without_its_attention_pool_is_still_a_map_model(tmp_path):
    built = keras_vit.ViT(**FEATURES, classifier="map")
    read = keras_vit.from_pretrained(fixture("timm_family/siglip_map"), include_top=False, pooling=None)
    built.save(tmp_path / "tokens.keras")  # read back by keras.saving.load_model, then rebuilt
    for model in (built, read, keras_vit.from_pretrained(str(tmp_path / "tokens.keras"))):
        assert "attention_pool" not in [layer.name for layer in model.layers]
        assert keras_vit.checkpoints.architecture_of(model).classifier == "map"
    with pytest.raises(ValueError, match=r"^'vit' returns its token sequence, without the attention pooling \(MAP\) its "
                                         r"head pools with; build it with include_top=False, pooling='map' for its "
                                         r"features\.$"):
        keras_vit.tools.analysis.feature_model(built)


@pytest.mark.backend_independent
def test_class_names_given_to_vit_stay_with_the_model_and_its_keras_file(tmp_path):
    # A model fine-tuned through the API had no class names (`ViT(..., classes=n)`), only the command's classes.txt.
    import keras

    names = ("cats", "dogs", "birds")
    model = keras_vit.ViT(**dict(FEATURES, include_top=True), class_names=names, weights=fixture("timm_hub"))
    assert model.output_shape == (None, 3) and model.class_names == list(names)  # a new head, named
    model.save(tmp_path / "named.keras")
    assert keras.saving.load_model(tmp_path / "named.keras").class_names == list(names)
    saved = keras_vit.from_pretrained(str(tmp_path / "named.keras"), class_names=names)  # as saved
    assert saved.class_names == list(names)
    renamed = keras_vit.from_pretrained(str(tmp_path / "named.keras"), class_names=["a", "b", "c"])
    assert renamed.class_names == ["a", "b", "c"]
    with pytest.raises(ValueError, match=r"^classes=4 disagrees with the 3 class_names; leave classes out to take "
                                         r"their number\.$"):
        keras_vit.ViT(**dict(FEATURES, include_top=True), classes=4, class_names=names)
    with pytest.raises(ValueError, match=r"^class_names name the outputs of the head, which include_top=False leaves "
                                         r"out\.$"):
        keras_vit.ViT(**FEATURES, class_names=names)
