"""The bounded near-duplicate index makes exactly the decisions of the datasketch reference, and
the vectorized signatures are bit-identical to datasketch's ``update_batch``."""
import numpy as np
import pytest

import ast_t5_preprocess.near_dup as nd
from ast_t5_preprocess.near_dup import (NearDupIndex, ReferenceNearDupIndex, exact_jaccard,
                                        lsh_bands, minhash_signature, reference_minhash_signature,
                                        shingle_ids)


def test_signature_is_bit_identical_to_datasketch_update_batch():
    rng = np.random.RandomState(0)
    lengths = [0, 1, 2, 4, 5, 6, 7, 100, 2500, 4095, 4100, 9000]
    for t in range(240):
        n = lengths[t % len(lengths)]
        ids = rng.randint(0, [3, 50, 32000, 2 ** 31 - 1][t % 4], n)
        sig = minhash_signature(ids)
        assert sig.dtype == np.uint32 and sig.shape == (128,)
        assert np.array_equal(sig, reference_minhash_signature(ids)), (t, n)
    for num_perm in (16, 256):
        ids = rng.randint(0, 32000, 3000)
        assert np.array_equal(minhash_signature(ids, num_perm), reference_minhash_signature(ids, num_perm))


def test_shingle_ids_are_numpy_unique():
    rng = np.random.RandomState(1)
    for n in (1, 3, 5, 6, 300, 5000):
        ids = rng.randint(0, 20, n)  # many repeated shingles
        sh = shingle_ids(ids)
        assert np.array_equal(sh, np.unique(sh)) and len(sh) < max(2, n)


def test_bands_are_datasketch_choice():
    from datasketch import MinHashLSH

    lsh = MinHashLSH(threshold=0.6, num_perm=128)
    assert lsh_bands(0.8) == (lsh.b, lsh.r) == (18, 7)


def _corpus(seed: int, num_bases: int = 150):
    """Token sequences with planted clusters: near copies at many edit rates (borderline pairs
    around the threshold included), clusters of several members, copies of copies, and singles."""
    rng = np.random.RandomState(seed)
    docs = []
    for _ in range(num_bases):
        base = rng.randint(4, 3000, rng.randint(30, 600))
        docs.append(base)
        for _ in range(rng.choice([0, 0, 1, 2, 5])):
            src = docs[rng.randint(len(docs) - 1, len(docs))] if rng.rand() < 0.3 else base
            copy = src.copy()
            rate = rng.choice([0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.08, 0.15])
            where = rng.rand(len(copy)) < rate
            copy[where] = rng.randint(4, 3000, where.sum())
            docs.append(copy)
    order = rng.permutation(len(docs))
    return [docs[i] for i in order]


def _reference(sigs, shingles, threshold, use_exact):
    """Decisions of ReferenceNearDupIndex: partner entry (or -1) and similarity per entry."""
    index = ReferenceNearDupIndex(threshold)
    kept_entries = []
    partner, sim = np.full(len(sigs), -1), np.zeros(len(sigs))
    for e, sig in enumerate(sigs):
        exact = (lambda c, e=e: exact_jaccard(shingles[e], shingles[kept_entries[c]])) if use_exact else None
        match = index.add(sig, exact)
        if match is None:
            kept_entries.append(e)
        else:
            partner[e], sim[e] = kept_entries[match[0]], match[1]
    return partner, sim


