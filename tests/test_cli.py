"""The keras-vit command as a user meets it: defaults in --help, one-line errors, validated flags."""

import inspect
import json
import os
import re
import subprocess
import sys

import keras
import numpy as np
import pytest
from PIL import Image

pytest.importorskip("tensorflow")

from keras_vit import checkpoints, cli, data, flags, startup  # noqa: E402
from keras_vit.checkpoints.hub import download  # noqa: E402
from keras_vit.tools import inference
from keras_vit.training import distribute

from conftest import fixture  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

BACKEND = keras.backend.backend()
SMALL_RUN = ["--verbose", "0", "--hidden-size", "32", "--num-layers", "1", "--num-heads", "2", "--mlp-dim", "64",
             "--epochs", "1", "--warmup-steps", "1", "--eval-batch-size", "360"]


@pytest.mark.backend_independent
def test_a_user_error_is_one_line_and_exit_status_2(capsys, tmp_path):
    status = cli.console_main(["pretrain", "--batch-size", "0", "--output-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert status == 2
    assert err == "keras-vit: error: --batch-size must be at least 1, got 0.\n"
    with pytest.raises(ValueError, match="--batch-size must be at least 1, got 0"):
        cli.console_main(["pretrain", "--batch-size", "0", "--debug"])
    with pytest.raises(ValueError, match="--batch-size must be at least 1"):
        cli.console_main(["--debug", "pretrain", "--batch-size", "0"])


@pytest.mark.backend_independent
def test_help_shows_every_default_and_the_inference_defaults_are_the_functions_own():
    # The parser holds the inference commands' defaults so that parsing imports no Keras; they must be the library's.
    required = {"predict": ["a.png"], "inspect": ["a.png"], "convert": ["a.npz", "a.keras"], "export": ["a.keras"]}
    for name in ("evaluate", "predict", "inspect", "convert", "export"):
        args = cli.build_parser().parse_args([name, *required.get(name, [])])
        for parameter in inspect.signature(getattr(inference, name)).parameters.values():
            if parameter.default is not inspect.Parameter.empty and parameter.name != "sizes":
                assert getattr(args, parameter.name) == parameter.default, (name, parameter.name)
    parser = cli.build_parser()
    commands = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction").choices
    assert "(default: runs/pretrain/model.keras)" in commands["finetune"].format_help()
    for name, digits in (("pretrain", 16), ("finetune", 32), ("evaluate", 32)):
        assert commands[name]._option_string_actions["--image-size"].help.endswith(
            f"; default: the checkpoint's own resolution, else {digits}")
    for name, command in commands.items():
        for action in command._actions:
            if action.option_strings and action.nargs != 0 and action.dest != "help":
                assert "default" in (action.help or ""), f"{name} {action.option_strings}"


@pytest.mark.backend_independent
def test_an_unknown_model_is_named_with_the_closest_names(capsys):
    # The default --weights (runs/pretrain/model.keras) does not exist here: the model name is the error.
    assert cli.console_main(["finetune", "--model", "ViT_B_16"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("keras-vit: error: Unknown model 'ViT_B_16'. Did you mean ViT_B16 or ")
    assert cli.console_main(["evaluate", "--model", "vit_b16"]) == 2
    assert "Did you mean ViT_B16" in capsys.readouterr().err


@pytest.mark.parametrize("flags,message", [
    (["--batch-size", "0"], "--batch-size must be at least 1, got 0."),
    (["--patch-size", "0"], "--patch-size must be at least 1, got 0."),
    (["--num-layers", "0"], "--num-layers must be at least 1, got 0."),
    (["--steps-per-execution", "0"], "--steps-per-execution must be at least 1, got 0."),
    (["--learning-rate", "-0.01"], "--learning-rate must be positive, got -0.01."),
    (["--label-smoothing", "5"], r"--label-smoothing must be in \[0, 1\), got 5.0."),
    (["--dropout", "1"], r"--dropout must be in \[0, 1\), got 1.0."),
    (["--holdout-fraction", "0"], "--holdout-fraction must be between 0 and 1, got 0.0."),
    (["--image-size", "16x16x3"], r"^--image-size takes SIZE or HEIGHTxWIDTH in pixels, one argument such as 224 or "
                                  r"224x320; got '16x16x3'\.$"),
    (["--model", "ViT_Ti16", "--hidden-size", "32"],
     "--hidden-size 32 disagrees with --model ViT_Ti16, whose hidden_size is 192; leave the size flags out"),
    (["--weights", fixture("vit_token.npz"), "--num-heads", "4"],
     "--num-heads 4 disagrees with --weights .*vit_token.npz, whose num_heads is 3"),
    (["--color-jitter", "0.3"], re.escape("color_jitter 0.3 (--color-jitter) is applied with 3-Augment, as DeiT III's "
                                          "recipe and timm's --aa 3a apply it: add --three-augment, or leave "
                                          "--color-jitter out.")),
    (["--three-augment", "--randaugment", "2", "9"], "RandAugment and 3-Augment are both on; timm's --aa takes one "
                                                     "policy: give --randaugment or --three-augment."),
    (["--aug-repeats", "-1"], "--aug-repeats must be at least 0, got -1."),
    (["--color-jitter", "2", "--three-augment"], re.escape("--color-jitter must be in [0, 1], got 2.0.")),
])
@pytest.mark.backend_independent
def test_numeric_and_size_flags_are_checked_before_training(flags, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        cli.main(["pretrain", "--verbose", "0", "--output-dir", str(tmp_path), *flags])
    assert not (tmp_path / "log.csv").exists()


# Flag parsing; non-square models are checked on every backend by test_position_embedding and test_models.
@pytest.mark.backend_independent
def test_image_size_takes_height_and_width(tmp_path):
    cli.main(["pretrain", *SMALL_RUN, "--image-size", "16x24", "--output-dir", str(tmp_path)])
    model = keras.saving.load_model(tmp_path / "model.keras")
    assert model.input_shape == (None, 16, 24, 3)
    results = cli.main(["evaluate", "--weights", str(tmp_path / "model.keras"), "--verbose", "0"])
    assert 0.0 <= results["top1"] <= 1.0


@pytest.mark.backend_independent
def test_a_tfds_name_without_tensorflow_datasets_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)
    with pytest.raises(FileNotFoundError, match=r"^dataset='mnist' is no folder, and tensorflow-datasets, whose sets "
                       r"have names, is not installed: check the folder's path, or pip install "
                       r"'keras-vision-transformer\[tensorflow\]' for its sets\.$"):
        cli.main(["pretrain", *SMALL_RUN, "--dataset", "mnist", "--output-dir", str(tmp_path)])


@pytest.mark.backend_independent
def test_every_extra_with_tensorflow_datasets_installs_what_it_imports():
    # tensorflow-datasets imports importlib_resources but declares it only for Python < 3.9, so our extras must.
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    with open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pyproject.toml"), "rb") as f:
        extras = tomllib.load(f)["project"]["optional-dependencies"]
    with_tfds = {name: deps for name, deps in extras.items() if any(d.startswith("tensorflow-datasets") for d in deps)}
    assert with_tfds, "no extra installs tensorflow-datasets"
    for name, deps in with_tfds.items():
        assert any(d.startswith("importlib_resources") for d in deps), name


@pytest.mark.skipif(BACKEND != "jax", reason="multi-host runs on the JAX backend")
def test_multi_host_without_its_environment_names_the_variables(monkeypatch):
    for name in distribute.MULTI_HOST_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match="--distribution multi_host needs KERAS_DISTRIBUTION_JOB_ADDRESSES, "
                       "KERAS_DISTRIBUTION_NUM_PROCESSES, KERAS_DISTRIBUTION_PROCESS_ID set on every process"):
        distribute.setup("multi_host")


def test_convert_of_a_weights_h5_file_takes_the_heads_of_its_width_or_asks_for_the_variant(tmp_path):
    import keras_vit

    unnamed = keras_vit.ViT(image_size=32, patch_size=8, hidden_size=24, num_layers=1, num_heads=2, mlp_dim=48)
    unnamed.save_weights(str(tmp_path / "unnamed.weights.h5"))
    with pytest.raises(ValueError, match=r"unnamed.weights.h5 does not store all its sizes \(a .weights.h5 file or a "
                       r"bare state dict has no head count\); name its variant with `model` \(--model\), e.g. ViT_B16, "
                       r"or pass `num_heads` \(--num-heads\)\."):
        cli.main(["convert", str(tmp_path / "unnamed.weights.h5"), str(tmp_path / "unnamed.keras")])
    model = keras_vit.ViT_Ti16(image_size=32, classes=10)
    model.get_layer("head").kernel.assign(np.ones((192, 10), "float32"))
    path = str(tmp_path / "ti.weights.h5")
    model.save_weights(path)
    cli.main(["convert", path, str(tmp_path / "ti.keras")])  # width 192 is Ti's: 3 heads, as from_pretrained reads it
    converted = keras.saving.load_model(tmp_path / "ti.keras")
    assert converted.get_layer("encoderblock_0").num_heads == 3
    images = np.random.default_rng(0).uniform(-1, 1, (1, 32, 32, 3)).astype("float32")
    np.testing.assert_allclose(keras.ops.convert_to_numpy(converted(images)),
                               keras.ops.convert_to_numpy(model(images)), atol=1e-6)
    assert os.path.exists(tmp_path / "ti.keras")


def test_convert_of_a_headless_folder_writes_the_feature_model_from_pretrained_builds(tmp_path, capsys):
    import keras_vit

    folder, output = fixture(os.path.join("timm_family", "dinov2_reg")), str(tmp_path / "dinov2.keras")
    cli.main(["convert", folder, output])
    converted, built = keras.saving.load_model(output), keras_vit.from_pretrained(folder)
    assert capsys.readouterr().out.splitlines()[-1] == \
        f"wrote {output}: vit_small_patch14_reg4_dinov2, {built.count_params():,} parameters, (28, 28) px"
    assert converted.output_shape == (None, 24) and "head" not in {layer.name for layer in converted.layers}
    images = np.random.default_rng(0).uniform(-1, 1, (2, 28, 28, 3)).astype("float32")
    np.testing.assert_allclose(keras.ops.convert_to_numpy(converted(images)),
                               keras.ops.convert_to_numpy(built(images)), atol=1e-6, rtol=0)


@pytest.mark.backend_independent
def test_image_size_is_one_argument_so_predict_keeps_the_image_path():
    from keras_vit import flags

    args = cli.build_parser().parse_args(["predict", "--image-size", "96", "img.png"])
    assert (args.images, flags.image_size_flag(args.image_size)) == (["img.png"], 96)
    for value in ("96x128", "96,128", "96X128"):
        args = cli.build_parser().parse_args(["predict", "--image-size", value, "a.png", "b.png"])
        assert (args.images, flags.image_size_flag(args.image_size)) == (["a.png", "b.png"], (96, 128))
    assert flags.image_size_flag(cli.build_parser().parse_args(["convert", "a.npz", "a.keras", "--image-size",
                                                                "64x32"]).image_size) == (64, 32)
    for value in ("96 128", "96x", "x96", "1.5", "96x128x3", "big"):
        with pytest.raises(ValueError, match=rf"^--image-size takes SIZE or HEIGHTxWIDTH in pixels, one argument such "
                                             rf"as 224 or 224x320; got '{value}'\.$"):
            flags.image_size_flag(value)


def hub_cache(root, repos):
    """A Hugging Face cache holding one snapshot of each `{repo: fixture folder}`, laid out as huggingface_hub writes it."""
    import shutil

    commit = "0" * 40
    for repo, folder in repos.items():
        repository = root / f"models--{repo.replace('/', '--')}"
        (repository / "refs").mkdir(parents=True)
        (repository / "refs" / "main").write_text(commit)
        shutil.copytree(fixture(folder), repository / "snapshots" / commit)
    return root


@pytest.mark.backend_independent
def test_predict_and_inspect_take_hf_handles_and_a_headless_folder_needs_no_head(tmp_path, monkeypatch, capsys,
                                                                               keras_vit_log):
    constants = pytest.importorskip("huggingface_hub.constants")
    import tensorflow as tf

    import keras_vit

    cache = hub_cache(tmp_path / "hub", {"timm/deit_test": "timm_family/deit", "timm/dinov2_test": "timm_family/dinov2"})
    for name, value in (("HF_HUB_CACHE", str(cache)), ("HF_HUB_OFFLINE", True)):  # read once, when it is imported
        monkeypatch.setenv(name, str(int(value)) if value is True else value)
        monkeypatch.setattr(constants, name, value)
    image = tmp_path / "digit.png"
    tf.io.write_file(str(image), tf.io.encode_png(np.random.default_rng(0).integers(0, 256, (32, 32, 3), np.uint8)))

    (found,) = cli.main(["predict", "--weights", "hf://timm/deit_test", str(image)])
    model = keras_vit.from_pretrained(fixture("timm_family/deit"), classifier_activation=None)
    pixels = keras_vit.eval_transform(model).load(str(image))  # timm's eval transform (test_preprocessing.py)
    assert model.eval_transform.convention == "timm"
    logits = keras.ops.convert_to_numpy(model(pixels[None])).astype("float64")[0]
    probabilities = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    best = np.argsort(probabilities)[::-1][:5]
    assert [name for name, _ in found] == [str(index) for index in best]
    np.testing.assert_allclose([p for _, p in found], probabilities[best], atol=1e-5, rtol=0)

    # A feature model (DINOv2 has no head) is inspected without one: nothing starts at zero.
    keras_vit_log.clear()
    written = cli.main(["inspect", "--weights", "hf://timm/dinov2_test", str(image), "--output-dir", str(tmp_path)])
    assert sorted(written) == ["attention_rollout", "embedding_filters", "mean_attention_distance",
                               "position_embedding_similarity"]
    assert keras_vit_log.text == ""
    assert capsys.readouterr().out.splitlines()[-4:] == [f"wrote {written[name]}" for name in written]


# --- A new user's install: the backend, --help, and messages that name the flag to change ---------------------

BACKEND_MODULES = ("keras", "tensorflow", "jax", "torch")
# sitecustomize for a fresh process: the modules in $BLOCKED cannot be imported, as if not installed, and at exit
# the names of BACKEND_MODULES that were imported go to the file $IMPORTED.
SITECUSTOMIZE = f"""
import atexit, json, os, sys
for name in filter(None, os.environ.get("BLOCKED", "").split(",")):
    sys.modules[name] = None
if os.environ.get("IMPORTED"):
    atexit.register(lambda: open(os.environ["IMPORTED"], "w").write(json.dumps(
        [name for name in {BACKEND_MODULES!r} if sys.modules.get(name) is not None])))
"""
# The console script pip writes for `keras-vit = "keras_vit.cli:console_main"`.
CONSOLE_SCRIPT = """import sys
from keras_vit.cli import console_main
if __name__ == '__main__':
    sys.argv[0] = sys.argv[0].removesuffix('.exe')
    sys.exit(console_main())
"""


def command(tmp_path, arguments, blocked=(), keras_json=None, entry=("-m", "keras_vit"), **env):
    """Run `python -m keras_vit` (`entry`: "script" for the console script) in a fresh process without
    KERAS_BACKEND or a keras.json; returns the finished process and the backend modules it imported."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    home = tmp_path / "keras_home"
    home.mkdir(exist_ok=True)
    if keras_json:
        (home / "keras.json").write_text(json.dumps(keras_json))
    environ = {name: value for name, value in os.environ.items() if name != "KERAS_BACKEND"}
    environ.update(PYTHONPATH=os.pathsep.join([str(site), ROOT]), KERAS_HOME=str(home), BLOCKED=",".join(blocked),
                   IMPORTED=str(tmp_path / "imported.json"), **env)
    if entry == "script":
        (tmp_path / "keras-vit").write_text(CONSOLE_SCRIPT)
        entry = [str(tmp_path / "keras-vit")]
    done = subprocess.run([sys.executable, *entry, *arguments], env=environ, cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    return done, json.loads((tmp_path / "imported.json").read_text())


@pytest.mark.parametrize("arguments,entry", [(["--help"], "script"), (["finetune", "--help"], ("-m", "keras_vit")),
                                             (["pretrain", "--lr", "0.1"], "script"),
                                             (["finetune", "--dataset", "photos/", "--weights", "run/model"], "script"),
                                             (["evaluate", "--dataset", "photos/", "--weights", "run/model"], "script")])
@pytest.mark.backend_independent
def test_help_a_mistyped_flag_and_missing_paths_import_no_backend(tmp_path, arguments, entry):
    """A missing folder or weights file is said before Keras loads: it cost 5-10 s of imports (before 2026-12-07)."""
    done, imported = command(tmp_path, arguments, entry=entry)
    assert done.returncode == (0 if "--help" in arguments else 2), done.stderr
    assert imported == []
    if "photos/" in arguments:  # finetune and evaluate alike
        assert done.stderr.endswith("keras-vit: error: 2 problems: (1) Image folder not found: photos/; check the path "
                                    "given as --dataset. (2) Weights file not found: run/model\n"), done.stderr


def note(backend):
    return (f"keras-vit: KERAS_BACKEND is not set and TensorFlow is not installed; using {backend} "
            "(set KERAS_BACKEND=jax|torch|tensorflow to choose).\n")


BAD_BATCH = "keras-vit: error: --batch-size must be at least 1, got 0.\n"


# torch hidden too where jax is expected: which of the two is taken is startup.fallback's (test_package).
@pytest.mark.parametrize("blocked,keras_json,env,stderr", [
    (["tensorflow", "torch"], None, {}, note("jax") + BAD_BATCH),
    (["tensorflow", "jax"], None, {}, note("torch") + BAD_BATCH),
    # Keras writes "tensorflow" into a new keras.json itself: that is no choice.
    (["tensorflow", "torch"], {"backend": "tensorflow"}, {}, note("jax") + BAD_BATCH),
    (["tensorflow"], {"backend": "torch"}, {}, BAD_BATCH),
    (["tensorflow", "jax", "torch"], None, {},
     "keras-vit: error: KERAS_BACKEND is not set and none of jax, torch, tensorflow is installed: pip install "
     "'keras-vision-transformer[jax]' (or [torch] or [tensorflow]), then set KERAS_BACKEND=jax|torch|tensorflow if "
     "more than one is installed.\n"),
    (["torch"], None, {"KERAS_BACKEND": "torch"},
     "keras-vit: error: KERAS_BACKEND=torch, but torch is not installed: pip install "
     "'keras-vision-transformer[torch]', or set KERAS_BACKEND=jax|torch|tensorflow to choose; installed: jax, "
     "tensorflow.\n"),
])
@pytest.mark.backend_independent
def test_without_tensorflow_the_command_takes_an_installed_backend_and_says_so(tmp_path, blocked, keras_json, env,
                                                                                stderr):
    if not all(startup.installed(backend) for backend in startup.BACKENDS):
        pytest.skip("needs jax, torch and tensorflow installed, to hide some of them")
    done, imported = command(tmp_path, ["pretrain", "--batch-size", "0"], blocked, keras_json, **env)
    assert (done.returncode, done.stderr) == (2, stderr)
    assert imported == []  # the flags were refused before Keras was imported


@pytest.mark.parametrize("keras_json,env,given", [
    (None, {"KERAS_BACKEND": "JAX"}, "KERAS_BACKEND=JAX, which is not a Keras backend (did you mean jax?)"),
    (None, {"KERAS_BACKEND": "pytorch"}, "KERAS_BACKEND=pytorch, which is not a Keras backend (did you mean torch?)"),
    ({"backend": "Tensorflow"}, {}, '{home}/keras.json sets "backend": "Tensorflow", which is not a Keras backend (did '
                                    'you mean tensorflow?)'),
])
@pytest.mark.backend_independent
def test_a_backend_name_keras_does_not_take_is_refused_in_one_line_naming_the_valid_ones(tmp_path, keras_json, env,
                                                                                        given):
    # Keras refused them on import with "Unable to import backend : JAX", naming none of its backends.
    done, imported = command(tmp_path, ["pretrain", "--batch-size", "0"], keras_json=keras_json, **env)
    assert (done.returncode, done.stderr) == (2, f"keras-vit: error: {given.format(home=tmp_path / 'keras_home')}: "
                                                 "set jax, torch or tensorflow, or Keras' inference-only numpy or "
                                                 "openvino.\n")
    assert imported == []


def taken_without_tensorflow():
    """jax or torch, the backend keras_vit takes here with TensorFlow hidden (test_package tests the choice)."""
    return startup.fallback([backend for backend in ("jax", "torch") if startup.installed(backend)])


@pytest.mark.backend_independent
def test_without_tensorflow_the_command_runs_on_jax_or_torch(tmp_path):
    if not (startup.installed("jax") or startup.installed("torch")):
        pytest.skip("neither jax nor torch is installed")
    taken = taken_without_tensorflow()
    done, imported = command(tmp_path, ["convert", fixture("vit_token.npz"), str(tmp_path / "vit.keras")],
                             ["tensorflow"])
    assert done.returncode == 0, done.stderr
    assert done.stderr == note(taken)
    assert done.stdout.startswith(f"wrote {tmp_path / 'vit.keras'}: ")
    assert taken in imported and "tensorflow" not in imported


@pytest.mark.backend_independent
def test_import_keras_vit_without_tensorflow_takes_jax_or_torch_and_warns(tmp_path):
    if not (startup.installed("jax") or startup.installed("torch")):
        pytest.skip("neither jax nor torch is installed")
    taken = taken_without_tensorflow()
    done, imported = command(tmp_path, [], ["tensorflow"],
                             entry=("-c", "import keras_vit, keras; print(keras.backend.backend())"))
    assert (done.returncode, done.stdout, done.stderr) == (0, f"{taken}\n", note(taken).removeprefix("keras-vit: "))


# What TensorFlow 2.21's C++ libraries print on import, whatever TF_CPP_MIN_LOG_LEVEL says (the oneDNN note twice).
TENSORFLOW_IMPORT = (b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
                     b"I0000 00:00:1796497394.867623   29263 port.cc:153] oneDNN custom operations are on. ...\n"
                     b"I0000 00:00:1796497434.750748   29391 cpu_feature_guard.cc:227] This TensorFlow binary is ...\n"
                     b"To enable the following instructions: AVX2 AVX512F FMA, in other operations, rebuild ...\n"
                     b"E0000 00:00:1796497434.750748   29391 cuda_dnn.cc:8579] an error stays\n")


@pytest.mark.backend_independent
def test_the_command_imports_tensorflow_without_its_start_up_banner(tmp_path, monkeypatch, capfd):
    (tmp_path / "noisy_library.py").write_text(f"import os, sys\nos.write(2, {TENSORFLOW_IMPORT!r})\n"
                                               "print('a Python warning stays', file=sys.stderr)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "noisy_library", raising=False)
    startup.hide_import_banner("noisy_library")
    import noisy_library  # noqa: F401

    # (under capfd Python's writes skip file descriptor 2, and so the filter: their order is the test's own)
    assert sorted(capfd.readouterr().err.splitlines()) == [
        "E0000 00:00:1796497434.750748   29391 cuda_dnn.cc:8579] an error stays", "a Python warning stays"]
    assert not any(isinstance(finder, startup._QuietImport) for finder in sys.meta_path)  # once
    monkeypatch.delitem(sys.modules, "noisy_library")


@pytest.mark.parametrize("arguments,line", [
    (["pretrain", "--lr", "0.1"], "keras-vit pretrain: error: unknown flag --lr; did you mean --learning-rate?"),
    (["finetune", "--image_size", "24"],
     "keras-vit finetune: error: unknown flag --image_size; did you mean --image-size?"),
    (["pretrain", "--batchsize=8"],
     "keras-vit pretrain: error: unknown flag --batchsize; did you mean --batch-size or --patch-size?"),
    (["evaluate", "--foo", "1", "--bar"],
     "keras-vit evaluate: error: unknown flags --foo, --bar; keras-vit evaluate --help lists the flags"),
    ([], "keras-vit: error: the following arguments are required: "
         "{pretrain,finetune,evaluate,predict,inspect,convert,export}"),
    # A mistyped command was "invalid choice: 'predcit' (choose from ...)", with no suggestion.
    (["predcit", "photo.jpg"], "keras-vit: error: unknown command 'predcit'; did you mean predict?"),
    (["--debug", "Evaluate"], "keras-vit: error: unknown command 'Evaluate'; did you mean evaluate?"),
    (["serve"], "keras-vit: error: unknown command 'serve'; the commands are pretrain, finetune, evaluate, predict, "
                "inspect, convert, export"),
])
@pytest.mark.backend_independent
def test_a_mistyped_flag_or_command_gets_one_line_with_those_it_may_mean(capsys, arguments, line):
    with pytest.raises(SystemExit) as exit:
        cli.console_main(arguments)
    assert (exit.value.code, capsys.readouterr().err) == (2, line + "\n")


@pytest.mark.parametrize("message,command,in_flags", [
    ("pass num_heads=3.", "finetune", "pass --num-heads 3."),
    ("pass drop_remainder=True to leave", "pretrain", "pass --drop-remainder to leave"),
    ("pass `drop_remainder=True`", "evaluate", "pass --drop-remainder"),
    ("pass classifier='gap' (the file's pooling), or class_token=False.", "finetune",
     "pass --classifier gap (the file's pooling), or class_token=False."),
    ("pass weights=PATH, its path, or", "predict", "pass --weights PATH, its path, or"),
    ("check the path given as dataset=.", "pretrain", "check the path given as --dataset."),
    ("image_size=(24, 40) and weights=None", "finetune", "--image-size 24x40 and --weights none"),
    ("pass quantize='int8'", "pretrain", "pass quantize='int8'"),  # not a flag of pretrain
])
@pytest.mark.backend_independent
def test_keyword_arguments_in_a_message_are_written_as_the_commands_flags(message, command, in_flags):
    assert flags.in_flags(message, cli.build_parser().command(command)) == in_flags


def image_folder(folder, counts, size=(20, 20)):
    rng = np.random.default_rng(0)
    for name, count in counts.items():
        (folder / name).mkdir(parents=True)
        for i in range(count):
            Image.fromarray(rng.integers(0, 256, (*size, 3), np.uint8)).save(folder / name / f"{i}.jpg")
    return folder


HELD_OUT = "has no train/test sub-folders: the 'test' split is a held-out 20% of each class's images"
TINY = ["--patch-size", "4", "--hidden-size", "16", "--num-layers", "1", "--num-heads", "2", "--mlp-dim", "32",
        "--verbose", "0"]


@pytest.mark.backend_independent
def test_each_user_error_is_one_line_that_names_the_flag_to_change(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    folder = str(image_folder(tmp_path / "photos", {"cats": 3, "dogs": 3}))
    unreachable = checkpoints.Checkpoint("test-offline", "ViT_Ti16", 32, "http://127.0.0.1:9/offline.npz", classes=10)
    checkpoints.register(unreachable)
    monkeypatch.setattr(download, "RETRIES", 0)
    cache = re.escape(os.path.join(checkpoints.cache_dir(), unreachable.filename))
    for arguments, line in [
        (["pretrain", "--dataset", "pictures/"],  # a path: not read as a tensorflow-datasets name
         r"Image folder not found: pictures/; check the path given as --dataset\."),
        (["pretrain", "--dataset", "photos/cats/0.jpg"],
         r"--dataset photos/cats/0\.jpg is a file; an image folder holds one sub-folder of images per class\."),
        (["pretrain", "--image-size", "30"], r"image_size \(30, 30\) is not divisible by patch_size 4; pass "
                                             r"--drop-remainder to leave out the last rows and columns that fill no "
                                             r"patch, as timm does\."),
        # Every input wrong, said at once: the missing folder was told only once the default weights were there.
        (["finetune", "--dataset", "pictures/"],
         r"2 problems: \(1\) Image folder not found: pictures/; check the path given as --dataset\. \(2\) Weights "
         r"file not found: runs/pretrain/model\.keras, finetune's default --weights \(what `keras-vit pretrain` "
         r"writes\): .*"),
        (["finetune", "--dataset", folder, "--weights", "gone/vit.npz", "--data-dir", "nowhere"],
         r"2 problems: \(1\) Data directory not found: nowhere \(2\) Weights file not found: gone/vit\.npz"),
        (["finetune"], r"Weights file not found: runs/pretrain/model\.keras, finetune's default --weights \(what "
                       r"`keras-vit pretrain` writes\): run `keras-vit pretrain` first, or pass --weights none \(a "
                       r"random initialisation\), --weights PATH \(a \.keras, \.npz or \.safetensors file, a timm or "
                       r"transformers folder\), --weights hf://org/name, or a named checkpoint such as --model "
                       r"ViT_B16 --weights imagenet21k\."),
        (["finetune", "--model", "ViT_Ti16", "--weights", "test-offline"],
         r"Could not get weights 'test-offline' for ViT_Ti16 from http://127\.0\.0\.1:9/offline\.npz: .* Nothing was "
         rf"cached\. If this machine is offline, download the file elsewhere and pass --weights PATH, its path, or "
         rf"place it at {cache}\."),
    ]:
        assert cli.console_main([*arguments, "--output-dir", str(tmp_path / "run"), *TINY]) == 2, arguments
        assert re.fullmatch(f"keras-vit: error: {line}\n", capsys.readouterr().err), arguments


@pytest.mark.backend_independent
def test_finetune_trains_a_folder_from_scratch_and_says_where_it_wrote(tmp_path, capsys, keras_vit_log):
    folder = image_folder(tmp_path / "photos", {"cats": 5, "dogs": 5})
    out = tmp_path / "run"
    # 18 px is no multiple of the 4 px patches: --drop-remainder leaves out the last 2 rows and columns.
    # The default batch of 64 is more than the 8 training images: the README's command failed on such a folder.
    assert cli.console_main(["finetune", "--dataset", str(folder), "--weights", "none", "--image-size", "18",
                             "--drop-remainder", "--epochs", "1", "--warmup-steps", "1",
                             "--output-dir", str(out), *TINY]) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    assert "note: --batch-size 64 is more than the 8 training examples; training with batches of 8" in printed
    *_, wrote, accuracy = printed
    assert re.fullmatch(rf"wrote {re.escape(str(out / 'model.keras'))} and its log "
                        rf"{re.escape(str(out / 'log.csv'))}( \(beside them: classes.txt, .*\))?", wrote), wrote
    assert re.fullmatch(r"top-1 accuracy: \d\.\d{4}", accuracy)
    trained = keras.saving.load_model(out / "model.keras")
    assert trained.input_shape == (None, 18, 18, 3)
    assert (out / "classes.txt").read_text() == "cats\ndogs\n"
    assert trained.class_names == ["cats", "dogs"]  # in model.keras too, for decode_predictions and the API
    assert keras_vit_log.text.count(HELD_OUT) == 1  # said once, not once per split


# --- predict and evaluate as a user of timm expects them ------------------------------------------------------------

def tiny_classifier(path, class_names=("cats", "dogs", "birds"), image_size=16):
    """A tiny ViT with random values in every tensor (its head too) and `class_names`, saved at `path`."""
    import keras_vit

    model = keras_vit.ViT(image_size=image_size, patch_size=4, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=32,
                          class_names=class_names, classifier_activation=None)
    rng = np.random.default_rng(0)
    for variable in model.weights:
        variable.assign(rng.normal(0, 0.5, variable.shape).astype(variable.dtype))
    model.save(path)
    return model


@pytest.mark.skipif(BACKEND != "jax", reason="counts JAX's XLA compiles")
def test_predict_of_a_keras_file_compiles_one_program_on_jax(tmp_path, xla_compiles):
    # Loading ran every variable's initializer, and each image went through the model op by op, each one compiled on
    # its own: about 70 programs, most of a tiny model's 9-12 s `keras-vit predict`.
    import keras_vit

    keras_vit.from_pretrained(fixture("vit_token.npz")).save(tmp_path / "vit.keras")  # loaded: no initializer ran
    folder = image_folder(tmp_path / "photos", {"a": 2}, size=(40, 30))
    del xla_compiles[:]
    results = inference.predict([str(path) for path in sorted(folder.glob("a/*.jpg"))], weights=str(tmp_path / "vit.keras"))
    assert len(results) == 2 and len(xla_compiles) == 1, xla_compiles


def test_predict_takes_folders_topk_and_json_with_the_models_class_names_and_probabilities(tmp_path, capsys):
    import keras_vit

    model = tiny_classifier(tmp_path / "model.keras")  # its names in the file: no classes.txt beside it
    folder = image_folder(tmp_path / "photos", {"garden": 2, "street": 1}, size=(30, 40))
    files = [str(path) for path in sorted(folder.glob("*/*.jpg"))]
    transform = keras_vit.eval_transform(model)
    logits = np.stack([keras.ops.convert_to_numpy(model(transform.load(path)[None]))[0] for path in files])
    expected = np.exp(logits - logits.max(-1, keepdims=True))
    expected /= expected.sum(-1, keepdims=True)

    results = cli.main(["predict", str(folder), "--weights", str(tmp_path / "model.keras"), "--topk", "2", "--json"])
    printed = json.loads(capsys.readouterr().out)
    assert [entry["image"] for entry in printed] == files
    for entry, result, probabilities in zip(printed, results, expected):
        best = np.argsort(-probabilities)[:2]
        assert [c["name"] for c in entry["classes"]] == [name for name, _ in result] == \
            [["cats", "dogs", "birds"][i] for i in best]
        np.testing.assert_allclose([c["probability"] for c in entry["classes"]], probabilities[best], atol=1e-6)

    assert cli.main(["predict", files[0], "--weights", str(tmp_path / "model.keras"), "--topk", "1"]) == \
        [results[0][:1]]
    assert capsys.readouterr().out == f"{files[0]}\n  {results[0][0][0]:>24s}  {results[0][0][1]:.4f}\n"


@pytest.mark.backend_independent
def test_predict_names_every_missing_image_and_empty_folder_in_one_line_before_loading(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert cli.console_main(["predict", str(tmp_path / "a.jpg"), str(tmp_path / "empty"), "--weights",
                             str(tmp_path / "no_model.keras")]) == 2
    assert capsys.readouterr().err == (
        f"keras-vit: error: 2 problems: (1) Image not found: {tmp_path / 'a.jpg'} (2) No images found under "
        f"{tmp_path / 'empty'} (extensions .jpg, .jpeg, .png, .bmp, .gif).\n")


@pytest.mark.backend_independent
def test_finetune_from_a_timm_folder_evaluates_and_saves_the_checkpoints_own_preprocessing(tmp_path, capsys):
    """One rule for the held-out accuracy, the saved model, predict and export: timm's crop 0.9, bicubic,
    antialiased here. model.keras carried keras_vit's squash resize, which predict then fed (before 2026-12-07).

    With `--recipe beit --layer-decay 0.7`: the optimizer in force is AdamW with timm's groups at the given layer
    decay and the given rate, the rest the recipe's, and model.keras says so."""
    import keras_vit
    from keras_vit import training
    from keras_vit.training import param_groups, recipes

    timm_folder = fixture("timm_family/deit")  # pretrained_cfg: 32 px, crop_pct 0.9, bicubic
    folder = str(image_folder(tmp_path / "photos", {"cats": 5, "dogs": 5}, size=(45, 70)))
    out = tmp_path / "run"
    cli.main(["finetune", "--dataset", folder, "--weights", timm_folder, "--epochs", "1", "--warmup-steps", "1",
              "--learning-rate", "0.1", "--output-dir", str(out), "--verbose", "0", "--recipe", "beit",
              "--layer-decay", "0.7"])
    printed = capsys.readouterr().out.splitlines()
    assert ("recipe beit (BEiT v2's get_started_cls.md (models pretrained 1600 epochs, batch 1024) and "
            "run_class_finetuning.py's defaults): opt adamw, learning_rate 0.1, weight_decay 0.05, layer_decay 0.7, "
            "stochastic_depth 0.2, label_smoothing 0.1, mixup 0.8, cutmix 1, reprob 0.25, randaugment (2, 9); given: "
            "layer_decay, learning_rate") in printed
    trained = keras.saving.load_model(out / "model.keras")
    assert (trained.training_settings["recipe"], trained.training_settings["layer_decay"],
            trained.training_settings["total_updates"]) == ("beit", 0.7, 1)
    assert isinstance(trained.optimizer, recipes.LayerDecayAdamW)
    assert int(keras.ops.convert_to_numpy(trained.optimizer.iterations)) == 1
    fresh = keras_vit.from_pretrained(timm_folder, classes=2)
    assert trained.optimizer.parameter_groups == param_groups.parameter_groups(fresh, layer_decay=0.7)
    assert trained.optimizer.get_config()["learning_rate"]["config"]["peak_learning_rate"] == 0.1
    assert ("preprocessing: timm's: the shorter side resized (bicubic, antialiased), then the centre 32x32 "
            "(crop_pct 0.9), for evaluation and the saved model") in printed
    assert trained.eval_transform == keras_vit.from_pretrained(timm_folder).eval_transform
    # The pixels the printed accuracy came from are those predict (and the API's training_data) give.
    held_out = data.load_source(folder, "test", holdout_fraction=0.2)
    files, labels = held_out.examples
    pixels = np.stack([keras_vit.eval_transform(trained).load(file) for file in files])
    _, validation = training.training_data(data.load_source(folder, "train", holdout_fraction=0.2), held_out, 32, 8,
                                           1, eval_transform=training.evaluation_transform(trained))
    np.testing.assert_array_equal(np.asarray(next(iter(validation))[0]), pixels)
    top1 = np.mean(np.argmax(trained.predict(pixels, verbose=0), -1) == labels)
    assert printed[-1] == f"top-1 accuracy: {top1:.4f}"


@pytest.mark.backend_independent
def test_the_deit3_recipe_trains_with_lamb_3_augment_repeats_and_bce_of_targets_above_0(tmp_path, capsys,
                                                                                         monkeypatch):
    """`--recipe deit3`: the optimizer, loss and augmentations in force are DeiT III's, and model.keras says so."""
    from keras_vit.data.three_augment import ThreeAugment
    from keras_vit.training import losses, recipes

    augmented, apply = [], ThreeAugment.apply
    monkeypatch.setattr(ThreeAugment, "apply", lambda self, image, seed, epoch, position: augmented.append(
        (self.color_jitter, epoch, position)) or apply(self, image, seed, epoch, position))
    folder = str(image_folder(tmp_path / "photos", {"cats": 5, "dogs": 5}, size=(45, 70)))
    out = tmp_path / "run"
    cli.main(["finetune", "--dataset", folder, "--weights", fixture("timm_family/deit"), "--epochs", "1",
              "--output-dir", str(out), "--verbose", "0", "--recipe", "deit3", "--batch-size", "4"])
    printed = capsys.readouterr().out
    assert ("opt lamb, learning_rate 5.85938e-06, weight_decay 0.05, stochastic_depth 0.2, mixup 0.8, cutmix 1, "
            "three_augment True, color_jitter 0.3, aug_repeats 3, bce_loss True, bce_target_thresh 0") in printed
    assert "note: --ema" not in printed  # DeiT III's recipe keeps none
    trained = keras.saving.load_model(out / "model.keras")
    assert isinstance(trained.optimizer, recipes.LayerDecayLamb)
    assert isinstance(trained.loss, losses.BinaryCrossentropyOfClasses) and trained.loss.target_threshold == 0.0
    settings = trained.training_settings
    assert (settings["three_augment"], settings["color_jitter"], settings["aug_repeats"], settings["total_updates"]) \
        == (True, 0.3, 3, 2)  # 8 training images (4 < 256 a pass: all kept), batches of 4
    # Each training example (Keras' first look at a tf.data stream reads ahead too: the set, not the count).
    assert sorted(set(augmented)) == [(0.3, 0, position) for position in range(8)]


@pytest.mark.backend_independent
def test_evaluate_scores_the_part_finetune_held_out_and_says_which_images(tmp_path, capsys, keras_vit_log):
    # It scored every image of a folder without splits, the 80% fine-tuning had trained on too, and said nothing.
    tiny_classifier(tmp_path / "model.keras", ("cats", "dogs"))
    folder = str(image_folder(tmp_path / "photos", {"cats": 5, "dogs": 5}))
    held_out = data.load_source(folder, "test", holdout_fraction=0.2)
    evaluate = ["evaluate", "--weights", str(tmp_path / "model.keras"), "--dataset", folder, "--verbose", "0"]

    cli.main([*evaluate, "--holdout-fraction"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (f"evaluating the {held_out.num_examples} images of {folder} that fine-tuning with "
                        "--holdout-fraction 0.2 held out (20% of each class, the same on every run)")
    assert re.fullmatch(r"top-1 accuracy: \d\.\d{4}", lines[1]) and len(lines) == 2  # no top-5 of 2 classes
    cli.main(evaluate)
    assert capsys.readouterr().out.startswith(f"evaluating all 10 images of {folder}, which has no train/test "
                                              "sub-folders (--holdout-fraction scores only the part fine-tuning "
                                              "held out)\n")


@pytest.mark.backend_independent
def test_predict_shows_each_photos_naflex_patch_grid(tmp_path, capsys):
    import keras_vit

    keras_vit.ViT(naflex=True, patch_size=4, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=32,
                  classes=3).save(tmp_path / "naflex.keras")
    photo = str(image_folder(tmp_path / "photos", {"a": 1}, size=(30, 90)) / "a" / "0.jpg")
    rows, cols = data.naflex_batch([photo], 4, max_patches=24)["patch_grid"][0]
    predict = ["predict", photo, "--weights", str(tmp_path / "naflex.keras"), "--max-patches", "24"]
    cli.main(predict)
    assert capsys.readouterr().out.splitlines()[0] == f"{photo}  (NaFlex patch grid {rows}x{cols})"
    cli.main([*predict, "--json"])
    assert json.loads(capsys.readouterr().out)[0]["patch_grid"] == [rows, cols]
