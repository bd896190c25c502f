"""The pre-training recipe as users run it, timed: ``fairseq-hydra-train`` on a real corpus.

    python benchmarks/bench_recipe.py --device cuda                        # base + single_gpu, 200 updates
    python benchmarks/bench_recipe.py --device cuda --config ast_t5_paper_base
    python benchmarks/bench_recipe.py --device cuda --run-config single_gpu_40gb --override model.compile=false
    python benchmarks/bench_recipe.py --device cpu                         # tiny config, a few updates

What ``bench_train.py`` cannot show: the whole command (its data loading and masking in
DataLoader workers, bucketing, batching by ``max_tokens``, fairseq's loop, logging and memory
handling) at the recipe's own batch size. The corpus is the default one (this interpreter's
standard library and the bundled samples), preprocessed once into ``--work`` with a 32k
vocabulary on CUDA (15 s on 2 cores; reused by later runs), or ``--data`` for your own.

It runs ``python -m fairseq_cli.hydra_train --config-name CONFIG +run_config=RUN_CONFIG`` for
``--updates`` updates with JSON logs every ``--log-interval`` updates, no checkpoint saving and no
validation, and reads fairseq's own ``train_inner`` records: updates/s, non-pad source tokens/s
(``src_wps``) and target tokens/s (fairseq's ``wps``: our criterion's ``ntokens`` are target
tokens), samples per update, model TFLOP/s and MFU (logged by our criterion: ``ast_t5.models.flops``), and the peak memory
of the last update of each interval (the GPU's memory minus fairseq's ``gb_free``: fairseq reads the
allocator's peak and resets it after every update, and its record keeps the interval's last value; so
``peak_gib``, the largest of them, samples one update in ``--log-interval``). Steady state: the median over the records after the
first (warm-up) whose interval compiled no new graph (``model.compile`` compiles once per length
class: tens of seconds each, amortized in a long run but not in 200 updates); the count and time of
the compilations are reported beside it. The default corpus is small (about 60 updates of 131k
tokens per epoch), so epoch boundaries (new data-loader workers) fall inside some records too. Every OOM recovery fairseq logs is counted: the
recipes' target is none.

Prints one summary; ``--json`` writes every record and the summary (atomically). The trainer's
output goes to ``--log`` as it runs, so that a run killed from outside leaves what it logged. Exit
status: 0 when the run finished with no OOM recovery, 124 when ``--timeout`` stopped it (what it
logged until then is still read and written; timeout(1)'s status, so that ``scripts/gpu_check.sh``
reruns it in a resumed call), 1 otherwise.
"""
import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG_DIR = os.path.join(REPO, "config", "pretrain")
OOM_MARKERS = ("attempting to recover from OOM", "OOM during optimization", "ran out of memory in validation")
DEFAULTS = {  # device -> config, run config, updates, log interval, vocabulary of the default corpus
    "cuda": ("base", "single_gpu", 200, 20, 32000),
    "cpu": ("tiny", "", 12, 4, 2000),
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--config", default=None, help="config/pretrain/<name>.yaml (default: base on cuda, tiny on cpu)")
    p.add_argument("--run-config", default=None,
                   help="config/pretrain/run_config/<name>.yaml (default: single_gpu on cuda, none on cpu; '' for none)")
    p.add_argument("--updates", type=int, default=0, help="optimization.max_update (default: 200 cuda, 12 cpu)")
    p.add_argument("--log-interval", type=int, default=0, help="common.log_interval (default: 20 cuda, 4 cpu)")
    p.add_argument("--data", default="", help="a preprocessed corpus (default: the default corpus, made in --work)")
    p.add_argument("--work", default="", help="folder for the corpus and the run (default: a temporary one)")
    p.add_argument("--vocab-size", type=int, default=0, help="vocabulary of the default corpus (32000 cuda, 2000 cpu)")
    p.add_argument("--workers", type=int, default=0, help="preprocessing workers (default: all cores)")
    p.add_argument("--override", action="append", default=[], help="extra Hydra override (repeatable)")
    p.add_argument("--timeout", type=float, default=0.0,
                   help="seconds for the whole benchmark, the corpus's preprocessing included, after which the "
                        "run is stopped and what it logged is read (0: none)")
    p.add_argument("--log", default="", help="also write the trainer's whole output here")
    p.add_argument("--json", default="", help="write the records and the summary to this JSON file")
    args = p.parse_args(argv)
    config, run_config, updates, interval, vocab = DEFAULTS[args.device]
    args.config = args.config or config
    args.run_config = run_config if args.run_config is None else args.run_config
    args.updates = args.updates or updates
    args.log_interval = args.log_interval or interval
    args.vocab_size = args.vocab_size or vocab
    args.workers = args.workers or max(1, min(16, os.cpu_count() or 1))
    if args.updates < 2 * args.log_interval:
        p.error("--updates must be at least twice --log-interval (the first record is warm-up)")
    if not os.path.exists(os.path.join(CONFIG_DIR, args.config + ".yaml")):
        p.error(f"no config {args.config!r} in {CONFIG_DIR}")
    if args.run_config and not os.path.exists(os.path.join(CONFIG_DIR, "run_config", args.run_config + ".yaml")):
        p.error(f"no run config {args.run_config!r} in {CONFIG_DIR}/run_config")
    return args


def default_corpus(work: str, vocab_size: int, workers: int, timeout: Optional[float] = None) -> str:
    """The default corpus preprocessed into ``work``/default_<vocab> (reused when complete), within
    ``timeout`` seconds (None: no limit)."""
    out = os.path.join(work, f"default_{vocab_size}")
    if os.path.exists(os.path.join(out, "manifest.json")):
        print(f"# corpus: {out} (already preprocessed)", flush=True)
        return out
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "ast_t5_preprocess", "run", "-o", out, "--vocab-size", str(vocab_size),
           "--workers", str(workers), "--no-progress", "--overwrite"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"bench_recipe: preprocessing the default corpus took more than the {timeout:.0f} s "
                         "--timeout left") from None
    if proc.returncode != 0:
        raise SystemExit(f"bench_recipe: preprocessing the default corpus failed:\n{proc.stderr[-3000:]}")
    print(f"# corpus: the default corpus preprocessed into {out} in {time.perf_counter() - t0:.0f} s", flush=True)
    return out


