"""Readers of corpora as they are published, streamed in bounded memory.

* JSONL, plain or compressed (``.jsonl``, ``.jsonl.gz``, ``.jsonl.zst``): line by line.
* Parquet (The Stack v1, StarCoderData): batch by batch inside each row group (pyarrow), only
  the content/path/language columns are decoded.
* A folder written by ``datasets.save_to_disk``: ``state.json`` + ``data-0000i-of-0000N.arrow``
  files in Arrow's IPC stream format, read one record batch at a time (no ``datasets`` needed).

Columns default to The Stack's: ``content``, ``max_stars_repo_path`` (or ``path``) and ``lang``
(or ``language``); :class:`Columns` overrides them. A record file that cannot be read at all, or
whose compressed stream is cut short, is not an error: the records before the damage are kept and
the rest (of the file; of the row group for Parquet, whose other row groups are still read) is
yielded as one skipped :class:`~.inputs.Document` (reason ``corrupt_stream``). Only a
file that lacks a content column stops the run, with :class:`CorpusFormatError` naming what is
missing, since no file of that corpus could be used.

Every file is opened by :func:`open_regular`: regular files only, opened non-blocking, so a named
pipe, a device or a socket among the inputs is skipped (``special_file``) instead of hanging.
"""
import io
import json
import logging
import os
import stat
import zlib
from dataclasses import dataclass
from typing import Iterator, List, Optional, Sequence, Tuple

logger = logging.getLogger(__name__)

JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst")
PARQUET_SUFFIXES = (".parquet",)
RECORD_SUFFIXES = JSONL_SUFFIXES + PARQUET_SUFFIXES
ARROW_STATE_FILE = "state.json"  # what datasets.save_to_disk writes beside its .arrow files

# Default column names, first present wins (The Stack's names first).
CONTENT_COLUMNS = ("content", "text", "code", "source")
PATH_COLUMNS = ("max_stars_repo_path", "path", "filepath", "file_path", "filename", "id")
LANGUAGE_COLUMNS = ("lang", "language", "programming_language")
BATCH_ROWS = 256  # rows decoded to Python objects at a time (Parquet and Arrow)


class CorpusFormatError(ValueError):
    """A record file has no usable content column: a one-line, user-facing error."""


@dataclass(frozen=True)
class Columns:
    """Column (field) names of record files; ``None`` means the first present of the defaults."""
    content: Optional[str] = None
    path: Optional[str] = None
    language: Optional[str] = None

    def pick(self, names: Sequence[str], source: str) -> Tuple[str, Optional[str], Optional[str]]:
        """The (content, path, language) columns of a schema; raises if content is missing."""
        present = set(names)
        if self.content is not None:
            content = self.content if self.content in present else None
        else:
            content = next((c for c in CONTENT_COLUMNS if c in present), None)
        if content is None:
            wanted = self.content or " / ".join(CONTENT_COLUMNS)
            hint = (" (The Stack v2 ships only blob_id: download the contents first)"
                    if "blob_id" in present else "")
            raise CorpusFormatError(
                f"{source}: no content column {wanted!r} among its columns "
                f"[{', '.join(list(names)[:12])}{', ...' if len(names) > 12 else ''}]{hint}; "
                "name it with --content-column")
        for flag, col in (("--path-column", self.path), ("--lang-column", self.language)):
            if col is not None and col not in present:
                raise CorpusFormatError(f"{source}: no column {col!r} ({flag}) among its columns "
                                        f"[{', '.join(list(names)[:12])}]")
        path = self.path or next((c for c in PATH_COLUMNS if c in present), None)
        lang = self.language or next((c for c in LANGUAGE_COLUMNS if c in present), None)
        return content, path, lang


def is_record_file(path: str) -> bool:
    return path.endswith(RECORD_SUFFIXES)


def is_arrow_dataset(path: str) -> bool:
    """A folder written by ``datasets.save_to_disk`` (one split)."""
    return os.path.isfile(os.path.join(path, ARROW_STATE_FILE)) and bool(arrow_files(path))


