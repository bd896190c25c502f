"""Merge complete shards into the final per-language datasets and write the manifest."""
import json
import logging
import os
import shutil
from collections import Counter, defaultdict
from typing import Dict, List, Optional

import numpy as np

from .formats import AST_DTYPE, IndexedReader, IndexedWriter
from .languages import TEXT, grammar_version, load_grammar
from .parsing import node_type_named, node_type_names
from .inputs import stable_hash
from .shards import read_signatures, shard_dir

logger = logging.getLogger(__name__)

MANIFEST_VERSION = 1


class MergeError(RuntimeError):
    pass


def missing_shards(out_dir: str, num_shards: int):
    return [i for i in range(num_shards)
            if not os.path.exists(os.path.join(shard_dir(out_dir, i, num_shards), "shard.json"))]


MIN_FILES_FOR_VALID = 3  # a language with at least this many files always gets a valid file


def merge_shards(out_dir: str, num_shards: int, fingerprint: str, dedup: bool = True,
                 near_dup_threshold: Optional[float] = None, valid_ratio: float = 0.0,
                 report_path: Optional[str] = None):
    """Concatenate shards in order into ``out_dir/<lang>/<split>``.

    Files are visited in one fixed order (group ``lang/split``, shard, file order in the shard);
    a later exact copy (``dedup``) or near duplicate (``near_dup_threshold``, see near_dup.py)
    of an earlier file is removed. A language with at least MIN_FILES_FOR_VALID files and no
    valid file gets one (the train file of smallest key hash) when ``valid_ratio > 0``.

    Returns:
        ``(stats, info)``: per-language Counters and a dict with ``near_duplicates`` (the
        manifest entry) and ``no_valid_split`` (languages too small for a validation file).
    """
    from .near_dup import summary

    missing = missing_shards(out_dir, num_shards)
    if missing:
        raise MergeError(f"cannot merge: {len(missing)} of {num_shards} shards are not complete "
                         f"(first missing: {missing[:5]}); run them first")
    shards = []
    for i in range(num_shards):
        with open(os.path.join(shard_dir(out_dir, i, num_shards), "shard.json"), encoding="utf-8") as f:
            meta = json.load(f)
        if meta["fingerprint"] != fingerprint:
            raise MergeError(f"shard {i} was made with other options or inputs")
        shards.append(meta)
    remove_stale_tmp_shards(out_dir)
    stats: Dict[str, Counter] = defaultdict(Counter)
    for meta in shards:
        for lang, s in meta["stats"].items():
            stats[lang].update(s)
    groups = sorted({g for meta in shards for g in meta["files"]})
    # (group, shard, files, keys) in the visiting order, and each block's exact duplicates
    blocks = []
    for group in groups:
        for i, meta in enumerate(shards):
            files = meta["files"].get(group)
            if files:
                blocks.append((group, i, files, meta.get("keys", {}).get(group) or [d for d, _, _ in files]))
    duplicate = _exact_duplicates(blocks, dedup)
    near = None
    if near_dup_threshold is not None:
        near = _near_duplicates(out_dir, num_shards, blocks, duplicate, near_dup_threshold)
    near_removed: Counter = Counter()
    pairs, removed_entries = [], []
    kept = []  # [lang, split, shard, group, first item, nseg, ntok, key]
    entry = 0  # files that are not exact duplicates, counted in the visiting order
    for b, (group, i, files, keys) in enumerate(blocks):
        lang, split = group.split("/")
        item = 0
        for j, (digest, nseg, ntok) in enumerate(files):
            first, item = item, item + nseg
            if duplicate[b][j]:
                _uncount_removed(stats[lang], nseg, ntok, "duplicate")
                removed_entries.append(_removed_entry(keys[j], lang, "duplicate"))
                continue
            if near is not None:
                index, partner, similarity = near
                match, entry = int(partner[entry]), entry + 1
                if match >= 0:
                    kb, krow = index.locate(match)
                    _uncount_removed(stats[lang], nseg, ntok, "near_duplicate")
                    near_removed[lang] += 1
                    pair = {"removed": keys[j], "kept": blocks[kb][3][krow],
                            "similarity": round(float(similarity[entry - 1]), 4), "language": lang}
                    pairs.append(pair)
                    removed_entries.append(dict(_removed_entry(keys[j], lang, "near_duplicate"),
                                                duplicate_of=pair["kept"], similarity=pair["similarity"]))
                    continue
            kept.append([lang, split, i, group, first, nseg, ntok, keys[j]])
    no_valid = _ensure_valid_files(kept, valid_ratio) if valid_ratio > 0 else []
    _write_groups(out_dir, num_shards, kept, stats)
    if report_path:
        _write_report(out_dir, num_shards, report_path, removed_entries)
    info = {"no_valid_split": no_valid,
            "near_duplicates": summary(dict(near_removed), pairs, near_dup_threshold)
            if near is not None else None}
    return stats, info


