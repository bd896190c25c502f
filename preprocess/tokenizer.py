"""A sentencepiece tokenizer that is lossless on code (DESIGN.md 5.1, 5.2).

Training options keep every byte: identity normalization (no NFKC), no whitespace collapsing, no
dummy prefix, whitespace-only pieces allowed and byte fallback, so ``decode(encode(t)) == t`` for
any UTF-8 text without U+2581 (sentencepiece's own space marker; such files are rejected by
:meth:`Tokenizer.encode_file`). Ids: ``<s>``=0, ``<pad>``=1, ``</s>``=2, ``<unk>``=3, then pieces,
which is also fairseq's ``Dictionary`` order, so the fairseq index equals the sentencepiece id.
Sentinels come after the pieces, the last id being ``<extra_id_0>`` (the Hugging Face T5 layout).
"""
import hashlib
import heapq
import io
import json
import logging
import os
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, List, Optional, Tuple

import numpy as np

logger = logging.getLogger(__name__)

SPACE_MARK = "\u2581"  # sentencepiece's visible space
SPECIALS = {"bos": 0, "pad": 1, "eos": 2, "unk": 3}
SENTINEL_FORMAT = "<extra_id_{}>"
DEFAULT_VOCAB_SIZE = 32000
DEFAULT_NUM_SENTINELS = 256
# sentencepiece skips training sentences longer than this; we feed file chunks up to half of it.
MAX_SENTENCE_BYTES = 16384
# sentencepiece samples at most this many training sentences (file chunks of <= 8 KiB, see
# chunk_text) from what it is given; the document sample below (--spm-sample-mb) comes first.
INPUT_SENTENCE_SIZE = 2_000_000
SPM_RANDOM_SEED = 1234  # sentencepiece's own shuffling/sampling
SAMPLE_FILE = "spm.sample.jsonl"  # which documents fed the tokenizer, beside spm.model
SPM_TRAIN_OPTIONS = dict(
    model_type="bpe", normalization_rule_name="identity", remove_extra_whitespaces=False,
    add_dummy_prefix=False, allow_whitespace_only_pieces=True, byte_fallback=True,
    split_digits=True, split_by_whitespace=True, character_coverage=0.9995,
    max_sentence_length=MAX_SENTENCE_BYTES, shuffle_input_sentence=True,
    input_sentence_size=INPUT_SENTENCE_SIZE,
    bos_id=SPECIALS["bos"], pad_id=SPECIALS["pad"], eos_id=SPECIALS["eos"], unk_id=SPECIALS["unk"],
    bos_piece="<s>", pad_piece="<pad>", eos_piece="</s>", unk_piece="<unk>", minloglevel=2,
)


class TokenizerError(ValueError):
    """The tokenizer cannot represent a file losslessly or cannot be trained/loaded."""


def chunk_text(text: str, max_bytes: int = MAX_SENTENCE_BYTES // 2) -> Iterator[str]:
    """Split a document at line ends into training "sentences" of at most ``max_bytes``."""
    buf, size = [], 0
    for line in text.splitlines(keepends=True):
        n = len(line.encode("utf-8"))
        if size + n > max_bytes and buf:
            yield "".join(buf)
            buf, size = [], 0
        if n <= max_bytes:
            buf.append(line)
            size += n
    if buf:
        yield "".join(buf)


def train_sentencepiece(texts: Iterable[str], out_dir: str, vocab_size: int = DEFAULT_VOCAB_SIZE,
                        num_sentinels: int = DEFAULT_NUM_SENTINELS, num_threads: int = 1,
                        seed_sentencepiece_size: int = 1000000) -> "Tokenizer":
    """Train on documents and write ``spm.model``, ``spm.vocab``, ``dict.txt``, ``tokenizer.json``."""
    import sentencepiece as spm

    model = io.BytesIO()
    spm.set_random_generator_seed(SPM_RANDOM_SEED)
    sentences = (chunk for t in texts if SPACE_MARK not in t for chunk in chunk_text(t))
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=sentences, model_writer=model, vocab_size=vocab_size,
            num_threads=num_threads, seed_sentencepiece_size=seed_sentencepiece_size,
            **SPM_TRAIN_OPTIONS)
    except RuntimeError as e:  # e.g. "Vocabulary size too high" on a tiny corpus
        raise TokenizerError(explain_spm_error(str(e), vocab_size)) from e
    os.makedirs(out_dir, exist_ok=True)
    _atomic_write(os.path.join(out_dir, "spm.model"), model.getvalue())
    tok = Tokenizer(os.path.join(out_dir, "spm.model"), num_sentinels)
    tok.write_vocab_files(out_dir)
    return tok


@dataclass
class SampledDocument:
    priority: int
    key: str
    language: Optional[str]
    where: str
    num_bytes: int
    text: str


