"""Keep every figure the docs state equal to what its command prints.

A figure in README.md, guides/*.md or docs/*.md that a command produces (an
accuracy, a loss) carries an invisible marker right after it, its name:

    fine-tuned, the digits reach 97.78%<!-- figure digits.top1 -->
    CI's smoke run ends at 0.24-0.35<!-- figure guide02-smoke.evaluate_top1 -->

`JOBS` below says which command prints each figure, on which backends, and
how to find it in the output. docs/figures.json records what the last
measured runs printed, with the command, the backend, the date, the seconds
and the CPU. A single value in the text must be every recorded run's value
at the text's precision (`%`: the printed fraction as a percentage); a
range `low-high` must run from the lowest to the highest of the runs it
covers: the backends, or several figures named in one marker
(`20-26%<!-- figure a b -->`). A figure must come back the same on every
run: a guide that states one seeds its weights and batches (`--twice`
checks).

    python tools/check_figures.py                        # the docs against docs/figures.json, as tests/test_guides.py does
    python tools/check_figures.py --run guide11          # run a job (full size: minutes), compare what it prints with the docs
    python tools/check_figures.py --run guide11 --twice  # run it twice: does every figure come back the same?
    python tools/check_figures.py --run all --record     # run every job, record its figures in docs/figures.json
    python tools/check_figures.py --from-logs DIR all    # read the logs that `--run --logs DIR` wrote instead

CI runs the guides in smoke mode only (KERAS_VIT_GUIDE_SMOKE=1: a few epochs,
other figures, the `-smoke` jobs here): the full runs take minutes each on a
CPU, so they are run by hand with this tool, before a release and after any
change that may move a figure; the test checks that text and record agree.
"""

import argparse
import dataclasses
import datetime
import decimal
import glob
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECORD = os.path.join(ROOT, "docs", "figures.json")
NUMBER = r"(\d+(?:\.\d+)?)"
PERCENT = r"(\d+(?:\.\d+)?%)"   # a figure printed as a percentage: read as the fraction it is


@dataclasses.dataclass(frozen=True)
class Job:
    """A command run in an empty folder, on each of `backends`, and the figures its output holds.

    `figures` pairs a regular expression (matched per line) with the names of
    everything it captures, in order: each group of each matching line; a
    figure's full name is the job's name, a dot and this one. A name of None
    is printed but not documented. A run must print exactly as
    many as are named, so a guide that gains or loses a printed line is
    noticed, not read one line off.
    """

    command: str   # run in an empty folder; {python} is this interpreter, {root} the repository's root (and a slash)
    backends: tuple
    figures: tuple
    smoke: bool = False


def guide(number, backends, figures, smoke=False):
    path = os.path.relpath(glob.glob(os.path.join(ROOT, "guides", f"{number}_*.md"))[0], ROOT)
    return Job(f"{{python}} {{root}}tools/run_guides.py {{root}}{path}", backends, figures, smoke)


TOP1 = rf"^top-1 accuracy: {NUMBER}$"   # what the keras-vit commands and examples/*.py print last


def guide02(smoke):
    """Guide 02's figures: the guide states its pretraining's of the full run only, and its one-epoch folder
    run's (the same command in either mode) of the smoke runs, on each backend."""
    return ((TOP1, (None if smoke else "pretrain_top1", "folder_top1" if smoke else None, "cli_top1",
                    "recipe_beit_top1")),
            (rf"^\{{'loss': [\d.e-]+, 'top1': {NUMBER}\}}$", ("evaluate_top1",)))


def guide06():
    resolutions, patches = (16, 24, 32, 40, 48), (4, 8, 16)
    return ((r"^accuracy by resolution: \{" + ", ".join(f"{size}: {NUMBER}" for size in resolutions) + r"\}$",
             tuple(f"top1_{size}px" for size in resolutions)),
            (r"^accuracy by patch size at 32 px: \{" + ", ".join(f"{size}: {NUMBER}" for size in patches) + r"\}$",
             ("top1_patch4", None, "top1_patch16")))   # 8 px patches at 32 px: the model itself, top1_32px


LAST = r"\b(?![\s\S]*\b{}: )"   # the line a run prints last with this metric: its last epoch's
GUIDE03 = ((rf"^\d+/\d+ - .* - top1: {NUMBER}" + LAST.format("top1"), ("top1",)),
           (rf"^\d+/\d+ - .*\bcorrupted_accuracy: {NUMBER}" + LAST.format("corrupted_accuracy"), ("corrupted_accuracy",)))
