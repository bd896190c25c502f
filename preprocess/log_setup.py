"""Logging set-up of our console commands.

``logging.basicConfig`` binds its handler to the ``sys.stderr`` of the moment and does nothing
when the root logger already has a handler. A command called again in the same process (tests, a
notebook) would then write to a stream that has since been replaced or closed, or keep the first
call's level. This handler looks ``sys.stderr`` up at every record and replaces only its own
earlier copies, leaving other handlers (a test runner's, an application's) alone.
"""
import logging
import sys


class _CurrentStderr(logging.StreamHandler):
    """A StreamHandler on whatever ``sys.stderr`` is when a record is written."""

    def __init__(self):
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):  # StreamHandler.__init__ assigns it; the property ignores it
        pass


def configure_cli_logging(level: int, fmt: str) -> None:
    """Console logging for a command: ``level`` on the root logger, one handler on stderr."""
    root = logging.getLogger()
    for h in [h for h in root.handlers if isinstance(h, _CurrentStderr)]:
        root.removeHandler(h)
    handler = _CurrentStderr()
    handler.setFormatter(logging.Formatter(fmt))
    root.addHandler(handler)
    root.setLevel(level)
