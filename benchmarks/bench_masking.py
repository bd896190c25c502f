"""Masking throughput on real code: AST-aware and T5 span corruption, samples/s on one core.

    python benchmarks/bench_masking.py [--files 200] [--segments 2000] [--seg-len 1024]

Segments come from the running interpreter's standard library (``*.py`` files, sorted by path,
so the set is the same on every run of one Python version). Each file is parsed with
tree-sitter-python and split into simple tokens: runs of word characters, runs of whitespace and
single other bytes (regex over the UTF-8 bytes; about 1.2 tokens per BPE token of a code
tokenizer). Token ids are a CRC32 of the piece (so equal identifiers get equal ids). Named nodes
are mapped to token spans with the monotone "first token starting at or after the byte" rule
(spec section 4.3) and the file is cut into consecutive segments of ``seg_len - 1`` content
tokens plus ``</s>``; nodes are clipped to their segment. Segments of at most ``seg_len / 2``
tokens (file tails) are left out, and the timed samples cycle through the remaining ones. The AST-aware run uses the paper's
configuration (mask 25%, thresholds 5..100, flat spans 1..9, obfuscation 0.5 / 0.5) and includes
creating the per-sample generator from (seed, epoch, index), as the dataset does.

The figure of merit is samples/s for one process on one core (DESIGN.md section 8: at least
1,000; the original C++ core takes about 1-1.6 ms per sample, spec section 5.11).
"""
import argparse
import glob
import os
import re
import sysconfig
import time
import zlib

import numpy as np

from ast_t5.data.node_categories import NodeCategories
from ast_t5.data.sentinels import EOS_ID, SentinelSpec
from ast_t5.data.spans import sample_rng
from ast_t5.data.subtree_masking import AstMaskingOptions, ast_span_corruption, select_mask
from ast_t5.data.t5_span_masking import t5_span_corruption

PIECE = re.compile(rb"\w+|\s+|[^\w\s]")
NUM_PIECE_IDS = 60000  # id space of the CRC32 token ids (a realistic vocabulary size)
FIRST_PIECE_ID = 4  # after <s>, <pad>, </s>, <unk>
NUM_SENTINELS = 256
SPEC = SentinelSpec(vocab_size=FIRST_PIECE_ID + NUM_PIECE_IDS + NUM_SENTINELS,
                    num_sentinels=NUM_SENTINELS)
T5_DENSITY, T5_MEAN_SPAN = 0.15, 3.0  # T5 defaults (Raffel et al., 2020)
TARGET_RATE = 1000  # samples/s per core, DESIGN.md section 8


def python_language():
    from tree_sitter import Language
    import tree_sitter_python
    return Language(tree_sitter_python.language())


def python_categories(lang) -> NodeCategories:
    ids = {}
    for i in range(lang.node_kind_count):
        if lang.node_kind_is_named(i):
            ids.setdefault(lang.node_kind_for_id(i), []).append(i)
    return NodeCategories.from_type_ids(ids, "python")


def named_nodes(tree) -> np.ndarray:
    """(n, 3) int64 (start_byte, end_byte, kind_id) of named nodes in pre-order (iterative)."""
    rows, cursor = [], tree.walk()
    while True:
        node = cursor.node
        if node.is_named:
            rows.append((node.start_byte, node.end_byte, node.kind_id))
        if cursor.goto_first_child():
            continue
        while not cursor.goto_next_sibling():
            if not cursor.goto_parent():
                return np.asarray(rows, dtype=np.int64).reshape(-1, 3)