GUIDE08 = ((TOP1, ("pretrain_top1", "finetune_top1")), (rf"^10-shot linear accuracy: {NUMBER}$", ("few_shot",)))
GUIDE09 = ((rf"^held-out accuracy with LoRA: {NUMBER}$", ("lora_top1",)),
           (rf"^int8 top-1 agreement with float32 on \d+ held-out digits: {PERCENT}$", ("int8_agreement",)))
GUIDE10 = ((rf"^linear probe on the frozen backbone: {PERCENT} held-out top-1$", ("probe",)),
           (rf"^the same probe on random weights: {PERCENT}$", ("random_probe",)))
GUIDE12 = tuple(
    (rf"^student, {re.escape(method)}: top-1 {NUMBER} \(seeds \[{NUMBER}, {NUMBER}, {NUMBER}\]\)$",
     tuple(f"{name}{part}" for part in ("", "_seed0", "_seed1", "_seed2")))
    for method, name in (("alone", "alone"), ("hard (DeiT)", "hard"), ("soft (tau=3)", "soft"))
) + (
    (rf"^teacher: [\d,]+ parameters, top-1 {NUMBER}$", ("teacher",)),
    (r"^student, hard \(DeiT\): ([+-][\d.]+) points over the student alone$", ("hard_gain",)),
    (r"^student, soft \(tau=3\): ([+-][\d.]+) points over the student alone$", ("soft_gain",)),
)

JOBS = {
    # README's first command, on Keras' default backend, TensorFlow, with 1, 2 (every core here) and 4 threads:
    # the last digits move with the threads, which split the float sums otherwise.
    "digits": Job("{python} {root}examples/pretrain.py && {python} {root}examples/finetune.py --image-size 32",
                  ("tensorflow@1", "tensorflow", "tensorflow@4"), ((TOP1, (None, "top1")),)),
    "guide02": guide("02", ("jax",), guide02(smoke=False)),
    "guide02-smoke": guide("02", ("jax", "tensorflow", "torch"), guide02(smoke=True), smoke=True),
    "guide03": guide("03", ("torch",), GUIDE03),
    "guide03-smoke": guide("03", ("torch",), GUIDE03, smoke=True),
    "guide05-smoke": guide("05", ("jax",), ((TOP1, ("multihost_top1",)),), smoke=True),
    "guide06": guide("06", ("torch",), guide06()),
    "guide06-smoke": guide("06", ("torch",), guide06(), smoke=True),
    "guide08": guide("08", ("torch",), GUIDE08),
    "guide08-smoke": guide("08", ("torch",), GUIDE08, smoke=True),
    "guide09": guide("09", ("jax",), GUIDE09),
    "guide09-smoke": guide("09", ("jax",), GUIDE09, smoke=True),
    "guide10": guide("10", ("jax",), GUIDE10),
    "guide10-smoke": guide("10", ("jax",), GUIDE10, smoke=True),
    "guide11": guide("11", ("jax",), ((
        rf"^\{{16: {NUMBER}, 36: {NUMBER}, 64: {NUMBER}, 144: {NUMBER}\}}$",
        ("top1_16", "top1_36", "top1_64", "top1_144")),)),
    "guide12": guide("12", ("jax",), GUIDE12),
}


# ---- the docs ----

MARKER = re.compile(r"<!-- figure ([\w. -]+?) -->(?!`)")   # one shown in a code span is an example
MARKED = re.compile(rf"{NUMBER}(?:-{NUMBER})?(%?)`?$")   # what a marker follows: 97.78% or 0.23-0.32, maybe in `...`


def documents():
    return [os.path.join(ROOT, "README.md"), *sorted(glob.glob(os.path.join(ROOT, "guides", "*.md"))),
            *sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))]


def marked_figures(text, where):
    """`(name, low, high, percent, where)` for each marker in `text`; high is None for a single value.

    A marker may name several figures (`20-26%<!-- figure a b c -->`): a range then runs over all of them.
    """
    found = []
    for line_number, line in enumerate(text.splitlines(), 1):
        for marker in MARKER.finditer(line):
            value = MARKED.search(line[:marker.start()])
            if value is None:
                raise SystemExit(f"{where}:{line_number}: the marker '{marker.group(0)}' must follow its figure, "
                                 "e.g. 97.78%<!-- figure NAME --> or 0.23-0.32<!-- figure NAME -->")
            found.append((marker.group(1), value.group(1), value.group(2), value.group(3) == "%",
                          f"{where}:{line_number}"))
    return found


