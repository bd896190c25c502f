"""Hardware counters of the attention kernels, from Nsight Compute: why each kernel takes its time.

    python benchmarks/profile_attention_kernels.py --json OUT/attention_profile.json   # a GPU host with ncu

`bench_attention.py` says how long the `triton` backend takes; this says why. It runs one forward
and backward of the `triton` backend at the attention issue's shape (B16 H12 T=S=1024 D64 bf16,
the (H, 32) bucket table's gradient included) under ``ncu`` with the sections that say what bounds
a kernel, one ncu run per condition in this order (those that do not fit ``--timeout`` are
skipped): attention dropout 0; the bias read as whole tiles (``triton-tiles``: BIAS_LAYOUT =
"tiles", whose bytes per tile through shared memory and L1 the SpeedOfLight and stall counters
test: 16-byte copies instead of the rows' 4-byte gather); the bias-free flash call at the same shape (PyTorch's or the flash-attn package's
FlashAttention kernels: what a tuned kernel's counters look like); dropout 0.1; one loop per kernel
(``triton-one-loop``: triton_rpe_attention.FAR_LOOPS = "none", where the triton rows' dK/dV and dQ
kernels walk their far tiles in a loop of their own, the default since 2026-11-27). For each kernel
it prints:

- ``us``: its duration under ncu (one launch, replayed once per counter pass with the caches
  flushed in between: a cold-cache time for the breakdown, not a speed figure);
- ``SM%``: ncu's compute throughput (the busiest SM unit, % of its peak);
- ``issue%``: issue slots busy (above ~80% the instructions themselves bound the kernel, which
  is what `compile_triton_rpe.py`'s instructions per element predict);
- ``tensor%``: the tensor pipe's busy cycles (% of peak; the largest of ncu's tensor-pipe metrics);
- ``occ%``: warps resident, % of the SM's maximum (achieved occupancy);
- ``cyc/iss``: cycles between two instructions of one warp, and the largest stall reasons
  (ncu's breakdown of those cycles: ``long_scoreboard`` = waiting for global memory,
  ``short_scoreboard`` = shared memory or special functions such as exp2, ``barrier``,
  ``wait`` = fixed latency, ``math_pipe_throttle``, ``mio_throttle``, ``selected`` = issuing...);
- ``bound by``: a first reading of those (`bound`): the tensor pipe or instruction issue when
  70%+ busy, else latency and its largest stall reason.

The JSON (embedded by `scripts/gpu_check.sh` in figures.json as ``attention_profile``) has every
counter of those sections per kernel and the hottest SASS instructions of each (warp-state samples
per instruction, from ncu's source page): what the next change to a kernel should address.

ncu reads the counters only where the driver lets it (the Firecracker machines of this workplace,
not gVisor: /work/.library/device/KINDS.md); elsewhere the script stops after the first condition
with ncu's own error (`NO_COUNTERS`), the others listed as skipped. ``--clock-control none`` leaves
the clocks as they are. ``--timeout`` bounds the whole script, the reading of each report included
(the JSON is written after every condition). The JSON records the triton backend's settings of the
run (``triton``: FAR_LOOPS, BACKWARD, DROPOUT_MASK, its default tiles), since ``triton p0`` means
what they are. Exit status: 0 when every kernel was profiled, 124 when ``--timeout`` cut or skipped
a condition (timeout(1)'s status: ``scripts/gpu_check.sh`` reruns it in a resumed call), 1 when a
profiled run failed or some kernel is missing, 2 when there is no ncu.
"""
import argparse
import csv
import glob
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# the sections whose counters say what bounds a kernel (ncu --list-sections): throughput against the
# peaks (memory's included), the pipes' use, occupancy and its limits, the schedulers' issue, the stall
# breakdown, and the per-instruction samples of the source page; few enough that each kernel replays
# in a few dozen passes
SECTIONS = ("SpeedOfLight", "ComputeWorkloadAnalysis", "Occupancy", "LaunchStats", "SchedulerStats",
            "WarpStateStats", "SourceCounters")
