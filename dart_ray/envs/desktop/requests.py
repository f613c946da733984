"""The desktop server's requests and replies, apart from any operation: a body parsed from
JSON or a form (OSWorld's client sends both), a field required of it, a JSON reply, and the
error a malformed request raises (`BadRequest`, answered with 400 and its message)."""

from __future__ import annotations

import json
import urllib.parse
from email.parser import BytesParser
from email.policy import HTTP
from typing import Any

Reply = tuple[int, bytes, str]  # status, body, content type


class BadRequest(ValueError):
    """The request is malformed; answered with 400 and this message."""


def json_reply(obj: Any, status: int = 200) -> Reply:
    return status, json.dumps(obj).encode(), "application/json"


def parse_body(content_type: str, raw: bytes) -> dict[str, Any]:
    """The request's fields, whatever way the client sent them.

    OSWorld's own client mixes encodings: most calls post JSON, but `get_file` posts
    `file_path` and `get_vm_window_size` posts `app_class_name` as an urlencoded form, and
    `/setup/upload` is multipart. So the body is read by its Content-Type: a form field is a
    string, a multipart file part is bytes; a body with no (or another) type is read as JSON."""
    if not raw:
        return {}
    kind = content_type.split(";", 1)[0].strip().lower()
    if kind == "application/x-www-form-urlencoded":
        try:
            pairs = urllib.parse.parse_qsl(
                raw.decode(), keep_blank_values=True, strict_parsing=True
            )
        except (UnicodeDecodeError, ValueError) as e:
            raise BadRequest(f"the form body is not valid urlencoded text: {e}") from None
        return dict(pairs)
    if kind == "multipart/form-data":
        msg = BytesParser(policy=HTTP).parsebytes(
            f"Content-Type: {content_type}\r\n\r\n".encode() + raw
        )
        if not msg.is_multipart():
            raise BadRequest("the multipart body has no parts (is the boundary right?)")
        out: dict[str, Any] = {}
        for part in msg.iter_parts():
            name = part.get_param("name", header="content-disposition")
            if not name:
                continue
            data = part.get_payload(decode=True) or b""
            if part.get_filename() is not None:
                out[str(name)] = data
            else:
                out[str(name)] = data.decode(part.get_content_charset() or "utf-8", "replace")
        return out
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadRequest(f"the body is not JSON ({e}); send JSON or a form") from None
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    return body


def required(b: dict[str, Any], name: str, kind: type = str) -> Any:
    """Field `name` of the body, present and of type `kind`, or a 400 naming it."""
    if name not in b:
        raise BadRequest(f"'{name}' is required")
    v = b[name]
    if not isinstance(v, kind) or (kind is str and not v):
        raise BadRequest(f"'{name}' must be a non-empty {kind.__name__}")
    return v
