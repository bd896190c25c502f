"""Near-duplicate removal: MinHash over token shingles, LSH to find candidates (datasketch).

As the published code corpora do it (The Stack, StarCoderData): every kept file gets a MinHash
signature of the set of its ``SHINGLE``-token shingles (sentencepiece ids, so the shingles are
the tokens the model sees); a locality-sensitive hash over the signatures finds candidate pairs
and a pair whose estimated Jaccard similarity is at least the threshold is a near duplicate.

Signatures are computed in the workers with the pipeline's other per-file work and stored with
each shard; the decision is made at merge time, over all shards, in one fixed order (language
group, shard, file order inside the shard), so a sharded run gives the same bytes every time.
The first file of a near-duplicate cluster in that order is kept, the later ones are removed.

Hashing and permutations are datasketch's ``MinHash`` (the affine32 scheme, which mixes each
input value before permuting it): we only encode each shingle of token ids as one 32-bit integer
with NumPy, which is 50x cheaper than a SHA-1 per shingle. At merge time, LSH candidates near
or above the threshold are verified with the exact Jaccard similarity of the two files' shingle
sets, computed from their stored tokens.
"""
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

DEFAULT_THRESHOLD = 0.8  # Jaccard similarity above which two files are near duplicates
NUM_PERM = 128  # signature length (datasketch's default)
SHINGLE = 5  # tokens per shingle
CANDIDATE_MARGIN = 0.2  # LSH bands tuned for threshold - margin, see NearDupIndex
VERIFY_MARGIN = 0.1  # candidates estimated within this below the threshold or above are verified
SEED = 1  # datasketch's default permutation seed: signatures are reproducible everywhere
_MIX = np.uint64(0x9E3779B97F4A7C15)  # odd 64-bit multiplier (golden ratio) for shingle ids


def _identity(x):
    return x


def shingle_ids(ids: np.ndarray, k: int = SHINGLE) -> np.ndarray:
    """Distinct 32-bit ids of the k-token shingles of a token sequence (one for short files)."""
    ids = np.asarray(ids, dtype=np.uint64)
    if len(ids) == 0:
        return np.zeros(0, dtype=np.uint32)
    k = min(k, len(ids))
    n = len(ids) - k + 1
    h = np.zeros(n, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(k):  # polynomial hash of each window, wrapping modulo 2**64
            h = h * _MIX + ids[j:j + n] + np.uint64(1)
    return np.unique((h >> np.uint64(32)).astype(np.uint32))


def minhash_signature(ids: np.ndarray, num_perm: int = NUM_PERM) -> np.ndarray:
    """(num_perm,) uint32 MinHash signature of a file's token shingles."""
    from datasketch import MinHash

    mh = MinHash(num_perm=num_perm, seed=SEED, hashfunc=_identity, scheme="affine32")
    sh = shingle_ids(ids)
    if len(sh):
        mh.update_batch(sh.tolist())
    return np.asarray(mh.hashvalues, dtype=np.uint32)


def exact_jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """Jaccard similarity of two sorted arrays of distinct shingle ids."""
    inter = len(np.intersect1d(a, b, assume_unique=True))
    union = len(a) + len(b) - inter
    return inter / union if union else 1.0


def estimated_jaccard(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.count_nonzero(a == b)) / len(a)


class NearDupIndex:
    """Files added one by one, in a fixed order; each is either new or a near duplicate of an
    earlier file. Candidates come from datasketch's ``MinHashLSH``; every candidate is checked
    with the estimated Jaccard similarity, and the earliest one at or above the threshold wins."""

    def __init__(self, threshold: float = DEFAULT_THRESHOLD, num_perm: int = NUM_PERM):
        from datasketch import MinHashLSH

        if not 0 < threshold <= 1:
            raise ValueError("the near-duplicate threshold must be in (0, 1]")
        self.threshold, self.num_perm = threshold, num_perm
        # The bands are tuned for a lower similarity than the threshold, so that pairs just above
        # it are candidates with high probability (at 0.8: 0.99 instead of datasketch's 0.4);
        # the exact check of every candidate keeps the precision.
        self.lsh = MinHashLSH(threshold=max(0.3, threshold - CANDIDATE_MARGIN), num_perm=num_perm)
        self.signatures: List[np.ndarray] = []

    def add(self, signature: np.ndarray, exact: Optional[Callable[[int], float]] = None
            ) -> Optional[Tuple[int, float]]:
        """Return ``(index of the earlier file, similarity)`` for a near duplicate (not added),
        else None (the file is added with the next index).

        ``exact(i)``, when given, is the exact Jaccard similarity of the shingle sets of the new
        file and earlier file ``i``: a candidate whose estimate is at least ``threshold -
        VERIFY_MARGIN`` is then accepted if and only if the exact similarity reaches the
        threshold (the estimate of 128 permutations has a standard deviation of about 0.035 at
        0.8, so this is what keeps the precision near 1 on corpora with many borderline pairs).
        """
        from datasketch import LeanMinHash, MinHash

        mh = LeanMinHash(MinHash(num_perm=self.num_perm, seed=SEED, hashvalues=signature,
                                 scheme="affine32"))
        best = None
        floor = self.threshold - (VERIFY_MARGIN if exact is not None else 0.0)
        for cand in sorted(self.lsh.query(mh)):
            sim = estimated_jaccard(signature, self.signatures[cand])
            if sim < floor:
                continue
            if exact is not None:
                sim = exact(cand)
            if sim >= self.threshold:
                best = (cand, sim)
                break
        if best is not None:
            return best
        self.lsh.insert(len(self.signatures), mh, check_duplication=False)
        self.signatures.append(np.asarray(signature, dtype=np.uint32))
        return None


def summary(removed: Dict[str, int], pairs: list, threshold: float, max_pairs: int = 20) -> dict:
    """The manifest's ``near_duplicates`` entry."""
    return {"threshold": threshold, "num_perm": NUM_PERM, "shingle_tokens": SHINGLE,
            "removed": dict(sorted(removed.items())), "removed_total": sum(removed.values()),
            "sample_pairs": pairs[:max_pairs]}