# the triton backend's three kernels and the flash kernels; PyTorch's small kernels around them are not profiled
KERNEL_FILTER = "regex:_fwd_kernel|_bwd_dkdv_kernel|_bwd_dq_kernel|flash"
# in order of need: one ncu run each, so that a run cut short keeps what came before
CONDITIONS = (("triton", 0.0), ("triton-tiles", 0.0), ("flash-nobias", 0.0), ("triton", 0.1), ("triton-one-loop", 0.0))
STALL = re.compile(r"^smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio$")
TENSOR = re.compile(r"^sm__(?:pipe_tensor\w*_cycles_active|inst_executed_pipe_tensor\w*)"
                    r"\.avg\.pct_of_peak_sustained_active$")
# one figure per column of the printed table: (key, raw metric names in order of preference)
PICKS = (
    ("duration_us", ("gpu__time_duration.sum",)),
    ("sm_throughput_pct", ("sm__throughput.avg.pct_of_peak_sustained_elapsed",)),
    ("issue_active_pct", ("smsp__issue_active.avg.pct_of_peak_sustained_active",
                          "sm__inst_issued.avg.pct_of_peak_sustained_active")),
    ("occupancy_pct", ("sm__warps_active.avg.pct_of_peak_sustained_active",)),
    ("cycles_per_issue", ("smsp__average_warp_latency_per_inst_issued.ratio",)),
    ("registers", ("launch__registers_per_thread",)),
    ("dram_pct", ("gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
                  "dram__throughput.avg.pct_of_peak_sustained_elapsed")),
)
TIME_UNITS = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3,
              "second": 1e6, "s": 1e6}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", default=None, help="write the counters here (atomically)")
    p.add_argument("--ncu", default=None, help="the ncu executable (default: $NCU, then PATH, then "
                                               "/opt/nvidia/nsight-compute/*/ncu, /usr/local/cuda/bin/ncu)")
    p.add_argument("--length", type=int, default=1024, help="T = S")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--hot", type=int, default=40, help="hottest SASS instructions kept per kernel")
    p.add_argument("--timeout", type=int, default=240,
                   help="seconds for all the profiled runs (one per condition; those that do not fit are skipped)")
    p.add_argument("--workload", type=int, default=None, help=argparse.SUPPRESS)  # the process ncu profiles
    return p.parse_args(argv)


def find_ncu(explicit: Optional[str] = None) -> Optional[str]:
    for candidate in (explicit, os.environ.get("NCU")):
        if candidate:
            return candidate if os.access(candidate, os.X_OK) else None
    found = shutil.which("ncu")
    if found:
        return found
    for pattern in ("/opt/nvidia/nsight-compute/*/ncu", "/usr/local/cuda/bin/ncu", "/usr/local/cuda-*/bin/ncu"):
        hits = sorted(glob.glob(pattern))
        if hits:
            return hits[-1]
    return None


def workload(args) -> int:
    """The profiled process of condition ``args.workload`` (an index into CONDITIONS): warmed up
    (compiled), then once between cudaProfilerStart and cudaProfilerStop (ncu runs with
    --profile-from-start off)."""
    import torch

    if not torch.cuda.is_available():
        print("profile_attention_kernels: no CUDA device", file=sys.stderr)
        return 2
    import bench_attention as bench

    shape = argparse.Namespace(batch=args.batch, heads=args.heads, head_dim=args.head_dim)
    device = torch.device("cuda")
    q, k, v, pad, table, grad_out = bench.make_case(shape, args.length, False, torch.bfloat16, device)
    name, dropout = CONDITIONS[args.workload]
    fn = bench.step_fn(name, q, k, v, pad, table, grad_out, dropout, backward=True)
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()  # less device memory for ncu to save and restore around each replay
    torch.cuda.cudart().cudaProfilerStart()
    fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    return 0


