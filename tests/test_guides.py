"""Every guide runs top to bottom (offline stand-ins, smoke sizes) on its first backend."""

import glob
import os
import subprocess
import sys

import keras
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import run_guides  # noqa: E402

GUIDES = sorted(glob.glob(os.path.join(ROOT, "guides", "*.md")))


def test_readme_lists_exactly_the_guides_that_exist():
    import re

    listed = re.findall(r"\]\((guides/\d\d_\w+\.md)\)", open(os.path.join(ROOT, "README.md")).read())
    assert listed == [os.path.relpath(g, ROOT) for g in GUIDES]
    assert len(GUIDES) == 8


@pytest.mark.parametrize("guide", GUIDES, ids=os.path.basename)
def test_guide_runs(guide, tmp_path):
    text = open(guide).read()
    backends = run_guides.backends(text)
    assert backends, "a guide must name its backends"
    if keras.backend.backend() != backends[0]:
        pytest.skip(f"runs in the {backends[0]} pass")
    os.symlink(os.path.join(ROOT, "examples"), tmp_path / "examples")
    env = {**os.environ, "KERAS_BACKEND": backends[0], "KERAS_VIT_GUIDE_SMOKE": "1", "TF_CPP_MIN_LOG_LEVEL": "2",
           "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    done = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "run_guides.py"), guide], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]


def test_needs_block_without_stand_in_is_an_error():
    text = "**Backends:** jax\n**Hardware:** CPU\n```python needs=download\nx = 1\n```\n"
    with pytest.raises(SystemExit, match="needs a following 'stand-in' block"):
        run_guides.plan(text, "guide.md")
    text += "```python stand-in\nx = 2\n```\n"
    assert [code for _, code, _ in run_guides.plan(text, "guide.md")] == ["x = 2\n"]
