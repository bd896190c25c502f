"""Evaluation of every trained arm and the report (``report.md``, ``results.json``, PNG plots).

Per arm and seed the evaluation is cached in its run directory (``eval.json``), so a rerun only
evaluates what is missing. Every figure comes with its interval: a bootstrap interval over
problems within a seed, and the seed spread across seeds; the verdict paragraph is computed
from these numbers by :func:`ast_t5.ablate.stats.verdict`.
"""
import datetime
import hashlib
import json
import logging
import math
import os
import platform
from typing import Dict, List

import numpy as np
import torch

from . import evaluate, problems, stats
from .train import TOLERANCE, arm_dir, atomic_write_json, train_env

logger = logging.getLogger(__name__)

OBJECTIVES = ("ast", "t5")


def _load_generator(path: str, tokenizer_dir: str, device: str):
    from ..generation.generator import AstT5Generator

    return AstT5Generator.from_checkpoint(path, tokenizer_dir=tokenizer_dir, device=device)


def build_problems(args, out: str, corpus: str) -> Dict[str, list]:
    from ..data.text_codec import TextCodec
    from ..tasks.ast_t5_pretraining import load_dictionary

    _, sentinels = load_dictionary(corpus)
    r = args.recipe_cfg
    sub = problems.subtree_problems(corpus, sentinels, args.eval_seed, args.problems_per_category,
                                    args.max_infill_tokens)
    rnd = problems.random_span_problems(corpus, sentinels, args.eval_seed, args.random_span_problems,
                                        r.random_span_window, args.mask_ratio, 3.0)
    codec = TextCodec.from_dir(corpus)
    down = {}
    if not args.no_downstream and not args.downstream_data:
        for split, limit in (("train", r.downstream_train), ("valid", r.downstream_test),
                             ("test", r.downstream_test)):
            down[split] = problems.docstring_functions(corpus, split, codec, limit, r.max_body_tokens,
                                                       args.eval_seed)
    record = {"eval_seed": args.eval_seed, "subtree": [p.to_json() for p in sub],
              "random_span": [p.to_json() for p in rnd], "downstream": down,
              "settings": [args.mask_ratio, args.finetune_updates, args.downstream_data,
                           args.downstream_config, args.recipe_cfg.valid_items_per_language]}
    sha = hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:16]
    atomic_write_json(os.path.join(out, "problems.json"), dict(record, sha=sha))
    return {"subtree": sub, "random_span": rnd, "downstream": down, "sha": sha}


def downstream_data_dir(args, out: str, probs) -> str:
    if args.downstream_data:
        return os.path.abspath(args.downstream_data)
    d = os.path.join(out, "downstream")
    os.makedirs(d, exist_ok=True)
    for split, rows in probs["downstream"].items():
        evaluate.write_jsonl(os.path.join(d, f"{split}.jsonl"), rows)
    return d


def downstream_rows(data_dir: str, limit: int) -> List[dict]:
    from ..eval.jsonl_io import iter_jsonl

    rows = []
    path = os.path.join(data_dir, "test.jsonl")
    with open(path, encoding="utf-8") as f:
        for _, rec in iter_jsonl(f, path):
            rows.append({"source": rec["source"], "target": rec["target"]})
            if len(rows) >= limit:
                break
    return rows