def sample_documents(documents: Iterable, read: Callable, budget_bytes: float,
                     seed: int = 0) -> Tuple[List[SampledDocument], Counter]:
    """A reproducible sample of about ``budget_bytes`` of readable documents, in one pass.

    Every document gets a priority ``hash(seed, key)``; the sample is the longest run of
    documents in priority order whose sizes sum to at most the budget (a bottom-k reservoir
    weighted by bytes). It depends only on the set of documents and the seed, not on their
    order or on the number of workers, and holds at most ``budget_bytes`` of text in memory. A
    document whose priority is above one already evicted can never enter, so it is not even read.

    ``read(doc)`` returns ``(data, text, skip_reason)`` (``inputs.read_document``). Returns the
    sample sorted by priority and the skip reasons met while reading.
    """
    from .inputs import stable_hash

    heap: List[tuple] = []  # max-heap on priority: (-priority, tie, SampledDocument)
    total, cutoff, skipped = 0, None, Counter()
    for n, doc in enumerate(documents):
        prio = stable_hash(f"spm:{seed}:{doc.key}")
        if cutoff is not None and prio >= cutoff:
            continue
        if not doc.skip and doc.content is None and doc.src_bytes > budget_bytes:
            skipped["larger_than_sample"] += 1
            continue
        data, text, skip = read(doc)
        if text is None:
            skipped[skip] += 1
            continue
        if len(data) > budget_bytes:  # could never be part of the sample: not a cutoff either
            skipped["larger_than_sample"] += 1
            continue
        heapq.heappush(heap, (-prio, n, SampledDocument(prio, doc.key, doc.language, doc.where, len(data), text)))
        total += len(data)
        while heap and total > budget_bytes:
            neg, _, evicted = heapq.heappop(heap)
            total -= evicted.num_bytes
            cutoff = -neg if cutoff is None else min(cutoff, -neg)
    return sorted((h[2] for h in heap), key=lambda d: (d.priority, d.key)), skipped


def write_sample_list(out_dir: str, sample: List[SampledDocument], seed: int, budget_bytes: float,
                      spm_sha256: str) -> str:
    """Write ``spm.sample.jsonl`` (atomic): a header line (seed, budget, sizes, the sha256 of the
    spm.model trained on it), then one line per document that fed the tokenizer."""
    head = dict(spm_sha256=spm_sha256, sample_seed=seed, budget_bytes=int(budget_bytes), documents=len(sample),
                bytes=sum(d.num_bytes for d in sample), input_sentence_size=INPUT_SENTENCE_SIZE)
    lines = [json.dumps(head, sort_keys=True)]
    lines += [json.dumps(dict(key=d.key, language=d.language, where=d.where, bytes=d.num_bytes),
                         sort_keys=True) for d in sample]
    path = os.path.join(out_dir, SAMPLE_FILE)
    _atomic_write(path, ("\n".join(lines) + "\n").encode("utf-8"))
    return path


def sample_list_of(out_dir: str, spm_sha256: str) -> Optional[str]:
    """``SAMPLE_FILE`` if ``out_dir`` has the sample list of this very tokenizer, else None."""
    try:
        with open(os.path.join(out_dir, SAMPLE_FILE), encoding="utf-8") as f:
            head = json.loads(f.readline())
    except (OSError, ValueError):
        return None
    return SAMPLE_FILE if isinstance(head, dict) and head.get("spm_sha256") == spm_sha256 else None


META_PIECES = len(SPECIALS) + 256  # specials + byte-fallback pieces, always in the vocabulary


def min_vocab_size() -> int:
    """The smallest ``--vocab-size`` worth training: the meta pieces plus at least one more."""
    return META_PIECES + 1


def explain_spm_error(message: str, vocab_size: int) -> str:
    """One line in terms of our options for a sentencepiece training error."""
    import re

    last = message.strip().splitlines()[-1] if message.strip() else message
    m = re.search(r"smaller than required_chars\. (\d+) vs (\d+)", last)
    if m:
        return (f"--vocab-size {vocab_size} is too small for this corpus: it needs at least "
                f"{m.group(2)} ({len(SPECIALS)} specials + 256 byte pieces + the corpus's characters)")
    if "Vocabulary size too high" in last:
        return (f"--vocab-size {vocab_size} is too large for this small corpus: {last.split(':')[-1].strip()} "
                "(lower --vocab-size or give more input)")
    return f"sentencepiece training failed: {last}"


