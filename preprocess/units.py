"""Which shard reads which part of the corpus: record files are split into *units* that one shard
job reads whole, so a job opens and decompresses only its own part of the record files.

* A Parquet row group is a unit (its compressed size from the file's footer; the footer and
  header bytes are counted with row group 0). A Parquet file whose footer cannot be read is one
  unit: its owner reports it as ``corrupt_stream``.
* A ``.jsonl``/``.jsonl.gz``/``.jsonl.zst`` file is a unit (a compressed stream cannot seek).
* An ``.arrow`` file of a ``datasets.save_to_disk`` folder is a unit.

Units are assigned by size, largest first, each to the shard with the fewest bytes so far (ties:
the lower shard id; units of equal size in the order of their stable key, ``<name>#rowgroup=K``
with ``<name>`` the file's path relative to its input folder). This greedy order balances shards
much better than a hash when there are few, large units, and it depends only on the set of units
and their sizes, not on the order the inputs were found in. Source files in directories keep
their per-document hash (:func:`shards.shard_of` of the key): finding them costs a stat, not a
decompression, and a hash needs no view of the whole corpus.

Every shard job and ``merge`` list the units again (a stat per record file, a footer read per
Parquet file); the assignment's digest is part of the shard fingerprint, so shards made with
another assignment (other sizes, another scheme) are refused rather than mixed.
"""
import hashlib
import heapq
import json
import os
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence

from .readers import arrow_files, is_arrow_dataset, is_record_file, open_regular, regular_file_size

SCHEME = "units-v1: parquet row group / jsonl file / arrow file by size (greedy); source files by hash"
ALL = "all"  # a record file read whole


@dataclass(frozen=True)
class Unit:
    """A part of a record file that one shard reads whole."""
    id: str  # unique in a run: the file's path as found, plus ``#rowgroup=K`` for Parquet
    key: str  # stable name: the path relative to its input, plus ``#rowgroup=K``
    path: str
    size: int  # bytes of the file this unit accounts for (they sum to the file's size)
    row_group: Optional[int] = None  # Parquet only; None: the whole file


def unit_id(path: str, row_group: Optional[int] = None) -> str:
    return path if row_group is None else f"{path}#rowgroup={row_group}"


def parquet_row_group_sizes(metadata, file_size: int) -> List[int]:
    """Compressed bytes of each row group; the rest of the file (magic, footer) goes to group 0,
    so the sizes sum to the file's size."""
    sizes = [sum(rg.column(c).total_compressed_size for c in range(rg.num_columns))
             for rg in (metadata.row_group(k) for k in range(metadata.num_row_groups))]
    if sizes:
        sizes[0] += max(0, file_size - sum(sizes))
    return sizes


def _parquet_sizes(path: str) -> Optional[List[int]]:
    """Row-group sizes from the footer only (no page is decompressed); None if unreadable."""
    import pyarrow.parquet as pq

    from .readers import _stream_errors

    raw, reason = open_regular(path)
    if raw is None:
        return None
    with raw:
        try:
            md = pq.ParquetFile(raw, pre_buffer=False).metadata
        except _stream_errors():
            return None
        return parquet_row_group_sizes(md, regular_file_size(path)[0]) or None


def _file_units(path: str, key: str) -> Iterator[Unit]:
    if path.endswith(".parquet"):
        sizes = _parquet_sizes(path)
        if sizes is not None:
            for k, size in enumerate(sizes):
                yield Unit(unit_id(path, k), f"{key}#rowgroup={k}", path, size, k)
            return
    yield Unit(path, key, path, regular_file_size(path)[0])


def _arrow_units(folder: str, key: str) -> Iterator[Unit]:
    for path in arrow_files(folder):
        yield Unit(path, f"{key}/{os.path.basename(path)}", path, regular_file_size(path)[0])


def iter_record_units(inputs: Sequence[str], language: Optional[str] = None,
                      exclude_dirs: Sequence[str] = ()) -> Iterator[Unit]:
    """The units of every record file of the inputs, in the order :func:`inputs.iter_documents`
    finds them (directories are walked the same way; source files are not opened)."""
    from .inputs import _walk

    for inp in inputs:
        if os.path.isdir(inp):
            base = os.path.basename(os.path.normpath(os.path.abspath(inp)))
            if is_arrow_dataset(inp):
                yield from _arrow_units(inp, base)
                continue
            for kind, path, _ in _walk(inp, language, frozenset(exclude_dirs)):
                rel = f"{base}/{os.path.relpath(path, inp).replace(os.sep, '/')}"
                if kind == "records":
                    yield from _file_units(path, rel)
                elif kind == "arrow":
                    yield from _arrow_units(path, rel)
        elif os.path.lexists(inp) and is_record_file(inp):
            yield from _file_units(inp, os.path.basename(inp))


def assign_units(units: Sequence[Unit], num_shards: int) -> List[int]:
    """Shard of each unit: largest first, each to the least loaded shard (deterministic)."""
    shards = [0] * len(units)
    if num_shards <= 1:
        return shards
    heap = [(0, s) for s in range(num_shards)]
    for i in sorted(range(len(units)), key=lambda i: (-units[i].size, units[i].key, i)):
        load, s = heapq.heappop(heap)
        shards[i] = s
        heapq.heappush(heap, (load + units[i].size, s))
    return shards


class Assignment:
    """The shard of every record unit of a corpus, and of source files (by key hash)."""

    def __init__(self, units: Sequence[Unit], num_shards: int):
        self.units, self.num_shards = list(units), num_shards
        self.shards = assign_units(self.units, num_shards)
        self.by_id: Dict[str, int] = {u.id: s for u, s in zip(self.units, self.shards)}

    @classmethod
    def of(cls, inputs, language=None, exclude_dirs=(), num_shards: int = 1) -> "Assignment":
        return cls(list(iter_record_units(inputs, language, exclude_dirs)), num_shards)

    def digest(self) -> str:
        """What the shard fingerprint records: the scheme and every (unit, size, shard)."""
        rows = sorted([u.key, u.size, s] for u, s in zip(self.units, self.shards))
        return hashlib.sha256(json.dumps([SCHEME, self.num_shards, rows]).encode()).hexdigest()

    def shard_of_document(self, doc) -> int:
        from .shards import shard_of

        if doc.unit is not None and doc.unit in self.by_id:
            return self.by_id[doc.unit]
        return shard_of(doc.key, self.num_shards)

    def unit_bytes(self, shard_id: int) -> int:
        return sum(u.size for u, s in zip(self.units, self.shards) if s == shard_id)

    def selection(self, shard_id: int) -> "Selection":
        return Selection(self, shard_id)


class Selection:
    """What one shard job reads (passed to :func:`inputs.iter_documents` as ``select``)."""

    def __init__(self, assignment: Assignment, shard_id: int):
        from .shards import shard_of

        self.shard_id, self.num_shards, self._shard_of = shard_id, assignment.num_shards, shard_of
        self.parts_by_path: Dict[str, object] = {}
        for u, s in zip(assignment.units, assignment.shards):
            if s != shard_id:
                continue
            if u.row_group is None:
                self.parts_by_path[u.path] = ALL
            else:
                self.parts_by_path.setdefault(u.path, []).append(u.row_group)

    def doc(self, key: str) -> bool:
        """Whether a source file (not a record) with this key is this shard's."""
        return self._shard_of(key, self.num_shards) == self.shard_id

    def parts(self, path: str):
        """``ALL``, the list of row groups to read, or None: nothing of this file."""
        return self.parts_by_path.get(path)
