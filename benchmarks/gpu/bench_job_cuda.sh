#!/usr/bin/env bash
# The benchmark Job on one lent GPU, end to end, in one call with no network (issue 34):
# the compute fit, the GPU validate (training-sized unseen released architectures at 4-16 k
# tokens, predicted by the document and by the datasheet priors side by side), and the checks.
#
#   bash benchmarks/gpu/bench_job_cuda.sh [--device cuda|cpu] [--scale full|small]
#        [--configs N] [--budget-s S]
#
# On the lent machine (from the repository root, the machine's own python3 with torch 2.11):
#   run(command="bash benchmarks/gpu/bench_job_cuda.sh", carry=[".whl"], timeout_s=540)
# Before that, here (pip works here, not there; the device README's recipe, Python 3.12):
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#       --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
#       --platform manylinux2014_x86_64 -d .whl -r benchmarks/gpu/wheels.txt
# A CPU dry run of the same path, up to the CUDA calls (minutes, this machine's venv):
#   OUT=/tmp/gpu-dry PYTHON=.venv/bin/python bash benchmarks/gpu/bench_job_cuda.sh \
#       --device cpu --scale small
#
# Writes to $OUT (at most 8 files, flat): env.txt, coefficients.json, fit.txt, bench.log,
# validation.json, validation.md, summary.txt. The bench run is cut at --budget-s (default
# 420 s) so the whole call stays under 8 minutes; the summary then says how far it got and
# what the default run would take. Exit status: 0 every check passed, 1 a check failed (or the
# run was cut), 2 setup failed.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
OUT="${OUT:-$(mktemp -d)}"
PY="${PYTHON:-python3}"
DEVICE=cuda
SCALE=full
CONFIGS=""
BUDGET_S=420
while [ $# -gt 0 ]; do
    case "$1" in
        --device) DEVICE="$2"; shift 2 ;;
        --scale) SCALE="$2"; shift 2 ;;
        --configs) CONFIGS="$2"; shift 2 ;;
        --budget-s) BUDGET_S="$2"; shift 2 ;;
        *) echo "bench_job_cuda: unknown argument $1" >&2; exit 2 ;;
    esac
done
mkdir -p "$OUT"
log() { printf '[bench_job_cuda] %s\n' "$*" >&2; }
started=$(date +%s)

# 1. carried wheels, no network (device README): installed beside the machine's packages
SITE="${TMPDIR:-/tmp}/shardmeter-site"
if compgen -G "$ROOT/.whl/*.whl" > /dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" "$ROOT"/.whl/*.whl || { log "installing the carried wheels failed"; exit 2; }
fi
export PYTHONPATH="$ROOT:$ROOT/bench-job:$SITE${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

# 2. what the machine is
{
    "$PY" - "$DEVICE" <<'PYENV'
import platform, sys
import torch
print(f"python {platform.python_version()}  torch {torch.__version__}  cuda {torch.version.cuda}")
if sys.argv[1] == "cuda":
    if not torch.cuda.is_available():
        sys.exit("--device cuda: torch sees no GPU")
    p = torch.cuda.get_device_properties(0)
    print(f"gpu {p.name}  {p.multi_processor_count} SMs  {p.total_memory / 2**30:.1f} GiB")
import pydantic, structlog, shardmeter, shardmeter_bench  # noqa: F401  (carried or installed)
from shardmeter_bench.compute import titan_block
print("torchtitan block:", titan_block.unavailable() or "importable")
PYENV
} > "$OUT/env.txt" 2>&1 || { cat "$OUT/env.txt" >&2; log "setup failed"; exit 2; }
if command -v nvidia-smi > /dev/null; then
    nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv \
        >> "$OUT/env.txt" 2>&1
fi
cat "$OUT/env.txt" >&2

# 3. measure, fit, validate: one process, as the operator's Job runs it (one GPU: no
#    collectives, whose fits stay datasheet priors; the document's notes say so)
args=(validate --device "$DEVICE" --scale "$SCALE" --repeats 3 --ranks 1 --block auto
      --out "$OUT/coefficients.json" --report-dir "$OUT" --log-format json)
[ -n "$CONFIGS" ] && args+=(--configs "$CONFIGS")
log "shardmeter_bench ${args[*]} (cut at ${BUDGET_S} s)"
bench_started=$(date +%s)
timeout --signal=INT "$BUDGET_S" "$PY" -m shardmeter_bench "${args[@]}" \
    2> "$OUT/bench.log" > "$OUT/fit.txt"
status=$?
bench_s=$(( $(date +%s) - bench_started ))
log "bench exit $status after ${bench_s} s"

# 4. priors vs document, the checks, the time estimate
"$PY" "$ROOT/benchmarks/gpu/summarize_run.py" "$OUT" --bench-exit "$status" \
    --bench-seconds "$bench_s" --budget-s "$BUDGET_S" | tee "$OUT/summary.txt"
checks=${PIPESTATUS[0]}
log "done in $(( $(date +%s) - started )) s; files in $OUT"
exit "$checks"