def train_command(args, data: str, save_dir: str) -> List[str]:
    cmd = [sys.executable, "-m", "fairseq_cli.hydra_train", "--config-dir", CONFIG_DIR, "--config-name", args.config,
           f"task.data={data}", f"optimization.max_update={args.updates}", f"common.log_interval={args.log_interval}",
           "common.log_format=json", "checkpoint.no_save=true", "dataset.disable_validation=true",
           f"checkpoint.save_dir={save_dir}"]
    if args.run_config:
        cmd.append(f"+run_config={args.run_config}")
    if args.device == "cpu":
        cmd.append("common.cpu=true")
    return cmd + list(args.override)


COMPILE_LINE = re.compile(r"torch\.compile: new graph .* in ([0-9.]+) s \(([0-9.]+) s in all\)")


def parse_records(text: str) -> List[Dict]:
    """fairseq's JSON ``train_inner`` records from its output, values as floats where they are
    numbers, each with ``compiles``: the graphs torch.compile made since the previous record (the
    model logs each one)."""
    records = []
    compiles = 0
    for line in text.splitlines():
        if COMPILE_LINE.search(line):
            compiles += 1
            continue
        start = line.find("{")
        if "[train_inner]" not in line or start < 0:
            continue
        try:
            raw = json.loads(line[start:])
        except ValueError:
            continue
        rec = {}
        for key, value in raw.items():
            try:
                rec[key] = float(value)
            except (TypeError, ValueError):
                rec[key] = value
        rec["compiles"] = compiles
        compiles = 0
        records.append(rec)
    return records


def compile_totals(text: str):
    """(graphs compiled, seconds spent compiling) over the whole run."""
    found = COMPILE_LINE.findall(text)
    return len(found), (float(found[-1][1]) if found else 0.0)


# the model's note on a compilation's graphs found in inductor's on-disk cache (a rerun on the same
# machine, or bench_train.py after this benchmark): its seconds are then a load, not a compilation
CACHE_NOTE = re.compile(r"torch\.compile: new graph .*; inductor's cache: ([0-9]+) of ([0-9]+) graphs loaded")


