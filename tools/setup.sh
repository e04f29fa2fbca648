#!/usr/bin/env bash
# Create .venv with keras_vit and the extras named (default "all": the JAX, TensorFlow and PyTorch backends as
# CPU builds, the example and test dependencies; "tensorflow" alone runs the digits job). Safe to run again: it
# only adds what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
EXTRAS=${1:-all}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
case ",$EXTRAS," in  # the CPU build of torch first, so that the package's "torch>=2.3" needs nothing more
  *,all,*|*,torch,*) .venv/bin/python -m pip install -q -r tools/requirements-cpu.txt ;;
esac
.venv/bin/python -m pip install -q -e ".[$EXTRAS]"
