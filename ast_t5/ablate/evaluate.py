"""Scoring a trained arm on the shared held-out problems.

* :func:`validation_loss`: mean cross-entropy per target token (nats) on the ``valid`` split of
  the AST-segmented corpus under one objective (``ast`` or ``t5``), with corruption drawn from the
  evaluation seed, so every arm sees the very same sources and targets.
* :func:`score_infill`: greedy generation for infilling problems; per problem exact match (every
  hole's span exactly right) and token accuracy (position-wise matches over the longer of the
  generated and the reference span, summed over holes).
* :func:`finetune` and :func:`score_downstream`: the short fine-tuning recipe through
  ``fairseq-hydra-train`` with a fine-tuning config, then greedy generation on held-out functions.
"""
import json
import logging
import os
import subprocess
import sys
from typing import Dict, List, Sequence

import numpy as np
import torch

from ..generation.generator import split_spans

logger = logging.getLogger(__name__)


def eval_task(data_dir: str, objective: str, seed: int, mask_ratio: float, max_positions: int):
    from omegaconf import OmegaConf

    from ..tasks.ast_t5_pretraining import AstT5PretrainingConfig, AstT5PretrainingTask

    cfg = OmegaConf.structured(AstT5PretrainingConfig)
    cfg.data, cfg.objective, cfg.seed, cfg.ast_check = data_dir, objective, seed, "none"
    cfg.max_source_positions = cfg.max_target_positions = max_positions
    if objective == "t5":
        cfg.noise_density, cfg.mean_span_length = mask_ratio, 3.0
    else:
        cfg.mask_prob = mask_ratio
    return AstT5PretrainingTask.setup_task(cfg)


@torch.no_grad()
def validation_loss(model, task, languages: Sequence[str], max_items: int, batch_size: int = 16,
                    device: str = "cpu") -> Dict[str, Dict[str, float]]:
    """{language: {"nll": summed nats, "tokens": target tokens, "item_nll": [...],
    "item_tokens": [...]}} on the first ``max_items`` items of each language's valid split."""
    model.eval()
    out = {}
    for lang in languages:
        try:
            task.load_dataset(f"valid_{lang}")
        except Exception:  # noqa: BLE001 - a language without a valid split
            continue
        ds = task.datasets[f"valid_{lang}"]
        n = min(len(ds), max_items)
        item_nll, item_tokens = [], []
        for start in range(0, n, batch_size):
            batch = ds.collater([ds[i] for i in range(start, min(n, start + batch_size))])
            net_input = {k: v.to(device) for k, v in batch["net_input"].items()}
            lprobs = model.get_normalized_probs(model(**net_input), log_probs=True).float()
            target = batch["target"].to(device)
            nll = torch.nn.functional.nll_loss(lprobs.view(-1, lprobs.size(-1)), target.view(-1),
                                               ignore_index=task.dictionary.pad(), reduction="none")
            item_nll += nll.view(target.shape).sum(1).tolist()
            item_tokens += target.ne(task.dictionary.pad()).sum(1).tolist()
        if sum(item_tokens):
            out[lang] = {"nll": float(sum(item_nll)), "tokens": int(sum(item_tokens)),
                         "item_nll": item_nll, "item_tokens": item_tokens}
    return out


def span_scores(generated: Sequence[int], reference: Sequence[int], codec) -> Dict[str, float]:
    """Exact match (0/1) and token accuracy of a generated target against the reference one."""
    ref, gen = split_spans(reference, codec), split_spans(generated, codec)
    matches = total = 0
    exact = True
    for sentinel, ref_span in ref.items():
        g = gen.get(sentinel, [])
        exact &= g == ref_span
        matches += sum(a == b for a, b in zip(g, ref_span))
        total += max(len(g), len(ref_span))
    return {"exact": float(exact and bool(ref)), "token_acc": matches / total if total else 0.0}