class Tokenizer:
    """Encode text to ids together with each token's UTF-8 byte length."""

    def __init__(self, model_path: str, num_sentinels: int = DEFAULT_NUM_SENTINELS):
        import sentencepiece as spm

        if not os.path.exists(model_path):
            raise TokenizerError(f"sentencepiece model not found: {model_path}")
        with open(model_path, "rb") as f:
            self.model_bytes = f.read()
        self.sp = spm.SentencePieceProcessor(model_proto=self.model_bytes)
        self.model_path, self.num_sentinels = model_path, num_sentinels
        self.spm_vocab_size = self.sp.get_piece_size()
        for name, idx in SPECIALS.items():
            if getattr(self.sp, f"{name}_id")() != idx:
                raise TokenizerError(f"{model_path}: {name} id must be {idx} (train with train-spm)")
        self.byte_lengths = self._piece_byte_lengths()

    @property
    def vocab_size(self) -> int:
        """Pieces plus sentinels: the size of the fairseq dictionary."""
        return self.spm_vocab_size + self.num_sentinels

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.model_bytes).hexdigest()

    def sentinel_id(self, k: int) -> int:
        """Id of ``<extra_id_k>`` (k = 0 is the last id of the vocabulary)."""
        if not 0 <= k < self.num_sentinels:
            raise IndexError(f"sentinel {k} out of range [0, {self.num_sentinels})")
        return self.vocab_size - 1 - k

    def _piece_byte_lengths(self) -> np.ndarray:
        ids = list(range(self.spm_vocab_size))
        pieces = self.sp.id_to_piece(ids)  # one batched call
        lengths = np.array([len(p.replace(SPACE_MARK, " ").encode("utf-8")) for p in pieces], dtype=np.int64)
        lengths[[i for i in ids if self.sp.is_unknown(i) or self.sp.is_control(i)]] = 0  # specials
        lengths[[i for i in ids if self.sp.is_byte(i)]] = 1  # <0xNN> pieces stand for one byte
        return lengths

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self.sp.encode(text), dtype=np.int32)

    def encode_file(self, text: str, num_bytes: int):
        """Ids and per-token end byte offsets; raises TokenizerError if not lossless."""
        ids = self.encode(text)
        ends = np.cumsum(self.byte_lengths[ids]) if len(ids) else np.zeros(0, np.int64)
        if (ends[-1] if len(ends) else 0) != num_bytes:
            raise TokenizerError("tokenization is not lossless for this text")
        return ids, ends

    def decode(self, ids) -> str:
        ids = [int(i) for i in ids if int(i) < self.spm_vocab_size]
        return self.sp.decode(ids)

    def dict_symbols(self):
        """fairseq ``dict.txt`` symbols for ids 4.. (pieces escaped to be one space-free token)."""
        symbols = []
        for i in range(len(SPECIALS), self.spm_vocab_size):
            piece = self.sp.id_to_piece(i)
            ok = piece.isprintable() and " " not in piece and not piece.startswith("#fairseq")
            symbols.append(piece if ok else f"<spm_{i}>")
        symbols += [SENTINEL_FORMAT.format(k) for k in reversed(range(self.num_sentinels))]
        if len(set(symbols)) != len(symbols):
            raise TokenizerError("dictionary symbols are not unique")
        return symbols

    def write_vocab_files(self, out_dir: str) -> None:
        """Write ``dict.txt`` (fairseq), ``spm.vocab`` and ``tokenizer.json`` atomically."""
        lines = "".join(f"{s} 1\n" for s in self.dict_symbols())
        _atomic_write(os.path.join(out_dir, "dict.txt"), lines.encode("utf-8"))
        vocab = "".join(f"{self.sp.id_to_piece(i)!r}\t{i}\n" for i in range(self.spm_vocab_size))
        _atomic_write(os.path.join(out_dir, "spm.vocab"), vocab.encode("utf-8"))
        meta = dict(spm_model="spm.model", spm_sha256=self.sha256, spm_vocab_size=self.spm_vocab_size,
                    num_sentinels=self.num_sentinels, vocab_size=self.vocab_size,
                    sentinel_format=SENTINEL_FORMAT, first_sentinel_id=self.vocab_size - 1,
                    sentinel_order="descending", **{f"{k}_id": v for k, v in SPECIALS.items()},
                    decoder_start_id=SPECIALS["eos"], train_options=_jsonable(SPM_TRAIN_OPTIONS))
        _atomic_write(os.path.join(out_dir, "tokenizer.json"),
                      (json.dumps(meta, indent=2, sort_keys=True) + "\n").encode("utf-8"))


def load_tokenizer(data_dir: str, num_sentinels: Optional[int] = None) -> Tokenizer:
    """Load the tokenizer of a preprocessed directory (its ``tokenizer.json`` gives the sentinels)."""
    meta_path = os.path.join(data_dir, "tokenizer.json")
    if num_sentinels is None:
        if not os.path.exists(meta_path):
            raise TokenizerError(f"{meta_path} not found: is {data_dir} a preprocessed directory?")
        with open(meta_path, encoding="utf-8") as f:
            num_sentinels = int(json.load(f)["num_sentinels"])
    return Tokenizer(os.path.join(data_dir, "spm.model"), num_sentinels)


def _jsonable(d):
    return {k: v for k, v in d.items() if isinstance(v, (int, float, str, bool))}


def _atomic_write(path: str, data: bytes) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
