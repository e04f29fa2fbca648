"""The README's main job, with its defaults, reaches the promised accuracy."""

import os
import re
import subprocess
import sys

import keras
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="run once, on the fastest CPU backend here")
def test_main_job_fine_tunes_digits_to_at_least_90_percent(tmp_path):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    for script in ("pretrain.py", "finetune.py"):
        done = subprocess.run([sys.executable, os.path.join(ROOT, "examples", script), "--verbose", "2"],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stderr[-3000:]
    final = done.stdout.strip().splitlines()[-1]
    accuracy = float(re.fullmatch(r"top-1 accuracy: (0\.\d{4}|1\.0000)", final).group(1))
    assert accuracy >= 0.90
    assert (tmp_path / "runs" / "finetune" / "learning_curve.png").exists()
