"""Progress of a shard: a bar on a terminal, a log line every N seconds otherwise.

Progress is measured in bytes of the input files read so far (compressed bytes for ``.gz``,
``.zst`` and Parquet), against the bytes the job will read (for a shard: its own record-file
units plus an even share of the source files, see shards.shard_input_bytes), so the ETA holds
for any format.
"""
import logging
import sys
import time
from typing import Optional

logger = logging.getLogger(__name__)


def _eta(seconds: float) -> str:
    if seconds != seconds or seconds == float("inf"):  # NaN / unknown
        return "?"
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    return f"{h}h{rem // 60:02d}m" if h else f"{rem // 60}m{rem % 60:02d}s"


class InputCounter:
    """Bytes of input consumed by the document walk (it runs ahead of the workers by at most
    the documents in flight)."""

    def __init__(self):
        self.bytes = 0

    def count(self, documents):
        for doc in documents:
            self.bytes += doc.src_bytes
            yield doc


class Progress:
    """Files done, content MB/s and ETA, as a tqdm bar when ``stream`` is a terminal, else
    one log line every ``log_interval`` seconds (and none when disabled)."""

    def __init__(self, desc: str, total_bytes: int, counter: InputCounter, enabled: bool = True,
                 log_interval: float = 60.0, stream=None):
        stream = stream if stream is not None else sys.stderr
        self.desc, self.total, self.counter = desc, max(0, int(total_bytes)), counter
        self.files = self.kept = self.content_bytes = 0
        self.t0 = self.last_log = time.monotonic()
        self.log_interval = log_interval
        self.bar = None
        self.log_lines = enabled and not _isatty(stream) and log_interval > 0
        if enabled and _isatty(stream):
            from tqdm import tqdm

            self.bar = tqdm(desc=desc, total=self.total or None, unit="B", unit_scale=True,
                            unit_divisor=1000, file=stream, mininterval=1.0, dynamic_ncols=True)

    def update(self, kept: bool, num_bytes: int) -> None:
        self.files += 1
        self.kept += kept
        self.content_bytes += num_bytes
        now = time.monotonic()
        if self.bar is not None:
            done = min(self.counter.bytes, self.total) if self.total else self.counter.bytes
            self.bar.update(done - self.bar.n)
            self.bar.set_postfix_str(f"{self.files} files, {self._mbps(now):.2f} MB/s of code",
                                     refresh=False)
        elif self.log_lines and now - self.last_log >= self.log_interval:
            self.last_log = now
            logger.info("%s", self.line(now))

    def _mbps(self, now: float) -> float:
        return self.content_bytes / 1e6 / max(1e-9, now - self.t0)

    def line(self, now: Optional[float] = None) -> str:
        now = time.monotonic() if now is None else now
        elapsed = max(1e-9, now - self.t0)
        done = self.counter.bytes
        frac = min(1.0, done / self.total) if self.total else float("nan")
        eta = elapsed * (1 - frac) / frac if frac and frac == frac else float("nan")
        pct = f"{100 * frac:.1f}%" if frac == frac else "?%"
        return (f"{self.desc}: {self.files} files ({self.kept} kept), {done / 1e6:.1f}/"
                f"{self.total / 1e6:.1f} MB of input ({pct}), {self._mbps(now):.2f} MB/s of code, "
                f"ETA {_eta(eta)}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.log_lines:
            logger.info("%s", self.line())


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
