"""Export for serving: ONNX (every backend), LiteRT (TensorFlow), SavedModel (TensorFlow, JAX), read back by their runtimes.

Each exported file is run by its own runtime (onnxruntime, the LiteRT
interpreter, TensorFlow) at two batch sizes from one file, and compared with
the Keras model to 1e-4.
"""

import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import warnings

import keras
import numpy as np
import pytest
from conftest import SMALL, fixture, predict

import keras_vit
from keras_vit import cli
from keras_vit.model import deployment

BACKEND = keras.backend.backend()
TOLERANCE = 1e-4
pytest.importorskip("onnxruntime")


def random_model(image_size=32, **options):
    """A small ViT with random values in every tensor (class token, table, head and biases too)."""
    model = keras_vit.ViT(image_size=image_size, **SMALL, classes=5, classifier_activation=None, **options)
    rng = np.random.default_rng(0)
    for variable in model.weights:
        variable.assign(rng.normal(scale=0.2, size=variable.shape).astype(variable.dtype))
    return model


def images(count, size=32, seed=1):
    return np.random.default_rng(seed).uniform(-1, 1, (count, size, size, 3)).astype("float32")


def run_onnx(path, batches):
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (feed,) = session.get_inputs()
    assert feed.shape[0] not in (1, 2, 3), f"the batch dimension is fixed: {feed.shape}"
    return [session.run(None, {feed.name: batch})[0] for batch in batches]


def run_litert(path, batches):
    from ai_edge_litert.interpreter import Interpreter

    outputs = []
    interpreter = Interpreter(model_path=str(path))
    (feed,) = interpreter.get_input_details()
    assert feed["shape_signature"][0] == -1, f"the batch dimension is fixed: {feed['shape_signature']}"
    for batch in batches:
        interpreter.resize_tensor_input(feed["index"], batch.shape)
        interpreter.allocate_tensors()
        interpreter.set_tensor(feed["index"], batch)
        interpreter.invoke()
        outputs.append(interpreter.get_tensor(interpreter.get_output_details()[0]["index"]).copy())
    return outputs


def run_saved_model(path, batches):
    # In a subprocess: TensorFlow is not imported into the JAX test process.
    script = ("import sys, numpy as np, tensorflow as tf\n"
              "served = tf.saved_model.load(sys.argv[1])\n"
              "data = np.load(sys.argv[2])\n"
              "np.savez(sys.argv[3], *[served.serve(data[k]).numpy() for k in sorted(data.files)])\n")
    folder = os.path.dirname(path)
    np.savez(os.path.join(folder, "in.npz"), *batches)
    subprocess.run([sys.executable, "-c", script, str(path), os.path.join(folder, "in.npz"),
                    os.path.join(folder, "out.npz")], check=True, capture_output=True,
                   env={**os.environ, "KERAS_BACKEND": "tensorflow"})
    with np.load(os.path.join(folder, "out.npz")) as data:
        return [data[f"arr_{i}"] for i in range(len(batches))]


RUNNERS = {"onnx": run_onnx, "litert": run_litert, "tf_saved_model": run_saved_model}
FILENAMES = {"onnx": "vit.onnx", "litert": "vit.tflite", "tf_saved_model": "vit_saved_model"}
SUPPORTED = [format for format in deployment.FORMATS if BACKEND in deployment.BACKENDS[format]]


def assert_served_like_keras(model, format, tmp_path, batches=None, tolerance=TOLERANCE, **options):
    batches = batches or [images(3), images(1, seed=2)]
    path = tmp_path / FILENAMES[format]
    assert model.export(str(path), format=format, verbose=False, **options) == str(path)
    served = RUNNERS[format](path, batches)
    for batch, output in zip(batches, served):
        assert output.shape == (len(batch), 5)
        np.testing.assert_allclose(output, predict(model, batch), atol=tolerance, rtol=0)
    return served


