"""Secrets are masked in text and in every log record of a process that has read them."""

from __future__ import annotations

import io
import logging
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from dart_ray.config import read_secret
from dart_ray.config.masking import MASK, install_log_masking, mask_text, remember


@pytest.fixture
def log_text() -> Iterator[io.StringIO]:
    """Everything logged on a fresh logger, formatted the ordinary way (tracebacks included)."""
    install_log_masking()
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))
    logger = logging.getLogger("dart_ray.test_masking")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield buf
    logger.removeHandler(handler)


def test_mask_text_hides_url_passwords_and_bearer_credentials() -> None:
    assert (
        mask_text("connect mysql+pymysql://dart:hunter2@db:3306/x failed")
        == f"connect mysql+pymysql://dart:{MASK}@db:3306/x failed"
    )
    assert mask_text("s3://AKIA:se/cret@bucket/p") == f"s3://AKIA:{MASK}@bucket/p"
    assert mask_text("Authorization: Bearer abc.DEF-123") == f"Authorization: Bearer {MASK}"
    # nothing else is touched
    assert mask_text("sqlite:////tmp/x.db and http://host:8000/v1") == (
        "sqlite:////tmp/x.db and http://host:8000/v1"
    )


def test_remembered_secrets_are_masked_in_any_form() -> None:
    s = "p@ss w/rd:" + secrets.token_hex(4)
    assert mask_text(f"x {s} y") == f"x {s} y"
    remember(s)
    assert mask_text(f"x {s} y") == f"x {MASK} y"
    # as it appears percent-encoded in a URL, or form-encoded
    assert s not in mask_text(f"mysql://u:{s.replace('@', '%40')}@h/d")
    assert "p%40ss+w%2Frd" not in mask_text("p%40ss+w%2Frd%3A" + s[-8:])
    remember("ab")  # too short to mask by value: it would mask every 'ab' in every log
    assert mask_text("tab") == "tab"


def test_read_secret_remembers_what_it_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from_file, from_env = secrets.token_urlsafe(12), secrets.token_urlsafe(12)
    f = tmp_path / "token"
    f.write_text(from_file + "\n")
    monkeypatch.setenv("DART_TEST_MASK_TOKEN", from_env)
    assert read_secret(None, f) == from_file
    assert read_secret("DART_TEST_MASK_TOKEN", None) == from_env
    assert mask_text(f"{from_file} {from_env}") == f"{MASK} {MASK}"


def test_log_records_are_masked_message_args_and_traceback(log_text: io.StringIO) -> None:
    secret = secrets.token_urlsafe(16)
    remember(secret)
    log = logging.getLogger("dart_ray.test_masking")
    log.info("dsn %s token %r", f"mysql://u:{secret}@h/d", secret)
    log.warning("header Authorization: Bearer %s", "not-remembered-but-a-bearer")
    try:
        raise RuntimeError(f"cannot connect with {secret}")
    except RuntimeError:
        log.exception("connection failed")
    text = log_text.getvalue()
    assert secret not in text and "not-remembered-but-a-bearer" not in text
    assert f"mysql://u:{MASK}@h/d" in text and f"Bearer {MASK}" in text
    assert "RuntimeError: cannot connect with ***" in text  # the traceback is still there


def test_masking_leaves_other_records_alone(log_text: io.StringIO) -> None:
    log = logging.getLogger("dart_ray.test_masking")
    log.info("%d rows for %s", 3, "run-a")
    assert "INFO dart_ray.test_masking 3 rows for run-a" in log_text.getvalue()
    # a malformed call: logging reports it when it emits; making the record must not raise
    record = logging.getLogRecordFactory()("x", logging.INFO, "f.py", 1, "bad %d", ("x",), None)
    assert (record.msg, record.args) == ("bad %d", ("x",))
