"""Run a guide's code blocks in order, as a reader would, and fail loudly.

    KERAS_VIT_GUIDE_SMOKE=1 python tools/run_guides.py guides/01_quickstart.md

Fenced ```python blocks run in one shared namespace; ```bash blocks run in a
shell, in the same working directory. A block whose info string says
`needs=download`, `needs=tpu`, `needs=network` (anything after `needs=`) is
replaced by the ```python stand-in (or ```bash stand-in) block right after
it, which the guide shows to readers as the offline stand-in. A needs-block
without a stand-in is an error: nothing is skipped silently.
Set KERAS_VIT_GUIDE_SMOKE=1 for smoke-size runs (guides read it to shrink
epochs and images).

    python tools/run_guides.py --first-block guides/*.md

runs only each guide's first ```python block (its set-up: the imports that
choose the Keras backend), as CI does in a `[jax]`-only venv with
KERAS_BACKEND unset. A guide none of whose **Backends:** is installed is
skipped, and says so. Several guides run one interpreter each: Keras takes
its backend once per process, so a guide must not lean on an earlier one's.
"""

import concurrent.futures
import importlib.util
import os
import re
import subprocess
import sys
import textwrap
import time
import traceback

FENCE = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)


def blocks(text):
    """`(language, options, code, line)` for every fenced block."""
    found = []
    for match in FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        found.append((match.group(1), match.group(2).strip(), match.group(3), line))
    return found


def plan(text, path):
    """The blocks to run, in order, with needs-blocks swapped for their stand-ins."""
    found = [b for b in blocks(text) if b[0] in ("python", "bash")]
    runs, skip_next = [], False
    for index, (language, options, code, line) in enumerate(found):
        if skip_next:
            skip_next = False
            continue
        if options.startswith("needs="):
            following = found[index + 1] if index + 1 < len(found) else None
            if following is None or following[1] != "stand-in":
                raise SystemExit(f"{path}:{line}: a '{options}' block needs a following 'stand-in' block")
            runs.append((following[0], following[2], following[3]))
            skip_next = True
        elif options == "stand-in":
            raise SystemExit(f"{path}:{line}: a stand-in block must follow a needs= block")
        else:
            runs.append((language, code, line))
    return runs


BACKENDS = ("jax", "tensorflow", "torch")


def backends(text):
    """The backends a guide's `**Backends:**` line names, without its trailing (note)."""
    match = re.search(r"^\*\*Backends:\*\*\s*([^(\n]+)", text, re.MULTILINE)
    return [b.strip() for b in match.group(1).split(",")] if match else []


def ci_backends(text):
    """The backends CI runs a guide on: its `**CI runs it on:**` line, else every backend it names.

    A guide whose code is the same on every backend is run on one: the unit
    tests run each call it makes on all three, so the other passes would
    repeat what that one checks. A guide that branches on the backend runs on each.
    """
    match = re.search(r"^\*\*CI runs it on:\*\*\s*([^(\n]+)", text, re.MULTILINE)
    return [b.strip() for b in match.group(1).split(",")] if match else backends(text)


def branches_on_backend(text):
    """Whether any code block of a guide reads the backend (and so may do different things on each)."""
    return any("keras.backend.backend()" in code or "KERAS_BACKEND" in code for _, code, _ in plan(text, "guide"))


def main(path, first=False):
    """Run the guide at `path`; `first`: only its first python block, and only if a backend it names is installed."""
    text = open(path).read()
    if not backends(text) or "**Hardware:**" not in text:
        raise SystemExit(f"{path}: a guide must say its **Backends:** and **Hardware:**")
    unknown = [b for b in backends(text) if b not in BACKENDS]
    if unknown:
        raise SystemExit(f"{path}: unknown backends {unknown} on the **Backends:** line; use {', '.join(BACKENDS)}")
    runs = plan(text, path)
    if first:
        if not any(importlib.util.find_spec(backend) for backend in backends(text)):
            print(f"skip {path}: its **Backends:** line names {', '.join(backends(text))}, none of them installed")
            return
        runs = [run for run in runs if run[0] == "python"][:1]   # the set-up, where the backend is chosen
    namespace = {"__name__": "__guide__"}
    started = time.perf_counter()
    for language, code, line in runs:
        print(f"--- {path}:{line} ({language}, at {time.perf_counter() - started:.1f} s)", flush=True)
        if language == "bash":
            done = subprocess.run(["bash", "-euo", "pipefail", "-c", code], env=os.environ)
            if done.returncode:
                raise SystemExit(f"{path}:{line}: bash block failed with status {done.returncode}")
            continue
        try:
            exec(compile(textwrap.dedent(code), f"{path}:{line}", "exec"), namespace)
        except Exception:
            traceback.print_exc()
            raise SystemExit(f"{path}:{line}: python block failed") from None
    print(f"ok {path} in {time.perf_counter() - started:.1f} s")


def run_each(guides, first):
    """Run each guide in an interpreter of its own: one after another, or first blocks side by side (they are
    short and share no files), each one's output printed whole when all are done."""
    def run(guide):
        command = [sys.executable, __file__, *(["--first-block"] if first else []), guide]
        captured = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT} if first else {}
        return subprocess.run(command, text=True, **captured)

    with concurrent.futures.ThreadPoolExecutor(os.cpu_count() if first else 1) as pool:
        done = list(pool.map(run, guides))
    print("".join(finished.stdout or "" for finished in done), end="", flush=True)
    failed = [guide for guide, finished in zip(guides, done) if finished.returncode]
    if failed:
        raise SystemExit(f"failed: {' '.join(failed)}")


if __name__ == "__main__":
    arguments = sys.argv[1:]
    first = "--first-block" in arguments
    guides = [argument for argument in arguments if argument != "--first-block"]
    if len(guides) == 1:
        main(guides[0], first)
    else:  # Keras takes its backend once per process: a guide must not lean on an earlier one's
        run_each(guides, first)
