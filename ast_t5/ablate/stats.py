"""Intervals and the verdict rule.

Within one seed, a mean over problems gets a percentile bootstrap interval (problems resampled
with a seeded generator). Across seeds, an arm's figure is the mean of its per-seed figures and
its seed spread the range (max - min) of them. Two arms are compared on the same problems:

* tie if the difference of their seed means is within the larger of their seed spreads, or if
  the paired bootstrap interval of the difference (problems resampled jointly, seeds pooled)
  contains 0;
* otherwise the arm with the better figure wins.

With one seed there is no seed spread: the report says so and only the paired interval decides.
"""
from typing import Dict, List, Optional, Sequence

import numpy as np

CONFIDENCE = 0.95
RESAMPLES = 1000


def bootstrap_ci(values: Sequence[float], seed: int, resamples: int = RESAMPLES):
    """(mean, low, high) of the mean of ``values`` with a percentile bootstrap interval."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return float("nan"), float("nan"), float("nan")
    rng = np.random.default_rng([seed, 0xC1])
    means = v[rng.integers(0, v.size, (resamples, v.size))].mean(1)
    a = (1 - CONFIDENCE) / 2
    return float(v.mean()), float(np.quantile(means, a)), float(np.quantile(means, 1 - a))


def ratio_ci(nll: Sequence[float], tokens: Sequence[float], seed: int, resamples: int = RESAMPLES):
    """(sum nll / sum tokens, low, high): a loss per token with items resampled."""
    x, t = np.asarray(nll, dtype=np.float64), np.asarray(tokens, dtype=np.float64)
    if x.size == 0 or t.sum() == 0:
        return float("nan"), float("nan"), float("nan")
    idx = np.random.default_rng([seed, 0xC2]).integers(0, x.size, (resamples, x.size))
    draws = x[idx].sum(1) / np.maximum(t[idx].sum(1), 1)
    a = (1 - CONFIDENCE) / 2
    return float(x.sum() / t.sum()), float(np.quantile(draws, a)), float(np.quantile(draws, 1 - a))


def paired_ratio_difference(nll_a, nll_b, tokens, seed: int, resamples: int = RESAMPLES):
    """Loss-per-token difference of two models on the same items, items resampled jointly."""
    d = np.asarray(nll_a, dtype=np.float64) - np.asarray(nll_b, dtype=np.float64)
    return ratio_ci(d, tokens, seed, resamples)


def interval(draws: Sequence[float], point: float):
    d = np.asarray(draws, dtype=np.float64)
    if d.size == 0:
        return point, float("nan"), float("nan")
    a = (1 - CONFIDENCE) / 2
    return point, float(np.quantile(d, a)), float(np.quantile(d, 1 - a))


def seed_summary(per_seed: Sequence[float]) -> Dict[str, Optional[float]]:
    v = np.asarray(per_seed, dtype=np.float64)
    return {"mean": float(v.mean()) if v.size else float("nan"),
            "spread": float(v.max() - v.min()) if v.size > 1 else None,
            "seeds": int(v.size)}


def paired_difference(a: Sequence[Sequence[float]], b: Sequence[Sequence[float]], seed: int,
                      resamples: int = RESAMPLES):
    """(mean diff, low, high) of mean(a) - mean(b) over problems, seeds averaged per problem.

    ``a`` and ``b`` are [seed][problem] with the same problems in the same order.
    """
    x = np.mean(np.asarray(a, dtype=np.float64), axis=0)
    y = np.mean(np.asarray(b, dtype=np.float64), axis=0)
    d = x - y
    return bootstrap_ci(d, seed, resamples)


def verdict(name_a: str, name_b: str, metric: str, a_seed_means: Sequence[float],
            b_seed_means: Sequence[float], paired, higher_is_better: bool = True) -> Dict[str, object]:
    """The comparison of two arms on one figure, worded from the numbers."""
    sa, sb = seed_summary(a_seed_means), seed_summary(b_seed_means)
    diff = sa["mean"] - sb["mean"]
    spreads = [s for s in (sa["spread"], sb["spread"]) if s is not None]
    spread = max(spreads) if spreads else None
    _, lo, hi = paired
    inside_spread = spread is not None and abs(diff) <= spread
    no_ci = np.isnan(lo) or np.isnan(hi)
    ci_has_zero = not no_ci and lo <= 0 <= hi
    no_noise_estimate = spread is None and no_ci  # one seed and nothing paired: cannot tell
    tie = inside_spread or ci_has_zero or no_noise_estimate or np.isnan(diff) or diff == 0
    better = None if tie else (name_a if (diff > 0) == higher_is_better else name_b)
    if tie:
        why = []
        if inside_spread:
            why.append(f"the difference {diff:+.4g} is within the seed spread {spread:.4g}")
        if ci_has_zero:
            why.append(f"the paired 95% interval [{lo:+.4g}, {hi:+.4g}] contains 0")
        if no_noise_estimate and not np.isnan(diff):
            why.append(f"the difference {diff:+.4g} comes from one seed with no paired interval, "
                       "so it cannot be told from seed noise")
        text = f"{metric}: {name_a} vs {name_b} is a tie ({'; '.join(why) or 'no difference'})."
    else:
        spread_txt = (f"larger than the seed spread {spread:.4g}" if spread is not None
                      else "one seed, so no seed spread to compare with")
        ci_txt = "" if no_ci else f", paired 95% interval [{lo:+.4g}, {hi:+.4g}]"
        text = f"{metric}: {better} is better ({name_a} - {name_b} = {diff:+.4g}{ci_txt}, {spread_txt})."
    return {"metric": metric, "a": name_a, "b": name_b, "difference": diff, "ci": [lo, hi],
            "seed_spread": spread, "tie": bool(tie), "better": better, "text": text}


def pooled(values_by_seed: List[List[float]]) -> List[float]:
    return [v for vs in values_by_seed for v in vs]
