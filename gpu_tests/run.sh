#!/usr/bin/env bash
# The GPU check, in one go, on a machine with a CUDA GPU and torch, JAX and CuPy installed
# (no network needed): environment report, offline editable install, the CUDA test suite,
# the GPU pipeline example, and the GPU benchmark when there is one.
#
#   bash gpu_tests/run.sh            # from anywhere; PYTHON=... picks the interpreter
#
# With $OUT set, the JUnit XML and the logs are written there. The exit status is the
# first failing step's (pytest, then the example, then the benchmark); every step runs.
set -uo pipefail
cd "$(dirname "$0")/.."

PY="${PYTHON:-}"
if [ -z "$PY" ]; then
    if command -v python >/dev/null 2>&1; then PY=python; else PY=python3; fi
fi
export PYTHONUNBUFFERED=1
export XLA_PYTHON_CLIENT_PREALLOCATE="${XLA_PYTHON_CLIENT_PREALLOCATE:-false}"
OUTDIR="${OUT:-}"
status=0
note() { printf '\n==== %s\n' "$*"; }
keep() { [ "$status" -ne 0 ] || status="$1"; }

note "machine"
nvidia-smi -L 2>&1 || echo "nvidia-smi: not available"
"$PY" - <<'EOF'
import importlib, platform
print(f"python {platform.python_version()} ({platform.machine()})")
for name in ("torch", "jax", "jaxlib", "cupy", "numpy", "ml_dtypes"):
    try:
        m = importlib.import_module(name)
    except Exception as exc:  # report, do not stop: the suite says what it skips
        print(f"{name:10} not importable: {type(exc).__name__}: {exc}")
        continue
    extra = ""
    if name == "torch":
        extra = f" CUDA {m.version.cuda}, cuda available: {m.cuda.is_available()}"
    elif name == "jax":
        try:
            extra = f" devices: {m.devices()}"
        except Exception as exc:
            extra = f" devices: error {exc}"
    elif name == "cupy":
        try:
            extra = (f" CUDA runtime {m.cuda.runtime.runtimeGetVersion()}, "
                     f"{m.cuda.runtime.getDeviceCount()} device(s)")
        except Exception as exc:
            extra = f" CUDA: error {exc}"
    print(f"{name:10} {getattr(m, '__version__', '?')}{extra}")
EOF

note "install (offline, editable)"
if ! "$PY" -m pip install -q --no-deps --no-build-isolation -e .; then
    echo "pip install failed"
    exit 2
fi

note "pytest gpu_tests"
junit=()
if [ -n "$OUTDIR" ]; then
    mkdir -p "$OUTDIR"
    junit=(--junitxml "$OUTDIR/gpu_tests.xml")
fi
# One process on the one GPU, and no -n from pyproject's addopts: the GPU machine may not
# have pytest-xdist, and pytest refuses an option no installed plugin defines.
"$PY" -m pytest gpu_tests -o addopts="-ra --strict-markers" -q -rs --durations=15 \
    ${junit[@]+"${junit[@]}"} 2>&1 \
    | { if [ -n "$OUTDIR" ]; then tee "$OUTDIR/gpu_tests.log"; else cat; fi; }
keep "${PIPESTATUS[0]}"

note "examples/gpu_pipeline.py"
"$PY" examples/gpu_pipeline.py 2>&1 \
    | { if [ -n "$OUTDIR" ]; then tee "$OUTDIR/gpu_pipeline.log"; else cat; fi; }
keep "${PIPESTATUS[0]}"

if [ -f benchmarks/gpu_bench.py ]; then
    note "benchmarks/gpu_bench.py"
    "$PY" -m benchmarks.gpu_bench 2>&1 \
        | { if [ -n "$OUTDIR" ]; then tee "$OUTDIR/gpu_bench.log"; else cat; fi; }
    keep "${PIPESTATUS[0]}"
else
    note "benchmarks/gpu_bench.py: not present, skipped"
fi

note "done: exit status $status"
exit "$status"