def arrow_files(folder: str) -> List[str]:
    """The ``.arrow`` files of a saved dataset, in the order ``state.json`` lists them."""
    try:
        with open(os.path.join(folder, ARROW_STATE_FILE), encoding="utf-8") as f:
            names = [d["filename"] for d in json.load(f).get("_data_files", [])]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        names = []
    if not names:
        try:
            names = sorted(n for n in os.listdir(folder) if n.endswith(".arrow"))
        except OSError:
            names = []
    return [os.path.join(folder, n) for n in names]


def regular_file_size(path: str) -> Tuple[int, Optional[str]]:
    """``(size, None)`` for a regular file (symlinks followed), else ``(0, skip_reason)``.

    A dangling symlink, a symlink loop or a permission error is ``unreadable``; a named pipe,
    device or socket is ``special_file``. Never opens the file, so it never blocks.
    """
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return 0, "unreadable"
    if not stat.S_ISREG(st.st_mode):
        return 0, "special_file"
    return st.st_size, None


def open_regular(path: str):
    """Open a regular file for binary reading without ever blocking: ``(file, None)`` or
    ``(None, skip_reason)``. The file is opened with ``O_NONBLOCK`` (a FIFO swapped in after the
    check still cannot block the open) and its type checked again on the open descriptor."""
    size, reason = regular_file_size(path)
    if reason:
        return None, reason
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except (OSError, ValueError):
        return None, "unreadable"
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            return None, "special_file"
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)  # a regular file: plain blocking reads from here on
        return os.fdopen(fd, "rb"), None
    except OSError:
        os.close(fd)
        return None, "unreadable"


# Errors of a damaged compressed or columnar stream (gzip: EOFError, BadGzipFile (OSError),
# zlib.error; zstandard: ZstdError; pyarrow: ArrowException subclasses of OSError/ValueError).
def _stream_errors():
    errors = [EOFError, OSError, zlib.error, ValueError]
    try:
        import zstandard

        errors.append(zstandard.ZstdError)
    except ImportError:
        pass
    try:
        import pyarrow as pa

        errors.append(pa.ArrowException)
    except ImportError:
        pass
    return tuple(errors)


def _text_lines(raw, path: str):
    """A text line iterator over a (possibly compressed) binary file."""
    if path.endswith(".gz"):
        import gzip

        stream = gzip.GzipFile(fileobj=raw, mode="rb")
    elif path.endswith(".zst"):
        stream = io.BufferedReader(_ZstdFrames(raw), buffer_size=1 << 16)
    else:
        stream = raw
    return io.TextIOWrapper(stream, encoding="utf-8", errors="surrogateescape", newline="\n")


class _ZstdFrames(io.RawIOBase):
    """Decompress concatenated zstd frames from a binary file; unlike ``stream_reader``, a stream
    that ends inside a frame raises (``ZstdError``) instead of ending quietly."""

    CHUNK = 1 << 16

    def __init__(self, raw):
        import zstandard

        self._zstd, self._raw = zstandard, raw
        self._dobj = zstandard.ZstdDecompressor().decompressobj()
        self._buf, self._in_frame = b"", False

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        while not self._buf:
            chunk = self._raw.read(self.CHUNK)
            if not chunk:
                if self._in_frame:
                    raise self._zstd.ZstdError("truncated zstd stream (ends inside a frame)")
                return 0
            self._buf = self._feed(chunk)
        n = min(len(b), len(self._buf))
        b[:n], self._buf = self._buf[:n], self._buf[n:]
        return n

    def _feed(self, chunk: bytes) -> bytes:
        out = []
        while chunk:
            self._in_frame = True
            out.append(self._dobj.decompress(chunk))
            if not self._dobj.eof:
                break
            chunk, self._in_frame = self._dobj.unused_data, False  # the next frame, if any
            self._dobj = self._zstd.ZstdDecompressor().decompressobj()
        return b"".join(out)


def iter_jsonl(path: str, language: Optional[str], columns: Columns) -> Iterator:
    """Documents of a JSONL file (plain, ``.gz`` or ``.zst``), one per line, streamed; the file
    is one shard unit (see units.py)."""
    for doc in _iter_jsonl(path, language, columns):
        doc.unit = path
        yield doc