def _number(text: str) -> Optional[float]:
    try:
        return float(text.replace(",", "").strip())
    except (AttributeError, ValueError):
        return None


def _csv_rows(text: str) -> List[List[str]]:
    """The CSV rows of ncu's output, its own ==PROF== / ==WARNING== lines left out."""
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("==")]
    return list(csv.reader(io.StringIO("\n".join(lines))))


def parse_results(text: str) -> List[Dict]:
    """Profiled kernels from ``ncu --import REPORT --csv --page raw`` (one row per kernel, one column
    per metric, a row of units under the header) or from the long form (one row per metric:
    "Metric Name", "Metric Unit", "Metric Value"), in launch order: [{"id", "kernel", "metrics":
    {name: (value, unit)}}]. Values are floats where they read as numbers, else strings."""
    rows = _csv_rows(text)
    header_at = next((i for i, row in enumerate(rows) if "ID" in row and "Kernel Name" in row), None)
    if header_at is None:
        return []
    header = rows[header_at]
    col = {name: i for i, name in enumerate(header)}
    results: Dict[str, Dict] = {}
    body = rows[header_at + 1:]
    if "Metric Name" in col and "Metric Value" in col:  # the long form
        for row in body:
            if len(row) != len(header):
                continue
            rid = row[col["ID"]]
            result = results.setdefault(rid, {"id": rid, "kernel": row[col["Kernel Name"]], "metrics": {}})
            value = row[col["Metric Value"]]
            unit = row[col["Metric Unit"]] if "Metric Unit" in col else ""
            number = _number(value)
            result["metrics"][row[col["Metric Name"]]] = (value if number is None else number, unit)
    else:
        units = [""] * len(header)
        for row in body:
            if len(row) != len(header):
                continue
            if not row[col["ID"]].strip():  # the units row
                units = row
                continue
            metrics = {}
            for i, name in enumerate(header):
                number = _number(row[i])
                metrics[name] = (row[i] if number is None else number, units[i])
            results[row[col["ID"]]] = {"id": row[col["ID"]], "kernel": row[col["Kernel Name"]], "metrics": metrics}
    return sorted(results.values(), key=lambda r: _number(r["id"]) if _number(r["id"]) is not None else 0)


def kernel_kind(name: str) -> str:
    """A short name: forward, dK/dV, dQ for the triton kernels; the flash kernels' own, shortened
    (their function name, or for a kernel called device_kernel<...> its first flash:: argument)."""
    plain = re.sub(r"^void\s+", "", name)
    for prefix, kind in (("_fwd_kernel", "forward"), ("_bwd_dkdv_kernel", "dK/dV"), ("_bwd_dq_kernel", "dQ")):
        if plain.startswith(prefix):
            return kind
    short = re.sub(r"[<(].*", "", plain).split("::")[-1]
    inner = re.search(r"flash::(\w*(?:Fwd|Bwd|fwd|bwd)\w*)", plain) or re.search(r"flash::(\w+)", plain)
    if short == "device_kernel" and inner:
        short = inner.group(1)
    return short[:40]


def label_results(results: List[Dict], conditions=CONDITIONS) -> List[Dict]:
    """Each result's condition, in launch order: every condition starts with its forward kernel (the
    only one whose name holds "fwd" and not "bwd"). Kernels before the first forward, or after more
    forwards than conditions, are labelled "unknown"."""
    index = -1
    for result in results:
        name = result["kernel"]
        if "fwd" in name.lower() and "bwd" not in name.lower():
            index += 1
        backend = None
        if 0 <= index < len(conditions):
            backend, dropout = conditions[index]
            result["condition"] = f"{backend} p{dropout:g}"
        else:
            result["condition"] = "unknown"
        result["kind"] = kernel_kind(name)
    return results


