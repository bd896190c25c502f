"""On-disk formats shared by the corpus pipeline and the fairseq task (DESIGN.md section 5).

Everything here needs only NumPy, so preprocessing workers never import torch or fairseq.

Layout of a preprocessed directory::

    OUT/
      spm.model  spm.vocab      sentencepiece model (lossless on code, see tokenizer.py)
      dict.txt                  fairseq dictionary: index == sentencepiece id, then sentinels
      tokenizer.json            vocabulary size, number of sentinels, special ids
      data_weights.json         {language: share of training tokens}
      manifest.json             versions, options and per-language counts
      <lang>/node_types.txt     node-type vocabulary (id <TAB> escaped name <TAB> named 0/1)
      <lang>/{train,valid,test}.{bin,idx}        token ids, one item per segment, ends with </s>
      <lang>/{train,valid,test}.ast.{bin,idx}    AST side-channel, parallel to the tokens

AST side-channel item (one per segment), int32, flattened ``(num_nodes, 3)`` rows of
``(start, end, type_id)``:

* ``start``/``end`` are token positions relative to the segment start, ``end`` exclusive, and
  ``0 <= start < end <= len(tokens) - 1`` (the trailing ``</s>`` belongs to no node);
* rows are in pre-order: sorted by ``start`` ascending, then ``end`` descending; the spans form a
  properly nested forest (two spans are either disjoint or one contains the other);
* row 0 is the root and spans the whole segment ``[0, len(tokens) - 1)``;
* nodes of the file that straddle a segment boundary are clipped to the segment, nodes whose
  clipped span is empty are dropped;
* ``type_id`` indexes ``<lang>/node_types.txt`` (the grammar's own symbol ids, so every shard and
  worker agrees without coordination).

The ``.bin``/``.idx`` pairs are fairseq's ``MMapIndexedDataset`` format (read it with
``fairseq.data.indexed_dataset.MMapIndexedDataset``); :class:`IndexedWriter` writes it and
:class:`IndexedReader` reads it without fairseq.
"""
import os
import struct
from typing import Iterator, List, Sequence

import numpy as np

AST_FIELDS = 3  # (start, end, type_id) per node
AST_DTYPE = np.int32

# fairseq MMapIndexedDataset on-disk header.
_MAGIC = b"MMIDIDX\x00\x00"
_VERSION = 1
_DTYPE_CODES = {np.uint8: 1, np.int8: 2, np.int16: 3, np.int32: 4, np.int64: 5,
                np.float64: 6, np.uint16: 8, np.uint32: 9, np.uint64: 10}
_CODE_DTYPES = {v: k for k, v in _DTYPE_CODES.items()}


class FormatError(ValueError):
    """A preprocessed file does not follow the format above."""


def token_dtype(vocab_size: int):
    """Smallest integer dtype that holds every id of a vocabulary (fairseq's choice too)."""
    return np.uint16 if vocab_size < 65500 else np.int32


def index_paths(prefix: str):
    return prefix + ".bin", prefix + ".idx"


class IndexedWriter:
    """Write a fairseq ``MMapIndexedDataset`` (``prefix.bin`` + ``prefix.idx``).

    Items are appended with :meth:`add`; :meth:`close` writes the index. Files are written under
    a temporary name and renamed at close, so a reader never sees a half-written dataset.
    """

    def __init__(self, prefix: str, dtype):
        self.prefix, self.dtype = prefix, np.dtype(dtype).type
        self._tmp_bin = prefix + ".bin.tmp"
        self._bin = open(self._tmp_bin, "wb")
        self._sizes: List[int] = []

    def add(self, item: np.ndarray) -> None:
        arr = np.ascontiguousarray(item, dtype=self.dtype)
        self._bin.write(arr.tobytes(order="C"))
        self._sizes.append(arr.size)

    def add_many(self, flat: np.ndarray, sizes: Sequence[int]) -> None:
        """Append ``len(sizes)`` items stored back to back in ``flat``."""
        arr = np.ascontiguousarray(flat, dtype=self.dtype)
        if arr.size != int(np.sum(sizes, dtype=np.int64)):
            raise FormatError(f"{self.prefix}: flat array has {arr.size} values, sizes sum to {sum(sizes)}")
        self._bin.write(arr.tobytes(order="C"))
        self._sizes.extend(int(s) for s in sizes)

    def close(self) -> None:
        self._bin.close()
        write_index(self.prefix + ".idx", self.dtype, np.asarray(self._sizes, dtype=np.int32))
        os.replace(self._tmp_bin, self.prefix + ".bin")

    def abort(self) -> None:
        self._bin.close()
        if os.path.exists(self._tmp_bin):
            os.remove(self._tmp_bin)


