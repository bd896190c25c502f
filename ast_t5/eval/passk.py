"""The unbiased pass@k estimator (Chen et al., 2021, "Evaluating Large Language Models Trained on
Code", section 2.1).

For a problem with n samples of which c pass, pass@k = 1 - C(n-c, k) / C(n, k): the probability
that at least one of k samples drawn without replacement passes. The benchmark score is the mean
over problems. Here the binomial coefficients are exact Python integers and the result is one
correctly rounded division, (C(n, k) - C(n-c, k)) / C(n, k), so there is neither overflow nor
cancellation for any n.
"""
import logging
import math
from typing import Dict, Sequence, Tuple

logger = logging.getLogger(__name__)

DEFAULT_KS = (1, 10, 100)  # the values reported by Chen et al. (2021)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem with `n` samples, `c` of them correct.

    Raises:
        ValueError: unless 0 <= c <= n and 1 <= k <= n.
    """
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}")
    total = math.comb(n, k)
    return (total - math.comb(n - c, k)) / total


def mean_pass_at_k(counts: Sequence[Tuple[int, int]], k: int) -> float:
    """Mean pass@k over problems given as (n, c) pairs."""
    if not counts:
        raise ValueError("pass@k of an empty benchmark")
    return sum(pass_at_k(n, c, k) for n, c in counts) / len(counts)


def pass_at_k_table(counts: Sequence[Tuple[int, int]], ks: Sequence[int],
                    warn: bool = True) -> Dict[str, float]:
    """{"pass@k": score} for every k in `ks` that every problem has enough samples for.

    A k that is skipped is logged as a warning, or only at debug level when `warn` is false.
    """
    if not counts:
        raise ValueError("pass@k of an empty benchmark")
    smallest_n = min(n for n, _ in counts)
    table = {}
    for k in sorted(set(ks)):
        if k > smallest_n:
            logger.log(logging.WARNING if warn else logging.DEBUG,
                       "pass@%d skipped: some problems have only %d samples", k, smallest_n)
            continue
        table[f"pass@{k}"] = mean_pass_at_k(counts, k)
    return table