def summarize(result: Dict) -> Dict:
    """The table's figures of one kernel, its stall breakdown (cycles per issued instruction, largest
    first) and its tensor-pipe metrics."""
    metrics = result["metrics"]
    out = {"condition": result.get("condition"), "kind": result.get("kind"), "kernel": result["kernel"]}
    for key, names in PICKS:
        for name in names:
            if name in metrics and isinstance(metrics[name][0], float):
                value, unit = metrics[name]
                if key == "duration_us":
                    value *= TIME_UNITS.get(unit.strip().lower(), 1e-3 if not unit else float("nan"))
                out[key] = value
                break
        else:
            out[key] = None
    tensor = {name: v for name, (v, _) in metrics.items() if TENSOR.match(name) and isinstance(v, float)}
    out["tensor_pipes_pct"] = tensor
    out["tensor_pct"] = max(tensor.values()) if tensor else None
    stalls = {STALL.match(name).group(1): v for name, (v, _) in metrics.items()
              if STALL.match(name) and isinstance(v, float)}
    out["stalls"] = dict(sorted(stalls.items(), key=lambda kv: -kv[1]))
    out["bound"] = bound(out)
    return out


def bound(kernel: Dict) -> str:
    """A first reading of what limits a kernel: the tensor pipe (70%+ busy), issuing instructions
    (70%+ of issue slots busy), else latency, named by its largest stall reason other than issuing
    itself ("selected")."""
    if (kernel.get("tensor_pct") or 0) >= 70:
        return "tensor pipe"
    if (kernel.get("issue_active_pct") or 0) >= 70:
        return "instruction issue"
    waits = [name for name in kernel.get("stalls", {}) if name not in ("selected", "not_selected")]
    return f"latency ({waits[0]})" if waits else "unknown"


def hot_instructions(text: str, top: int) -> List[Dict]:
    """From ``ncu --import REPORT --page source --csv --print-source sass``: per block of rows under
    a header (one per kernel, in launch order), the ``top`` instructions with the most warp-state
    samples, with every column that holds a number (the stall reasons' samples among them). A block
    whose header has no sampling column keeps its first rows instead, so its columns can be read."""
    blocks, header, rows = [], None, []

    def close():
        if header is None:
            return
        sample_cols = [i for i, name in enumerate(header) if "Sampling" in name and "All" in name] or \
                      [i for i, name in enumerate(header) if "Sampling" in name]
        keyed = []
        for row in rows:
            entry = {"source": row[header.index("Source")] if "Source" in header else row[min(1, len(row) - 1)]}
            for i, name in enumerate(header):
                number = _number(row[i])
                if number is not None and number != 0:
                    entry[name] = number
            keyed.append((_number(row[sample_cols[0]]) or 0.0 if sample_cols else 0.0, entry))
        if sample_cols:
            keyed.sort(key=lambda kv: -kv[0])
        blocks.append({"columns": header, "instructions": [e for _, e in keyed[:top]]})

    for row in _csv_rows(text):
        if "Source" in row and ("Address" in row or any("Sampling" in c for c in row)):
            close()
            header, rows = row, []
        elif header is not None and len(row) == len(header):
            rows.append(row)
    close()
    return blocks


def print_table(kernels: List[Dict]) -> None:
    def f(value, fmt):
        return "-" if value is None else format(value, fmt)

    print(f"{'condition':<16} {'kernel':<26} {'us':>8} {'SM%':>5} {'issue%':>6} {'tensor%':>7} {'occ%':>5} "
          f"{'regs':>4} {'cyc/iss':>7}  {'bound by':<28} largest stalls (cycles per issued instruction)")
    for k in kernels:
        stalls = ", ".join(f"{name} {value:.2f}" for name, value in list(k["stalls"].items())[:5])
        print(f"{k['condition']:<16} {k['kind']:<26} {f(k['duration_us'], '8.1f')} {f(k['sm_throughput_pct'], '5.1f')} "
              f"{f(k['issue_active_pct'], '6.1f')} {f(k['tensor_pct'], '7.1f')} {f(k['occupancy_pct'], '5.1f')} "
              f"{f(k['registers'], '4.0f')} {f(k['cycles_per_issue'], '7.2f')}  {k['bound']:<28} {stalls}", flush=True)


