"""Text <-> token ids for fine-tuning, generation and export (DESIGN.md sections 5.1, 5.2).

The sentencepiece model never produces sentinels from text, so sentinel strings are split out
first: every ``<extra_id_N>`` in the text (N without leading zeros, N < num_sentinels) becomes the
sentinel id ``vocab_size - 1 - N`` and the text between them is encoded by sentencepiece piece by
piece. Decoding is the inverse: runs of ordinary pieces go through sentencepiece (lossless for
code: indentation, tabs, CRLF, unicode) and sentinels are rendered as ``<extra_id_N>`` (or
dropped). ``<s>``, ``<pad>`` and ``</s>`` are never rendered.

Hugging Face's tokenizer built by ``ast_t5.hf.tokenizer`` follows the same rules, so both agree
id for id.
"""
import io
import logging
import os
import re
import tempfile
from typing import Iterable, List, Optional

from ast_t5_preprocess.tokenizer import (
    SENTINEL_FORMAT,
    SPECIALS,
    Tokenizer,
    load_tokenizer,
)
from fairseq.data import Dictionary

logger = logging.getLogger(__name__)

SENTINEL_TEXT = re.compile(r"<extra_id_(0|[1-9][0-9]*)>")  # SENTINEL_FORMAT, as a pattern
CONTROL_IDS = frozenset((SPECIALS["bos"], SPECIALS["pad"], SPECIALS["eos"]))  # never rendered
TOKENIZER_FILES = ("spm.model", "tokenizer.json")  # what makes a directory a tokenizer directory


class TextCodec:
    """Encode text with sentinels to ids and decode ids back to text.

    Args:
        tokenizer: the pre-training tokenizer (``ast_t5_preprocess.tokenizer.Tokenizer``).
    """

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.sp = tokenizer.sp
        self.num_sentinels = tokenizer.num_sentinels
        self.vocab_size = tokenizer.vocab_size
        self.first_sentinel = tokenizer.spm_vocab_size
        self.eos, self.pad, self.bos = SPECIALS["eos"], SPECIALS["pad"], SPECIALS["bos"]

    @classmethod
    def from_dir(cls, path: str) -> "TextCodec":
        """Load ``spm.model`` and ``tokenizer.json`` from an ast-t5-preprocess output directory."""
        if not is_tokenizer_dir(path):
            needs = " and ".join(TOKENIZER_FILES)
            raise FileNotFoundError(f"{path} is not a tokenizer directory (needs {needs}, "
                                    "as written by ast-t5-preprocess)")
        return cls(load_tokenizer(path))

    @classmethod
    def from_bytes(cls, spm_model: bytes, num_sentinels: int) -> "TextCodec":
        """Rebuild from a serialized sentencepiece model (as stored in fine-tuning checkpoints)."""
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "spm.model")
            with open(path, "wb") as f:
                f.write(spm_model)
            return cls(Tokenizer(path, num_sentinels))

    def sentinel_id(self, k: int) -> int:
        return self.tokenizer.sentinel_id(k)

    def is_sentinel(self, token_id: int) -> bool:
        return self.first_sentinel <= token_id < self.vocab_size

    def sentinel_number(self, token_id: int) -> int:
        """k of ``<extra_id_k>`` for a sentinel id."""
        return self.vocab_size - 1 - token_id

    def encode(self, text: str) -> List[int]:
        """Token ids of ``text`` (no ``</s>``); raises ValueError for an unknown sentinel number."""
        ids: List[int] = []
        start = 0
        for match in SENTINEL_TEXT.finditer(text):
            k = int(match.group(1))
            if k >= self.num_sentinels:
                raise ValueError(f"{match.group(0)} in the text, but the tokenizer has only "
                                 f"{self.num_sentinels} sentinels (<extra_id_0> .. "
                                 f"<extra_id_{self.num_sentinels - 1}>)")
            ids.extend(self.sp.encode(text[start:match.start()]))
            ids.append(self.sentinel_id(k))
            start = match.end()
        ids.extend(self.sp.encode(text[start:]))
        return ids

    def decode(self, ids: Iterable[int], keep_sentinels: bool = True) -> str:
        """Text of ``ids``: pieces decoded by sentencepiece, sentinels as ``<extra_id_N>`` text
        (or dropped with ``keep_sentinels=False``), ``<s>``/``<pad>``/``</s>`` dropped."""
        out = io.StringIO()
        run: List[int] = []
        for token in ids:
            token = int(token)
            if token in CONTROL_IDS:
                continue
            if self.is_sentinel(token):
                out.write(self.sp.decode(run))
                run = []
                if keep_sentinels:
                    out.write(SENTINEL_FORMAT.format(self.sentinel_number(token)))
            elif 0 <= token < self.first_sentinel:
                run.append(token)
            else:
                raise ValueError(f"token id {token} is outside the vocabulary of {self.vocab_size}")
        out.write(self.sp.decode(run))
        return out.getvalue()

    def dictionary(self) -> Dictionary:
        """The fairseq dictionary (identical to ``dict.txt``): index == sentencepiece id."""
        d = Dictionary()
        for symbol in self.tokenizer.dict_symbols():
            d.add_symbol(symbol)
        if len(d) != self.vocab_size:
            raise ValueError(f"dictionary has {len(d)} symbols, expected {self.vocab_size}")
        return d

    @property
    def spm_model_bytes(self) -> bytes:
        return self.tokenizer.model_bytes

    def write(self, out_dir: str) -> None:
        """Write spm.model, spm.vocab, dict.txt and tokenizer.json, each atomically."""
        os.makedirs(out_dir, exist_ok=True)
        path = os.path.join(out_dir, "spm.model")
        tmp = f"{path}.tmp.{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(self.spm_model_bytes)
        os.replace(tmp, path)
        self.tokenizer.write_vocab_files(out_dir)


def is_tokenizer_dir(path: Optional[str]) -> bool:
    """Whether ``path`` holds ``spm.model`` and ``tokenizer.json``."""
    return bool(path) and all(os.path.isfile(os.path.join(path, f)) for f in TOKENIZER_FILES)
