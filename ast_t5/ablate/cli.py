"""``ast-t5-ablate``: train objectives as arms at equal tokens and judge them on held-out code.

Examples::

    # CPU smoke run (recipe tiny: arms t5 and ast, one seed)
    ast-t5-ablate --recipe tiny --corpus data/bin --inputs ~/code -o ablation/

    # the one-H100-hour recipe on a real corpus, three arms
    ast-t5-ablate --recipe small --corpus /data/bin --fixed-corpus /data/bin_fixed -o abl_small/

    # any arms: masking-ratio variants and an override arm, two seeds
    ast-t5-ablate --corpus /data/bin --inputs /data/code --preset small --tokens 2e8 \\
        --arms t5,t5+seg,ast,ast@0.15,noobf=ast:task.obfuscation_prob=0 --seeds 1,2 -o abl/

The ``t5`` arm trains on fixed-length segments of the same files: give them with
``--fixed-corpus`` (``ast-t5-preprocess run ... --segmenter fixed --spm-model CORPUS/spm.model``)
or give ``--inputs`` (the corpus' original inputs) and they are made under ``OUT/corpus_fixed``.
Rerunning the same command resumes: killed arms continue from their checkpoints, finished arms
and finished evaluations are read back.
"""
import argparse
import glob
import json
import logging
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List

from .arms import DEFAULT_MASK_RATIO, RECIPES, ArmError, parse_arms
from .train import (AblationError, arm_dir, check_budget, load_preset, plan_schedule,
                    repo_config_dir, run_arm, train_command, train_env)

logger = logging.getLogger("ast_t5.ablate")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ast-t5-ablate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", required=True, help="output of ast-t5-preprocess (AST-aware segments)")
    p.add_argument("-o", "--output", required=True, help="output directory (report.md, results.json, ...)")
    p.add_argument("--recipe", choices=sorted(RECIPES), default="tiny",
                   help="sized defaults for everything below (default tiny)")
    p.add_argument("--fixed-corpus", help="fixed-length segments of the same files, same tokenizer")
    p.add_argument("--inputs", nargs="+", help="the corpus' original inputs, to make the fixed-"
                   "length segmentation when --fixed-corpus is not given")
    p.add_argument("--preset", help="pre-training config name in --config-dir (tiny, small, base...)")
    p.add_argument("--config-dir", default=repo_config_dir("pretrain"))
    p.add_argument("--tokens", type=float, help="training tokens per arm (segments' own tokens)")
    p.add_argument("--arms", help="comma-separated arms: t5, t5+seg, ast, BASE@RATIO, "
                   "NAME=BASE:KEY=VALUE[,KEY=VALUE] (one user arm per --arm is safer)")
    p.add_argument("--arm", action="append", default=[], help="one more arm (may contain commas)")
    p.add_argument("--seeds", help="comma-separated seeds (model init, data order, masking)")
    p.add_argument("--mask-ratio", type=float, default=DEFAULT_MASK_RATIO,
                   help="masking ratio of the built-in arms: T5 noise density and AST mask_prob")
    p.add_argument("--override", action="append", default=[],
                   help="Hydra override for every arm's training (repeatable)")
    p.add_argument("--jobs", type=int, default=1, help="arms trained at once (default 1)")
    p.add_argument("--eval-seed", type=int, default=0, help="seed of the held-out problems")
    p.add_argument("--problems-per-category", type=int)
    p.add_argument("--max-infill-tokens", type=int)
    p.add_argument("--random-span-problems", type=int)
    p.add_argument("--curve-points", type=int)
    p.add_argument("--downstream-data", help="DIR with train/valid/test.jsonl (e.g. Concode, "
                   "Bugs2Fix, Java-C#) instead of the built-in docstring-to-body task")
    p.add_argument("--downstream-config", default="concode",
                   help="fine-tuning config in config/finetune (default concode)")
    p.add_argument("--finetune-config-dir", default=repo_config_dir("finetune"))
    p.add_argument("--finetune-updates", type=int)
    p.add_argument("--no-downstream", action="store_true", help="skip the downstream task")
    p.add_argument("--device", default=None, help="evaluation device (default: cuda if available)")
    p.add_argument("--keep-checkpoints", action="store_true",
                   help="keep the intermediate checkpoints after the curves are computed")
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def _fail(msg: str) -> int:
    print(f"ast-t5-ablate: error: {msg}", file=sys.stderr)
    return 2


