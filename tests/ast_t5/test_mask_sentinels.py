"""Sentinel convention and source/target format (ast_t5/data/sentinels.py)."""
import numpy as np
import pytest

from ast_t5.data.sentinels import (SentinelSpec, build_source_target, first_appearance_ranks,
                                   fit_spans, reconstruct, sentinel_symbols)

SPEC = SentinelSpec(vocab_size=50, num_sentinels=10)  # sentinels 40..49, <extra_id_0> = 49


def test_spec_example_with_a_shared_sentinel():
    # a b X Y c d Z e X Y  with spans [X Y] (shared), [Z], [X Y]   (spec section 5.8 example)
    a, b, x, y, c, d, z, e = range(10, 18)
    content = np.array([a, b, x, y, c, d, z, e, x, y])
    starts, ends = np.array([2, 6, 8]), np.array([4, 7, 10])
    sent = first_appearance_ranks(np.array([7, 3, 7]))
    assert sent.tolist() == [0, 1, 0]
    source, target = build_source_target(content, starts, ends, sent, SPEC)
    assert source.tolist() == [a, b, 49, c, d, 48, e, 49, 2]
    assert target.tolist() == [49, x, y, 48, z, 2]
    assert reconstruct(source, target, SPEC).tolist() == content.tolist() + [2]


def test_empty_spans_and_no_spans():
    content = np.array([10, 11, 12])
    source, target = build_source_target(content, np.array([1]), np.array([1]), np.array([0]), SPEC)
    assert source.tolist() == [10, 49, 11, 12, 2] and target.tolist() == [49, 2]
    source, target = build_source_target(content, np.zeros(0, int), np.zeros(0, int),
                                         np.zeros(0, int), SPEC)
    assert source.tolist() == [10, 11, 12, 2] and target.tolist() == [2]


def test_fit_spans_keeps_the_longest_prefix_that_fits():
    starts, ends = np.array([0, 5, 10, 20]), np.array([3, 6, 14, 22])
    sent = np.array([0, 1, 0, 2])  # target cost: 1 + (1+3) + (1+1) + (1+2) = 10
    assert fit_spans(starts, ends, sent, 10, None).all()
    assert fit_spans(starts, ends, sent, 10, 10).all()
    assert fit_spans(starts, ends, sent, 10, 9).tolist() == [True, True, True, False]
    assert fit_spans(starts, ends, sent, 1, None).tolist() == [True, False, True, False]
    assert not fit_spans(starts, ends, sent, 10, 4).any()


def test_spec_validation_and_token_checks():
    with pytest.raises(ValueError, match="num_sentinels"):
        SentinelSpec(vocab_size=50, num_sentinels=0)
    with pytest.raises(ValueError, match="vocab_size"):
        SentinelSpec(vocab_size=10, num_sentinels=7)
    with pytest.raises(ValueError, match="1-D integer"):
        SPEC.check_tokens(np.array([1.0, 2.0]))
    SPEC.check_tokens(np.array([5, 39, 2], dtype=np.uint16))
    assert SPEC.first_sentinel == 40 and SPEC.sentinel_id(np.arange(3)).tolist() == [49, 48, 47]
    assert sentinel_symbols(3) == ["<extra_id_2>", "<extra_id_1>", "<extra_id_0>"]


@pytest.mark.parametrize("source, target, match", [
    ([10, 49], [49, 11, 2], "end with </s>"),
    ([10, 49, 2], [11, 49, 2], "start with a sentinel"),
    ([10, 48, 2], [49, 11, 2], "missing"),
])
def test_reconstruct_rejects_malformed_pairs(source, target, match):
    with pytest.raises(ValueError, match=match):
        reconstruct(source, target, SPEC)