def evaluate_run(args, out, corpus, preset_cfg, arm, seed, done, probs, ds_dir, test_rows, device):
    run_dir = arm_dir(out, arm, seed)
    cache = os.path.join(run_dir, "eval.json")
    if os.path.exists(cache):
        with open(cache, encoding="utf-8") as f:
            cached = json.load(f)
        if cached.get("problems_sha") == probs["sha"]:
            return cached
    max_pos = int(preset_cfg.task.get("max_source_positions", 1024))
    langs = problems.code_languages(corpus)
    tasks = {o: evaluate.eval_task(corpus, o, args.eval_seed, args.mask_ratio, max_pos) for o in OBJECTIVES}
    r = args.recipe_cfg
    curve = []
    from ..generation.checkpoints import load_checkpoint

    for point in done["checkpoints"]:
        path = os.path.join(run_dir, point["path"])
        if not os.path.exists(path):
            continue
        loaded = load_checkpoint(path, tokenizer_dir=corpus, device=device)
        entry = {"updates": point["updates"], "tokens": point["tokens"]}
        for o in OBJECTIVES:
            per_lang = evaluate.validation_loss(loaded.model, tasks[o], langs, r.valid_items_per_language,
                                                device=device)
            nll = sum(v["nll"] for v in per_lang.values())
            count = sum(v["tokens"] for v in per_lang.values())
            entry[f"valid_loss_{o}"] = nll / count if count else float("nan")
            entry[f"valid_loss_{o}_per_language"] = {l: v["nll"] / v["tokens"] for l, v in per_lang.items()}
            if point is done["checkpoints"][-1]:  # per item, for intervals of the final loss
                entry[f"valid_items_{o}"] = {"nll": [x for v in per_lang.values() for x in v["item_nll"]],
                                             "tokens": [x for v in per_lang.values() for x in v["item_tokens"]]}
        curve.append(entry)
        logger.info("%s seed %d @ %d tokens: valid loss ast %.4f, t5 %.4f", arm.name, seed,
                    entry["tokens"], entry["valid_loss_ast"], entry["valid_loss_t5"])
    gen = _load_generator(os.path.join(run_dir, "checkpoint_last.pt"), corpus, device)
    codec = gen.codec
    sub = evaluate.score_infill(gen, probs["subtree"], codec)
    rnd = evaluate.score_infill(gen, probs["random_span"], codec)
    result = {"arm": arm.name, "seed": seed, "eval_seed": args.eval_seed, "problems_sha": probs["sha"],
              "curve": curve, "subtree": sub, "random_span": rnd}
    if ds_dir and test_rows:
        ft_dir = os.path.join(run_dir, "finetune")
        arch = evaluate.model_arch(preset_cfg)
        overrides = list(r.finetune_overrides)
        overrides += [o for o in args.override if o.lstrip("+").startswith("model.")]
        cmd = evaluate.finetune_command(args.finetune_config_dir, args.downstream_config, ds_dir,
                                        corpus, os.path.join(run_dir, "checkpoint_last.pt"), ft_dir,
                                        seed, args.finetune_updates, arch, overrides)
        ckpt = evaluate.finetune(cmd, ft_dir, env=train_env())
        ft_gen = _load_generator(ckpt, corpus, device)
        cap = max(len(codec.encode(t["target"])) for t in test_rows) + 2
        scored = evaluate.score_downstream(ft_gen, test_rows, cap)
        result["downstream"] = scored
    atomic_write_json(cache, result)
    return result


def _mean(v):
    return float(np.mean(v)) if len(v) else float("nan")