@pytest.mark.parametrize("format", SUPPORTED)
def test_exported_model_matches_keras_with_a_dynamic_batch_and_no_torchvision_warnings(format, tmp_path, monkeypatch,
                                                                                      recwarn):
    # As where torchvision is not installed: torch's ONNX exporter warned four times of operators it skipped.
    monkeypatch.setitem(sys.modules, "torchvision", None)
    torch_exporter, seen = logging.getLogger("torch.onnx._internal.exporter._registration"), logging.Handler()
    seen.emit = lambda record: pytest.fail(f"the exporter said: {record.getMessage()}")
    torch_exporter.addHandler(seen)
    try:
        assert_served_like_keras(random_model(), format, tmp_path)
    finally:
        torch_exporter.removeHandler(seen)
    assert not [warning for warning in recwarn if "LeafSpec" in str(warning.message)]


def test_exact_gelu_model_exports_to_onnx(tmp_path):
    # Exact GELU is every timm and transformers checkpoint's; TensorFlow's Erfc had no ONNX op.
    assert_served_like_keras(random_model(approximate_gelu=False), "onnx", tmp_path)


def test_onnx_export_of_a_model_used_only_through_predict(tmp_path):
    # On JAX, Keras refused this: "The model provided has never called".
    model = random_model()
    model.predict(images(2), verbose=0)
    assert_served_like_keras(model, "onnx", tmp_path)


@pytest.mark.parametrize("format", [f for f in SUPPORTED if f != "litert"])
def test_int8_model_exports_with_its_own_outputs(format, tmp_path):
    model = random_model()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.quantize("int8")
    assert_served_like_keras(model, format, tmp_path)


def test_quantize_option_exports_an_int8_copy_and_leaves_the_model_float(tmp_path):
    model = random_model()
    float_logits = predict(model, images(3))
    (served, _) = run_onnx_export(model, tmp_path, quantize="int8")
    assert all(getattr(layer, "quantization_mode", None) is None for layer in model._flatten_layers())
    quantized = np.abs(served - float_logits).max()
    assert 0 < quantized < 0.05 * np.abs(float_logits).max(), quantized


def run_onnx_export(model, tmp_path, **options):
    path = tmp_path / "vit.onnx"
    model.export(str(path), format="onnx", verbose=False, **options)
    return run_onnx(path, [images(3), images(1, seed=2)])


def test_lora_model_exports_merged_with_equal_outputs(tmp_path):
    model = random_model()
    keras_vit.enable_lora(model, rank=2)
    rng = np.random.default_rng(3)
    for variable in model.weights:
        if "lora_kernel" in variable.path:
            variable.assign(rng.normal(scale=0.2, size=variable.shape).astype("float32"))
    assert_served_like_keras(model, "onnx", tmp_path)


def test_dynamic_resolution_model_exports(tmp_path, caplog):
    model = random_model(image_size=(None, None))
    native = keras_vit.model.vision_transformer.native_image_size(model)
    if BACKEND != "jax":  # height and width stay open: another size, and a grid of as many patches (16x64)
        batches = [images(2, size=32), images(1, size=48),
                   np.random.default_rng(4).uniform(-1, 1, (1, 16, 64, 3)).astype("float32")]
    else:  # jax2onnx cannot: exported at the table's own size, which it says
        batches = [images(2, size=native[0]), images(1, size=native[0], seed=2)]
    assert_served_like_keras(model, "onnx", tmp_path, batches=batches)
    said = f"vit takes images of any size, but the JAX backend exports it at one: {tmp_path / 'vit.onnx'} takes " \
           f"{native[0]}x{native[1]} images; export it on the tensorflow or torch backend"
    assert (said in caplog.text) == (BACKEND == "jax")


@pytest.mark.skipif(BACKEND != "tensorflow", reason="LiteRT is exported through TensorFlow")
def test_litert_int8_is_litert_dynamic_range_quantization_close_to_float(tmp_path):
    model = random_model()
    batch = images(8)
    model.export(str(tmp_path / "vit.tflite"), format="litert", verbose=False, quantize="int8")
    (served,) = run_litert(tmp_path / "vit.tflite", [batch])
    expected = predict(model, batch)
    assert 0 < np.abs(served - expected).max() < 0.05 * np.abs(expected).max()
    assert (served.argmax(-1) == expected.argmax(-1)).mean() >= 0.75
    model.export(str(tmp_path / "float.tflite"), format="litert", verbose=False)
    assert os.path.getsize(tmp_path / "vit.tflite") < 0.7 * os.path.getsize(tmp_path / "float.tflite")


