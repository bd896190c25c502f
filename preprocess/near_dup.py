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
with NumPy, which is 50x cheaper than a SHA-1 per shingle, and apply datasketch's permutation
parameters to all shingles of a file in one NumPy pass (``minhash_signature``, bit-identical to
``MinHash.update_batch``). At merge time, LSH candidates near or above the threshold are
verified with the exact Jaccard similarity of the two files' shingle sets, computed from their
stored tokens.

The LSH is datasketch's: its band layout for the candidate threshold (``lsh_bands``) and its
candidate rule (two signatures are candidates when all values of one band are equal). The
decisions are defined by ``ReferenceNearDupIndex`` (on ``MinHashLSH``); the merge makes the same
decisions with ``NearDupIndex``, which keeps about 180 bytes per file in NumPy arrays instead of
about 7 KB of Python objects, and reads the signatures from the shards' files through memory
maps. The index spans all languages and splits of a run (one visiting order over all groups).
"""
from typing import Callable, Dict, List, Optional, Sequence, Tuple

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
    # sorted distinct values, as np.unique gives them, but 5x cheaper on NumPy 2.4 (np.unique
    # of a small uint32 array takes a slower general path than one sort and one comparison)
    s = np.sort((h >> np.uint64(32)).astype(np.uint32))
    keep = np.empty(len(s), dtype=bool)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]


_PERMUTATIONS: Dict[int, tuple] = {}  # num_perm -> datasketch's (a, b, initial hash values)
_SIGNATURE_CHUNK = 4096  # shingles permuted at a time: a (num_perm, chunk) uint32 temporary (2 MB)


def _affine32(num_perm: int) -> tuple:
    """datasketch's own permutation parameters and initial values for (``SEED``, affine32),
    taken from a ``MinHash`` once per process (building one draws them from a RandomState)."""
    if num_perm not in _PERMUTATIONS:
        from datasketch import MinHash

        mh = MinHash(num_perm=num_perm, seed=SEED, hashfunc=_identity, scheme="affine32")
        a, b = (np.ascontiguousarray(x, dtype=np.uint32).reshape(-1, 1) for x in mh.permutations)
        _PERMUTATIONS[num_perm] = (a, b, np.asarray(mh.hashvalues, dtype=np.uint32).copy())
    return _PERMUTATIONS[num_perm]


def minhash_signature(ids: np.ndarray, num_perm: int = NUM_PERM) -> np.ndarray:
    """(num_perm,) uint32 MinHash signature of a file's token shingles.

    Bit-identical to ``datasketch.MinHash(num_perm, seed=SEED, hashfunc=identity,
    scheme="affine32").update_batch(shingle_ids(ids).tolist()).hashvalues`` (tested on random
    inputs, see ``reference_minhash_signature``), computed in one NumPy pass per chunk of
    shingles with datasketch's permutation parameters and its input finalizer (``_fmix``),
    without the per-value Python call and list of ``update_batch`` and without drawing the
    permutations again for every file: 2-5x cheaper per file (BENCHMARKS.md).
    """
    from datasketch.minhash import _fmix

    a, b, init = _affine32(num_perm)
    sig = init.copy()
    sh = shingle_ids(ids)
    if len(sh):
        hv = _fmix(sh, 32)  # uint32 arithmetic wraps, as in datasketch
        for start in range(0, len(hv), _SIGNATURE_CHUNK):
            phv = np.multiply(a, hv[None, start:start + _SIGNATURE_CHUNK])  # (num_perm, chunk)
            phv += b
            np.minimum(sig, phv.min(axis=1), out=sig)
    return sig


def reference_minhash_signature(ids: np.ndarray, num_perm: int = NUM_PERM) -> np.ndarray:
    """``minhash_signature`` through datasketch's public ``MinHash.update_batch`` (the
    definition the fast path is tested against)."""
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


def candidate_threshold(threshold: float) -> float:
    """The similarity the LSH bands are tuned for (below the decision threshold, so that pairs
    just above it are candidates with high probability: at 0.8, 0.99 instead of 0.4)."""
    return max(0.3, threshold - CANDIDATE_MARGIN)


def lsh_bands(threshold: float, num_perm: int = NUM_PERM) -> Tuple[int, int]:
    """(bands, rows per band) that datasketch's ``MinHashLSH`` chooses for this decision
    threshold: 18 bands of 7 rows at 0.8 (permutations 126 and 127 are in no band)."""
    from datasketch import MinHashLSH

    lsh = MinHashLSH(threshold=candidate_threshold(threshold), num_perm=num_perm)
    return lsh.b, lsh.r


_KEY_MIX = np.uint64(0xBF58476D1CE4E5B9)  # splitmix64 multipliers, for the band keys
_KEY_MIX2 = np.uint64(0x94D049BB133111EB)


def band_keys(sigs: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """(n, bands) uint64: one 64-bit hash of each band's ``rows`` values per signature. Equal
    band values give equal keys; the rare unequal values with equal keys are filtered out when
    the candidates are checked (``NearDupIndex``), so the candidates stay datasketch's."""
    h = np.full((len(sigs), bands), 0x9E3779B97F4A7C15, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(rows):
            h ^= sigs[:, j:bands * rows:rows]  # value j of every band, widened to uint64
            h *= _KEY_MIX
            h ^= h >> np.uint64(31)
        h *= _KEY_MIX2
        h ^= h >> np.uint64(29)
    return h


class NearDupIndex:
    """The near-duplicate decisions of ``ReferenceNearDupIndex`` (datasketch's ``MinHashLSH``),
    made in bounded memory over signatures that stay on disk.

    The files are the rows ``rows_b`` of each block ``b`` of signatures (``(n_b, num_perm)``
    uint32, a ``np.memmap`` of a shard's signature file), in block order then row order; entry
    ``e`` is the e-th of them. Entry ``e`` is a near duplicate of the earliest entry ``c < e``
    that is still kept, shares all ``r`` values of at least one of datasketch's ``b`` bands with
    ``e`` (``lsh_bands``: exactly the pairs ``MinHashLSH.query`` returns), has an estimated
    similarity of at least ``threshold`` (``threshold - VERIFY_MARGIN`` when ``exact`` is given)
    and, when ``exact`` is given, an exact similarity of at least ``threshold``.

    How: per band, a 64-bit key per entry (``band_keys``, computed from the memory-mapped
    signatures in chunks and spilled to a temporary file under ``workdir``); a stable sort of
    each band's keys numbers the groups of entries with equal keys (an entry alone in its group
    gets -1: nothing can match it through that band). The entries are then visited in order,
    and each band's kept members of a group form a linked list through one int32 per entry and
    band (the list head per group, the next older kept member in the entry's slot, written over
    its group id once it is visited), so the candidates of an entry are walked without scanning
    removed files.

    Memory, per entry: ``4 * bands`` bytes of group ids / links (72 B at the default threshold,
    18 bands; past ``MAX_SLOT_BYTES`` a memory-mapped file in ``workdir`` instead of RAM), 4 B
    per group of two or more entries for its list head (few: most band keys are unique), 24 B
    for the rows and the result (partner, similarity); while the groups are numbered, one band
    at a time, about 40 B more (keys, sort order, group numbers). Measured: 180 B per file of
    peak anonymous memory at 200,000 files, against 6.8 KB per file for
    ``ReferenceNearDupIndex`` (``benchmarks/bench_preprocess.py --near-dup-index``). The
    signatures are read through the memory maps (a chunk at a time, and each candidate's row
    when it is checked), never loaded whole.
    """

    CHUNK = 1 << 14  # entries whose band keys are computed at a time (8 MB of signatures)
    MAX_SLOT_BYTES = 1 << 30  # larger group-id/link tables are a memory-mapped file in workdir

    def __init__(self, threshold: float = DEFAULT_THRESHOLD, num_perm: int = NUM_PERM,
                 workdir: Optional[str] = None):
        if not 0 < threshold <= 1:
            raise ValueError("the near-duplicate threshold must be in (0, 1]")
        self.threshold, self.num_perm, self.workdir = threshold, num_perm, workdir
        self.bands, self.rows = lsh_bands(threshold, num_perm)

    def run(self, blocks: Sequence[Tuple[np.ndarray, np.ndarray]],
            exact: Optional[Callable[[int, int], float]] = None) -> Tuple[np.ndarray, np.ndarray]:
        """Decide every entry of ``blocks`` (``(signatures, rows)`` pairs, see the class).

        ``exact(e, c)``, when given, is the exact Jaccard similarity of entries ``e`` and ``c``.

        Returns:
            ``(partner, similarity)``: int64 and float64 arrays over the entries; ``partner[e]``
            is the kept entry that ``e`` duplicates, or -1 when ``e`` is kept, and
            ``similarity[e]`` the similarity that decided it (estimated or exact).
        """
        import shutil
        import tempfile

        self.blocks = [(sigs, np.asarray(rows, dtype=np.int64)) for sigs, rows in blocks]
        for sigs, _ in self.blocks:
            if sigs.ndim != 2 or sigs.shape[1] != self.num_perm:
                raise ValueError(f"signatures of shape {sigs.shape}, expected (n, {self.num_perm})")
        self.starts = np.cumsum([0] + [len(r) for _, r in self.blocks])
        n = int(self.starts[-1])
        if n >= 2 ** 31:
            raise ValueError(f"{n} files: the index numbers files with int32 (split the run)")
        partner = np.full(n, -1, dtype=np.int64)
        similarity = np.zeros(n, dtype=np.float64)
        if n == 0:
            return partner, similarity
        tmp = tempfile.mkdtemp(prefix="near_dup.", dir=self.workdir)
        try:
            slots, heads = self._number_groups(n, tmp)
            self._visit(slots, heads, exact, partner, similarity)
            del slots
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return partner, similarity

    def locate(self, entry: int) -> Tuple[int, int]:
        """(block, row) of an entry."""
        b = int(np.searchsorted(self.starts, entry, side="right")) - 1
        return b, int(self.blocks[b][1][entry - self.starts[b]])

    def signature(self, entry: int) -> np.ndarray:
        b, row = self.locate(entry)
        return np.asarray(self.blocks[b][0][row], dtype=np.uint32)

    def _chunks(self):
        """Signatures of the entries in order, ``CHUNK`` at a time."""
        for sigs, rows in self.blocks:
            for start in range(0, len(rows), self.CHUNK):
                yield np.asarray(sigs[rows[start:start + self.CHUNK]], dtype=np.uint32)

    def _number_groups(self, n: int, tmp: str) -> Tuple[np.ndarray, List[np.ndarray]]:
        import os

        paths = [os.path.join(tmp, f"band{k}.u64") for k in range(self.bands)]
        files = [open(p, "wb") for p in paths]
        try:
            for chunk in self._chunks():
                keys = band_keys(chunk, self.bands, self.rows)
                for k, f in enumerate(files):
                    f.write(np.ascontiguousarray(keys[:, k]).tobytes())
        finally:
            for f in files:
                f.close()
        if n * self.bands * 4 > self.MAX_SLOT_BYTES:  # on disk, paged in as the visit needs them
            slots = np.memmap(os.path.join(tmp, "slots.i32"), dtype=np.int32, mode="w+",
                              shape=(n, self.bands))
        else:
            slots = np.empty((n, self.bands), dtype=np.int32)
        heads = []  # per band, the newest kept member of each shared group (-1: none yet)
        for k, path in enumerate(paths):
            keys = np.fromfile(path, dtype=np.uint64)
            os.remove(path)
            order = np.argsort(keys, kind="stable")
            sorted_keys = keys[order]
            del keys
            new = np.empty(n, dtype=bool)
            new[0] = True
            np.not_equal(sorted_keys[1:], sorted_keys[:-1], out=new[1:])
            del sorted_keys
            run = np.cumsum(new) - 1  # run (equal keys) of each sorted position
            size = np.bincount(run)
            shared = size >= 2
            local = np.full(len(size), -1, dtype=np.int32)
            local[shared] = np.arange(int(shared.sum()), dtype=np.int32)
            heads.append(np.full(int(shared.sum()), -1, dtype=np.int32))
            slots[order, k] = local[run]
            del order, run, new
        return slots, heads

    def _visit(self, slots, heads, exact, partner, similarity) -> None:
        bands, rows = self.bands, self.rows
        floor = self.threshold - (VERIFY_MARGIN if exact is not None else 0.0)
        # entries that share a group in some band; the others are kept and cannot be matched
        chunk = self.CHUNK * 4
        active = (e for s in range(0, len(slots), chunk)
                  for e in (np.flatnonzero((slots[s:s + chunk] >= 0).any(axis=1)) + s).tolist())
        for e in active:
            slot = slots[e]
            ks = np.flatnonzero(slot >= 0).tolist()
            groups = [int(slot[k]) for k in ks]
            cands = set()
            for k, g in zip(ks, groups):
                c = int(heads[k][g])
                while c >= 0:
                    cands.add(c)
                    c = int(slots[c, k])
            if cands:
                sig = self.signature(e)
                for c in sorted(cands):
                    eq = sig == self.signature(c)
                    if not eq[:bands * rows].reshape(bands, rows).all(axis=1).any():
                        continue  # equal 64-bit keys, unequal band values: not a candidate
                    sim = float(np.count_nonzero(eq)) / len(eq)
                    if sim < floor:
                        continue
                    if exact is not None:
                        sim = exact(e, c)
                    if sim >= self.threshold:
                        partner[e], similarity[e] = c, sim
                        break
            if partner[e] < 0:  # kept: first in the kept lists of its groups
                for k, g in zip(ks, groups):
                    slots[e, k] = heads[k][g]
                    heads[k][g] = e


class ReferenceNearDupIndex:
    """The definition of the near-duplicate decisions, on datasketch's ``MinHashLSH`` (the merge
    used it until its memory grew with the corpus: about 7 KB of Python objects per file, all
    signatures and band keys held; ``NearDupIndex`` makes the same decisions in bounded memory
    and is tested against this class).

    Files added one by one, in a fixed order; each is either new or a near duplicate of an
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
        self.lsh = MinHashLSH(threshold=candidate_threshold(threshold), num_perm=num_perm)
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
