#!/usr/bin/env bash
# Create .venv with keras_vit, the JAX, TensorFlow and PyTorch backends (CPU builds),
# the example and test dependencies. Safe to run again: it only adds what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# The CPU build of torch first, so that the package's "torch>=2.3" needs nothing more.
.venv/bin/python -m pip install -q -r tools/requirements-cpu.txt
.venv/bin/python -m pip install -q -e ".[all]"