def write_index(path: str, dtype, sizes: np.ndarray) -> None:
    """Write a fairseq mmap ``.idx`` file (atomically) for items of the given sizes."""
    dtype = np.dtype(dtype).type
    sizes = np.asarray(sizes, dtype=np.int32)
    itemsize = np.dtype(dtype).itemsize
    pointers = np.zeros(len(sizes), dtype=np.int64)
    if len(sizes) > 1:
        np.cumsum(sizes[:-1].astype(np.int64) * itemsize, out=pointers[1:])
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(_MAGIC)
        f.write(struct.pack("<Q", _VERSION))
        f.write(struct.pack("<B", _DTYPE_CODES[dtype]))
        f.write(struct.pack("<Q", len(sizes)))
        f.write(sizes.tobytes(order="C"))
        f.write(pointers.tobytes(order="C"))
    os.replace(tmp, path)


class IndexedReader:
    """Memory-mapped reader of the format written by :class:`IndexedWriter`."""

    def __init__(self, prefix: str):
        bin_path, idx_path = index_paths(prefix)
        for p in (bin_path, idx_path):
            if not os.path.exists(p):
                raise FileNotFoundError(f"missing indexed dataset file: {p}")
        with open(idx_path, "rb") as f:
            if f.read(len(_MAGIC)) != _MAGIC:
                raise FormatError(f"{idx_path}: not a fairseq mmap index (bad magic)")
            (version,) = struct.unpack("<Q", f.read(8))
            if version != _VERSION:
                raise FormatError(f"{idx_path}: unsupported index version {version}")
            (code,) = struct.unpack("<B", f.read(1))
            self.dtype = _CODE_DTYPES[code]
            (n,) = struct.unpack("<Q", f.read(8))
            offset = f.tell()
        idx = np.memmap(idx_path, mode="r", dtype=np.uint8)
        self.sizes = np.frombuffer(idx, dtype=np.int32, count=n, offset=offset)
        self.pointers = np.frombuffer(idx, dtype=np.int64, count=n, offset=offset + self.sizes.nbytes)
        size = os.path.getsize(bin_path)
        self._data = np.memmap(bin_path, mode="r", dtype=np.uint8) if size else np.zeros(0, np.uint8)
        self.prefix = prefix

    def __len__(self) -> int:
        return len(self.sizes)

    def __getitem__(self, i: int) -> np.ndarray:
        return np.frombuffer(self._data, dtype=self.dtype, count=int(self.sizes[i]),
                             offset=int(self.pointers[i]))

    def __iter__(self) -> Iterator[np.ndarray]:
        for i in range(len(self)):
            yield self[i]


def ast_rows(item: np.ndarray) -> np.ndarray:
    """View a flat AST item as its ``(num_nodes, 3)`` rows."""
    return np.asarray(item).reshape(-1, AST_FIELDS)


def check_ast_item(rows: np.ndarray, num_tokens: int, num_types: int = -1) -> None:
    """Raise :class:`FormatError` unless ``rows`` is a valid AST item for a segment.

    Args:
        rows: (num_nodes, 3) int array of (start, end, type_id).
        num_tokens: length of the token item, including the trailing ``</s>``.
        num_types: size of the node-type vocabulary, or -1 to skip that check.
    """
    rows = np.asarray(rows)
    if rows.ndim != 2 or rows.shape[1] != AST_FIELDS or len(rows) == 0:
        raise FormatError(f"AST item must be a non-empty (n, 3) array, got shape {rows.shape}")
    start, end, typ = rows[:, 0], rows[:, 1], rows[:, 2]
    content = num_tokens - 1
    if start[0] != 0 or end[0] != content:
        raise FormatError(f"root spans [{start[0]}, {end[0]}), expected [0, {content})")
    if np.any(start < 0) or np.any(end > content) or np.any(start >= end):
        raise FormatError(f"AST span out of range or empty (segment has {content} tokens)")
    if num_types >= 0 and (np.any(typ < 0) or np.any(typ >= num_types)):
        raise FormatError(f"node type id out of range [0, {num_types})")
    order = np.lexsort((-end, start))
    if not np.array_equal(order, np.arange(len(rows))):
        raise FormatError("AST rows are not in pre-order (start ascending, end descending)")
    # Proper nesting: with a stack of open ends, every span must close inside its parent.
    stack: List[int] = []
    for s, e in zip(start.tolist(), end.tolist()):
        while stack and stack[-1] <= s:
            stack.pop()
        if stack and e > stack[-1]:
            raise FormatError(f"AST span [{s}, {e}) crosses its parent's end {stack[-1]}")
        stack.append(e)