def compile_cache(text: str):
    """(graphs loaded from inductor's cache, graphs looked up there) over the whole run."""
    found = [(int(hits), int(lookups)) for hits, lookups in CACHE_NOTE.findall(text)]
    return sum(h for h, _ in found), sum(n for _, n in found)


# torch's warning when a function has as many graphs as torch._dynamo.config.recompile_limit
# (older torch: cache_size_limit): from then on, inputs no graph fits run eagerly
RECOMPILE_LIMIT_LINE = re.compile(r"hit config\.(?:recompile_limit|cache_size_limit)")


def recompile_limit_hits(text: str) -> int:
    return len(RECOMPILE_LIMIT_LINE.findall(text))


# the cudnn attention backend's note per cuDNN graph it builds (one per new shape and direction)
CUDNN_GRAPH_LINE = re.compile(r"attention backend cudnn: built an? \w+ graph \(\d+ in all, ([0-9.]+) s\)")


def cudnn_graph_builds(text: str):
    """(cuDNN attention graphs built, their seconds) over the whole run: what the cudnn backend paid for the
    shapes it met."""
    seconds = [float(x) for x in CUDNN_GRAPH_LINE.findall(text)]
    return len(seconds), sum(seconds)


def count_ooms(text: str) -> int:
    return sum(text.count(marker) for marker in OOM_MARKERS)


def gpu_total_gib() -> Optional[float]:
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_properties(0).total_memory / 1024 ** 3
    except Exception:  # noqa: BLE001 - the summary then has no peak memory
        pass
    return None


def summarize(records: List[Dict], ooms: int, total_gib: Optional[float]) -> Dict:
    """Steady state: medians over the records after the first whose interval compiled no graph
    (a new length bucket compiles once, tens of seconds, which a long run amortizes); all records
    after the first when every one compiled."""
    later = records[1:]
    steady = [r for r in later if not r.get("compiles")] or later
    out: Dict = {"records": len(records), "steady_records": len(steady), "oom_recoveries": ooms,
                 "records_with_compiles": sum(1 for r in records if r.get("compiles")),
                 "last_update": int(records[-1].get("num_updates", 0)) if records else 0}

    def median(key):
        values = [r[key] for r in steady if isinstance(r.get(key), float)]
        return statistics.median(values) if values else None

    for key in ("ups", "wps", "src_wps", "wpb", "bsz", "tflops", "mfu", "loss", "gb_free"):
        out[key] = median(key)
    if total_gib is not None:
        free = [r["gb_free"] for r in records if isinstance(r.get("gb_free"), float)]
        out["gpu_gib"] = total_gib
        out["peak_gib"] = total_gib - min(free) if free else None
    return out


def format_summary(args, summary: Dict, seconds: float) -> str:
    def fmt(value, spec):
        return "n/a" if value is None else format(value, spec)

    lines = [f"# {args.config}" + (f" + {args.run_config}" if args.run_config else "") +
             f" on {args.device}: {summary['last_update']} of {args.updates} updates in {seconds:.0f} s, "
             f"steady state = median of {summary['steady_records']} records of {args.log_interval} updates "
             f"(after the first; without the {summary['records_with_compiles']} that compiled a graph "
             f"unless all did)",
             f"torch.compile: {summary.get('compiled_graphs', 0)} graphs, {summary.get('compile_seconds', 0.0):.0f} s"
             + (f" ({summary['compile_cache_hits']} of {summary['compile_cache_lookups']} inductor graphs loaded "
                "from its cache)" if summary.get("compile_cache_lookups") else "")
             + (f"; torch's recompile limit hit {summary['recompile_limit_hits']} times (later shapes ran eagerly)"
                if summary.get("recompile_limit_hits") else "")
             + (f"; cuDNN attention graphs: {summary['cudnn_graphs']} built in {summary['cudnn_graph_seconds']:.0f} s"
                if summary.get("cudnn_graphs") else ""),
             f"updates/s {fmt(summary['ups'], '.3f')}   source tokens/s {fmt(summary['src_wps'], ',.0f')}   "
             f"target tokens/s {fmt(summary['wps'], ',.0f')}   "
             f"samples/update {fmt(summary['bsz'], ',.0f')}",
             f"model TFLOP/s {fmt(summary['tflops'], '.4g')}   "
             f"MFU {'n/a (GPU peak unknown)' if summary['mfu'] is None else format(summary['mfu'], '.1f') + '%'}   "
             f"OOM recoveries {summary['oom_recoveries']}"]
    if summary.get("gpu_gib") is not None:
        lines.append(f"peak memory {fmt(summary.get('peak_gib'), '.1f')} GiB of {summary['gpu_gib']:.1f} GiB")
    return "\n".join(lines)