def _iter_jsonl(path: str, language: Optional[str], columns: Columns) -> Iterator:
    from .inputs import Document

    name = os.path.basename(path)
    raw, reason = open_regular(path)
    if raw is None:
        yield Document(name, None, file_path=path, skip=reason, origin=path)
        return
    lineno, pos = 0, 0
    try:
        with raw:
            lines = _text_lines(raw, path)
            content_cols = (columns.content,) if columns.content else CONTENT_COLUMNS
            path_cols = (columns.path,) if columns.path else PATH_COLUMNS
            lang_cols = (columns.language,) if columns.language else LANGUAGE_COLUMNS
            for lineno, line in enumerate(lines, 1):
                now = raw.tell()
                src, pos = now - pos, now
                if not line.strip():
                    continue
                origin = f"{path}:{lineno}"
                try:
                    rec = json.loads(line)
                    content = next(rec[k] for k in content_cols if isinstance(rec.get(k), str))
                except (ValueError, StopIteration, AttributeError, TypeError):
                    yield Document(f"{name}:{lineno}", None, skip="bad_jsonl_record", origin=origin,
                                   src_bytes=src)
                    continue
                rec_path = next((str(rec[k]) for k in path_cols if rec.get(k) is not None), None)
                lang = language or record_language([rec.get(k) for k in lang_cols], rec_path)
                yield Document(rec_path or f"{name}:{lineno}", lang, content=content, origin=origin,
                               skip=None if lang else "unknown_language", src_bytes=src)
    except _stream_errors() as e:
        logger.warning("%s: damaged after line %d (%s: %s); the rest of the file is skipped",
                       path, lineno, type(e).__name__, str(e).splitlines()[0] if str(e) else "")
        yield Document(f"{name}:{lineno + 1}-", None, file_path=path, skip="corrupt_stream",
                       origin=f"{path}:{lineno + 1}", src_bytes=max(0, _size(path) - pos))


def record_language(values: Sequence, rec_path: Optional[str]) -> Optional[str]:
    """Our language of a record: its first language field, else its path's extension.

    A language field naming a language we do not parse (``Ruby``) makes the record unknown
    rather than guessed from the extension (``.h`` of Objective-C is not C).
    """
    from .languages import language_from_path, normalize_language

    for v in values:
        if isinstance(v, str) and v.strip():
            return normalize_language(v)
    return language_from_path(rec_path) if rec_path else None


def _size(path: str) -> int:
    return regular_file_size(path)[0]


def iter_parquet(path: str, language: Optional[str], columns: Columns,
                 row_groups: Optional[Sequence[int]] = None) -> Iterator:
    """Documents of a Parquet file, decoded ``BATCH_ROWS`` rows at a time, row group by row
    group, reading only the content, path and language columns.

    ``row_groups`` (default: all) are the groups to read, each a shard unit (see units.py):
    the pages of the other groups are neither read nor decompressed. A damaged row group is
    one ``corrupt_stream`` document (the rows before the damage kept); the next group is read.
    """
    import pyarrow.parquet as pq

    from .inputs import Document
    from .units import parquet_row_group_sizes, unit_id

    name = os.path.basename(path)
    raw, reason = open_regular(path)
    if raw is None:
        yield Document(name, None, file_path=path, skip=reason, origin=path, unit=path)
        return
    size = _size(path)
    with raw:
        try:
            pf = pq.ParquetFile(raw, pre_buffer=False, buffer_size=1 << 20)
            names = pf.schema_arrow.names
            md = pf.metadata
        except _stream_errors() as e:
            logger.warning("%s: not a readable Parquet file (%s)", path, str(e).splitlines()[0] if str(e) else e)
            yield Document(name, None, file_path=path, skip="corrupt_stream", origin=path, src_bytes=size,
                           unit=path)
            return
        content, path_col, lang_col = columns.pick(names, path)
        cols = [c for c in (content, path_col, lang_col) if c is not None]
        sizes = parquet_row_group_sizes(md, size)
        starts = [0]
        for k in range(md.num_row_groups):
            starts.append(starts[-1] + md.row_group(k).num_rows)
        for k in (range(md.num_row_groups) if row_groups is None else row_groups):
            batches = pf.iter_batches(batch_size=BATCH_ROWS, row_groups=[k], columns=cols, use_threads=False)
            for doc in _iter_batches(batches, path, name, language, cols, content, path_col, lang_col,
                                     sizes[k], max(1, md.row_group(k).num_rows), starts[k],
                                     part="row group"):
                doc.unit = unit_id(path, k)
                yield doc


