"""T5 random-span corruption (Raffel et al., JMLR 2020, section 3.1.4; spec section 5.10).

The baseline objective and the one used for the natural-language ("text") subset. Written from
the description of T5's ``random_spans_noise_mask``: with ``L`` tokens, ``round(L * density)``
noise tokens form ``round(noise / mean_span_length)`` spans; the noise and non-noise token counts
are each split into that many positive parts uniformly at random, and the parts alternate,
non-noise first. So the noise fraction and the mean span length match the requested values in
distribution. Pure NumPy, explicit generator.

Optional "empty" sentinels (the original's ``empty_prob``, spec section 5.10): a share of the
noise budget becomes sentinels with no content, inserted between two unmasked tokens.
"""
from typing import Optional, Tuple

import numpy as np

from .sentinels import SentinelSpec, build_source_target, fit_spans
from .spans import mask_runs, random_composition, ranges_to_indices


def _check_args(noise_density: float, mean_span_length: float, empty_prob: float) -> None:
    if not 0.0 <= noise_density < 1.0:
        raise ValueError(f"noise_density={noise_density} must be in [0, 1)")
    if not mean_span_length >= 1.0:
        raise ValueError(f"mean_span_length={mean_span_length} must be >= 1")
    if not 0.0 <= empty_prob <= 1.0:
        raise ValueError(f"empty_prob={empty_prob} must be in [0, 1]")


def random_spans_noise_mask(length: int, noise_density: float, mean_span_length: float,
                            rng: np.random.Generator) -> np.ndarray:
    """T5's noise mask: which of ``length`` tokens are noise.

    ``num_noise = clip(round(length * noise_density), 1, length - 1)`` (0 when the density is 0
    or ``length < 2``), ``num_spans = clip(round(num_noise / mean_span_length), 1,
    min(num_noise, length - num_noise))``. Rounding is round-half-to-even, as in T5.

    Returns:
        (length,) bool; noise spans never touch each other, the last token is always noise.
    """
    _check_args(noise_density, mean_span_length, 0.0)
    if length < 2 or noise_density == 0.0:
        return np.zeros(max(length, 0), dtype=bool)
    num_noise = min(max(int(round(length * noise_density)), 1), length - 1)
    num_keep = length - num_noise
    num_spans = min(max(int(round(num_noise / mean_span_length)), 1), num_noise, num_keep)
    noise_lens = random_composition(num_noise, num_spans, rng)
    keep_lens = random_composition(num_keep, num_spans, rng)
    span_ends = np.cumsum(keep_lens + noise_lens)  # (keep, noise) pairs, keep first
    mask = np.zeros(length, dtype=bool)
    mask[ranges_to_indices(span_ends - noise_lens, span_ends)] = True
    return mask


def _empty_slots(mask: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` distinct boundaries between two unmasked tokens (fewer if there are not enough).

    Returns:
        (e,) int64 positions b: the empty sentinel goes before token b.
    """
    b = np.flatnonzero(~mask[:-1] & ~mask[1:]) + 1
    return np.sort(rng.choice(b, min(count, b.size), replace=False)) if count > 0 else b[:0]


def t5_span_corruption(tokens, noise_density: float, mean_span_length: float,
                       rng: np.random.Generator, *, sentinels: SentinelSpec,
                       max_target_len: Optional[int] = None, empty_prob: float = 0.0
                       ) -> Tuple[np.ndarray, np.ndarray]:
    """T5 span corruption of one item.

    Args:
        tokens: (N + 1,) int item, content then ``</s>``; ids below the first sentinel.
        noise_density: fraction of content tokens that become noise (T5: 0.15; the original's
            baseline config: 0.15, spec section 6).
        mean_span_length: mean noise span length (T5: 3.0; the original's baseline uses spans
            1..10, i.e. about 5.5).
        rng: the sample's generator (``sample_rng(seed, epoch, index)``).
        sentinels: vocabulary layout (sentinel k has id ``vocab_size - 1 - k``).
        max_target_len: longest target including ``</s>``, or None for no limit; spans that do
            not fit (or exceed ``num_sentinels``) are dropped from the end, see ``fit_spans``.
        empty_prob: share of the noise budget spent on empty sentinels (original default 0.1 on
            text, 0.0 in its baseline); 0 reproduces T5 exactly. Each empty sentinel adds one
            source token, so with empty_prob > 0 the source can outgrow the item.
    Returns:
        ``(source, target)``, int64, in the format of :mod:`ast_t5.data.sentinels`.
    """
    _check_args(noise_density, mean_span_length, empty_prob)
    tokens = np.asarray(tokens)
    sentinels.check_tokens(tokens)
    content = tokens[:-1].astype(np.int64)
    num_empty = int(round(content.size * noise_density * empty_prob))
    mask = random_spans_noise_mask(content.size, noise_density * (1.0 - empty_prob),
                                   mean_span_length, rng) if empty_prob < 1.0 else \
        np.zeros(content.size, dtype=bool)
    starts, ends = mask_runs(mask)
    if num_empty and content.size >= 2:
        slots = _empty_slots(mask, num_empty, rng)
        starts, ends = np.concatenate((starts, slots)), np.concatenate((ends, slots))
        order = np.argsort(starts, kind="stable")
        starts, ends = starts[order], ends[order]
    sentinel = np.arange(starts.size, dtype=np.int64)
    keep = fit_spans(starts, ends, sentinel, sentinels.num_sentinels, max_target_len)
    return build_source_target(content, starts[keep], ends[keep], sentinel[keep], sentinels)
