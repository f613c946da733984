"""Every command in the docs is run by a test.

Each line of a ```bash block in README.md and docs/*.md must match exactly one entry of
`HOW`, which says how it is tested:

- `run`: run here as written, in a scratch folder laid out like the repository (configs,
  fixtures, the venv's `bin` as `.venv/bin`, a populated SQLite log), and it must succeed;
- `flags`: a script or module that would run for minutes or needs a service: its own
  `--help` must list every flag the docs pass;
- `check`: something that needs a cluster, a GPU, Docker or kubectl: a function checks what
  it acts on (the YAML, the manifest, the entrypoint) and names the test that covers the
  rest, which must exist.

A new command in the docs without an entry fails `test_every_doc_command_has_a_test`.
The ```sql and ```python blocks: tests/test_doc_blocks.py.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from dart_ray.cli import build_parser
from dart_ray.config import load_config
from dart_ray.store.db import create_engine
from tests.doc_common import BIN, REPO, RUN_ID, doc_commands, populate
from tests.doc_help import script_helps

# --------------------------------------------------------------------------- checks


def _tested(ref: str) -> None:
    """`tests/x.py::test_y` names a test that exists."""
    file, _, name = ref.partition("::")
    assert re.search(rf"^def {name}\(", (REPO / file).read_text(), re.M), f"{ref} is gone"


def _validate_cluster_yaml(cmd: str) -> None:
    from ray.autoscaler._private.util import prepare_config, validate_config

    path = REPO / shlex.split(cmd)[-1]
    validate_config(prepare_config(yaml.safe_load(path.read_text())))
    _tested("tests/cluster/test_cluster_configs.py::test_cluster_yamls_pass_rays_validation")


def _entrypoint(cmd: str) -> None:
    """A `ray job submit ... -- dart-ray ...`: the runtime_env file is valid, and the
    entrypoint parses with our CLI and its config loads."""
    import ray

    argv = shlex.split(cmd)
    if "--runtime-env" in argv:
        spec = yaml.safe_load((REPO / argv[argv.index("--runtime-env") + 1]).read_text())
        ray.runtime_env.RuntimeEnv(**spec)
    entry = argv[argv.index("--") + 1 :]
    assert entry[0] == "dart-ray"
    args = build_parser().parse_args(entry[1:])
    load_config(REPO / args.config if args.config else None, args.overrides)
    _tested("tests/test_job_submit.py::test_job_submit_to_a_two_node_cluster")
    if argv[0] == "RAY_AUTH_MODE=token":  # submitted as written to a head with token auth
        _tested(
            "tests/cluster/test_operator_mistakes.py::"
            "test_ray_job_stop_stops_the_run_cleanly_and_leaves_other_apps_alone"
        )


MANIFEST_TESTS = {
    "RayCluster": "tests/cluster/test_cluster_configs.py::"
    "test_kuberay_raycluster_structure_and_resources",
    "RayJob": "tests/cluster/test_cluster_configs.py::test_kuberay_rayjob_runs_the_recipe_on_that_cluster",
}


def _manifest(cmd: str) -> None:
    doc = yaml.safe_load((REPO / shlex.split(cmd)[-1]).read_text())
    assert doc["apiVersion"] == "ray.io/v1"
    _tested(MANIFEST_TESTS[doc["kind"]])


def _kuberay_cluster() -> dict:  # type: ignore[type-arg]
    return yaml.safe_load((REPO / "cluster/kuberay/raycluster.yaml").read_text())


def _secret(cmd: str) -> None:
    """The Secret the docs create is the one the manifest's containers read."""
    argv = shlex.split(cmd)
    name = argv[argv.index("generic") + 1]
    keys = {a.split("=")[1] for a in argv if a.startswith("--from-file=")}
    head = _kuberay_cluster()["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    refs = [e["valueFrom"]["secretKeyRef"] for e in head["env"] if "valueFrom" in e]
    assert {(r["name"], r["key"]) for r in refs} == {(name, k) for k in keys}  # all, and only


def _port_forward(cmd: str) -> None:
    """KubeRay names the head service `<cluster>-head-svc`; the head exposes the port."""
    argv = shlex.split(cmd)
    rc = _kuberay_cluster()
    assert argv[2] == f"svc/{rc['metadata']['name']}-head-svc"
    remote = int(argv[3].split(":")[1])
    head = rc["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert remote in {p["containerPort"] for p in head["ports"]}


def _dockerfile(cmd: str) -> None:
    argv = shlex.split(cmd)
    assert (REPO / argv[argv.index("-f") + 1]).is_file()
    _tested("tests/cluster/test_dockerfile.py::test_hadolint_finds_nothing")


def _ci_runs_it(cmd: str) -> None:
    """CI's entry point is this very command."""
    assert cmd in (REPO / ".ci" / "run").read_text()


def _covered(ref: str) -> Callable[[str], None]:
    return lambda cmd: _tested(ref)


def _train_parses(cmd: str) -> None:
    """A `dart-ray train` of the embedded default with overrides: the parser accepts it and
    the config with its overrides validates (the runs themselves take minutes)."""
    args = build_parser().parse_args(shlex.split(cmd)[1:])
    load_config(
        REPO / args.config if args.config else REPO / "configs" / "default.toml", args.overrides
    )


def _serve_parses(cmd: str) -> None:
    """`dart-ray serve` blocks until it is stopped: the parser accepts the line and the
    config loads; tests/test_serve_command.py runs it."""
    args = build_parser().parse_args(shlex.split(cmd)[1:])
    load_config(REPO / "configs" / "default.toml", args.overrides)
    _tested(
        "tests/test_serve_command.py::test_serve_answers_the_documented_route_and_stops_on_sigterm"
    )


def _eval_parses(cmd: str) -> None:
    """`dart-ray eval` of a run's checkpoint (which a fresh machine has not): the parser
    accepts it; tests/evaluation/test_eval_command.py runs eval on the tiny model."""
    build_parser().parse_args(shlex.split(cmd.replace("<", "").replace(">", ""))[1:])
    _tested(
        "tests/evaluation/test_eval_command.py::test_eval_lists_a_task_its_env_refused_apart_from_the_rate"
    )


def _eval_on_ray_parses(cmd: str) -> None:
    """`dart-ray eval --ray` on OSWorld's tasks: the parser accepts it and the config loads;
    tests/engines/test_script.py plays scripts through it in EnvSession actors."""
    args = build_parser().parse_args(shlex.split(cmd)[1:])
    load_config(REPO / args.config, args.overrides)
    _tested("tests/engines/test_script.py::test_eval_on_ray_plays_in_env_session_actors")


def _osworld_train_parses(cmd: str) -> None:
    """`dart-ray train` on OSWorld's tasks needs a checkout and the profile (20 minutes; what
    it measured is in docs/ENVIRONMENTS.md): the parser accepts it, the config loads, and
    tests/test_driver.py trains through the same seeding on MiniDesk."""
    args = build_parser().parse_args(shlex.split(cmd)[1:])
    load_config(REPO / args.config, args.overrides)
    _tested(
        "tests/test_driver.py::"
        "test_written_solutions_seed_replay_so_a_policy_that_never_succeeds_trains"
    )


@dataclass(frozen=True)
class How:
    kind: str  # "run" | "flags" | "check"
    check: Callable[[str], None] | None = None


def _cli_parses(cmd: str) -> None:
    """A dart-ray command that runs for minutes: the CLI's own parser must accept it as written,
    and the config it names must load."""
    args = build_parser().parse_args(shlex.split(cmd)[1:])
    load_config(REPO / args.config)


def _pinned_tasks(cmd: str) -> None:
    """Fetching OSWorld's task files (GitHub is not reachable here): the docs name the source
    and commit the code pins."""
    from dart_ray.envs.osworld.tasks import TASKS_COMMIT, TASKS_REPOSITORY

    assert TASKS_REPOSITORY in cmd or TASKS_COMMIT in cmd, cmd


HOW: dict[str, How] = {
    # run as written
    r"dart-ray config show( --docs)?( --config configs/[\w.-]+\.toml)?": How("run"),
    r"(\.venv/bin/)?dart-ray status( --tasks)?": How("run"),
    r"(\.venv/bin/)?dart-ray report my-run( --out \S+)?": How("run"),
    r"dart-ray config show '[^']*' \| grep \w+": How("run"),
    r"dart-ray model init --out models/tiny\d?( --seed \d+)?( --min-pixels \d+)?( --max-pixels \d+)?"
    r"( --layers \d+)?": How("run"),
    r"pytest -m gpu tests/test_gpu_recipe\.py": How("run"),
    # serves until Ctrl-C: its own test runs it, over HTTP, and stops it with SIGTERM
    r"dart-ray serve( --model \S+)?( --port \d+)?": How("check", _serve_parses),
    # long runs and services: the flags exist
    r"\.venv/bin/python (benchmarks|scripts)/\w+\.py.*": How("flags"),
    r"(\.venv/bin/)?python -m dart_ray\.envs\.(minidesk\.generate|desktop\.server|osworld\.tasks|osworld\.coverage|osworld\.cache|osworld\.solutions|miniwob\.tasks|osworld\.chrome_history) .*": How(
        "flags"
    ),
    # need what this machine has not: checked against what they act on
    r"make run": How(
        "check", _covered("tests/test_readme_run.py::test_make_run_from_a_clean_clone")
    ),
    r"make test": How("check", _ci_runs_it),
    r"dart-ray eval --checkpoint runs/\S+( --suite \w+)?": How("check", _eval_parses),
    r"dart-ray (sft|eval|train) -c configs/(learning|multi-step|miniwob)\.toml( .*)?": How(
        "check", _cli_parses
    ),
    r"make test-fault-schedule": How(
        "check",
        _covered(
            "tests/test_fault_schedule.py::"
            "test_a_seeded_schedule_of_fifty_faults_loses_and_repeats_nothing"
        ),
    ),
    r"make test-bench": How(
        "check",
        _covered(
            "tests/test_timing_mode.py::test_the_timing_mode_benchmark_runs_every_mode_correctly"
        ),
    ),
    r"make gpu-check|scripts/gpu-check\.sh( --dry-run)?( \S+)?": How(
        "check", _covered("tests/test_gpu_check.py::test_the_dry_run_passes_every_step")
    ),
    # installs Debian packages, an account and a sudoers file as root: what it installs is
    # used (and so checked) by the osworld_apps tier
    r"(sudo )?bash scripts/install-osworld-desktop\.sh": How(
        "check",
        _covered(
            "tests/envs/osworld/test_apps.py::test_the_desktop_runs_as_user_with_home_at_home_user"
        ),
    ),
    r"make (test-osworld-apps|osworld-desktop)": How(
        "check",
        _covered(
            "tests/envs/osworld/test_apps.py::test_osworlds_evaluator_scores_0_before_and_1_after_the_solution"
        ),
    ),
    r"git clone \S+/OSWorld \.\./OSWorld|git -C \.\./OSWorld checkout [0-9a-f]{40}": How(
        "check", _pinned_tasks
    ),
    # needs an OSWorld checkout and the profile: the eval's path runs on MiniDesk in its test,
    # the solutions' files in theirs; docs/ENVIRONMENTS.md has what it measured here
    r"dart-ray eval --ray -c configs/osworld-local\.toml .*": How("check", _eval_on_ray_parses),
    r"dart-ray train -c configs/osworld-local\.toml": How("check", _osworld_train_parses),
    r"dart-ray audit <run id>": How(
        "check",
        _covered(
            "tests/test_driver.py::"
            "test_written_solutions_seed_replay_so_a_policy_that_never_succeeds_trains"
        ),
    ),
    r"make osworld-eval( OSWORLD=\S+)?( SCRIPTS=\S+)?": How(
        "check",
        _covered(
            "tests/envs/osworld/test_solutions.py::"
            "test_the_files_written_are_what_the_script_engine_and_eval_read"
        ),
    ),
    r"(sudo )?make osworld-desktop osworld-venv": How(
        "check",
        _covered(
            "tests/envs/osworld/test_apps.py::test_the_desktop_runs_as_user_with_home_at_home_user"
        ),
    ),
    r"make osworld-venv": How(
        "check", _covered("tests/envs/osworld/test_official.py::test_osworld_semantics")
    ),
    r"make test-osworld": How(
        "check",
        _covered(
            "tests/envs/osworld/test_official_desktop.py::test_ours_and_osworlds_agree_on_the_suite"
        ),
    ),
    r"make test-learning": How(
        "check", _covered("tests/test_learning.py::test_the_default_run_lifts_held_out_success")
    ),
    r"dart-ray audit my-run( --live)?( --json)?": How(
        "check",
        _covered(
            "tests/test_faults.py::"
            "test_killing_each_part_in_turn_loses_nothing_and_resume_continues"
        ),
    ),
    r"(RAY_AUTH_MODE=token )?ray job submit .* -- dart-ray train .*": How("check", _entrypoint),
    r"dart-ray train( --resume \w+)?( [\w.]+=\S+)+": How("check", _train_parses),
    r"ray (up|down|dashboard) cluster/\w+\.yaml": How("check", _validate_cluster_yaml),
    r"docker build -f cluster/Dockerfile .*": How("check", _dockerfile),
    r"kubectl apply -f cluster/kuberay/\w+\.yaml": How("check", _manifest),
    r"kubectl create secret generic .*": How("check", _secret),
    r"kubectl port-forward svc/\S+ \d+:\d+": How("check", _port_forward),
}


def _kind(cmd: str) -> str | None:
    """The kind of the one entry that matches, else None (reported by the test below)."""
    matches = [h for pattern, h in HOW.items() if re.fullmatch(pattern, cmd)]
    return matches[0].kind if len(matches) == 1 else None


def _how(cmd: str) -> How:
    matches = [h for pattern, h in HOW.items() if re.fullmatch(pattern, cmd)]
    assert len(matches) == 1, (
        f"{cmd!r} matches {len(matches)} entries of tests/test_docs.py HOW: add exactly one, "
        "saying how it is tested"
    )
    return matches[0]


def test_configuration_reference_is_current() -> None:
    """docs/CONFIGURATION.md is what `dart-ray config show --markdown` prints today."""
    from dart_ray.config import reference_markdown

    assert (REPO / "docs" / "CONFIGURATION.md").read_text() == reference_markdown(), (
        "regenerate: dart-ray config show --markdown > docs/CONFIGURATION.md"
    )


def test_every_doc_command_has_a_test() -> None:
    cmds = doc_commands()
    assert len(cmds) > 20
    for _, cmd in cmds:
        _how(cmd)


# --------------------------------------------------------------------------- commands


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    """A folder laid out like the repository for the commands, with a populated log where
    the default config puts it (runs/dart-ray.sqlite)."""
    for name in ("configs", "fixtures", "cluster", "tests", "pyproject.toml"):
        (tmp_path / name).symlink_to(REPO / name)
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / "bin").symlink_to(BIN)
    (tmp_path / "runs").mkdir()
    engine = create_engine(f"sqlite:///{tmp_path / 'runs' / 'dart-ray.sqlite'}")
    populate(engine)
    engine.dispose()
    return tmp_path


def _run(cmd: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PATH": f"{BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "PYTHONPATH": str(REPO),
    }
    return subprocess.run(
        ["/bin/bash", "-c", cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )


_COMMANDS = doc_commands()


@pytest.mark.parametrize(
    ("where", "cmd"),
    [c for c in _COMMANDS if _kind(c[1]) == "run"],
)
def test_doc_command_runs(where: str, cmd: str, scratch: Path) -> None:
    p = _run(cmd, scratch)
    assert p.returncode == 0, f"{where}: {cmd}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    if cmd.endswith("dart-ray status"):
        assert f"run {RUN_ID}" in p.stdout and "log: " in p.stdout
    if cmd.endswith("status --tasks"):
        assert "every task (" in p.stdout, p.stdout
    if "example-not-a-secret" in cmd:  # SECURITY.md: the password is masked
        assert "example-not-a-secret" not in p.stdout and "***" in p.stdout


@pytest.mark.parametrize(
    ("where", "cmd"),
    [c for c in _COMMANDS if _kind(c[1]) == "flags"],
)
def test_doc_command_flags_exist(where: str, cmd: str) -> None:
    argv = shlex.split(cmd.replace("[", " ").replace("]", " ").replace("|", " "))
    rc, out, err = _help(_help_target(cmd))
    assert rc == 0, err[-2000:]
    for flag in (a.split("=")[0] for a in argv if a.startswith("--")):
        assert flag in out, f"{where}: {cmd}: {flag} is not an option"


def _help_target(cmd: str) -> tuple[str, ...]:
    argv = shlex.split(cmd.replace("[", " ").replace("]", " ").replace("|", " "))
    return tuple(argv[1:3] if argv[1] == "-m" else argv[1:2])


@functools.cache
def _helps() -> dict[str, tuple[int, str, str]]:
    targets = sorted({_help_target(c) for _, c in _COMMANDS if _kind(c) == "flags"})
    return script_helps(targets, REPO)


def _help(target: tuple[str, ...]) -> tuple[int, str, str]:
    return _helps()[" ".join(target)]


@pytest.mark.parametrize(
    ("where", "cmd"),
    [c for c in _COMMANDS if _kind(c[1]) == "check"],
)
def test_doc_command_is_checked(where: str, cmd: str) -> None:
    check = _how(cmd).check
    assert check is not None
    check(cmd)


def test_the_data_flow_picture_is_current_and_names_real_modules() -> None:
    """docs/CONCEPTS.md opens with docs/img/dataflow.svg, which scripts/draw_dataflow.py
    draws: the checked-in SVG shows exactly the script's texts (titles, labels, modules;
    the shapes may differ by matplotlib version), and every module it names exists."""
    import importlib.util
    import xml.etree.ElementTree as ET

    spec = importlib.util.spec_from_file_location("draw", REPO / "scripts" / "draw_dataflow.py")
    assert spec is not None and spec.loader is not None
    draw = importlib.util.module_from_spec(spec)

    sys.modules["draw"] = draw  # dataclasses look their module up
    spec.loader.exec_module(draw)
    svg = ET.parse(REPO / "docs" / "img" / "dataflow.svg")
    shown = {
        "".join(t.itertext()) for t in svg.iter() if t.tag.endswith("}text") or t.tag == "text"
    }
    # matplotlib writes each line of a text as an element of its own
    assert shown == {line for t in draw.texts() for line in t.split("\n")}, (
        "regenerate: .venv/bin/python scripts/draw_dataflow.py"
    )
    missing = [m for m in draw.modules() if not (REPO / m).exists()]
    assert missing == []
    assert (REPO / "docs" / "CONCEPTS.md").read_text().splitlines()[2].startswith("![The data flow")
