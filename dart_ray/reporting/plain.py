"""Plain text where the output is a file: a job's log, `> run.log`, CI.

Ray colours some of what a driver prints whatever the stream is: the dashboard URL of "View
the dashboard at ...", the "[repeated 3x across cluster]" of its log deduplication (its
`RAY_COLOR_PREFIX=0` turns off only the worker prefixes). In a file those are escape codes
in the text. `plain_streams()` wraps `sys.stdout` and `sys.stderr` so that what is written
through them loses its colour codes; it runs before Ray is imported, so Ray's log handler
writes through the wrapper too.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable
from typing import Any, TextIO

# SGR sequences (colours, bold) and the other CSI sequences a logger might carry
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class PlainStream:
    """A text stream that writes through to `inner` without ANSI escape sequences."""

    def __init__(self, inner: TextIO) -> None:
        self._inner = inner

    def write(self, s: str) -> int:
        self._inner.write(ANSI.sub("", s))
        return len(s)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:  # flush, fileno, isatty, encoding, buffer, ...
        return getattr(self._inner, name)


def plain_streams() -> None:
    """Strip colour codes from stdout and stderr where each is not a terminal (idempotent)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is None or isinstance(stream, PlainStream) or stream.isatty():
            continue
        setattr(sys, name, PlainStream(stream))
