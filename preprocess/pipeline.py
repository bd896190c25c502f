"""Turn one document into segments: read -> parse -> tokenize -> align -> segment -> clip.

:func:`process_document` is a pure function of the document and a :class:`WorkerContext`, so it
runs unchanged in the main process or in ``multiprocessing`` workers.
"""
import hashlib
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import numpy as np

from .decontamination import Decontaminator
from .inputs import Document, ReadLimits, read_document, stable_hash
from .languages import TEXT
from .near_dup import DEFAULT_THRESHOLD, minhash_signature
from .parsing import DEFAULT_MAX_AST_DEPTH, CodeParser, ErrorPolicy, max_error_ratio_for
from .segmentation import (align_nodes, ast_aware_cuts, broken_count, clip_tree, cut_costs,
                           naive_cuts, segment_bounds)
from .tokenizer import Tokenizer, TokenizerError

TEXT_ROOT_TYPE = 0  # the only node type of the text subset ("document")
NEWLINE = 10


@dataclass
class PipelineOptions:
    max_tokens: int = 1024  # per segment, including the trailing </s>
    valid_ratio: float = 0.01
    test_ratio: float = 0.01
    error_policy: ErrorPolicy = ErrorPolicy.SPANS
    max_error_ratio: Optional[float] = None  # None: per language (parsing.DEFAULT_MAX_ERROR_RATIO)
    limits: ReadLimits = field(default_factory=ReadLimits)
    max_ast_depth: int = DEFAULT_MAX_AST_DEPTH
    near_dup_threshold: Optional[float] = DEFAULT_THRESHOLD  # None: no near-duplicate removal
    segmenter: str = "ast"  # "ast": AST-aware cuts; "fixed": fixed-length cuts (ablation baseline)


@dataclass
class FileResult:
    """What one document produced. ``skip`` is set (and nothing else) for skipped documents."""
    language: Optional[str]
    skip: Optional[str] = None
    split: str = "train"
    content_hash: bytes = b""
    num_bytes: int = 0
    tokens: List[np.ndarray] = field(default_factory=list)  # per segment, without </s>
    asts: List[np.ndarray] = field(default_factory=list)  # per segment, (k, 3) int32
    num_nodes: int = 0
    broken_ast: int = 0
    broken_naive: int = 0
    had_parse_errors: bool = False
    key: str = ""  # the document's key (path), for the skip report and near-duplicate pairs
    error_ratio: float = 0.0
    ast_depth_cut: int = 0  # subtrees deeper than max_ast_depth, not stored
    minhash: Optional[np.ndarray] = None  # (num_perm,) uint32 near-duplicate signature
    decontaminated_by: Optional[str] = None  # the benchmark a skipped file overlapped


def split_of(key: str, valid_ratio: float, test_ratio: float) -> str:
    """Deterministic split from a hash of the document key: a file never lands in two splits."""
    u = (stable_hash("split:" + key) >> 11) / float(1 << 53)
    if u < valid_ratio:
        return "valid"
    if u < valid_ratio + test_ratio:
        return "test"
    return "train"


class WorkerContext:
    """Per-process state: the tokenizer and one parser per language (created lazily)."""

    def __init__(self, spm_model: str, num_sentinels: int, options: PipelineOptions,
                 decontaminator: Optional[Decontaminator] = None):
        self.tokenizer = Tokenizer(spm_model, num_sentinels)
        self.options = options
        self.decontaminator = decontaminator
        self._parsers: Dict[str, CodeParser] = {}

    def parser(self, language: str) -> CodeParser:
        if language not in self._parsers:
            self._parsers[language] = CodeParser(language)
        return self._parsers[language]


def process_document(doc: Document, ctx: WorkerContext) -> FileResult:
    opts = ctx.options
    res = _process(doc, ctx)
    res.key = doc.key
    return res