def _iter_batches(batches, path, name, language, cols, content, path_col, lang_col, size,
                  total_rows, row_offset=0, size_offset=0, part="file"):
    """Documents of record batches (shared by Parquet and Arrow); catches a damaged stream."""
    from .inputs import Document

    row = row_offset
    done_bytes = size_offset
    try:
        for batch in batches:
            values = {c: batch.column(batch.schema.get_field_index(c)).to_pylist() for c in cols}
            for i in range(batch.num_rows):
                origin = f"{path}#{row}"
                end = size_offset + (size * (row - row_offset + 1)) // total_rows
                src, done_bytes = end - done_bytes, end
                text = values[content][i]
                rec_path = values[path_col][i] if path_col else None
                rec_path = None if rec_path is None else str(rec_path)
                row += 1
                if not isinstance(text, (str, bytes)):
                    yield Document(rec_path or f"{name}#{row - 1}", None, skip="bad_record", origin=origin,
                                   src_bytes=src)
                    continue
                lang = language or record_language([values[lang_col][i]] if lang_col else [], rec_path)
                yield Document(rec_path or f"{name}#{row - 1}", lang, content=text, origin=origin,
                               skip=None if lang else "unknown_language", src_bytes=src)
            del values
    except _stream_errors() as e:
        logger.warning("%s: damaged after row %d (%s); the rest of the %s is skipped",
                       path, row, str(e).splitlines()[0] if str(e) else type(e).__name__, part)
        yield Document(f"{name}#{row}-", None, file_path=path, skip="corrupt_stream",
                       origin=f"{path}#{row}", src_bytes=max(0, size_offset + size - done_bytes))


def iter_arrow_dataset(folder: str, language: Optional[str], columns: Columns, select=None) -> Iterator:
    """Documents of a ``datasets.save_to_disk`` folder: its ``.arrow`` files (IPC streams) in
    ``state.json`` order, one record batch in memory at a time. Each file is a shard unit;
    with ``select`` (units.Selection), only that shard's files are opened."""
    for path in arrow_files(folder):
        if select is not None and select.parts(path) is None:
            continue
        for doc in _iter_arrow_file(folder, path, language, columns):
            doc.unit = path
            yield doc


def _iter_arrow_file(folder: str, path: str, language: Optional[str], columns: Columns) -> Iterator:
    import pyarrow as pa

    from .inputs import Document

    name = f"{os.path.basename(os.path.normpath(folder))}/{os.path.basename(path)}"
    raw, reason = open_regular(path)
    if raw is None:
        yield Document(name, None, file_path=path, skip=reason, origin=path)
        return
    size = _size(path)
    with raw:
        try:
            reader = pa.ipc.open_stream(raw)
        except _stream_errors() as e:
            logger.warning("%s: not an Arrow IPC stream (%s)", path, e)
            yield Document(name, None, file_path=path, skip="corrupt_stream", origin=path,
                           src_bytes=size)
            return
        content, path_col, lang_col = columns.pick(reader.schema.names, path)
        cols = [c for c in (content, path_col, lang_col) if c is not None]
        # Rows are unknown until the stream is read: spread the file's bytes by batch.
        yield from _iter_arrow_batches(reader, path, name, language, cols, content, path_col,
                                       lang_col, raw, size)


def _iter_arrow_batches(reader, path, name, language, cols, content, path_col, lang_col, raw, size):
    """Documents of an Arrow IPC stream, one record batch at a time."""
    from .inputs import Document

    row, pos = 0, 0
    while True:
        try:
            batch = reader.read_next_batch()
        except StopIteration:
            return
        except _stream_errors() as e:
            logger.warning("%s: damaged after row %d (%s); the rest of the file is skipped", path, row,
                           str(e).splitlines()[0] if str(e) else type(e).__name__)
            yield Document(f"{name}#{row}-", None, file_path=path, skip="corrupt_stream",
                           origin=f"{path}#{row}", src_bytes=max(0, size - pos))
            return
        now = min(size, raw.tell())  # the batch's bytes, spread over its rows
        yield from _iter_batches([batch], path, name, language, cols, content, path_col, lang_col,
                                 now - pos, max(1, batch.num_rows), row, pos)
        row, pos = row + batch.num_rows, now