def score_infill(generator, problems, codec, batch_size: int = 16) -> List[Dict[str, float]]:
    """Per problem {"exact", "token_acc"}; greedy decoding, at most the longest reference + 2."""
    scores: List[Dict[str, float]] = [{}] * len(problems)
    groups: Dict[str, List[int]] = {}
    for i, p in enumerate(problems):
        groups.setdefault(p.category, []).append(i)
    for cat, idx in groups.items():
        cap = max(len(problems[i].target) for i in idx) + 2
        outs = generator.generate_ids([problems[i].source for i in idx], beam=1,
                                      max_new_tokens=cap, batch_size=batch_size)
        for i, o in zip(idx, outs):
            scores[i] = span_scores(o[0], problems[i].target[:-1], codec)
    return scores


def write_jsonl(path: str, rows: Sequence[dict]) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps({"source": r["source"], "target": r["target"]}, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def finetune_command(config_dir: str, config: str, data: str, tokenizer: str, init: str,
                     save_dir: str, seed: int, updates: int, arch: str,
                     overrides: Sequence[str]) -> List[str]:
    return [sys.executable, "-m", "fairseq_cli.hydra_train", "--config-dir", config_dir,
            "--config-name", config, f"task.data={data}", f"task.tokenizer={tokenizer}",
            f"checkpoint.finetune_from_model={init}", f"checkpoint.save_dir={save_dir}",
            f"common.seed={seed}", f"optimization.max_update={updates}",
            f"lr_scheduler.warmup_updates={max(1, updates // 10)}", f"model._name={arch}",
            "dataset.disable_validation=true", "checkpoint.save_interval_updates=0",
            "common.log_format=json", "++common.tensorboard_logdir=", *overrides]


def finetune(cmd: List[str], save_dir: str, env=None) -> str:
    """Run (or resume, or skip when finished) one fine-tuning; returns its checkpoint."""
    os.makedirs(save_dir, exist_ok=True)
    done = os.path.join(save_dir, "done")
    last = os.path.join(save_dir, "checkpoint_last.pt")
    if os.path.exists(done) and os.path.exists(last):
        return last
    with open(os.path.join(save_dir, "finetune.log"), "a", encoding="utf-8") as log:
        rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=save_dir, env=env)
    if rc != 0 or not os.path.exists(last):
        raise RuntimeError(f"fine-tuning failed (exit code {rc}); see {save_dir}/finetune.log")
    with open(done, "w", encoding="utf-8") as f:
        f.write("ok\n")
    return last


def score_downstream(generator, rows: Sequence[dict], max_new_tokens: int,
                     batch_size: int = 16) -> Dict[str, object]:
    """Per-problem exact match plus the hypotheses (for corpus BLEU/chrF with intervals)."""
    from ..eval.metrics import normalize_for_match

    hyps = generator.translate([r["source"] for r in rows], beam=1, max_new_tokens=max_new_tokens,
                               batch_size=batch_size) if rows else []
    exact = [float(normalize_for_match(h) == normalize_for_match(r["target"]))
             for h, r in zip(hyps, rows)]
    return {"hypotheses": list(hyps), "exact": exact}


def corpus_text_scores(hyps: Sequence[str], refs: Sequence[str]) -> Dict[str, float]:
    """Corpus BLEU (code tokenization, as ``ast-t5-eval text-metrics``) and chrF."""
    from sacrebleu.metrics import CHRF

    from ..eval.metrics import corpus_bleu

    if not hyps:
        return {"bleu": float("nan"), "chrf": float("nan")}
    bleu = corpus_bleu(list(hyps), [list(refs)])["bleu"]
    chrf = CHRF().corpus_score(list(hyps), [list(refs)]).score
    return {"bleu": float(bleu), "chrf": float(chrf)}


def model_arch(preset_cfg) -> str:
    return str(preset_cfg.model._name)


def bootstrap_corpus_metric(hyps, refs, seed: int, resamples: int = 200) -> Dict[str, List[float]]:
    """Bootstrap draws of corpus BLEU and chrF over problems (for their intervals)."""
    rng = np.random.default_rng([seed, 0xB1E])
    draws = {"bleu": [], "chrf": []}
    n = len(hyps)
    for _ in range(resamples if n else 0):
        idx = rng.integers(0, n, n)
        s = corpus_text_scores([hyps[i] for i in idx], [refs[i] for i in idx])
        draws["bleu"].append(s["bleu"])
        draws["chrf"].append(s["chrf"])
    return draws
