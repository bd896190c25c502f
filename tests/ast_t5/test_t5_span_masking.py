"""T5 random-span corruption (ast_t5/data/t5_span_masking.py): distribution and format."""
from math import comb

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ast_t5.data.sentinels import SentinelSpec, reconstruct
from ast_t5.data.spans import mask_runs, sample_rng
from ast_t5.data.t5_span_masking import random_spans_noise_mask, t5_span_corruption

SPEC = SentinelSpec(vocab_size=1000, num_sentinels=200)


def test_noise_fraction_and_span_length_match_the_request():
    """Per sample, T5 fixes round(L * density) noise tokens in round(noise / mean) spans; the
    random segmentation must give span lengths distributed as a uniform composition."""
    length, density, mean = 500, 0.15, 3.0
    noise, spans = round(length * density), round(round(length * density) / mean)
    rng = np.random.default_rng(0)
    lengths, per_position = [], np.zeros(length)
    for _ in range(3000):
        mask = random_spans_noise_mask(length, density, mean, rng)
        s, e = mask_runs(mask)
        assert mask.sum() == noise and s.size == spans  # spans never touch
        lengths.append(e - s)
        per_position += mask
    lengths = np.concatenate(lengths)
    assert abs(lengths.mean() - noise / spans) < 1e-9
    # P(part = j) of a uniform composition of `noise` into `spans` parts.
    p = np.array([comb(noise - j - 1, spans - 2) / comb(noise - 1, spans - 1) for j in range(1, 9)])
    freq = np.bincount(lengths, minlength=9)[1:9] / lengths.size
    assert np.all(np.abs(freq - p) < 4 * np.sqrt(p * (1 - p) / lengths.size) + 1e-3), (freq, p)
    rate = per_position[:-1] / 3000  # the last token is always noise, as in T5
    assert per_position[-1] == 3000
    assert abs(rate[: length // 2].mean() - rate[length // 2:].mean()) < 0.01
    assert abs(rate.mean() - density) < 0.01


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(4, 799), max_size=120), st.floats(0, 0.9), st.floats(1, 8),
       st.sampled_from([0.0, 0.1, 0.5]), st.integers(0, 10 ** 6))
def test_reconstruction_and_format(content, density, mean, empty_prob, seed):
    tokens = np.array(content + [SPEC.eos])
    source, target = t5_span_corruption(tokens, density, mean, sample_rng(seed, 0, 0),
                                        sentinels=SPEC, empty_prob=empty_prob)
    assert np.array_equal(reconstruct(source, target, SPEC), tokens)
    src_sent = [t for t in source.tolist() if t >= SPEC.first_sentinel]
    tgt_sent = [t for t in target.tolist() if t >= SPEC.first_sentinel]
    assert src_sent == tgt_sent == [999 - k for k in range(len(src_sent))]
    n = len(content)
    if empty_prob == 0.0:
        noise = 0 if n < 2 or density == 0 else min(max(round(n * density), 1), n - 1)
        assert target.size - 1 - len(tgt_sent) == noise


def test_empty_sentinels_have_no_content():
    tokens = np.append(np.arange(4, 404), SPEC.eos)
    source, target = t5_span_corruption(tokens, 0.15, 3.0, sample_rng(0, 0, 0), sentinels=SPEC,
                                        empty_prob=0.5)
    tgt = target.tolist()
    is_sentinel = lambda t: t >= SPEC.first_sentinel
    empties = [i for i in range(len(tgt) - 1)
               if is_sentinel(tgt[i]) and (is_sentinel(tgt[i + 1]) or tgt[i + 1] == SPEC.eos)]
    assert len(empties) == round(400 * 0.15 * 0.5)
    assert np.array_equal(reconstruct(source, target, SPEC), tokens)


@pytest.mark.parametrize("max_target_len", [2, 5, 17, 40])
def test_targets_respect_max_target_len_and_sentinel_count(max_target_len):
    tokens = np.append(np.arange(4, 604), SPEC.eos)
    few = SentinelSpec(vocab_size=1000, num_sentinels=6)
    for i in range(20):
        source, target = t5_span_corruption(tokens, 0.3, 3.0, sample_rng(0, 0, i), sentinels=few,
                                            max_target_len=max_target_len)
        assert target.size <= max_target_len
        assert sum(t >= few.first_sentinel for t in target.tolist()) <= 6
        assert np.array_equal(reconstruct(source, target, few), tokens)


def test_determinism_short_inputs_and_bad_arguments():
    tokens = np.append(np.arange(4, 104), SPEC.eos)
    a = t5_span_corruption(tokens, 0.15, 3, sample_rng(1, 2, 3), sentinels=SPEC)
    b = t5_span_corruption(tokens, 0.15, 3, sample_rng(1, 2, 3), sentinels=SPEC)
    c = t5_span_corruption(tokens, 0.15, 3, sample_rng(1, 3, 3), sentinels=SPEC)
    assert all(np.array_equal(x, y) for x, y in zip(a, b)) and not np.array_equal(a[0], c[0])
    for short in ([SPEC.eos], [7, SPEC.eos]):
        source, target = t5_span_corruption(np.array(short), 0.5, 3, sample_rng(0, 0, 0),
                                            sentinels=SPEC)
        assert source.tolist() == short and target.tolist() == [SPEC.eos]
    for kwargs, match in (({"noise_density": 1.0}, "noise_density"),
                          ({"mean_span_length": 0.5}, "mean_span_length"),
                          ({"empty_prob": 2.0}, "empty_prob")):
        args = {"noise_density": 0.15, "mean_span_length": 3.0, **kwargs}
        with pytest.raises(ValueError, match=match):
            t5_span_corruption(tokens, args.pop("noise_density"), args.pop("mean_span_length"),
                               sample_rng(0, 0, 0), sentinels=SPEC, **args)