@pytest.mark.skipif(BACKEND != "tensorflow", reason="LiteRT is exported through TensorFlow")
def test_keras_int8_model_to_litert_names_the_fix(tmp_path):
    model = random_model()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.quantize("int8")
    with pytest.raises(ValueError, match=r"export the float model with quantize='int8'"):
        model.export(str(tmp_path / "vit.tflite"), format="litert")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("format", [f for f in deployment.FORMATS if BACKEND not in deployment.BACKENDS[f]])
def test_format_the_backend_cannot_write_names_the_backend_to_use(format, tmp_path):
    needs = " or ".join(deployment.BACKENDS[format])
    with pytest.raises(NotImplementedError, match=rf"^Export to {format} needs the {needs} backend, not {BACKEND} "):
        random_model().export(str(tmp_path / FILENAMES[format]), format=format)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("format,backend,missing,install", [
    ("onnx", "torch", "onnxscript", "pip install 'keras-vision-transformer[export]'"),
    ("onnx", "tensorflow", "onnx", "pip install 'keras-vision-transformer[export]'"),
    ("onnx", "jax", "jax2onnx", "pip install 'keras-vision-transformer[export-jax]'"),
    # It named [export], which has no TensorFlow.
    ("tf_saved_model", "jax", "tensorflow", "pip install 'keras-vision-transformer[tensorflow]' (Keras converts a JAX "
     "model through TensorFlow's jax2tf), then set KERAS_BACKEND=jax, since Keras takes TensorFlow by default once it "
     "is installed"),
])
@pytest.mark.backend_independent
def test_missing_export_package_names_the_install_that_brings_it(monkeypatch, format, backend, missing, install):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == missing else real(name, *a))
    monkeypatch.setattr(keras.backend, "backend", lambda: backend)
    with pytest.raises(ImportError) as error:
        deployment.check_format(format)
    assert str(error.value) == f"Export to {format} on {backend} needs {missing}: {install}."


def test_unknown_format_and_quantization_are_refused(tmp_path):
    with pytest.raises(ValueError, match=r"Unknown quantization 'int4'; choose among \['int8'\] or none\."):
        random_model().export(str(tmp_path / "vit.onnx"), format="onnx", quantize="int4")
    with pytest.raises(ValueError, match=r"Unknown export format 'pdf'"):
        deployment.check_format("pdf")


def test_failed_export_keeps_the_previous_file_whole(tmp_path, monkeypatch):
    path = tmp_path / "vit.onnx"
    path.write_bytes(b"the previous export")

    def fails_halfway(model, filepath, **kwargs):
        with open(filepath, "wb") as f:
            f.write(b"half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(keras.Model, "export", fails_halfway)
    monkeypatch.setattr(deployment, "_export_onnx_torch", lambda model, path, *a: fails_halfway(model, path))
    with pytest.raises(OSError, match="No space left"):
        random_model().export(str(path), format="onnx")
    assert path.read_bytes() == b"the previous export"
    assert os.listdir(tmp_path) == ["vit.onnx"]


@pytest.mark.skipif(BACKEND != "jax", reason="jax2onnx writes each tensor of 1 MB or more to <file>.data; the other "
                                             "exporters do so only past 2 GB")
def test_onnx_export_under_2_gb_is_one_file_that_runs_copied_alone(tmp_path):
    # jax2onnx left the head in vit.onnx.data, which only the .onnx named: a vit.onnx copied alone did not load.
    model = keras_vit.ViT(image_size=32, **SMALL, classes=6000, classifier_activation=None)  # a 1.1 MB head
    (tmp_path / "export").mkdir()
    model.export(str(tmp_path / "export" / "vit.onnx"), format="onnx", verbose=False)
    assert os.listdir(tmp_path / "export") == ["vit.onnx"]
    (tmp_path / "copy").mkdir()
    shutil.copy(tmp_path / "export" / "vit.onnx", tmp_path / "copy")
    (served,) = run_onnx(tmp_path / "copy" / "vit.onnx", [images(2)])
    np.testing.assert_allclose(served, predict(model, images(2)), atol=TOLERANCE, rtol=0)


def write_onnx_with_external_weights(path):
    """An ONNX writer as jax2onnx is: `x @ weights`, its 3x2 weights in `<path>.data`, which `path` names."""
    import onnx

    weights = np.arange(6, dtype="float32").reshape(3, 2)
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("MatMul", ["x", "weights"], ["y"])], "matmul",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", 3])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["batch", 2])],
        [onnx.numpy_helper.from_array(weights, "weights")])
    onnx.save_model(onnx.helper.make_model(graph), path, save_as_external_data=True, size_threshold=0,
                    location=os.path.basename(path) + ".data")
    return weights


