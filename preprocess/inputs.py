"""Find documents in directories and record files, and read them with explicit skip reasons.

A *document* is one source file: from a directory (walked recursively in sorted order, hidden
folders and symlinked folders skipped) or one record of a record file (JSONL, ``.jsonl.gz``,
``.jsonl.zst``, Parquet, or a ``datasets.save_to_disk`` folder of Arrow files; see readers.py for
the columns). Record files and saved datasets found inside a directory are read as such. Reading
never raises for bad input: it returns a skip reason that the caller counts. Only regular files
are ever opened, non-blocking: named pipes, devices and sockets are skipped (``special_file``),
dangling symlinks and symlink loops are ``unreadable``.
"""
import hashlib
import os
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence, Union

from .languages import language_from_path
from .readers import (Columns, is_arrow_dataset, is_record_file, iter_arrow_dataset, iter_jsonl,
                      iter_parquet, open_regular, regular_file_size)

# Skip reasons, in the order the summary table lists them.
SKIP_REASONS = ("unreadable", "special_file", "corrupt_stream", "binary", "invalid_utf8", "empty",
                "too_large", "long_lines", "bad_jsonl_record", "bad_record", "unknown_language",
                "unknown_extension", "unrepresentable", "parse_errors", "duplicate", "near_duplicate",
                "decontaminated")


@dataclass
class Document:
    """Where a document lives; its bytes are read later, in a worker.

    ``key`` identifies the document for splitting and sharding (relative path inside its input
    directory, or the JSONL record's path field), so it does not depend on where the corpus is.
    """
    key: str
    language: Optional[str]
    file_path: Optional[str] = None
    content: Optional[Union[str, bytes]] = None
    skip: Optional[str] = None  # a reason already known when the document was found
    origin: str = ""  # where it was read: a file path, "file.jsonl:LINE" or "file.parquet#ROW"
    src_bytes: int = 0  # bytes of the input files this document accounts for (progress, plan)
    unit: Optional[str] = None  # the record-file unit it was read from (units.Unit.id), if any

    @property
    def where(self) -> str:
        """The name to report for this document (skip report, sample list)."""
        return self.origin or self.file_path or self.key


@dataclass
class ReadLimits:
    max_file_bytes: int = 1 << 20  # The Stack drops files over 1 MB too
    max_line_length: int = 1000  # longest line allowed; longer means minified or generated
    max_mean_line_length: int = 100  # The Stack's "avg line length" filter for generated files


def stable_hash(key: str) -> int:
    """64-bit hash of a string, identical across processes and Python versions."""
    return int.from_bytes(hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")


def iter_documents(inputs: Sequence[str], language: Optional[str] = None,
                   exclude_dirs: Sequence[str] = (), columns: Optional[Columns] = None,
                   select=None) -> Iterator[Document]:
    """Documents of every input path, in a deterministic order.

    ``exclude_dirs`` names folders (by base name) not to descend into, e.g. ``site-packages``.
    ``columns`` names the content/path/language columns of record files (default: The Stack's).
    ``select`` (a :class:`units.Selection`) keeps one shard's part: source files whose key it
    wants, and only its units of record files (the others are never opened).
    """
    columns = columns or Columns()
    for inp in inputs:
        if os.path.isdir(inp):
            if is_arrow_dataset(inp):
                yield from iter_arrow_dataset(inp, language, columns, select)
            else:
                yield from _iter_directory(inp, language, frozenset(exclude_dirs), columns, select)
        elif os.path.lexists(inp):
            if is_record_file(inp):
                yield from iter_record_file(inp, language, columns, select)
            elif select is not None and not select.doc(os.path.basename(inp)):
                continue
            else:
                size, skip = regular_file_size(inp)
                yield Document(os.path.basename(inp), language or language_from_path(inp),
                               file_path=inp, skip=skip, origin=inp, src_bytes=size)
        else:
            raise FileNotFoundError(f"input not found: {inp}")


def iter_record_file(path: str, language: Optional[str], columns: Columns, select=None) -> Iterator[Document]:
    """Documents of a record file; with ``select``, only the units of that shard."""
    parts = "all" if select is None else select.parts(path)
    if parts is None:  # no unit of this file belongs to the shard: not even opened
        return iter(())
    if path.endswith(".parquet"):
        return iter_parquet(path, language, columns, row_groups=None if parts == "all" else parts)
    return iter_jsonl(path, language, columns)


def _walk(root: str, language: Optional[str], exclude):
    """What a directory holds for the corpus, in walk order: ``("file", path, language)``,
    ``("records", path, None)`` and ``("arrow", folder, None)`` entries."""
    for dirpath, dirnames, filenames in os.walk(root):
        datasets = sorted(d for d in dirnames if is_arrow_dataset(os.path.join(dirpath, d))
                          and not os.path.islink(os.path.join(dirpath, d)))
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d not in exclude
                             and not os.path.islink(os.path.join(dirpath, d)) and d not in datasets)
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            if is_record_file(name):
                yield "records", path, None
                continue
            if name == "dataset_dict.json" and datasets:  # a saved DatasetDict's own metadata
                continue
            lang = language or language_from_path(name)
            if lang is None:  # not a source file of a known language: counted, never read
                yield "unknown", path, None
            else:
                yield "file", path, lang
        for d in datasets:
            yield "arrow", os.path.join(dirpath, d), None


