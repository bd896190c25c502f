"""JSON-lines input with line-numbered errors, and atomic output (DESIGN.md section 9).

Outputs are written to a temporary file in the destination's directory, flushed to disk and
renamed over the destination, so an interrupted run never leaves a half-written file behind.
"""
import gzip
import io
import json
import os
import tempfile
from typing import Iterable, Iterator, List, Tuple

from .tasks import EvalInputError


def read_jsonl(path: str) -> List[dict]:
    """Records of a ``.jsonl`` (or ``.jsonl.gz``) file; blank lines are skipped.

    Raises:
        EvalInputError: missing file, bad encoding, invalid JSON or a line that is not an object.
    """
    opener = gzip.open if str(path).endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as handle:
            return parse_jsonl(handle, str(path))
    except FileNotFoundError:
        raise EvalInputError(f"{path}: no such file") from None
    except (UnicodeDecodeError, OSError) as exc:
        raise EvalInputError(f"{path}: cannot read: {exc}") from None


def parse_jsonl(handle: Iterable[str], name: str) -> List[dict]:
    """Parse JSON lines from an open text stream; `name` is used in error messages."""
    return [record for _, record in iter_jsonl(handle, name)]


def iter_jsonl(handle: Iterable[str], name: str) -> Iterator[Tuple[int, dict]]:
    """``(line_number, record)`` of each non-blank line; raises EvalInputError (a ValueError)
    naming ``name:line`` on invalid JSON or a line that is not an object."""
    for line_number, line in enumerate(handle, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise EvalInputError(f"{name}:{line_number}: invalid JSON: {exc}") from None
        if not isinstance(record, dict):
            raise EvalInputError(f"{name}:{line_number}: expected a JSON object")
        yield line_number, record


def write_text_atomic(path: str, text: str) -> None:
    """Write `text` to `path` atomically (temporary file in the same directory, then rename)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp_path = tempfile.mkstemp(prefix=".tmp_", suffix=os.path.basename(path), dir=directory)
    try:
        with io.open(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_path, path)
    except BaseException:
        if os.path.exists(tmp_path):
            os.unlink(tmp_path)
        raise


def json_line(record: dict) -> str:
    """One JSONL line; UTF-8 text as it is, but ASCII escapes where a string cannot be encoded
    (a lone surrogate such as ``"\\ud800"`` from a model's output reads back unchanged)."""
    line = json.dumps(record, ensure_ascii=False)
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:
        line = json.dumps(record, ensure_ascii=True)
    return line + "\n"


def write_jsonl_atomic(path: str, records: Iterable[dict]) -> None:
    """Write one JSON object per line, atomically."""
    write_text_atomic(path, "".join(json_line(record) for record in records))
