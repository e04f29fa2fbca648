"""The benchmarks' own logic: what each mode of `throughput.py` times and how its table ranks the contenders."""

import importlib.util
import os

import pytest

BENCHMARKS = os.path.join(os.path.dirname(__file__), "..", "benchmarks")


def load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(BENCHMARKS, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_throughput_times_device_resident_and_end_to_end_steps_for_inference_and_training():
    throughput = load("throughput")
    images = 2 * 32 * 32 * 3 * 4  # batch 2 of float32 at 32 px
    infer = throughput.run_keras("keras_vit", "tiny", "infer", batch=2, iterations=1, dtype="bfloat16",
                                 image_size=32)
    train = throughput.run_keras("keras_vit", "tiny", "train", batch=2, iterations=1, dtype="bfloat16",
                                 image_size=32)
    for result in (infer, train):
        assert set(result) == {"device", "end_to_end"}
        assert all(mode["step_s"] > 0 and len(mode["round_step_s"]) == 1 for mode in result.values())
    # On the device nothing crosses but a training step's loss; end to end the numpy batch goes in and the
    # output (bfloat16 tokens: 2 images x 5 tokens x 48) or the loss comes out.
    assert (infer["device"]["bytes_in"], infer["device"]["bytes_out"]) == (0, 0)
    assert (infer["end_to_end"]["bytes_in"], infer["end_to_end"]["bytes_out"]) == (images, 2 * 5 * 48 * 2)
    assert (train["device"]["bytes_in"], train["device"]["bytes_out"]) == (0, 4)
    assert (train["end_to_end"]["bytes_in"], train["end_to_end"]["bytes_out"]) == (images + 2 * 8, 4)


@pytest.mark.backend_independent
def test_throughput_table_ranks_each_mode_against_keras_vit_and_timm():
    throughput = load("throughput")

    def process(device_s, end_to_end_s):
        return {mode: {"round_step_s": seconds, "first_call_s": 1.0, "peak_rss_mb": 100.0, "bytes_in": 0,
                       "bytes_out": 0} for mode, seconds in (("device", device_s), ("end_to_end", end_to_end_s))}

    runs = [("keras_vit", "bfloat16"), ("timm", "bfloat16")]
    results = {runs[0]: [process([0.5, 0.4], [1.0, 1.0])], runs[1]: [process([1.0, 1.0], [0.5, 0.5])]}
    rows = throughput.summarize("B16", "infer", runs, results, 8, 8e9, {"bfloat16": 1e12}, ["device", "end_to_end"])
    by = {(row["mode"], row["contender"]): row for row in rows}
    assert by["device", "keras_vit"]["images_per_s"] == pytest.approx(18)  # the median of 16 and 20 img/s
    assert by["device", "keras_vit"]["speed_vs_timm"] == pytest.approx(18 / 8)
    assert by["device", "timm"]["ranking"] == "behind beyond spread"
    assert by["end_to_end", "timm"]["ranking"] == "ahead beyond spread"
    assert by["end_to_end", "keras_vit"]["roofline"] == pytest.approx(8e9 / 1.0 / 1e12)
    assert len(throughput.report(rows).splitlines()) == 5