@pytest.mark.parametrize("threshold,use_exact,seed", [(0.8, True, 0), (0.8, False, 1), (0.7, True, 2)])
def test_banded_index_decides_like_datasketch_lsh(tmp_path, threshold, use_exact, seed):
    docs = _corpus(seed)
    shingles = [shingle_ids(d) for d in docs]
    sigs = np.stack([minhash_signature(d) for d in docs])
    ref_partner, ref_sim = _reference(sigs, shingles, threshold, use_exact)
    removed = ref_partner >= 0
    assert removed.sum() >= 60  # the clusters are there...
    assert len(set(ref_partner[removed].tolist())) < removed.sum()  # ...with several members
    # ...and borderline pairs: removed at an exact similarity near the threshold
    assert np.any(removed & (ref_sim < threshold + 0.05))
    # the signatures on disk in three blocks (shards), memory-mapped, every entry indexed
    path = tmp_path / "sigs.u32"
    sigs.tofile(path)
    mm = np.memmap(path, dtype=np.uint32, mode="r").reshape(len(sigs), -1)
    cuts = [0, len(sigs) // 3, len(sigs) // 2, len(sigs)]
    blocks = [(mm[a:b], np.arange(b - a)) for a, b in zip(cuts, cuts[1:])]
    exact = (lambda e, c: exact_jaccard(shingles[e], shingles[c])) if use_exact else None
    index = NearDupIndex(threshold, workdir=str(tmp_path))
    partner, sim = index.run(blocks, exact)
    assert np.array_equal(partner, ref_partner)
    assert np.array_equal(sim, ref_sim)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sigs.u32"]  # spill files removed


def test_banded_index_skips_rows_and_filters_key_collisions(tmp_path, monkeypatch):
    docs = _corpus(3, 80)
    shingles = [shingle_ids(d) for d in docs]
    sigs = np.stack([minhash_signature(d) for d in docs])
    rows = np.flatnonzero(np.arange(len(docs)) % 7 != 3)  # rows not indexed (exact duplicates)
    ref_partner, ref_sim = _reference(sigs[rows], [shingles[i] for i in rows], 0.8, True)
    exact = lambda e, c: exact_jaccard(shingles[rows[e]], shingles[rows[c]])  # noqa: E731
    # 64-bit band keys that collide for unequal band values: the candidates must stay datasketch's
    real_keys = nd.band_keys
    monkeypatch.setattr(nd, "band_keys", lambda s, b, r: real_keys(s, b, r) % np.uint64(5))
    for chunk in (1 << 16, 17):  # keys computed in one chunk or in many
        monkeypatch.setattr(NearDupIndex, "CHUNK", chunk)
        partner, sim = NearDupIndex(0.8).run([(sigs, rows)], exact)
        assert np.array_equal(partner, ref_partner) and np.array_equal(sim, ref_sim)
        assert (partner >= 0).sum() >= 20
    index = NearDupIndex(0.8)
    index.run([(sigs[:10], np.array([2, 5])), (sigs[10:], np.array([0, 4]))])
    assert index.locate(0) == (0, 2) and index.locate(3) == (1, 4)
    assert np.array_equal(index.signature(3), sigs[14])
    assert [len(a) for a in index.run([])] == [0, 0]
    with pytest.raises(ValueError):
        NearDupIndex(0.8).run([(sigs[:, :64], np.arange(3))])


def _planted_signatures(seed: int, n: int = 400):
    """Random signatures with planted variants whose LSH status is known: copies that agree
    on >= 86% of the values but on no whole band (never candidates for datasketch), copies that
    share exactly one band and agree on 81% (candidates, removed), or on 30% (candidates, kept)."""
    rng = np.random.RandomState(seed)
    bands, rows = lsh_bands(0.8)
    sigs = [rng.randint(0, 2 ** 32, 128, dtype=np.uint64).astype(np.uint32) for _ in range(n)]
    for i in range(n):
        src = sigs[rng.randint(0, len(sigs))]
        copy = src.copy()
        kind = i % 3
        if kind == 0:  # one value changed in every band: 110 of 128 agree
            for k in range(bands):
                copy[k * rows + rng.randint(rows)] ^= 1
        else:
            agree = 104 if kind == 1 else 38
            keep_band = rng.randint(bands)
            # one change in every other band, the rest anywhere outside the shared band
            first = [k * rows + rng.randint(rows) for k in range(bands) if k != keep_band]
            shared = np.arange(keep_band * rows, (keep_band + 1) * rows)
            rest = np.setdiff1d(np.arange(128), np.r_[shared, first])
            copy[np.r_[first, rng.choice(rest, 128 - agree - len(first), replace=False)]] ^= 1
        sigs.append(copy)
    order = rng.permutation(len(sigs))
    return np.stack(sigs)[order]


def test_banded_index_candidates_are_exactly_datasketch_pairs(monkeypatch):
    sigs = _planted_signatures(4)
    ref_partner, ref_sim = _reference(sigs, None, 0.8, False)
    assert 80 <= (ref_partner >= 0).sum() <= 200
    partner, sim = NearDupIndex(0.8).run([(sigs, np.arange(len(sigs)))])
    assert np.array_equal(partner, ref_partner) and np.array_equal(sim, ref_sim)
    real_keys = nd.band_keys  # every key colliding with a 40th of the others
    monkeypatch.setattr(nd, "band_keys", lambda s, b, r: real_keys(s, b, r) % np.uint64(40))
    partner, sim = NearDupIndex(0.8).run([(sigs, np.arange(len(sigs)))])
    assert np.array_equal(partner, ref_partner) and np.array_equal(sim, ref_sim)


def test_banded_index_with_its_tables_on_disk(tmp_path, monkeypatch):
    sigs = _planted_signatures(5, 200)
    expected = NearDupIndex(0.8).run([(sigs, np.arange(len(sigs)))])
    monkeypatch.setattr(NearDupIndex, "MAX_SLOT_BYTES", 0)
    seen = []
    real_visit = NearDupIndex._visit

    def visit(self, slots, *rest):
        seen.append(isinstance(slots, np.memmap) and str(tmp_path) in slots.filename)
        return real_visit(self, slots, *rest)

    monkeypatch.setattr(NearDupIndex, "_visit", visit)
    got = NearDupIndex(0.8, workdir=str(tmp_path)).run([(sigs, np.arange(len(sigs)))])
    assert seen == [True] and list(tmp_path.iterdir()) == []
    assert np.array_equal(got[0], expected[0]) and np.array_equal(got[1], expected[1])
    assert (got[0] >= 0).sum() > 40


def test_memory_benchmark_runs_both_indexes_and_compares_them():
    """benchmarks/bench_preprocess.py --near-dup-index: old and new in their own processes, on
    the same signatures; it exits with an error when their decisions differ."""
    import os
    import subprocess
    import sys

    bench = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "bench_preprocess.py")
    out = subprocess.run([sys.executable, bench, "--near-dup-index", "3000"], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "identical decisions: True" in out.stdout and "anonymous growth, B/file" in out.stdout


class _ReferenceMergeIndex:
    """NearDupIndex's interface on ReferenceNearDupIndex (datasketch's MinHashLSH), for the merge."""

    def __init__(self, threshold, workdir=None):
        self.threshold = threshold

    def run(self, blocks, exact=None):
        self.entries = [(b, int(r)) for b, (_, rows) in enumerate(blocks) for r in rows]
        index, kept = ReferenceNearDupIndex(self.threshold), []
        partner, sim = np.full(len(self.entries), -1), np.zeros(len(self.entries))
        for e, (b, r) in enumerate(self.entries):
            match = index.add(blocks[b][0][r], None if exact is None else lambda c, e=e: exact(e, kept[c]))
            if match is None:
                kept.append(e)
            else:
                partner[e], sim[e] = kept[match[0]], match[1]
        return partner, sim

    def locate(self, entry):
        return self.entries[entry]


def test_merge_output_is_the_reference_output(tmp_path, tokenizer_dir, monkeypatch):
    """The whole pipeline, sharded, on real code with planted near copies (borderline ones,
    copies of copies, an exact copy): the same bytes as with the datasketch reference index,
    also with the index's tables on disk."""
    import json
    import os
    import random

    from ast_t5_preprocess.cli import main

    from ..conftest import STDLIB

    corpus = tmp_path / "c"
    corpus.mkdir()
    names = ["textwrap.py", "heapq.py", "bisect.py", "colorsys.py", "shlex.py", "fnmatch.py",
             "glob.py", "keyword.py", "stat.py", "this.py"]
    rng = random.Random(0)
    for n, name in enumerate(names):
        text = open(os.path.join(STDLIB, name), encoding="utf-8").read()
        (corpus / name).write_text(text)
        lines = text.split("\n")
        for copy in range(3):  # edited copies, some of them edits of an earlier copy
            rate = [0.02, 0.06, 0.12][copy]
            for i in rng.sample(range(len(lines)), max(1, int(rate * len(lines)))):
                lines[i] += "  # edited"
            (corpus / f"{name[:-3]}_copy{copy}.py").write_text("\n".join(lines))
        # two copies edited in different halves: each near the original, not near each other,
        # so the original, when visited after both, has two kept candidates
        lines = text.split("\n")
        half = len(lines) // 2
        for part, span in (("a", range(0, half)), ("b", range(half, len(lines)))):
            edited = list(lines)
            for i in rng.sample(span, max(1, int(0.07 * len(lines)))):
                edited[i] += "  # edited"
            (corpus / f"{part}_{name}").write_text("\n".join(edited))
    (corpus / "heapq_exact.py").write_text(open(os.path.join(STDLIB, "heapq.py"), encoding="utf-8").read())
    spm = ["--spm-model", str(tokenizer_dir / "spm.model")]

    def run(out, index_class=None, **attrs):
        import ast_t5_preprocess.near_dup as near_dup

        with monkeypatch.context() as m:
            if index_class is not None:
                m.setattr(near_dup, "NearDupIndex", index_class)
            for k, v in attrs.items():
                m.setattr(NearDupIndex, k, v)
            assert main(["run", str(corpus), "-o", str(tmp_path / out), "--num-shards", "3",
                         "--report", str(tmp_path / f"{out}.jsonl"), "--valid-ratio", "0.2",
                         "--no-progress", "--max-tokens", "256", "--num-sentinels", "32", *spm]) == 0

    run("reference", _ReferenceMergeIndex)
    run("banded")
    run("spilled", MAX_SLOT_BYTES=0, CHUNK=3)
    manifest = json.load(open(tmp_path / "reference" / "manifest.json"))
    assert manifest["near_duplicates"]["removed_total"] >= 10
    assert manifest["languages"]["python"]["skipped_duplicate"] == 1
    def tree(root):
        return {os.path.relpath(os.path.join(d, f), root): open(os.path.join(d, f), "rb").read()
                for d, _, files in os.walk(root) for f in files}

    reference = tree(tmp_path / "reference")
    assert len(reference) > 8
    for out in ("banded", "spilled"):
        assert tree(tmp_path / out) == reference, out
        assert (tmp_path / "reference.jsonl").read_bytes() == (tmp_path / f"{out}.jsonl").read_bytes()
