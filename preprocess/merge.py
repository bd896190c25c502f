"""Merge complete shards into the final per-language datasets and write the manifest."""
import json
import logging
import os
import shutil
from collections import Counter, defaultdict
from typing import Dict

from .formats import AST_DTYPE, IndexedReader, IndexedWriter
from .languages import TEXT, grammar_version, load_grammar
from .parsing import node_type_named, node_type_names
from .shards import shard_dir

logger = logging.getLogger(__name__)

MANIFEST_VERSION = 1


class MergeError(RuntimeError):
    pass


def missing_shards(out_dir: str, num_shards: int):
    return [i for i in range(num_shards)
            if not os.path.exists(os.path.join(shard_dir(out_dir, i, num_shards), "shard.json"))]


def merge_shards(out_dir: str, num_shards: int, fingerprint: str, dedup: bool = True) -> dict:
    """Concatenate shards in order into ``out_dir/<lang>/<split>``; returns the language stats."""
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
    stats: Dict[str, Counter] = defaultdict(Counter)
    for meta in shards:
        for lang, s in meta["stats"].items():
            stats[lang].update(s)
    groups = sorted({g for meta in shards for g in meta["files"]})
    seen = set()
    for group in groups:
        lang, split = group.split("/")
        _merge_group(out_dir, num_shards, shards, group, seen if dedup else None, stats[lang], split)
    return stats


def _merge_group(out_dir, num_shards, shards, group, seen, stats: Counter, split: str) -> None:
    lang = group.split("/")[0]
    os.makedirs(os.path.join(out_dir, lang), exist_ok=True)
    prefix = os.path.join(out_dir, group)
    tok_w = ast_w = None
    for i, meta in enumerate(shards):
        files = meta["files"].get(group)
        if not files:
            continue
        src = os.path.join(shard_dir(out_dir, i, num_shards), group)
        toks, asts = IndexedReader(src), IndexedReader(src + ".ast")
        if tok_w is None:
            tok_w, ast_w = IndexedWriter(prefix, toks.dtype), IndexedWriter(prefix + ".ast", AST_DTYPE)
        item = 0
        for digest, nseg, ntok in files:
            if seen is not None and digest in seen:
                _uncount_duplicate(stats, nseg, ntok)
            else:
                if seen is not None:
                    seen.add(digest)
                for j in range(item, item + nseg):
                    tok_w.add(toks[j])
                    ast_w.add(asts[j])
                stats[f"{split}_files"] += 1
                stats[f"{split}_segments"] += nseg
                stats[f"{split}_tokens"] += ntok
            item += nseg
    if tok_w is not None:
        tok_w.close()
        ast_w.close()


def _uncount_duplicate(stats: Counter, nseg: int, ntok: int) -> None:
    """A file kept by its shard turned out to duplicate a file of an earlier shard."""
    stats["files_kept"] -= 1
    stats["skipped_duplicate"] += 1
    stats["segments"] -= nseg
    stats["tokens"] -= ntok


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


def write_outputs(out_dir: str, stats: Dict[str, Counter], options: dict, tokenizer) -> dict:
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
