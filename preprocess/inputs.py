"""Find documents in directories and JSONL files, and read them with explicit skip reasons.

A *document* is one source file: from a directory (walked recursively in sorted order, hidden
folders and symlinked folders skipped) or one record of a JSONL file (The Stack layout: a
``content`` field, a ``path``-like field and an optional ``lang``/``language`` field). Reading
never raises for bad input: it returns a skip reason that the caller counts.
"""
import hashlib
import json
import os
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence, Union

from .languages import language_from_path, normalize_language

CONTENT_FIELDS = ("content", "text", "code", "source")
PATH_FIELDS = ("path", "max_stars_repo_path", "filepath", "file_path", "filename", "id")
LANGUAGE_FIELDS = ("lang", "language", "programming_language")
BINARY_SNIFF_BYTES = 8192  # a NUL byte in the first 8 KiB marks a binary file (git's rule)

# Skip reasons, in the order the summary table lists them.
SKIP_REASONS = ("unreadable", "binary", "invalid_utf8", "empty", "too_large", "long_lines",
                "bad_jsonl_record", "unknown_language", "unknown_extension", "unrepresentable",
                "parse_errors", "duplicate", "near_duplicate", "decontaminated")


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


@dataclass
class ReadLimits:
    max_file_bytes: int = 1 << 20  # The Stack drops files over 1 MB too
    max_line_length: int = 1000  # longest line allowed; longer means minified or generated
    max_mean_line_length: int = 100  # The Stack's "avg line length" filter for generated files


def stable_hash(key: str) -> int:
    """64-bit hash of a string, identical across processes and Python versions."""
    return int.from_bytes(hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")


def iter_documents(inputs: Sequence[str], language: Optional[str] = None,
                   exclude_dirs: Sequence[str] = ()) -> Iterator[Document]:
    """Documents of every input path, in a deterministic order.

    ``exclude_dirs`` names folders (by base name) not to descend into, e.g. ``site-packages``.
    """
    for inp in inputs:
        if os.path.isdir(inp):
            yield from _iter_directory(inp, language, frozenset(exclude_dirs))
        elif inp.endswith((".jsonl", ".jsonl.gz")) and os.path.isfile(inp):
            yield from _iter_jsonl(inp, language)
        elif os.path.isfile(inp):
            yield Document(os.path.basename(inp), language or language_from_path(inp), file_path=inp)
        else:
            raise FileNotFoundError(f"input not found: {inp}")


def _iter_directory(root: str, language: Optional[str], exclude) -> Iterator[Document]:
    base = os.path.basename(os.path.normpath(os.path.abspath(root)))
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d not in exclude
                             and not os.path.islink(os.path.join(dirpath, d)))
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            lang = language or language_from_path(name)
            rel = os.path.relpath(path, root).replace(os.sep, "/")
            if lang is None:  # not a source file of a known language: counted, never read
                yield Document(f"{base}/{rel}", None, skip="unknown_extension")
                continue
            yield Document(f"{base}/{rel}", lang, file_path=path)


def _iter_jsonl(path: str, language: Optional[str]) -> Iterator[Document]:
    import gzip

    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8", errors="surrogateescape") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            key = f"{os.path.basename(path)}:{lineno}"
            try:
                rec = json.loads(line)
                content = next(rec[k] for k in CONTENT_FIELDS if isinstance(rec.get(k), str))
            except (ValueError, StopIteration, AttributeError, TypeError):
                yield Document(key, None, skip="bad_jsonl_record")
                continue
            rec_path = next((str(rec[k]) for k in PATH_FIELDS if rec.get(k) is not None), None)
            lang = language or _record_language(rec, rec_path)
            yield Document(rec_path or key, lang, content=content,
                           skip=None if lang else "unknown_language")


def _record_language(rec: dict, rec_path: Optional[str]) -> Optional[str]:
    for k in LANGUAGE_FIELDS:
        if isinstance(rec.get(k), str):
            lang = normalize_language(rec[k])
            if lang:
                return lang
    return language_from_path(rec_path) if rec_path else None


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
        try:
            if os.path.getsize(doc.file_path) > limits.max_file_bytes:
                return None, None, "too_large"
            with open(doc.file_path, "rb") as f:
                data = f.read(limits.max_file_bytes + 1)
        except OSError:
            return None, None, "unreadable"
    return check_content(data, limits)


def check_content(data: bytes, limits: ReadLimits):
    if len(data) > limits.max_file_bytes:
        return None, None, "too_large"
    if b"\x00" in data[:BINARY_SNIFF_BYTES]:
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