def summarize(args, probs, evals: Dict[str, Dict[int, dict]], test_rows) -> dict:
    """All tables' numbers: per arm, per (metric, category/language) mean, CI, seed spread."""
    arms = [a.name for a in args.arm_list]
    seeds = args.seed_list
    sub_p, rnd_p = probs["subtree"], probs["random_span"]
    groups = {}
    for cat in problems.CATEGORIES:
        idx = [i for i, p in enumerate(sub_p) if p.category == cat]
        if idx:
            groups[f"subtree: {cat}"] = ("subtree", idx)
    for lang in sorted({p.language for p in sub_p}):
        groups[f"subtree: all ({lang})"] = ("subtree", [i for i, p in enumerate(sub_p) if p.language == lang])
    if sub_p:
        groups["subtree: all"] = ("subtree", list(range(len(sub_p))))
    for lang in sorted({p.language for p in rnd_p}):
        groups[f"random spans ({lang})"] = ("random_span", [i for i, p in enumerate(rnd_p) if p.language == lang])
    if rnd_p:
        groups["random spans: all"] = ("random_span", list(range(len(rnd_p))))
    table = {}
    for gname, (kind, idx) in groups.items():
        row = {"kind": kind, "problems": len(idx)}
        for arm in arms:
            cell = {}
            for metric in ("exact", "token_acc"):
                per_seed = [[evals[arm][s][kind][i][metric] for i in idx] for s in seeds]
                means = [_mean(v) for v in per_seed]
                m, lo, hi = stats.bootstrap_ci(np.mean(per_seed, axis=0), args.eval_seed)
                cell[metric] = {"mean": float(np.mean(means)), "ci": [lo, hi],
                                "per_seed": means, **{k: v for k, v in stats.seed_summary(means).items()
                                                      if k == "spread"}}
            row[arm] = cell
        table[gname] = row
    curves = {arm: {s: evals[arm][s]["curve"] for s in seeds} for arm in arms}
    final_loss = {}
    for arm in arms:
        final_loss[arm] = {}
        for o in OBJECTIVES:
            vals = [evals[arm][s]["curve"][-1][f"valid_loss_{o}"] for s in seeds if evals[arm][s]["curve"]]
            items = [evals[arm][s]["curve"][-1].get(f"valid_items_{o}") for s in seeds if evals[arm][s]["curve"]]
            ci = [float("nan")] * 2
            if items and all(items):
                nll = np.mean([it["nll"] for it in items], axis=0)
                ci = list(stats.ratio_ci(nll, items[0]["tokens"], args.eval_seed)[1:])
            final_loss[arm][o] = {"mean": _mean(vals), "per_seed": vals, "ci": ci,
                                  "spread": stats.seed_summary(vals)["spread"]}
    downstream = {}
    if test_rows and all("downstream" in evals[a][s] for a in arms for s in seeds):
        refs = [r["target"] for r in test_rows]
        for arm in arms:
            per_seed = {"exact": [], "bleu": [], "chrf": []}
            draws = {"bleu": [], "chrf": []}
            for s in seeds:
                d = evals[arm][s]["downstream"]
                per_seed["exact"].append(_mean(d["exact"]))
                sc = evaluate.corpus_text_scores(d["hypotheses"], refs)
                per_seed["bleu"].append(sc["bleu"])
                per_seed["chrf"].append(sc["chrf"])
                b = evaluate.bootstrap_corpus_metric(d["hypotheses"], refs, args.eval_seed)
                draws["bleu"] += b["bleu"]
                draws["chrf"] += b["chrf"]
            ex = np.mean([evals[arm][s]["downstream"]["exact"] for s in seeds], axis=0)
            _, elo, ehi = stats.bootstrap_ci(ex, args.eval_seed)
            downstream[arm] = {
                "exact": {"mean": _mean(per_seed["exact"]), "ci": [elo, ehi], "per_seed": per_seed["exact"],
                          "spread": stats.seed_summary(per_seed["exact"])["spread"]},
                **{m: {"mean": _mean(per_seed[m]), "ci": list(stats.interval(draws[m], _mean(per_seed[m]))[1:]),
                       "per_seed": per_seed[m], "spread": stats.seed_summary(per_seed[m])["spread"]}
                   for m in ("bleu", "chrf")}}
    return {"infilling": table, "curves": curves, "final_valid_loss": final_loss,
            "downstream": downstream}


def verdicts(args, probs, evals, summary, test_rows) -> List[dict]:
    """Each arm against the first arm (the baseline), on the headline figures."""
    arms = [a.name for a in args.arm_list]
    if len(arms) < 2:
        return []
    base = arms[0]
    seeds = args.seed_list
    out = []
    headline = [("subtree", "masked-subtree infilling exact match", "exact"),
                ("subtree", "masked-subtree infilling token accuracy", "token_acc"),
                ("random_span", "random-span infilling token accuracy", "token_acc")]
    for arm in arms[1:]:
        for kind, label, metric in headline:
            if not probs[kind]:
                continue
            a = [[x[metric] for x in evals[arm][s][kind]] for s in seeds]
            b = [[x[metric] for x in evals[base][s][kind]] for s in seeds]
            paired = stats.paired_difference(a, b, args.eval_seed)
            out.append(stats.verdict(arm, base, label, [_mean(v) for v in a], [_mean(v) for v in b], paired))
        for o in OBJECTIVES:
            fa = summary["final_valid_loss"][arm][o]
            fb = summary["final_valid_loss"][base][o]
            ia = [evals[arm][s]["curve"][-1].get(f"valid_items_{o}") for s in seeds if evals[arm][s]["curve"]]
            ib = [evals[base][s]["curve"][-1].get(f"valid_items_{o}") for s in seeds if evals[base][s]["curve"]]
            paired = (float("nan"),) * 3
            if ia and ib and all(ia) and all(ib):
                paired = stats.paired_ratio_difference(np.mean([x["nll"] for x in ia], axis=0),
                                                       np.mean([x["nll"] for x in ib], axis=0),
                                                       ia[0]["tokens"], args.eval_seed)
            out.append(stats.verdict(arm, base, f"validation loss ({o} objective)", fa["per_seed"],
                                     fb["per_seed"], paired, higher_is_better=False))
        if summary["downstream"]:
            a = [evals[arm][s]["downstream"]["exact"] for s in seeds]
            b = [evals[base][s]["downstream"]["exact"] for s in seeds]
            out.append(stats.verdict(arm, base, "downstream exact match", [_mean(v) for v in a],
                                     [_mean(v) for v in b], stats.paired_difference(a, b, args.eval_seed)))
    return out