def _iter_directory(root: str, language: Optional[str], exclude, columns: Columns,
                    select=None) -> Iterator[Document]:
    base = os.path.basename(os.path.normpath(os.path.abspath(root)))
    for kind, path, lang in _walk(root, language, exclude):
        if kind == "records":
            yield from iter_record_file(path, language, columns, select)
            continue
        if kind == "arrow":
            yield from iter_arrow_dataset(path, language, columns, select)
            continue
        rel = os.path.relpath(path, root).replace(os.sep, "/")
        if select is not None and not select.doc(f"{base}/{rel}"):
            continue
        if kind == "unknown":
            yield Document(f"{base}/{rel}", None, skip="unknown_extension", origin=path)
        else:
            size, skip = regular_file_size(path)  # dangling/looping symlink, FIFO, device: skipped
            yield Document(f"{base}/{rel}", lang, file_path=path, skip=skip, origin=path, src_bytes=size)


def input_bytes(inputs: Sequence[str], language: Optional[str] = None, exclude_dirs: Sequence[str] = ()) -> int:
    """Total size of the files :func:`iter_documents` reads (compressed sizes for record files;
    files of unknown extension are never read, so not counted); only stats files."""
    from .readers import arrow_files

    total = 0
    for inp in inputs:
        if os.path.isdir(inp):
            entries = ([("arrow", inp, None)] if is_arrow_dataset(inp)
                       else _walk(inp, language, frozenset(exclude_dirs)))
            for kind, path, _ in entries:
                if kind == "unknown":
                    continue
                paths = arrow_files(path) if kind == "arrow" else [path]
                total += sum(regular_file_size(p)[0] for p in paths)
        else:
            total += regular_file_size(inp)[0]
    return total


def read_document(doc: Document, limits: ReadLimits):
    """Return ``(data_bytes, text, None)`` or ``(None, None, skip_reason)``."""
    if doc.skip:
        return None, None, doc.skip
    if doc.language is None:
        return None, None, "unknown_language"
    if doc.content is not None:
        try:
            data = doc.content if isinstance(doc.content, bytes) else doc.content.encode("utf-8")
        except UnicodeEncodeError:
            return None, None, "invalid_utf8"
    else:
        f, reason = open_regular(doc.file_path)  # regular files only, never blocks
        if f is None:
            return None, None, reason
        try:
            with f:
                if os.fstat(f.fileno()).st_size > limits.max_file_bytes:
                    return None, None, "too_large"
                data = f.read(limits.max_file_bytes + 1)
        except OSError:
            return None, None, "unreadable"
    return check_content(data, limits)


def check_content(data: bytes, limits: ReadLimits):
    if len(data) > limits.max_file_bytes:
        return None, None, "too_large"
    if b"\x00" in data:  # anywhere, not only in the first 8 KiB (git's sniff)
        return None, None, "binary"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None, None, "invalid_utf8"
    if not text.strip():
        return None, None, "empty"
    lines = text.count("\n") + 1
    if len(data) / lines > limits.max_mean_line_length or _longest_line(text) > limits.max_line_length:
        return None, None, "long_lines"
    return data, text, None


def _longest_line(text: str) -> int:
    return max(map(len, text.split("\n")))
