"""Serve tests: the bearer token must be in the environment before Ray starts its workers."""

from __future__ import annotations

import os
import secrets

TOKEN_ENV = "DART_RAY_TEST_POLICY_TOKEN"
os.environ.setdefault(TOKEN_ENV, secrets.token_hex(16))