def run_trainer(cmd: List[str], cwd: str, log: str, timeout: Optional[float]):
    """(output, exit status or None when ``timeout`` stopped it): ``cmd`` run in its own process group
    with stdout and stderr, in order, appended to ``log`` as they come (so that a run killed from outside
    leaves its lines there); on the timeout the whole group is killed."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    os.makedirs(os.path.dirname(os.path.abspath(log)), exist_ok=True)
    with open(log, "ab") as f:
        start = f.tell()
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            returncode = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # DataLoader workers and compile workers with it
            except ProcessLookupError:
                pass
            proc.wait()
            returncode = None
    with open(log, "rb") as f:
        f.seek(start)
        return f.read().decode(errors="replace"), returncode


def write_json(path: str, payload: Dict) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(payload, f, indent=1)
    os.replace(tmp, path)


def main(argv=None) -> int:
    started = time.perf_counter()  # --timeout counts from here: the corpus is made within it too
    args = parse_args(argv)
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("bench_recipe: --device cuda: no CUDA device is available")
    with tempfile.TemporaryDirectory(prefix="bench_recipe_") as tmp:
        # the trainer runs in `work` (its outputs land there), so every path it is given is absolute
        work = os.path.abspath(args.work or tmp)
        os.makedirs(work, exist_ok=True)
        data = os.path.abspath(args.data) if args.data else default_corpus(work, args.vocab_size, args.workers,
                                           max(1.0, args.timeout - (time.perf_counter() - started))
                                           if args.timeout else None)
        cmd = train_command(args, data, os.path.join(work, "checkpoints"))
        print("# " + " ".join(cmd[1:]), flush=True)
        t0 = time.perf_counter()
        left = max(1.0, args.timeout - (t0 - started)) if args.timeout else None
        output, returncode = run_trainer(cmd, work, args.log or os.path.join(work, "trainer.log"), left)
        if returncode is None:
            output += f"\nbench_recipe: stopped at --timeout {args.timeout:g} s (the run had {left:.0f} s)\n"
            if args.log:
                with open(args.log, "a", encoding="utf-8") as f:
                    f.write(output[output.rindex("\nbench_recipe: stopped"):])
        seconds = time.perf_counter() - t0
    records = parse_records(output)
    summary = summarize(records, count_ooms(output), gpu_total_gib() if args.device == "cuda" else None)
    summary["compiled_graphs"], summary["compile_seconds"] = compile_totals(output)
    summary["compile_cache_hits"], summary["compile_cache_lookups"] = compile_cache(output)
    summary["recompile_limit_hits"] = recompile_limit_hits(output)
    summary["cudnn_graphs"], summary["cudnn_graph_seconds"] = cudnn_graph_builds(output)
    summary.update(exit=returncode, seconds=seconds, config=args.config, run_config=args.run_config,
                   updates=args.updates, log_interval=args.log_interval, overrides=args.override,
                   timed_out=returncode is None)
    print(format_summary(args, summary, seconds))
    if args.json:
        write_json(args.json, {"summary": summary, "records": records, "command": cmd[1:]})
        print(f"wrote {args.json}")
    if returncode is None:
        print(f"bench_recipe: stopped at --timeout {args.timeout:g} s after {summary['last_update']} of "
              f"{args.updates} updates", file=sys.stderr)
        return 124
    if returncode != 0:
        print(f"bench_recipe: the run failed (exit {returncode}); its last lines:\n" +
              "\n".join(output.splitlines()[-25:]), file=sys.stderr)
        return 1
    if not records or summary["oom_recoveries"]:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