def _exact_duplicates(blocks: list, dedup: bool) -> List[np.ndarray]:
    """Per block, which files repeat the content of an earlier file (when ``dedup``)."""
    seen = set()
    out = []
    for _, _, files, _ in blocks:
        dup = np.zeros(len(files), dtype=bool)
        if dedup:
            for j, (digest, _, _) in enumerate(files):
                dup[j] = digest in seen
                seen.add(digest)
        out.append(dup)
    return out


def _near_duplicates(out_dir: str, num_shards: int, blocks: list, duplicate: List[np.ndarray],
                     threshold: float):
    """Near-duplicate decisions over the files that are not exact duplicates, in the visiting
    order (see near_dup.NearDupIndex): ``(index, partner, similarity)`` per such file. The
    signatures stay memory-mapped in the shards; the index spills its band keys under
    ``out_dir`` while it numbers its groups."""
    from .near_dup import NearDupIndex

    sig_blocks, firsts = [], []
    for (group, i, files, _), dup in zip(blocks, duplicate):
        sig_blocks.append((read_signatures(shard_dir(out_dir, i, num_shards), group, len(files)),
                           np.flatnonzero(~dup)))
        nseg = np.fromiter((f[1] for f in files), dtype=np.int64, count=len(files))
        firsts.append(np.cumsum(nseg) - nseg)
    shingles = _StoredShingles(out_dir, num_shards)
    index = NearDupIndex(threshold, workdir=out_dir)

    def loc(entry: int) -> tuple:
        b, row = index.locate(entry)
        group, i, files, _ = blocks[b]
        return (i, group, int(firsts[b][row]), files[row][1])

    partner, similarity = index.run(sig_blocks, lambda e, c: shingles.similarity(loc(c), loc(e)))
    return index, partner, similarity


class _StoredShingles:
    """Shingle sets of files from their stored token items (the </s> of each segment dropped),
    for the exact check of near-duplicate candidates."""

    def __init__(self, out_dir: str, num_shards: int):
        self.out_dir, self.num_shards = out_dir, num_shards
        self.readers: Dict[tuple, IndexedReader] = {}
        self.cache: Dict[tuple, np.ndarray] = {}

    def shingles(self, loc) -> np.ndarray:
        from .near_dup import shingle_ids

        if loc not in self.cache:
            i, group, first, nseg = loc
            if (i, group) not in self.readers:
                self.readers[(i, group)] = IndexedReader(os.path.join(shard_dir(self.out_dir, i, self.num_shards), group))
            toks = self.readers[(i, group)]
            ids = np.concatenate([np.asarray(toks[j][:-1], dtype=np.int64) for j in range(first, first + nseg)]
                                 or [np.zeros(0, np.int64)])
            if len(self.cache) > 4096:
                self.cache.clear()
            self.cache[loc] = shingle_ids(ids)
        return self.cache[loc]

    def similarity(self, a, b) -> float:
        from .near_dup import exact_jaccard

        return exact_jaccard(self.shingles(a), self.shingles(b))


def _ensure_valid_files(kept: list, valid_ratio: float) -> List[str]:
    """Move one train file to valid for each language with enough files and no valid file; a
    language with fewer than MIN_FILES_FOR_VALID files keeps all of them in train."""
    by_lang: Dict[str, list] = defaultdict(list)
    for entry in kept:
        by_lang[entry[0]].append(entry)
    too_small = []
    for lang, entries in sorted(by_lang.items()):
        if len(entries) < MIN_FILES_FOR_VALID:
            # Too few files to hold any out: all of them train (a lone file that hashed into
            # valid or test would leave the language with no training data at all).
            for e in entries:
                e[1] = "train"
            too_small.append(lang)
            logger.warning("%s has %d file(s): too few for a validation file, so there is no "
                           "valid_%s subset", lang, len(entries), lang)
            continue
        if any(e[1] == "valid" for e in entries):
            continue
        train = [e for e in entries if e[1] == "train"]
        if len(train) < 2:
            too_small.append(lang)
            logger.warning("%s has %d file(s): too few for a validation file, so there is no "
                           "valid_%s subset", lang, len(entries), lang)
            continue
        chosen = min(train, key=lambda e: (stable_hash("valid:" + e[7]), e[7]))
        chosen[1] = "valid"
        logger.info("%s had no validation file by hash: moved %s from train to valid", lang, chosen[7])
    return too_small


def _write_groups(out_dir: str, num_shards: int, kept: list, stats: Dict[str, Counter]) -> None:
    """Copy the kept files' items, destination group by destination group."""
    readers = {}
    dest_groups = sorted({(e[0], e[1]) for e in kept})
    for lang, split in dest_groups:
        os.makedirs(os.path.join(out_dir, lang), exist_ok=True)
        prefix = os.path.join(out_dir, lang, split)
        tok_w = ast_w = None
        for e in kept:
            if (e[0], e[1]) != (lang, split):
                continue
            _, _, i, group, first, nseg, ntok, _ = e
            if (i, group) not in readers:
                src = os.path.join(shard_dir(out_dir, i, num_shards), group)
                readers[(i, group)] = (IndexedReader(src), IndexedReader(src + ".ast"))
            toks, asts = readers[(i, group)]
            if tok_w is None:
                tok_w, ast_w = IndexedWriter(prefix, toks.dtype), IndexedWriter(prefix + ".ast", AST_DTYPE)
            for j in range(first, first + nseg):
                tok_w.add(toks[j])
                ast_w.add(asts[j])
            stats[lang][f"{split}_files"] += 1
            stats[lang][f"{split}_segments"] += nseg
            stats[lang][f"{split}_tokens"] += ntok
        if tok_w is not None:
            tok_w.close()
            ast_w.close()


