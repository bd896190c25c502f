"""ast_t5.eval.passk: exact against brute-force enumeration of k-subsets."""
import itertools
import math
from fractions import Fraction

import pytest

from ast_t5.eval.passk import mean_pass_at_k, pass_at_k, pass_at_k_table


def brute_force(n: int, c: int, k: int) -> Fraction:
    """Share of the k-subsets of n samples (the first c correct) that contain a correct one."""
    subsets = list(itertools.combinations(range(n), k))
    return Fraction(sum(any(i < c for i in subset) for subset in subsets), len(subsets))


@pytest.mark.parametrize("n", range(1, 9))
def test_matches_enumeration_exactly(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == float(brute_force(n, c, k)), (n, c, k)


def test_large_n_is_exact_and_stable():
    assert pass_at_k(2000, 1, 1) == 1 / 2000
    assert pass_at_k(10**6, 1, 1) == 1e-6  # 1 - (1 - 1e-6) would lose digits
    exact = 1 - Fraction(math.comb(5000, 100), math.comb(10000, 100))
    assert pass_at_k(10000, 5000, 100) == float(exact)
    assert pass_at_k(200, 0, 100) == 0.0 and pass_at_k(200, 101, 100) == 1.0


@pytest.mark.parametrize("n, c, k", [(5, 6, 1), (5, -1, 1), (5, 2, 0), (5, 2, 6)])
def test_rejects_impossible_arguments(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_mean_and_table():
    counts = [(4, 2), (4, 0), (2, 2)]
    assert mean_pass_at_k(counts, 1) == pytest.approx((0.5 + 0 + 1) / 3)
    table = pass_at_k_table(counts, [1, 2, 10])
    assert set(table) == {"pass@1", "pass@2"}  # pass@10 needs 10 samples per task
    assert table["pass@2"] == pytest.approx((1 - 1 / 6 + 0 + 1) / 3)
    with pytest.raises(ValueError):
        pass_at_k_table([], [1])