@pytest.mark.parametrize("limit,written", [(deployment.ONNX_FILE_LIMIT, ["vit.onnx"]),
                                           (100, ["vit.onnx", "vit.onnx.data"])])  # as if 2 GB were 100 bytes
@pytest.mark.backend_independent
def test_onnx_export_is_one_file_under_the_limit_and_names_its_weights_file_over_it(tmp_path, monkeypatch, caplog,
                                                                                    limit, written):
    weights = {}

    def writes(model, path, *args, **kwargs):
        weights["written"] = write_onnx_with_external_weights(path)

    monkeypatch.setattr(keras.Model, "export", writes)
    monkeypatch.setattr(deployment, "_export_onnx_torch", writes)
    monkeypatch.setattr(deployment, "ONNX_FILE_LIMIT", limit)
    (tmp_path / "export").mkdir()
    path = tmp_path / "export" / "vit.onnx"
    assert random_model().export(str(path), format="onnx") == str(path)
    assert sorted(os.listdir(tmp_path / "export")) == written
    said = [record.getMessage() for record in caplog.records if record.name == "keras_vit"]
    assert said == ([f"{path} is over ONNX's 2 GB for one file, so its weights are in {path}.data beside it: copy "
                     "them together."] if len(written) == 2 else [])
    shutil.copytree(tmp_path / "export", tmp_path / "copy")
    import onnxruntime

    session = onnxruntime.InferenceSession(str(tmp_path / "copy" / "vit.onnx"), providers=["CPUExecutionProvider"])
    x = np.ones((4, 3), "float32")
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], x @ weights["written"])


def test_cli_export_writes_beside_the_model_and_matches_it(tmp_path, capsys):
    model = random_model()
    model.save(tmp_path / "vit.keras")
    cli.main(["export", str(tmp_path / "vit.keras")])
    assert f"wrote {tmp_path / 'vit.onnx'} (onnx)" in capsys.readouterr().out
    batch = images(2)
    (served,) = run_onnx(tmp_path / "vit.onnx", [batch])
    np.testing.assert_allclose(served, predict(model, batch), atol=TOLERANCE, rtol=0)


def test_cli_export_errors_are_one_line(tmp_path, capsys):
    unsupported = [f for f in deployment.FORMATS if BACKEND not in deployment.BACKENDS[f]]
    if unsupported:
        random_model().save(tmp_path / "vit.keras")
        assert cli.console_main(["export", str(tmp_path / "vit.keras"), "--format", unsupported[0]]) == 2
        assert capsys.readouterr().err.startswith(f"keras-vit: error: Export to {unsupported[0]} needs the ")
    assert cli.console_main(["export", str(tmp_path / "missing.keras")]) == 2
    assert "missing.keras" in capsys.readouterr().err


def test_rope_model_exports_to_onnx(tmp_path):
    # RoPE's positions are computed in the graph (Perception Encoder's axial form, with attention pooling).
    model = keras_vit.from_pretrained(fixture("timm_eva/pe_core"), classifier_activation=None)
    batches = [images(3, size=48), images(1, size=48, seed=2)]
    assert_served_like_keras(model, "onnx", tmp_path, batches=batches)