def file_segments(source: bytes, parser, seg_len: int):
    """Yield ``(tokens, rows)`` segments of one file (see the module docstring)."""
    pieces = [(m.start(), m.group()) for m in PIECE.finditer(source)]
    if not pieces:
        return
    tok_start = np.array([p[0] for p in pieces], dtype=np.int64)
    ids = np.array([FIRST_PIECE_ID + zlib.crc32(p[1]) % NUM_PIECE_IDS for p in pieces])
    nodes = named_nodes(parser.parse(source))
    span = np.searchsorted(tok_start, nodes[:, :2], side="left")  # byte -> first token at/after
    content = seg_len - 1
    for lo in range(0, len(pieces), content):
        hi = min(lo + content, len(pieces))
        s, e = np.clip(span[:, 0], lo, hi) - lo, np.clip(span[:, 1], lo, hi) - lo
        keep = s < e
        order = np.lexsort((np.flatnonzero(keep), -e[keep], s[keep]))
        rows = np.stack((s[keep], e[keep], nodes[keep, 2]), axis=1)[order]
        if rows.size == 0 or rows[0, 0] != 0 or rows[0, 1] != hi - lo:
            rows = np.concatenate(([[0, hi - lo, 0]], rows))  # synthetic root
        yield np.append(ids[lo:hi], EOS_ID), rows


def stdlib_segments(max_files: int, seg_len: int, min_len: int = 0):
    """Segments of the first ``max_files`` stdlib files (sorted paths), with ``min_len`` or more
    content tokens. Returns a list of ``(tokens, rows)``."""
    from tree_sitter import Parser
    parser = Parser(python_language())
    paths = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))[:max_files]
    out = []
    for path in paths:
        with open(path, "rb") as f:
            segments = file_segments(f.read(), parser, seg_len)
            out += [seg for seg in segments if seg[0].size > min_len]
    return out


def timed(fn, segments) -> float:
    """Samples per CPU second of ``fn(index, tokens, rows)`` over all segments.

    CPU time of this (single-threaded) process, so other load on the machine does not count.
    """
    t0 = time.process_time()
    for i, (tokens, rows) in enumerate(segments):
        fn(i, tokens, rows)
    return len(segments) / (time.process_time() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--files", type=int, default=200, help="stdlib files to read")
    ap.add_argument("--segments", type=int, default=2000, help="segments to time")
    ap.add_argument("--seg-len", type=int, default=1024, help="tokens per segment incl. </s>")
    args = ap.parse_args()
    cats = python_categories(python_language())
    distinct = stdlib_segments(args.files, args.seg_len, min_len=args.seg_len // 2)
    segs = [distinct[i % len(distinct)] for i in range(args.segments)]
    lengths = np.array([t.size for t, _ in segs])
    nodes = np.array([r.shape[0] for _, r in segs])
    print(f"{len(segs)} samples of {len(distinct)} distinct segments (> {args.seg_len // 2} "
          f"tokens): {lengths.mean():.0f} tokens, {nodes.mean():.0f} AST nodes on average")
    paper = AstMaskingOptions()
    paper.validate()
    plain = AstMaskingOptions(obfuscation_prob=0.0)
    results = {
        "ast (paper: obfuscation 0.5/0.5)": lambda i, t, r: ast_span_corruption(
            t, r, paper, sample_rng(1, 0, i), sentinels=SPEC, categories=cats),
        "ast (no obfuscation)": lambda i, t, r: ast_span_corruption(
            t, r, plain, sample_rng(1, 0, i), sentinels=SPEC, categories=cats),
        "t5 (density 0.15, mean span 3)": lambda i, t, r: t5_span_corruption(
            t, T5_DENSITY, T5_MEAN_SPAN, sample_rng(1, 0, i), sentinels=SPEC),
    }
    timed(results["ast (paper: obfuscation 0.5/0.5)"], segs[:50])  # warm-up
    for name, fn in results.items():
        rate = timed(fn, segs)
        print(f"{name:36s} {rate:8.0f} samples/s/core  ({1e3 / rate:.3f} ms/sample, "
              f"{rate / TARGET_RATE:.2f} x target)")
    sels = [select_mask(t, r, paper, sample_rng(1, 0, i), sentinels=SPEC, categories=cats)
            for i, (t, r) in enumerate(segs[:500])]
    print(f"paper config: {np.mean([s.num_masked / s.budget for s in sels]):.4f} of budget masked, "
          f"{np.mean([s.sentinel.max() + 1 for s in sels]):.1f} sentinels and "
          f"{np.mean([s.starts.size for s in sels]):.1f} spans per sample")


if __name__ == "__main__":
    main()