def write_json(path: str, payload: Dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(payload, fh, indent=1)
    os.replace(tmp, path)


IMPORT_TIMEOUT = 120  # seconds at most for each reading of a report (`ncu --import`)
IMPORT_RESERVE = 20  # seconds of a condition's time kept for reading its report
# ncu's errors when it cannot read the counters at all on this machine: no later condition would either
NO_COUNTERS = ("ERR_NVGPUCTRPERM", "LibraryNotLoaded")


def run_bounded(cmd, timeout: float):
    """``cmd`` with its output captured, stopped after ``timeout`` seconds together with every process it
    started (its own session: ncu's profiled Python, which a plain timeout leaves running on the GPU,
    holding memory and disturbing the next step's timings): a CompletedProcess, or None when stopped."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:  # a process outside the group holding the pipes must not hang us
            proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        return None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def profile_condition(ncu: str, index: int, args, timeout: float, match_base, print_base, tmp) -> Dict:
    """One ncu run of condition ``index`` and the reading of its report, within about ``timeout`` seconds:
    {"kernels": [...], "all_metrics": [...]} or {"error": ...}, with "cut": True when the time ran out."""
    deadline = time.time() + timeout
    report = os.path.join(tmp, f"attention-{index}")
    cmd = [ncu, "--profile-from-start", "off", "--clock-control", "none", *match_base,
           "--kernel-name", KERNEL_FILTER, "--export", report, "--force-overwrite"]
    for section in SECTIONS:
        cmd += ["--section", section]
    cmd += [sys.executable, os.path.abspath(__file__), "--workload", str(index), "--length", str(args.length),
            "--batch", str(args.batch), "--heads", str(args.heads), "--head-dim", str(args.head_dim)]
    print("profile_attention_kernels:", " ".join(cmd), flush=True)
    run_timeout = max(5.0, timeout - IMPORT_RESERVE)
    run = run_bounded(cmd, run_timeout)
    log = "" if run is None else run.stdout + run.stderr
    if run is None or run.returncode != 0 or not os.path.exists(report + ".ncu-rep"):
        why = f"timed out after {run_timeout:.0f} s" if run is None else f"exit {run.returncode}"
        errors = [line for line in log.splitlines() if "ERROR" in line][-3:]
        return {"error": f"the profiled run failed ({why}): " + (" | ".join(errors) or log[-300:]),
                "ncu_log_tail": log[-4000:], "cut": run is None}
    empty = subprocess.CompletedProcess([], None, "", "timed out")

    def read(page, *extra):  # what is left of the condition's time (IMPORT_RESERVE at least), within bounds
        left = max(5.0, min(IMPORT_TIMEOUT, deadline - time.time()))
        return run_bounded([ncu, "--import", report + ".ncu-rep", *print_base, "--page", page, "--csv", *extra],
                           left) or empty
    raw = read("raw")
    source = read("source", "--print-source", "sass")
    results = label_results(parse_results(raw.stdout), conditions=CONDITIONS[index:index + 1])
    out = {"kernels": [summarize(r) for r in results],
           "all_metrics": [{"condition": r["condition"], "kind": r["kind"],
                            "metrics": {name: v for name, (v, _) in r["metrics"].items()}} for r in results]}
    hot = hot_instructions(source.stdout, args.hot)
    if len(hot) == len(out["kernels"]):
        for kernel, block in zip(out["kernels"], hot):
            kernel["hot_instructions"] = block["instructions"]
            kernel["source_columns"] = block["columns"]
    else:
        out["source_page"] = {"blocks": hot, "note": f"{len(hot)} source blocks for {len(out['kernels'])} kernels",
                              "head": source.stdout[:20000], "stderr": source.stderr[-1000:]}
    if not results:
        out["error"] = f"no kernel in ncu's raw page ({raw.stderr.strip()[-300:] or raw.stdout[:300]})"
        out["cut"] = raw is empty
    return out


def triton_settings() -> Dict:
    """What ``triton`` means in this run: triton_rpe_attention's settings and its default tiles here."""
    try:
        import torch

        from ast_t5.modules import triton_rpe_attention as tra

        device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
        return {"FAR_LOOPS": tra.FAR_LOOPS, "BACKWARD": tra.BACKWARD, "DROPOUT_MASK": tra.DROPOUT_MASK,
                "tiles": list(tra.BLOCKS_OVERRIDE or tra.default_blocks(64, device, dtype=torch.bfloat16))}
    except Exception as e:  # noqa: BLE001 - recorded, the profile goes on
        return {"error": f"{type(e).__name__}: {e}"}


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.workload is not None:
        return workload(args)
    ncu = find_ncu(args.ncu)
    payload = {"shape": f"B{args.batch} H{args.heads} T=S={args.length} D{args.head_dim} bf16, fwd+bwd",
               "conditions": [f"{b} p{p:g}" for b, p in CONDITIONS], "sections": list(SECTIONS), "kernels": [],
               "all_metrics": [], "errors": {}}
    if ncu is None:
        message = "ncu (Nsight Compute) not found: set NCU or --ncu, or put it on the PATH"
        print(f"profile_attention_kernels: {message}", file=sys.stderr)
        payload["error"] = message
        if args.json:
            write_json(args.json, payload)
        return 2
    start = time.time()
    payload["triton"] = triton_settings()
    empty = subprocess.CompletedProcess([], None, "", "")
    version = run_bounded([ncu, "--version"], 30) or empty
    payload["ncu"] = {"path": ncu, "version": (version.stdout.strip().splitlines() or [""])[-1]}
    # match and print kernels by their whole demangled names (FlashAttention-3's kernels are all called
    # device_kernel<...>, with "flash" and "Fwd"/"Bwd" in their template arguments), and print every
    # value in its base unit (not scaled per value), where this ncu has the options (read from its
    # --help, so that an older one runs without them)
    helptext = (run_bounded([ncu, "--help"], 30) or empty).stdout
    match_base = ["--kernel-name-base", "demangled"] if "--kernel-name-base" in helptext else []
    print_base = ["--print-kernel-base", "demangled"] if "--print-kernel-base" in helptext else []
    if "--print-units" in helptext:
        print_base += ["--print-units", "base"]
    failed = cut = False
    no_counters = None
    with tempfile.TemporaryDirectory() as tmp:
        for index, (backend, dropout) in enumerate(CONDITIONS):
            label = f"{backend} p{dropout:g}"
            left = args.timeout - (time.time() - start)
            if no_counters:
                payload["errors"][label] = f"skipped: ncu cannot read the counters here ({no_counters})"
                failed = True
                continue
            if left < IMPORT_RESERVE + 20:
                payload["errors"][label] = f"skipped: {left:.0f} s of --timeout {args.timeout} s left"
                cut = True
                continue
            out = profile_condition(ncu, index, args, left, match_base, print_base, tmp)
            cut = cut or out.get("cut", False)
            no_counters = next((e for e in NO_COUNTERS if e in out.get("error", "")), None)
            payload["kernels"] += out.get("kernels", [])
            payload["all_metrics"] += out.get("all_metrics", [])
            for key in ("source_page", "ncu_log_tail"):
                if key in out:
                    payload.setdefault(key, {})[label] = out[key]
            expected = 3 if backend.startswith("triton") else 1
            found = len(out.get("kernels", []))
            if "error" in out or found < expected:
                payload["errors"][label] = out.get("error") or f"{found} kernels, {expected}+ expected"
                print(f"profile_attention_kernels: {label}: {payload['errors'][label]}", file=sys.stderr)
                failed = True
            if args.json:  # after each condition: a run cut short keeps what it measured
                write_json(args.json, payload)
    if args.json:
        write_json(args.json, payload)
    print_table(payload["kernels"])
    return 124 if cut else 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
