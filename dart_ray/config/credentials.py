"""Secrets around the configuration: `read_secret` reads one from the file or environment
variable a field names (and remembers it for masking), `redact` masks whatever still looks like
a secret in a config tree before it is printed, logged or stored."""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path
from typing import Any

from dart_ray.config.base import ConfigError
from dart_ray.config.masking import MASK, mask_text, remember

SECRET_KEY = re.compile(r"(password|passwd|secret|token|api_key|apikey)", re.I)
_SECRET_REFERENCE = re.compile(r"_(env|file)$")


def redact(obj: Any, key: str = "") -> Any:
    """Mask values under secret-looking keys, passwords inside URLs and every secret this
    process has read (`dart_ray.config.masking`), recursively.

    Keys ending in `_env`/`_file` name where a secret lives, not the secret, and stay.
    """
    if isinstance(obj, dict):
        return {k: redact(v, str(k)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [redact(v, key) for v in obj]
    if isinstance(obj, str):
        if SECRET_KEY.search(key) and not _SECRET_REFERENCE.search(key) and obj:
            return MASK
        return mask_text(obj)
    return obj


def read_secret(env: str | None, file: Path | None, *, required: str | None = None) -> str | None:
    """A secret from a file (first line) or an environment variable; None if neither is set.

    `required` names the config key that asked for it (`env.desktop.token_env`): a variable it
    names that is unset or empty in this process's environment, or an empty file, is then a
    ConfigError naming the key and the variable, never a silent None (requests would go out
    without the token and be refused, far from the cause). The secret is remembered for
    masking (`dart_ray.config.masking`): this process never logs it."""
    secret = None
    if file is not None:
        try:
            lines = file.read_text().splitlines()
        except OSError as e:
            raise ConfigError(f"cannot read secret file {file}: {e.strerror}") from None
        secret = lines[0].strip() if lines else ""
        if required and not secret:
            raise ConfigError(f"{required}: the secret file {file} is empty")
    elif env:
        secret = os.environ.get(env)
        if required and not secret:
            raise ConfigError(
                f"{required} names ${env}, which is not set (or empty) in the environment of "
                f"this process on {socket.gethostname()}: on a cluster, every node that runs "
                "the part needs it (a runtime_env env_vars entry, a mounted secret)"
            )
    remember(secret)
    return secret