def plot_curves(out: str, summary: dict) -> List[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, o in zip(axes, OBJECTIVES):
        for arm, by_seed in summary["curves"].items():
            for j, (seed, pts) in enumerate(sorted(by_seed.items())):
                if not pts:
                    continue
                ax.plot([p["tokens"] for p in pts], [p[f"valid_loss_{o}"] for p in pts], marker="o",
                        label=arm if j == 0 else None, alpha=0.9 if j == 0 else 0.5,
                        color=f"C{list(summary['curves']).index(arm)}")
        ax.set_xlabel("training tokens")
        ax.set_ylabel("validation loss (nats / target token)")
        ax.set_title(f"held-out loss under the {o} objective")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    path = os.path.join(out, "valid_curves.png")
    fig.savefig(path + ".tmp.png", dpi=110)
    os.replace(path + ".tmp.png", path)
    plt.close(fig)
    paths = [path]
    groups = [g for g in summary["infilling"] if g.startswith("subtree: ") and "(" not in g]
    if groups:
        arms = list(summary["curves"])
        fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(groups) * len(arms) / 2), 4))
        width = 0.8 / len(arms)
        top = max(summary["infilling"][g][a]["token_acc"]["ci"][1] for g in groups for a in arms)
        ax.set_ylim(0, max(0.05, 1.15 * top))
        for k, arm in enumerate(arms):
            means = [summary["infilling"][g][arm]["token_acc"]["mean"] for g in groups]
            lo = [m - summary["infilling"][g][arm]["token_acc"]["ci"][0] for g, m in zip(groups, means)]
            hi = [summary["infilling"][g][arm]["token_acc"]["ci"][1] - m for g, m in zip(groups, means)]
            ax.bar(np.arange(len(groups)) + k * width, means, width, yerr=[lo, hi], capsize=3, label=arm)
        ax.set_xticks(np.arange(len(groups)) + width * (len(arms) - 1) / 2)
        ax.set_xticklabels([g.replace("subtree: ", "") for g in groups], rotation=15)
        ax.set_ylabel("token accuracy (95% CI)")
        ax.set_title("masked-subtree infilling")
        ax.legend()
        fig.tight_layout()
        p = os.path.join(out, "infilling.png")
        fig.savefig(p + ".tmp.png", dpi=110)
        os.replace(p + ".tmp.png", p)
        plt.close(fig)
        paths.append(p)
    return paths


def _fmt(cell, pct=True) -> str:
    k = 100.0 if pct else 1.0
    m, (lo, hi) = cell["mean"], cell["ci"]
    s = f"{k * m:.1f} [{k * lo:.1f}, {k * hi:.1f}]" if pct else f"{m:.2f} [{lo:.2f}, {hi:.2f}]"
    if cell.get("spread") is not None:
        s += f" ±{k * cell['spread'] / 2:.1f}" if pct else f" ±{cell['spread'] / 2:.2f}"
    return s