def shown(value, like, percent):
    """`value` (a printed fraction or number) as the text would show it: `like`'s decimals, half up."""
    number = decimal.Decimal(str(value)) * (100 if percent else 1)
    decimals = len(like.split(".")[1]) if "." in like else 0
    return str(number.quantize(decimal.Decimal(1).scaleb(-decimals), rounding=decimal.ROUND_HALF_UP))


def compare(marks, measured):
    """The mismatches between the docs' marked figures and `measured` ({name: {backend: printed value}})."""
    problems = []
    for name, low, high, percent, where in marks:
        names = name.split()
        if any(not measured.get(figure) for figure in names):
            problems.append(f"{where}: figure {name} was never measured (python tools/check_figures.py --run JOB --record)")
            continue
        runs = {f"{figure}, {backend}" if len(names) > 1 else backend: value
                for figure in names for backend, value in measured[figure].items()}
        values = sorted(runs.values(), key=decimal.Decimal)
        described = ", ".join(f"{value} ({run})" for run, value in sorted(runs.items()))
        text = low + (f"-{high}" if high else "") + ("%" if percent else "")
        if high is None and any(shown(value, low, percent) != low for value in values):
            problems.append(f"{where}: {name} says {text}, the runs printed {described}")
        elif high is not None and (shown(values[0], low, percent), shown(values[-1], high, percent)) != (low, high):
            problems.append(f"{where}: {name} says {text}, the runs printed {described}: "
                            "a range must run from the lowest to the highest")
    return problems


def load_record(path=RECORD):
    if not os.path.exists(path):
        return {"jobs": {}, "figures": {}}
    with open(path) as file:
        return json.load(file)


def problems(record=None, jobs=JOBS):
    """Every disagreement between the docs, docs/figures.json and `JOBS` (empty when all agree)."""
    record = load_record() if record is None else record
    marks = [mark for path in documents()
             for mark in marked_figures(open(path).read(), os.path.relpath(path, ROOT))]
    measured = {name: figure["measured"] for name, figure in record["figures"].items()}
    found = compare(marks, measured)
    named = {f"{job}.{name}" for job, spec in jobs.items() for _, names in spec.figures for name in names if name}
    found += [f"docs/figures.json: figure {name} is marked in no doc" for name in
              sorted(set(measured) - {figure for mark in marks for figure in mark[0].split()})]
    found += [f"tools/check_figures.py: figure {name} is not in docs/figures.json: --run its job with --record" for name in
              sorted(named - set(measured))]
    return found


# ---- the runs ----

def read_figures(job, output):
    """{short name: printed value} from a run's output; SystemExit where the lines are not the job's."""
    values, output = {}, output.replace("\r", "\n")   # Keras' progress bars rewrite their line
    for pattern, names in job.figures:
        captured = [group for match in re.finditer(pattern, output, re.MULTILINE) for group in match.groups()]
        if len(captured) != len(names):
            raise SystemExit(f"'{pattern}' matched {len(captured)} values in the output, the job names {len(names)}: "
                             "update JOBS in tools/check_figures.py to what the command prints")
        values.update((name, fraction(value)) for name, value in zip(names, captured) if name)
    return values


def fraction(value):
    """A printed figure as the number the docs compare: `97.8%` is 0.978."""
    return str(decimal.Decimal(value[:-1]) / 100) if value.endswith("%") else value


def thread_env(threads):
    """The environment that gives TensorFlow, XLA, torch and the BLAS libraries `threads` compute threads each."""
    env = {name: str(threads) for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                           "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS")}
    if threads == 1:
        env["XLA_FLAGS"] = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
    return env


def run(name, job, backend, logs, timeout, again=False):
    """Run `job` on `backend` in an empty folder; its log goes to `logs`; returns (figures, seconds).

    A backend `tensorflow@4` is the backend run with 4 compute threads (`thread_env`); a plain one takes what the
    libraries choose (every core)."""
    python = sys.executable
    command = job.command.format(python=shlex.quote(python), root=shlex.quote(ROOT + os.sep))
    keras_backend, _, threads = backend.partition("@")
    env = {**os.environ, "KERAS_BACKEND": keras_backend, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "PATH": os.path.dirname(python) + os.pathsep + os.environ.get("PATH", ""),   # the keras-vit command
           **(thread_env(int(threads)) if threads else {})}
    env.pop("KERAS_VIT_GUIDE_SMOKE", None)
    if job.smoke:
        env["KERAS_VIT_GUIDE_SMOKE"] = "1"
    log = os.path.join(logs, f"{name}-{backend}{'-again' if again else ''}.log")
    print(f"{name} on {backend}: {shown_command(job)} (log: {log})", flush=True)
    start = time.time()
    with tempfile.TemporaryDirectory() as folder, open(log, "w") as file:
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=folder, env=env, stdout=file,
                              stderr=subprocess.STDOUT, timeout=timeout)
    seconds = round(time.time() - start)
    if done.returncode:
        raise SystemExit(f"{name} on {backend} failed (status {done.returncode}): see {log}")
    with open(log, "a") as file:
        file.write(f"{SECONDS_LINE}{seconds}\n")
    return read_log(job, log)


