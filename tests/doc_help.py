"""Every documented script's `--help` in one Python (tests/test_docs.py): 38 documented
commands name 20 scripts, and each script's start imports Ray and torch (10-15 s on 2 busy
cores), so one process per script cost CI's parallel tier minutes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

_HELP_ALL = """
import contextlib, io, json, os, runpy, sys
out = {}
for target in json.loads(sys.argv[1]):
    o, e, rc = io.StringIO(), io.StringIO(), 0
    sys.argv = [target[-1], "--help"]
    try:
        with contextlib.redirect_stdout(o), contextlib.redirect_stderr(e):
            if target[0] == "-m":
                runpy.run_module(target[1], run_name="__main__", alter_sys=True)
            else:  # as `python SCRIPT` runs it: the script's folder first on the path
                sys.path.insert(0, os.path.dirname(os.path.abspath(target[0])))
                try:
                    runpy.run_path(target[0], run_name="__main__")
                finally:
                    sys.path.pop(0)
    except SystemExit as x:
        rc = x.code if isinstance(x.code, int) else (0 if x.code is None else 1)
    except BaseException as x:  # a script that breaks on import: its test reports it
        rc, e = 1, io.StringIO(e.getvalue() + repr(x))
    out[" ".join(target)] = [rc, o.getvalue(), e.getvalue()]
print("\\n" + json.dumps(out))
"""


def script_helps(targets: list[tuple[str, ...]], cwd: Path) -> dict[str, tuple[int, str, str]]:
    """`--help` of each target (`("-m", "pkg.mod")` or `("path/script.py",)`), keyed by the
    target joined with spaces: (exit code, stdout, stderr), each run as `python TARGET --help`
    would run it, all in one Python."""
    p = subprocess.run(
        [sys.executable, "-c", _HELP_ALL, json.dumps(targets)],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(cwd)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    found = json.loads(p.stdout.rstrip().splitlines()[-1])
    return {k: (v[0], v[1], v[2]) for k, v in found.items()}
