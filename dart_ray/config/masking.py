"""Secrets out of logs, error texts and stored snapshots.

A secret reaches dart-ray in one of a few ways: `config.read_secret` (a password or token from
an environment variable or a file), a whole DSN from the environment (`store.dsn_env`), or a
token a component makes up for itself. Whatever reads or makes one calls `remember(secret)`:
from then on this process masks that exact string wherever it masks text. `mask_text` also
masks any password inside a URL (`scheme://user:pw@host`) and the credential after `Bearer`,
remembered or not, so a DSN pasted into an error message is safe even in a process that never
read it.

`install_log_masking()` passes every log record of the process through `mask_text` (message,
arguments and traceback), whichever logger or handler emits it: it wraps the log record
factory, once. `remember` installs it, so a process that holds a secret does not log it.
Masking is a second line of defence: secrets are never put into configs, rows or messages on
purpose, and tests check the first line too.
"""

from __future__ import annotations

import logging
import re
import threading
import traceback
from typing import Any
from urllib.parse import quote, quote_plus

MASK = "***"

MIN_SECRET_LEN = 4
"""Shorter strings are not masked by value (masking every 'a' would wreck the logs); they are
still masked where they appear as a URL password or a bearer credential."""

# the password runs to the next '@'; a '/' is allowed in it (cloud secret keys have them, and
# people paste them unencoded), at the price of masking a port and path before a later '@'
_URL_PASSWORD = re.compile(r"(?P<head>[a-z][a-z0-9+.-]*://[^/@:\s]*:)(?P<pw>[^@\s]+)(?=@)", re.I)
_BEARER = re.compile(r"(?P<head>\bbearer\s+)[^\s'\",;]+", re.I)

_known: set[str] = set()
_lock = threading.Lock()
_installed = False


def remember(secret: str | None) -> None:
    """Mask `secret` (and its URL-encoded forms) in every text this process masks from now on."""
    if not secret or len(secret) < MIN_SECRET_LEN:
        return
    with _lock:
        _known.update({secret, quote(secret, safe=""), quote_plus(secret)})
    install_log_masking()


def mask_text(s: str) -> str:
    """`s` with URL passwords, bearer credentials and remembered secrets replaced by `***`."""
    s = _URL_PASSWORD.sub(lambda m: m.group("head") + MASK, s)
    s = _BEARER.sub(lambda m: m.group("head") + MASK, s)
    with _lock:
        known = sorted(_known, key=len, reverse=True)  # a longer secret may contain a shorter
    for secret in known:
        if secret in s:
            s = s.replace(secret, MASK)
    return s


def _mask_record(record: logging.LogRecord) -> None:
    try:
        message = record.getMessage()
    except (TypeError, ValueError, KeyError):  # a malformed call: logging reports it at emit
        return
    masked = mask_text(message)
    if masked != message:
        record.msg, record.args = masked, ()
    if record.exc_info and record.exc_info[0] is not None and not record.exc_text:
        # formatters use exc_text when it is set, so the traceback is printed masked
        text = "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")
        record.exc_text = mask_text(text)
    if record.stack_info:
        record.stack_info = mask_text(record.stack_info)


def install_log_masking() -> None:
    """Mask every log record this process creates from now on (idempotent)."""
    global _installed
    with _lock:
        if _installed:
            return
        _installed = True
    previous = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        _mask_record(record)
        return record

    logging.setLogRecordFactory(factory)