def write_report(args, out: str, corpora, preset_cfg, schedule, trained, summary, verdict_list,
                 plots, test_rows, elapsed) -> str:
    arms = args.arm_list
    seeds = args.seed_list
    L = [f"# Ablation: {', '.join(a.name for a in arms)}", ""]
    L.append(f"Generated {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')} "
             f"on {platform.node()} ({platform.machine()}, "
             f"{'CUDA ' + torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'CPU'}), "
             f"{elapsed / 60:.1f} min in all.")
    L.append(f"Recipe `{args.recipe}`, preset `{args.preset}` (model `{preset_cfg.model._name}`), "
             f"seeds {seeds}, evaluation seed {args.eval_seed}, masking ratio {args.mask_ratio:g}. "
             f"Corpus `{corpora['ast']}`" + (f"; fixed-length segments `{corpora['fixed']}`" if "fixed" in corpora else "") + ".")
    L.append("")
    L.append("## Arms and training tokens")
    L.append("")
    L.append(f"Budget {args.tokens:,} training tokens per arm (the segments' own tokens, before "
             f"corruption); arms must agree within {TOLERANCE:.1%}. Shared schedule: "
             f"{schedule.updates:,} updates (warm-up {schedule.warmup:,}); training stops by tokens.")
    L.append("")
    L.append("| arm | what | seed | tokens consumed | vs budget | updates | encoder tokens | decoder tokens |")
    L.append("|---|---|---|---|---|---|---|---|")
    for a in arms:
        for s in seeds:
            d = trained[f"{a.name}|{s}"]
            L.append(f"| `{a.name}` | {a.description} | {s} | {d['tokens']:,} | "
                     f"{(d['tokens'] - args.tokens) / args.tokens:+.4%} | {d['updates']:,} | "
                     f"{d['source_tokens']:,} | {d['target_tokens']:,} |")
    L.append("")
    L.append("## Validation loss")
    L.append("")
    L.append("Held-out `valid` split of the AST-segmented corpus, the same corrupted items for every "
             "arm (evaluation seed), mean cross-entropy in nats per target token under each "
             "objective, [95% bootstrap interval over items]; ± is half the seed spread (with several seeds).")
    L.append("")
    L.append("![validation curves](valid_curves.png)")
    L.append("")
    L.append("| arm | final loss, ast objective | final loss, t5 objective |")
    L.append("|---|---|---|")
    for a in arms:
        f = summary["final_valid_loss"][a.name]
        cells = []
        for o in OBJECTIVES:
            c = f[o]
            cells.append(f"{c['mean']:.4f} [{c['ci'][0]:.4f}, {c['ci'][1]:.4f}]"
                         + (f" ±{c['spread'] / 2:.4f}" if c["spread"] is not None else ""))
        L.append(f"| `{a.name}` | {cells[0]} | {cells[1]} |")
    L.append("")
    L.append("## Infilling on held-out code")
    L.append("")
    L.append("`test` split; masked-subtree problems mask one whole AST node (by category), "
             "random-span problems are T5 corruption of a window. Greedy decoding. Cells: "
             "percentage, [95% bootstrap interval over problems]" + (", ± half the seed spread" if len(seeds) > 1 else "") + ".")
    L.append("")
    head = "| problems | n | " + " | ".join(f"`{a.name}` exact | `{a.name}` token acc" for a in arms) + " |"
    L.append(head)
    L.append("|" + "---|" * (2 + 2 * len(arms)))
    for g, row in summary["infilling"].items():
        cells = " | ".join(f"{_fmt(row[a.name]['exact'])} | {_fmt(row[a.name]['token_acc'])}" for a in arms)
        L.append(f"| {g} | {row['problems']} | {cells} |")
    if len(plots) > 1:
        L += ["", "![infilling](infilling.png)"]
    L.append("")
    L.append("## Downstream")
    L.append("")
    if summary["downstream"]:
        src = args.downstream_data or "Python functions of the corpus: signature + docstring -> body " \
              "(fine-tuning data from the train split, scored on the test split)"
        L.append(f"Task: {src}; config `{args.downstream_config}`, {args.finetune_updates} "
                 f"updates from each arm's final checkpoint, greedy decoding, {len(test_rows)} test "
                 "problems. Exact match (whitespace-normalized) and corpus BLEU (code tokens) / chrF "
                 "with 95% bootstrap intervals.")
        L.append("")
        L.append("| arm | exact match | BLEU | chrF |")
        L.append("|---|---|---|---|")
        for a in arms:
            d = summary["downstream"][a.name]
            L.append(f"| `{a.name}` | {_fmt(d['exact'])} | {_fmt(d['bleu'], False)} | {_fmt(d['chrf'], False)} |")
    else:
        L.append("Not run (" + ("--no-downstream" if args.no_downstream else "no usable test functions") + ").")
    L.append("")
    L.append("## Verdict")
    L.append("")
    L.append(verdict_paragraph(args, verdict_list))
    L.append("")
    path = os.path.join(out, "report.md")
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.write("\n".join(L))
    os.replace(path + ".tmp", path)
    return path


