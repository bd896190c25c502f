#!/usr/bin/env bash
# Every GPU figure and check of this project in one call, inside 10 minutes:
#
#   bash scripts/gpu_check.sh OUTDIR
#
# On the project's GPU host (Python 3.12, CUDA torch, no package registry), from the project root:
#   source ../shared/gpu/device_env.sh && bash scripts/gpu_check.sh "$OUT"
# (carry liger-kernel for the fused cross-entropy: bash ../shared/gpu/bundle.sh liger-kernel==0.8.5)
#
# Steps, each under `timeout`, in order of value, inside one overall budget (GPU_CHECK_BUDGET_S,
# default 520 s, so that it fits a 10-minute call with the environment set-up):
#   1. build the fused_ops CUDA extension in place                        -> build.log
#   2. the CUDA tests (pytest -m cuda)                                     -> tests.log
#   3. bench_train.py --device cuda --profile (trainer vs HF, time budget,
#      host syncs per update)                                              -> bench_train.log, train.json
#   4. bench_model.py --device cuda --skip-cpu (model step, fused softmax) -> bench_model.log
#      and --norm-ffn (eager vs liger RMSNorm / gated GELU, ~30 s)          -> bench_model.log
#   5. bench_attention.py --device cuda (when the file exists)            -> attention.log, attention.json
#   6. the whole suite except the CUDA tests already run                   -> tests.log (appended)
# The steps 1-5 usually leave too little of the budget for the whole suite; a second call runs it:
#   GPU_CHECK_STEPS="build suite" bash scripts/gpu_check.sh "$OUT"
# (GPU_CHECK_STEPS: the step names to run, space-separated: build cuda_tests bench_train
# bench_model norm_ffn bench_attention suite; default all.)
# Then OUTDIR/figures.json: every step's status and time, test counts, and the benchmarks' figures.
# At most 8 files are written to OUTDIR. Exit status: 0 when every step passed, 1 otherwise,
# 2 on a usage error.
set -uo pipefail
if [ $# -ne 1 ] || [ -z "$1" ]; then
  echo "usage: bash scripts/gpu_check.sh OUTDIR" >&2
  exit 2
fi
OUTDIR=$1
mkdir -p "$OUTDIR" || { echo "gpu_check: cannot create $OUTDIR" >&2; exit 2; }
OUTDIR=$(cd "$OUTDIR" && pwd)
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
BUDGET=${GPU_CHECK_BUDGET_S:-520}
STEPS=${GPU_CHECK_STEPS:-build cuda_tests bench_train bench_model norm_ffn bench_attention suite}
for step in $STEPS; do
  case $step in
    build|cuda_tests|bench_train|bench_model|norm_ffn|bench_attention|suite) ;;
    *) echo "gpu_check: unknown step '$step' in GPU_CHECK_STEPS (build cuda_tests bench_train bench_model norm_ffn bench_attention suite)" >&2; exit 2 ;;
  esac
done
START=$(date +%s)
STATUS_FILE=$(mktemp)
trap 'rm -f "$STATUS_FILE"' EXIT

# run NAME CAP LOG CMD...: run CMD under timeout min(CAP, what is left of the budget), append its
# output to LOG, record "name rc seconds" in the status file.
run() {
  local name=$1 cap=$2 log=$3
  shift 3
  case " $STEPS " in *" $name "*) ;; *) return ;; esac
  local left=$(( BUDGET - ($(date +%s) - START) ))
  local limit=$(( cap < left ? cap : left ))
  if [ "$limit" -lt 10 ]; then
    echo "$name skipped 0" >> "$STATUS_FILE"
    echo "== $name: skipped (budget spent)" | tee -a "$OUTDIR/$log"
    return
  fi
  echo "== $name (limit ${limit}s): $*" | tee -a "$OUTDIR/$log"
  local t0=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" >> "$OUTDIR/$log" 2>&1
  local rc=$?
  echo "$name $rc $(( $(date +%s) - t0 ))" >> "$STATUS_FILE"
  echo "== $name: exit $rc after $(( $(date +%s) - t0 ))s" | tee -a "$OUTDIR/$log"
  tail -3 "$OUTDIR/$log"
}

export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
run build 120 build.log env AST_T5_BUILD_CUDA_EXT=1 "$PY" setup.py -q build_ext --inplace
run cuda_tests 150 tests.log "$PY" -m pytest -q -m cuda -rs tests
run bench_train 240 bench_train.log "$PY" benchmarks/bench_train.py --device cuda --profile --json "$OUTDIR/train.json"
run bench_model 90 bench_model.log "$PY" benchmarks/bench_model.py --device cuda --skip-cpu
run norm_ffn 45 bench_model.log "$PY" benchmarks/bench_model.py --device cuda --skip-cpu --norm-ffn --gpu-steps 5 --repeats 5
if [ -f benchmarks/bench_attention.py ]; then
  run bench_attention 90 attention.log "$PY" benchmarks/bench_attention.py --device cuda --json "$OUTDIR/attention.json"
fi
run suite 300 tests.log "$PY" -m pytest -q -m "not cuda" -rs tests

"$PY" - "$OUTDIR" "$STATUS_FILE" <<'PY'
import json, os, re, sys, time
out, status_file = sys.argv[1], sys.argv[2]
figures = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "steps": {}}
for line in open(status_file):
    name, rc, seconds = line.split()
    figures["steps"][name] = {"exit": rc if rc == "skipped" else int(rc), "seconds": int(seconds)}
try:
    import torch
    figures["device"] = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device"
    figures["torch"] = torch.__version__
except Exception as e:
    figures["device"] = f"torch failed to import: {e}"
def read(name):
    path = os.path.join(out, name)
    return open(path, encoding="utf-8", errors="replace").read() if os.path.exists(path) else ""
tests = read("tests.log")
figures["pytest_summaries"] = re.findall(r"^=*\s*(\d+ (?:passed|failed).*?)\s*=*$", tests, re.M)
figures["pytest_failures"] = re.findall(r"^FAILED (\S+)", tests, re.M)
for name in ("train.json", "attention.json"):
    text = read(name)
    if text:
        try:
            figures[name[:-5]] = json.loads(text)
        except ValueError as e:
            figures[name[:-5]] = f"unreadable: {e}"
figures["bench_model"] = [l.strip() for l in read("bench_model.log").splitlines()
                          if re.search(r"ms/step|speed-up|TFLOP", l)]
tmp = os.path.join(out, "figures.json.tmp")
with open(tmp, "w", encoding="utf-8") as f:
    json.dump(figures, f, indent=1)
os.replace(tmp, os.path.join(out, "figures.json"))
failed = [n for n, s in figures["steps"].items() if s["exit"] != 0]
print("gpu_check:", "all steps passed" if not failed else "failed or skipped: " + ", ".join(failed),
      f"({sum(s['seconds'] for s in figures['steps'].values())} s); figures in", os.path.join(out, "figures.json"))
sys.exit(1 if failed else 0)
PY