def shown_command(job):
    """The command as a reader runs it from the repository's root."""
    return ("KERAS_VIT_GUIDE_SMOKE=1 " if job.smoke else "") + job.command.format(python="python", root="")


SECONDS_LINE = "# check_figures: seconds "


def read_log(job, log):
    """(figures, seconds) from a log `run` wrote."""
    output = open(log).read()
    seconds = re.search(rf"^{SECONDS_LINE}(\d+)$", output, re.MULTILINE)
    return read_figures(job, output), seconds and int(seconds.group(1))


def main(arguments=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("jobs", nargs="*", help=f"the jobs to run or read ('all': every one): {', '.join(JOBS)}")
    parser.add_argument("--run", action="store_true", help="run the jobs (full size: minutes each) and compare")
    parser.add_argument("--backend", help="run only on this backend (of those the job names)")
    parser.add_argument("--from-logs", metavar="DIR", help="read the logs an earlier --run wrote instead of running")
    parser.add_argument("--logs", default=None, help="where --run writes its logs (default: a new temporary folder)")
    parser.add_argument("--record", action="store_true", help="record the figures measured in docs/figures.json")
    parser.add_argument("--timeout", type=int, default=3600, help="seconds each run may take")
    parser.add_argument("--twice", action="store_true",
                        help="run each job twice: a figure that differs between the runs is not reproducible (seed it)")
    options = parser.parse_args(arguments)

    record = load_record()
    chosen = list(JOBS) if options.jobs == ["all"] else options.jobs
    if bool(chosen) != bool(options.run or options.from_logs):
        raise SystemExit("name the jobs with --run or --from-logs DIR (or neither, to check the docs against the record)")
    unknown = [name for name in chosen if name not in JOBS]
    if unknown:
        raise SystemExit(f"unknown jobs {unknown}: choose from {', '.join(JOBS)}")
    logs = options.from_logs or options.logs or tempfile.mkdtemp(prefix="figures-")
    os.makedirs(logs, exist_ok=True)
    date, unstable = datetime.date.today().isoformat(), []
    for name in chosen:
        job = JOBS[name]
        for backend in [options.backend] if options.backend else job.backends:
            if backend not in job.backends:
                raise SystemExit(f"{name} runs on {', '.join(job.backends)}, not {backend}")
            if options.from_logs:
                log = os.path.join(logs, f"{name}-{backend}.log")
                figures, seconds = read_log(job, log)
                date = datetime.date.fromtimestamp(os.path.getmtime(log)).isoformat()
            else:
                figures, seconds = run(name, job, backend, logs, options.timeout)
                if options.twice:
                    again, _ = run(name, job, backend, logs, options.timeout, again=True)
                    unstable += [f"{name}.{short} printed {value}, then {again[short]} ({backend}): not reproducible"
                                 for short, value in figures.items() if again[short] != value]
            for short, value in figures.items():
                figure = f"{name}.{short}"
                print(f"figure {figure} {value} ({backend})")
                record["figures"].setdefault(figure, {"job": name, "measured": {}})["measured"][backend] = value
            runs = record["jobs"].setdefault(name, {"runs": {}})
            runs["command"] = shown_command(job) + "   # KERAS_BACKEND=each run's key (@N: N compute threads)"
            runs["runs"][backend] = {"date": date, "seconds": seconds, "machine": machine()}
    found = unstable + problems(record)
    print("\n".join(found) if found else "every marked figure agrees with the measured runs")
    if options.record and chosen and not unstable:
        with open(RECORD, "w") as file:
            json.dump(record, file, indent=1, sort_keys=True)
            file.write("\n")
        print(f"recorded in {os.path.relpath(RECORD)}")
    return 1 if found else 0


def machine():
    """The CPU the figures came from: TensorFlow's oneDNN and XLA pick kernels by it, and so the last digits."""
    model = re.search(r"^model name\s*: (.+)$", open("/proc/cpuinfo").read(), re.MULTILINE) \
        if os.path.exists("/proc/cpuinfo") else None
    return f"{os.cpu_count()} CPU cores" + (f", {model.group(1)}" if model else "")


if __name__ == "__main__":
    sys.exit(main())