def verdict_paragraph(args, verdict_list) -> str:
    if not verdict_list:
        return "One arm only: nothing to compare."
    seeds_note = ("" if len(args.seed_list) > 1 else
                  "With one seed there is no seed spread: differences are judged only by paired "
                  "95% bootstrap intervals over the same problems, which measure problem sampling, "
                  "not seed-to-seed variation; run several seeds before trusting a win. ")
    wins = [v for v in verdict_list if not v["tie"]]
    lines = [f"Baseline `{args.arm_list[0].name}`. {seeds_note}".strip()]
    lines += [v["text"] for v in verdict_list]
    lines.append(f"{len(wins)} of {len(verdict_list)} comparisons exceed the noise; the rest are ties.")
    return " ".join(lines)


def evaluate_and_report(args, out, corpora, preset_cfg, schedule, trained, train_seconds) -> None:
    import time

    t0 = time.time()
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    corpus = corpora["ast"]
    probs = build_problems(args, out, corpus)
    logger.info("held-out problems: %d masked-subtree, %d random-span, downstream %s",
                len(probs["subtree"]), len(probs["random_span"]),
                {k: len(v) for k, v in probs["downstream"].items()})
    ds_dir, test_rows = None, []
    if not args.no_downstream:
        if args.downstream_data or (probs["downstream"].get("train") and probs["downstream"].get("test")):
            ds_dir = downstream_data_dir(args, out, probs)
            test_rows = downstream_rows(ds_dir, 10 ** 9 if args.downstream_data else len(probs["downstream"]["test"]))
        else:
            logger.warning("no Python docstring functions in the corpus: downstream task skipped")
    evals: Dict[str, Dict[int, dict]] = {}
    for a in args.arm_list:
        evals[a.name] = {}
        for s in args.seed_list:
            evals[a.name][s] = evaluate_run(args, out, corpus, preset_cfg, a, s, trained[f"{a.name}|{s}"],
                                            probs, ds_dir, test_rows, device)
    summary = summarize(args, probs, evals, test_rows)
    verdict_list = verdicts(args, probs, evals, summary, test_rows)
    plots = plot_curves(out, summary)
    elapsed = train_seconds + time.time() - t0
    results = {
        "arms": [{"name": a.name, "description": a.description, "corpus": a.corpus,
                  "objective": a.objective, "mask_ratio": a.mask_ratio, "overrides": list(a.overrides)}
                 for a in args.arm_list],
        "seeds": args.seed_list, "eval_seed": args.eval_seed, "preset": args.preset,
        "recipe": args.recipe, "budget_tokens": args.tokens, "tolerance": TOLERANCE,
        "schedule": {"updates": schedule.updates, "cap": schedule.cap, "warmup": schedule.warmup,
                     "save_every": schedule.save_every, "tokens_per_update": schedule.tokens_per_update},
        "training": {k: {x: v[x] for x in ("arm", "seed", "tokens", "source_tokens", "target_tokens",
                                           "updates", "within_tolerance")} for k, v in trained.items()},
        "tokens_equal_within_tolerance": all(
            abs(v["tokens"] - args.tokens) <= TOLERANCE * args.tokens for v in trained.values()),
        "problems": {"subtree": len(probs["subtree"]), "random_span": len(probs["random_span"]),
                     "downstream_test": len(test_rows)},
        **summary, "verdicts": verdict_list, "plots": [os.path.basename(p) for p in plots],
        "seconds": elapsed,
    }
    results["curves"] = {a: {str(s): c for s, c in by.items()} for a, by in summary["curves"].items()}
    atomic_write_json(os.path.join(out, "results.json"), _finite(results))
    write_report(args, out, corpora, preset_cfg, schedule, trained, summary, verdict_list, plots,
                 test_rows, elapsed)


def _finite(obj):
    """NaN/inf -> None, so results.json is strict JSON."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    if isinstance(obj, (np.floating, np.integer)):
        return _finite(obj.item())
    return obj