def _process(doc: Document, ctx: WorkerContext) -> FileResult:
    opts = ctx.options
    data, text, skip = read_document(doc, opts.limits)
    if skip:
        return FileResult(doc.language, skip=skip)
    if ctx.decontaminator:
        bench = ctx.decontaminator.match(text)
        if bench is not None:
            return FileResult(doc.language, skip="decontaminated", decontaminated_by=bench)
    res = FileResult(doc.language, split=split_of(doc.key, opts.valid_ratio, opts.test_ratio),
                     content_hash=hashlib.blake2b(data, digest_size=16).digest(), num_bytes=len(data))
    try:
        ids, tok_ends = ctx.tokenizer.encode_file(text, len(data))
    except TokenizerError:
        return FileResult(doc.language, skip="unrepresentable")
    if opts.near_dup_threshold is not None:
        res.minhash = minhash_signature(ids)
    if doc.language == TEXT:
        starts = ends = kinds = np.zeros(0, np.int64)
        root_kind = TEXT_ROOT_TYPE
        cost = _text_costs(data, tok_ends)
    else:
        parsed, res.language = _parse(doc, data, ctx)
        res.had_parse_errors = parsed.has_error
        res.error_ratio, res.ast_depth_cut = parsed.error_ratio, parsed.depth_cut
        too_many = parsed.error_ratio > max_error_ratio_for(res.language, opts.max_error_ratio)
        if too_many and opts.error_policy in (ErrorPolicy.SKIP, ErrorPolicy.SPANS):
            return FileResult(res.language, skip="parse_errors", error_ratio=parsed.error_ratio)
        root_kind = int(parsed.kinds[0])
        if too_many and opts.error_policy == ErrorPolicy.FLAT:
            starts = ends = kinds = np.zeros(0, np.int64)
        else:  # drop the file's root: every segment gets its own root row
            starts, ends, keep = align_nodes(parsed.starts[1:], parsed.ends[1:], tok_ends)
            kinds = parsed.kinds[1:][keep]
        res.num_nodes = len(starts) + 1
        cost = cut_costs(starts, ends, len(ids))
    _segment(res, ids, starts, ends, kinds, root_kind, cost, opts.max_tokens - 1, opts.segmenter)
    return res


def _parse(doc: Document, data: bytes, ctx: WorkerContext):
    """Parse with the document's grammar; a ``.h`` file with errors also tries the C++ grammar
    (C++ headers are named ``.h`` too) and keeps the parse with the smaller error ratio."""
    opts = ctx.options
    spans = opts.error_policy == ErrorPolicy.SPANS
    parsed = ctx.parser(doc.language).parse(data, opts.max_ast_depth, spans)
    if parsed.has_error and doc.language == "c" and doc.key.lower().endswith(".h"):
        other = ctx.parser("cpp").parse(data, opts.max_ast_depth, spans)
        if other.error_ratio < parsed.error_ratio:
            return other, "cpp"
    return parsed, doc.language


def _segment(res: FileResult, ids, starts, ends, kinds, root_kind, cost, max_len,
             segmenter: str = "ast") -> None:
    n = len(ids)
    cuts = ast_aware_cuts(cost, max_len)
    res.broken_ast = broken_count(cost, cuts)
    res.broken_naive = broken_count(cost, naive_cuts(n, max_len))
    if segmenter == "fixed":  # the ablation baseline: same files, fixed-length cuts
        cuts = naive_cuts(n, max_len)
    for a, b in segment_bounds(n, cuts):
        res.tokens.append(ids[a:b])
        res.asts.append(clip_tree(starts, ends, kinds, root_kind, a, b))


def _text_costs(data: bytes, tok_ends: np.ndarray) -> np.ndarray:
    """For text, a cut costs 1 unless it falls right after a newline (paragraphs stay whole)."""
    n = len(tok_ends)
    cost = np.ones(n + 1, dtype=np.int64)
    cost[0] = cost[n] = 0
    if n > 1:
        last_byte = np.frombuffer(data, dtype=np.uint8)[tok_ends[:-1] - 1]
        cost[1:n][last_byte == NEWLINE] = 0
    return cost
