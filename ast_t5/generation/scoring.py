"""Exact match and corpus BLEU of generated outputs as summable statistics (validation metrics).

Each validation batch contributes counts (exact-match hits, BLEU n-gram matches and totals,
hypothesis and reference lengths) to its logging output; fairseq sums them across batches and
workers, and :func:`log_generation_metrics` turns the sums into ``exact_match`` and ``bleu`` (both
in percent) with the same definitions as ``ast_t5.eval.metrics``: exact match after whitespace
normalization, sacrebleu corpus BLEU (exponential smoothing) over our ``code`` tokenization.
Keys starting with ``_`` are fairseq's hidden meters: only the derived metrics are printed.
"""
from functools import lru_cache
from typing import Dict, Sequence

from fairseq.logging import metrics
from sacrebleu.metrics import BLEU

from ..eval.metrics import CODE_TOKENIZER, code_tokenize, normalize_for_match

MAX_NGRAM = 4  # BLEU-4, sacrebleu's default
EM_HITS, EM_COUNT = "_em_hits", "_em_count"
SYS_LEN, REF_LEN = "_bleu_sys_len", "_bleu_ref_len"
COUNTS = [f"_bleu_counts_{n}" for n in range(MAX_NGRAM)]
TOTALS = [f"_bleu_totals_{n}" for n in range(MAX_NGRAM)]
STAT_KEYS = [EM_HITS, EM_COUNT, SYS_LEN, REF_LEN] + COUNTS + TOTALS


@lru_cache(maxsize=8)
def _bleu(tokenize: str) -> BLEU:
    """A sacrebleu scorer; our "code" tokenizer is applied before it (tokenize="none")."""
    return BLEU(tokenize="none" if tokenize == CODE_TOKENIZER else tokenize)


def generation_stats(hypotheses: Sequence[str], references: Sequence[str],
                     bleu_tokenize: str = CODE_TOKENIZER,
                     em_normalization: str = "whitespace") -> Dict[str, float]:
    """Summable exact-match and BLEU statistics of one batch (keys: STAT_KEYS)."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    hits = sum(normalize_for_match(h, em_normalization) == normalize_for_match(r, em_normalization)
               for h, r in zip(hypotheses, references))
    stats = {EM_HITS: float(hits), EM_COUNT: float(len(hypotheses))}
    if bleu_tokenize == CODE_TOKENIZER:
        hypotheses = [code_tokenize(h) for h in hypotheses]
        references = [code_tokenize(r) for r in references]
    score = _bleu(bleu_tokenize).corpus_score(list(hypotheses), [list(references)])
    stats[SYS_LEN], stats[REF_LEN] = float(score.sys_len), float(score.ref_len)
    for n in range(MAX_NGRAM):
        stats[COUNTS[n]], stats[TOTALS[n]] = float(score.counts[n]), float(score.totals[n])
    return stats


def bleu_from_sums(sums: Dict[str, float]) -> float:
    """Corpus BLEU (percent) from summed statistics."""
    if sums[TOTALS[0]] <= 0:
        return 0.0
    return BLEU.compute_bleu(
        correct=[int(sums[k]) for k in COUNTS], total=[int(sums[k]) for k in TOTALS],
        sys_len=int(sums[SYS_LEN]), ref_len=int(sums[REF_LEN]), smooth_method="exp").score


def log_generation_metrics(logging_outputs) -> None:
    """Accumulate the statistics of ``logging_outputs`` and derive ``exact_match`` and ``bleu``.

    Does nothing for logging outputs without generation statistics (training steps).
    """
    if not any(EM_COUNT in log for log in logging_outputs):
        return
    for key in STAT_KEYS:
        metrics.log_scalar_sum(key, sum(log.get(key, 0.0) for log in logging_outputs))

    def summed(meters):
        return {key: meters[key].sum for key in STAT_KEYS}

    metrics.log_derived("exact_match", lambda m: round(
        100.0 * m[EM_HITS].sum / max(m[EM_COUNT].sum, 1.0), 2))
    metrics.log_derived("bleu", lambda m: round(bleu_from_sums(summed(m)), 2))