def resolve(args):
    r = RECIPES[args.recipe]
    args.preset = args.preset or r.preset
    args.tokens = int(args.tokens if args.tokens is not None else r.tokens)
    specs = [s for s in (args.arms.split(",") if args.arms else ([] if args.arm else list(r.arms)))]
    # a user arm's overrides follow its ':' and may be split by the comma list: glue them back
    glued: List[str] = []
    for s in specs:
        if glued and "=" in s and ":" not in s and "=" in glued[-1].split(":", 1)[0] and ":" in glued[-1]:
            glued[-1] += "," + s
        else:
            glued.append(s)
    args.arm_list = parse_arms(glued + args.arm, args.mask_ratio)
    args.seed_list = [int(s) for s in args.seeds.split(",")] if args.seeds else list(r.seeds)
    for name in ("problems_per_category", "max_infill_tokens", "random_span_problems",
                 "curve_points", "finetune_updates"):
        if getattr(args, name) is None:
            setattr(args, name, getattr(r, name))
    args.recipe_cfg = r
    return args


def ensure_fixed_corpus(args, out: str) -> str:
    if args.fixed_corpus:
        return os.path.abspath(args.fixed_corpus)
    target = os.path.join(out, "corpus_fixed")
    if os.path.exists(os.path.join(target, "manifest.json")):
        return target
    if not args.inputs:
        raise AblationError("the t5 arm needs fixed-length segments of the same files: give "
                            "--fixed-corpus DIR or --inputs PATH... (the corpus' inputs)")
    with open(os.path.join(args.corpus, "manifest.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    o = manifest["options"]
    lim = o.get("limits", {})
    cmd = [sys.executable, "-m", "ast_t5_preprocess.cli", "run", *args.inputs, "-o", target,
           "--spm-model", os.path.join(args.corpus, "spm.model"),
           "--num-sentinels", str(manifest["tokenizer"]["num_sentinels"]),
           "--max-tokens", str(o["max_tokens"]), "--valid-ratio", str(o["valid_ratio"]),
           "--test-ratio", str(o["test_ratio"]), "--parse-error-policy", o["error_policy"],
           "--segmenter", "fixed", "--no-progress"]
    # every option that decides which files are kept, as the AST-segmented corpus had it
    if o.get("max_error_ratio") is not None:  # None: the per-language defaults
        cmd += ["--max-error-ratio", str(o["max_error_ratio"])]
    if o.get("max_ast_depth") is not None:
        cmd += ["--max-ast-depth", str(o["max_ast_depth"])]
    if "near_dup_threshold" in o:
        cmd += (["--no-near-dup"] if o["near_dup_threshold"] is None
                else ["--near-dup-threshold", str(o["near_dup_threshold"])])
    if o.get("dedup") is False:
        cmd += ["--no-dedup"]
    for name in o.get("exclude_benchmark") or ():
        if name != "humaneval":  # the manifest keeps names, not the benchmark files' paths
            raise AblationError(f"{args.corpus} was decontaminated against {name!r}: make the "
                                "fixed-length corpus yourself with the same --exclude-benchmark "
                                "and --segmenter fixed, and pass it as --fixed-corpus")
        cmd += ["--exclude-benchmark", name]
    if o.get("language"):
        cmd += ["--language", o["language"]]
    for key, flag in (("max_file_bytes", "--max-file-bytes"), ("max_line_length", "--max-line-length"),
                      ("max_mean_line_length", "--max-mean-line-length")):
        if key in lim:
            cmd += [flag, str(lim[key])]
    logger.info("making the fixed-length segmentation: %s", " ".join(cmd))
    rc = subprocess.call(cmd, env=train_env())
    if rc != 0:
        raise AblationError(f"ast-t5-preprocess --segmenter fixed failed with exit code {rc}")
    compare_corpora(args.corpus, target)
    return target


def compare_corpora(ast_dir: str, fixed_dir: str) -> None:
    """Same tokenizer, same files per split: the two segmentations differ only in their cuts."""
    with open(os.path.join(ast_dir, "manifest.json"), encoding="utf-8") as f:
        a = json.load(f)
    with open(os.path.join(fixed_dir, "manifest.json"), encoding="utf-8") as f:
        b = json.load(f)
    if a["tokenizer"]["spm_sha256"] != b["tokenizer"]["spm_sha256"]:
        raise AblationError(f"{fixed_dir} was made with another tokenizer than {ast_dir}")
    for lang, s in a["languages"].items():
        t = b["languages"].get(lang, {})
        for split in ("train", "valid", "test"):
            if s.get(f"{split}_files") != t.get(f"{split}_files"):
                raise AblationError(f"{lang}/{split}: {ast_dir} and {fixed_dir} hold different files "
                                    f"({s.get(f'{split}_files')} vs {t.get(f'{split}_files')})")


def train_all(args, out: str, corpora: Dict[str, str], preset_cfg, schedule) -> Dict[str, dict]:
    scheduler = str(preset_cfg.get("lr_scheduler", {}).get("_name", ""))
    jobs = []
    for seed in args.seed_list:
        for arm in args.arm_list:
            run_dir = arm_dir(out, arm, seed)
            overrides = list(args.recipe_cfg.overrides) + list(args.override)
            cmd = train_command(args.config_dir, args.preset, corpora[arm.corpus], run_dir, seed,
                                args.tokens, schedule.overrides(scheduler), arm, overrides)
            jobs.append((arm, seed, run_dir, cmd))
    env = train_env()
    if args.jobs > 1:
        with ThreadPoolExecutor(args.jobs) as pool:
            futures = [pool.submit(run_arm, d, a, s, c, args.tokens, env) for a, s, d, c in jobs]
            results = [f.result() for f in futures]
    else:
        results = [run_arm(d, a, s, c, args.tokens, env) for a, s, d, c in jobs]
    return {f"{a.name}|{s}": r for (a, s, _, _), r in zip(jobs, results)}


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, force=True,
                        format="%(asctime)s | %(levelname)s | %(name)s | %(message)s")
    for noisy in ("matplotlib", "PIL", "ast_t5.tasks", "ast_t5.models", "ast_t5.modules"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        resolve(args)
    except (ArmError, ValueError) as e:
        return _fail(str(e))
    if not os.path.exists(os.path.join(args.corpus, "manifest.json")):
        return _fail(f"{args.corpus} is not the output of ast-t5-preprocess (no manifest.json)")
    if args.tokens <= 0 or args.jobs < 1 or not args.seed_list:
        return _fail("--tokens must be > 0, --jobs >= 1 and --seeds non-empty")
    if args.downstream_data and not os.path.exists(os.path.join(args.downstream_data, "train.jsonl")):
        return _fail(f"{args.downstream_data} has no train.jsonl")
    out = os.path.abspath(args.output)
    os.makedirs(out, exist_ok=True)
    args.corpus = os.path.abspath(args.corpus)
    t0 = time.time()
    try:
        preset_cfg = load_preset(args.config_dir, args.preset, list(args.recipe_cfg.overrides) + args.override)
        corpora = {"ast": args.corpus}
        if any(a.corpus == "fixed" for a in args.arm_list):
            corpora["fixed"] = ensure_fixed_corpus(args, out)
            compare_corpora(args.corpus, corpora["fixed"])
        check_budget(args.tokens, corpora, args.arm_list)
        schedule = plan_schedule(preset_cfg, corpora, args.arm_list, args.tokens,
                                 args.curve_points, args.recipe_cfg.warmup_updates)
        logger.info("schedule: %d updates (cap %d, warm-up %d), checkpoint every %d; tokens per "
                    "update %s", schedule.updates, schedule.cap, schedule.warmup, schedule.save_every,
                    {k: round(v) for k, v in schedule.tokens_per_update.items()})
        trained = train_all(args, out, corpora, preset_cfg, schedule)
        train_seconds = time.time() - t0
        from .report import evaluate_and_report

        evaluate_and_report(args, out, corpora, preset_cfg, schedule, trained, train_seconds)
    except AblationError as e:
        return _fail(str(e))
    if not args.keep_checkpoints:  # the curves are computed: keep only checkpoint_last.pt
        for a in args.arm_list:
            for s in args.seed_list:
                for p in glob.glob(os.path.join(arm_dir(out, a, s), "checkpoint_*_*.pt")):
                    os.remove(p)
    print(f"report: {os.path.join(out, 'report.md')}  ({time.time() - t0:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