def _removed_entry(key: str, lang: str, reason: str) -> dict:
    return {"path": key, "language": lang, "reason": reason, "skipped": True, "error_ratio": None}


def _write_report(out_dir: str, num_shards: int, path: str, merge_entries: list) -> None:
    """``--report``: every skipped file of every shard, then the files removed at merge."""
    from .shards import SKIPPED_FILE

    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as out:
        for i in range(num_shards):
            src = os.path.join(shard_dir(out_dir, i, num_shards), SKIPPED_FILE)
            if os.path.exists(src):
                with open(src, encoding="utf-8") as f:
                    shutil.copyfileobj(f, out)
        for entry in merge_entries:
            out.write(json.dumps(entry, sort_keys=True) + "\n")
    os.replace(tmp, path)


def _uncount_removed(stats: Counter, nseg: int, ntok: int, reason: str) -> None:
    """A file kept by its shard turned out to duplicate an earlier file (exactly or nearly)."""
    stats["files_kept"] -= 1
    stats["skipped_" + reason] += 1
    stats["segments"] -= nseg
    stats["tokens"] -= ntok


def remove_stale_tmp_shards(out_dir: str) -> None:
    """Temporary folders of shard runs that were killed (``shard-*.tmp-PID``)."""
    root = os.path.join(out_dir, "shards")
    if os.path.isdir(root):
        for name in os.listdir(root):
            if ".tmp-" in name:
                shutil.rmtree(os.path.join(root, name), ignore_errors=True)


def write_node_types(out_dir: str, lang: str) -> int:
    """``<lang>/node_types.txt``: ``id<TAB>name<TAB>named`` for every node type id.

    Names are written with Python's ``unicode_escape`` (some grammar tokens are a newline or a
    tab); named node types are plain identifiers and read back unchanged.
    """
    if lang == TEXT:
        names, named = ["document"], [True]
    else:
        grammar = load_grammar(lang)
        names, named = node_type_names(grammar), node_type_named(grammar)
    lines = "".join(f"{i}\t{n.encode('unicode_escape').decode('ascii')}\t{int(b)}\n"
                    for i, (n, b) in enumerate(zip(names, named)))
    atomic_write_text(os.path.join(out_dir, lang, "node_types.txt"), lines)
    return len(names)


def write_outputs(out_dir: str, stats: Dict[str, Counter], options: dict, tokenizer,
                  extra: Optional[dict] = None) -> dict:
    """node_types.txt, data_weights.json and, last, manifest.json (the completion marker)."""
    languages = sorted(l for l, s in stats.items() if s.get("train_tokens", 0) + s.get("valid_tokens", 0)
                       + s.get("test_tokens", 0) > 0)
    for lang in languages:
        write_node_types(out_dir, lang)
    total = sum(stats[l].get("train_tokens", 0) for l in languages) or 1
    weights = {l: stats[l].get("train_tokens", 0) / total for l in languages}
    atomic_write_text(os.path.join(out_dir, "data_weights.json"), json.dumps(weights, indent=2, sort_keys=True) + "\n")
    manifest = {
        "manifest_version": MANIFEST_VERSION,
        "created_by": f"ast-t5-preprocess {package_version()}",
        "options": options,
        "tokenizer": {"spm_sha256": tokenizer.sha256, "spm_vocab_size": tokenizer.spm_vocab_size,
                      "num_sentinels": tokenizer.num_sentinels, "vocab_size": tokenizer.vocab_size,
                      "sample": _tokenizer_sample(out_dir, tokenizer.sha256)},
        "grammars": {l: grammar_version(l) for l in languages},
        "data_weights": weights,
        "languages": {l: dict(sorted(stats[l].items())) for l in sorted(stats)},
        "totals": dict(sorted(sum(stats.values(), Counter()).items())),
    }
    manifest.update(extra or {})
    atomic_write_text(os.path.join(out_dir, "manifest.json"), json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


def _tokenizer_sample(out_dir: str, spm_sha256: str):
    """The list of documents the tokenizer was trained on, if it was trained here."""
    from .tokenizer import sample_list_of

    return sample_list_of(out_dir, spm_sha256)


def package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ast-t5-fairseq")
    except PackageNotFoundError:
        return "unknown"


def atomic_write_text(path: str, text: str) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def remove_shards(out_dir: str) -> None:
    shutil.rmtree(os.path.join(out_dir, "shards"), ignore_errors=True)
