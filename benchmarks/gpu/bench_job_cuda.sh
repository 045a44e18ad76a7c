#!/usr/bin/env bash
# The bench Job's CUDA path on one GPU (issue 26), prepared to run as one short command on a
# machine with an NVIDIA GPU — it has NOT been run yet: no GPU was available when it was written.
#
#   bash benchmarks/gpu/bench_job_cuda.sh            # from the repository root; writes to $OUT
#
# 1. installs what the bench image installs (Dockerfile, target `bench`): the project with the
#    `bench` extra and torchtitan 0.3.0 around the machine's own CUDA torch (pinned by a
#    constraint so pip never swaps it), or torch 2.11 (the image's base) when none is there;
# 2. runs `shardmeter_bench all --device cuda --scale small` (collectives need two ranks: on
#    one GPU `compute` runs instead and the collectives stay datasheet priors — the document's
#    notes say so);
# 3. checks the published document: source measured, every compute target fitted from
#    measured samples, leave-one-model-out MAPE ≤ 15 % per target;
# 4. validates unseen shapes: `shardmeter_bench validate --coefficients` (eight unseen
#    Hugging Face Llama architectures and the preset models, forward and backward), goal
#    median ≤ 10 %, max ≤ 20 % (DESIGN §7); figures land in $OUT/validation.
# Exit status: 0 all checks passed, 1 a check failed, 2 setup failed. Minutes on an H100.
set -euo pipefail
OUT="${OUT:-$(mktemp -d)}"
PY="${PYTHON:-python3}"
TORCHTITAN_VERSION=0.3.0
TORCH_FALLBACK=2.11.0
mkdir -p "$OUT"
log() { printf '[bench_job_cuda] %s\n' "$*" >&2; }

nvidia-smi --query-gpu=name,memory.total,power.limit,clocks.max.sm --format=csv \
    | tee "$OUT/nvidia-smi.csv" || { log "no NVIDIA GPU here"; exit 2; }

log "installing (torch kept if present)"
"$PY" -m venv "$OUT/venv" --system-site-packages
VPY="$OUT/venv/bin/python"
if "$VPY" -c 'import torch, sys; sys.exit(0 if torch.version.cuda else 1)' 2>/dev/null; then
    "$VPY" -c 'import torch; print(f"torch=={torch.__version__}")' > "$OUT/torch-constraint.txt"
else
    echo "torch==${TORCH_FALLBACK}" > "$OUT/torch-constraint.txt"
fi
"$VPY" -m pip install --quiet --constraint "$OUT/torch-constraint.txt" ".[bench]" \
    "torchtitan==${TORCHTITAN_VERSION}" || { log "install failed"; exit 2; }
"$VPY" -c "import torch; assert torch.cuda.is_available(), 'CUDA torch cannot see a GPU'"
"$VPY" -c "import shardmeter_bench, torchft, shardmeter_torchtitan.config_registry"

GPUS="$("$VPY" -c 'import torch; print(torch.cuda.device_count())')"
MODE=all
if [ "$GPUS" -lt 2 ]; then MODE=compute; log "one GPU: collectives skipped (priors)"; fi
log "shardmeter_bench $MODE --device cuda --scale small"
timeout 900 "$VPY" -m shardmeter_bench "$MODE" --device cuda --scale small --ranks "$GPUS" \
    --out "$OUT/coefficients.json" --log-format json 2> "$OUT/bench.log" | tee "$OUT/fit.txt"

log "checking the published document"
"$VPY" - "$OUT/coefficients.json" <<'PYCHECK' | tee "$OUT/document-check.txt"
import json, sys
doc = json.load(open(sys.argv[1]))
problems = []
if doc.get("source") != "measured":
    problems.append(f"source is {doc.get('source')!r}, not 'measured'")
compute = doc.get("compute") or {}
if not compute:
    problems.append("no compute coefficients")
for target, fit in sorted(compute.items()):
    n = fit.get("n_samples", 0)
    mape = fit.get("leave_one_model_out_mape") or fit.get("cv_mape")
    print(f"{target:<20} samples {n:>4}  leave-one-model-out MAPE {mape}")
    if not n:
        problems.append(f"{target}: no measured samples (prior fallback)")
    elif mape is not None and mape > 0.15:
        problems.append(f"{target}: MAPE {mape:.1%} > 15 %")
print("document:", "OK" if not problems else "; ".join(problems))
sys.exit(1 if problems else 0)
PYCHECK

log "validating unseen shapes against the fit"
timeout 900 "$VPY" -m shardmeter_bench validate --device cuda --scale small --ranks "$GPUS" \
    --coefficients "$OUT/coefficients.json" --report-dir "$OUT/validation" \
    --log-format json 2> "$OUT/validate.log" | tee "$OUT/validate.txt"
"$VPY" - "$OUT/validation/validation.json" <<'PYCHECK'
import json, sys
unseen = json.load(open(sys.argv[1])).get("unseen")
if not unseen:
    print("validation: no unseen architecture was measured"); sys.exit(1)
for phase in ("fwd", "bwd"):
    print(f"{phase}: n={len(unseen['points'])} median {unseen[f'{phase}_median']:.1%} "
          f"max {unseen[f'{phase}_max']:.1%}")
print("unseen shapes:", "goal met" if unseen["meets_goal"] else "goal NOT met")
sys.exit(0 if unseen["meets_goal"] else 1)
PYCHECK
log "all checks passed; files in $OUT"
