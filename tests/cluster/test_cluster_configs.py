"""cluster/: the Ray cluster YAMLs pass Ray's own validation, the KubeRay manifests have the
structure the operator reads, and every node type offers the resources that the actors of
the GPU recipe request, read from the code (session options, trainer and replica options),
not copied into the test."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import ray
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

from actors.env_session import session_options
from dart_ray.cli import build_parser
from dart_ray.config import Config, load_config
from dart_ray.run.runtime import _worker_resources
from serve_apps.policy import build_app

REPO = Path(__file__).resolve().parents[2]
CLUSTER = REPO / "cluster"
RECIPE = REPO / "configs" / "osworld-uitars-7b.toml"
IMAGE_HOME = "/home/ray/dart-ray"  # where cluster/Dockerfile puts the repository


def _yaml(name: str) -> Any:
    return yaml.safe_load((CLUSTER / name).read_text())


@pytest.fixture(scope="module")
def recipe() -> Config:
    return load_config(RECIPE)


@pytest.fixture(scope="module")
def replica_options(recipe: Config) -> dict[str, float]:
    """What one policy replica asks Ray for, from the deployment `build_app` builds (the
    recipe's policy on the shipped tiny model folder, since the 7B is not here)."""
    policy = recipe.policy.model_copy(update={"model_path": REPO / "fixtures" / "tiny-sft"})
    app = build_app(policy, REPO / "fixtures" / "tiny-sft")
    return dict(app._bound_deployment.ray_actor_options)


@pytest.mark.parametrize("name", ["aws.yaml", "local.yaml"])
def test_cluster_yamls_pass_rays_validation(name: str) -> None:
    prepared = prepare_config(_yaml(name))
    validate_config(prepared)  # ray-schema.json plus Ray's own cross-field checks
    assert prepared["head_node_type"] in prepared["available_node_types"]


def test_fake_multinode_yaml_is_aws_shrunk_to_one_machine() -> None:
    """cluster/fake-multinode.yaml (tests/cluster/test_autoscaling.py runs it): valid for
    Ray (validated as given: Ray's wheel lacks the fake provider's defaults file that
    `prepare_config` merges in, and the monitor does not merge them), the head type named
    as the fake provider tags its head, and aws.yaml's env type, starting from none."""
    from ray.autoscaler._private.fake_multi_node.node_provider import FAKE_HEAD_NODE_TYPE

    cfg = _yaml("fake-multinode.yaml")
    validate_config(cfg)
    provider = cfg["provider"]
    assert provider["type"] == "fake_multinode"
    # nodes told apart by id (all share one address), none updated over SSH: as Ray's own
    # fake_multi_node/example.yaml, which the wheel does not ship
    assert provider["use_node_id_as_ip"] and provider["disable_node_updaters"]
    assert cfg["head_node_type"] == FAKE_HEAD_NODE_TYPE
    types, aws = _types(cfg), _types(_yaml("aws.yaml"))
    assert set(types) - {FAKE_HEAD_NODE_TYPE} <= set(aws)  # the same names where they exist
    tiny = load_config(REPO / "configs" / "tiny-cpu.toml")
    opts = session_options(tiny.env)
    [env_name] = opts["resources"]
    assert [t for t, r in types.items() if env_name in r] == ["env"]
    env = cfg["available_node_types"]["env"]
    assert env["min_workers"] == 0 < env["max_workers"] <= cfg["max_workers"]  # 0 up at first
    assert types["env"]["CPU"] >= types["env"][env_name] * opts["num_cpus"]
    assert 0 < cfg["idle_timeout_minutes"] <= 0.5  # the test waits for the scale-down
    # every key the autoscaler reads (a KeyError in the monitor otherwise)
    assert {"docker", "file_mounts", "setup_commands", "worker_start_ray_commands"} <= set(cfg)


def _types(cfg: dict[str, Any]) -> dict[str, dict[str, float]]:
    return {k: v.get("resources", {}) for k, v in cfg["available_node_types"].items()}


def test_aws_node_types_offer_what_the_actors_request(
    recipe: Config, replica_options: dict[str, float]
) -> None:
    cfg = _yaml("aws.yaml")
    types = _types(cfg)
    [env_name] = session_options(recipe.env)["resources"]  # what an EnvSession requests
    env_types = [t for t, r in types.items() if env_name in r]
    assert env_types == ["env"], "only the env type carries the env resource"
    env = types["env"]
    assert env["CPU"] >= env[env_name] * session_options(recipe.env)["num_cpus"]
    spec = cfg["available_node_types"]["env"]
    assert recipe.env.max_sessions <= env[env_name] * spec["max_workers"]  # the pool can grow
    assert recipe.env.num_sessions <= env[env_name] * spec["min_workers"]  # and starts at once

    gpu = types["gpu"]
    trainer = _worker_resources(recipe)  # what each Ray Train worker reserves
    # the first GPU node holds every train worker and the minimum of policy replicas
    need_gpu = recipe.train.num_workers * trainer["GPU"]
    need_gpu += recipe.policy.min_replicas * replica_options["num_gpus"]
    need_cpu = recipe.train.num_workers * trainer["CPU"]
    need_cpu += recipe.policy.min_replicas * replica_options["num_cpus"]
    assert gpu["GPU"] >= need_gpu and gpu["CPU"] >= need_cpu
    gpu_max = cfg["available_node_types"]["gpu"]["max_workers"] * gpu["GPU"]
    assert gpu_max >= need_gpu + (recipe.policy.max_replicas - recipe.policy.min_replicas)
    head = types[cfg["head_node_type"]]
    assert "GPU" not in head and env_name not in head


def test_local_workers_pick_their_role_from_the_machine(tmp_path: Path, recipe: Config) -> None:
    cfg = _yaml("local.yaml")
    script = CLUSTER / "node-resources.sh"
    start = " ".join(cfg["worker_start_ray_commands"])
    assert "bash ~/dart-ray-cluster/node-resources.sh" in start
    assert cfg["file_mounts"]["~/dart-ray-cluster"] == "cluster"
    env_name = next(iter(session_options(recipe.env)["resources"]))

    # a PATH with only the tools the script uses, so the machine running the test (which
    # may have a GPU) does not decide the answer
    tools = tmp_path / "tools"
    tools.mkdir()
    for tool in ("nproc", "grep"):
        found = shutil.which(tool)
        assert found is not None
        (tools / tool).symlink_to(found)

    def run(*extra: Path) -> dict[str, int]:
        path = ":".join(str(p) for p in (*extra, tools))
        env = {"PATH": path, "DART_RAY_CPUS_PER_ENV": "1"}
        out = subprocess.run(
            ["/bin/bash", str(script)], env=env, capture_output=True, text=True, check=True
        )
        return json.loads(out.stdout)

    cpu = run()
    assert cpu == {env_name: len(os.sched_getaffinity(0))}  # a unit per core (CPUS_PER_ENV=1)
    fake = tmp_path / "gpu"
    fake.mkdir()
    (fake / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 (UUID: GPU-0)'\n")
    (fake / "nvidia-smi").chmod(0o755)
    assert run(fake) == {}  # a GPU machine offers no env units


def _rayclusters() -> dict[str, Any]:
    return _yaml("kuberay/raycluster.yaml")


def _start_resources(group: dict[str, Any]) -> dict[str, float]:
    """Custom resources in KubeRay's rayStartParams form: '"{\\"env\\": 16}"'."""
    raw = group["rayStartParams"].get("resources")
    return json.loads(json.loads(raw)) if raw else {}


def _containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return spec["template"]["spec"]["containers"]


def test_kuberay_raycluster_structure_and_resources(
    recipe: Config, replica_options: dict[str, float]
) -> None:
    rc = _rayclusters()
    assert (rc["apiVersion"], rc["kind"]) == ("ray.io/v1", "RayCluster")
    spec = rc["spec"]
    assert spec["rayVersion"] == ray.__version__ and spec["enableInTreeAutoscaling"] is True
    groups = {g["groupName"]: g for g in spec["workerGroupSpecs"]}
    assert set(groups) == {"gpu", "env"}
    for g in groups.values():
        assert g["minReplicas"] <= g["replicas"] <= g["maxReplicas"]
    [env_name] = session_options(recipe.env)["resources"]
    env_units = _start_resources(groups["env"])[env_name]
    assert float(groups["env"]["rayStartParams"]["num-cpus"]) >= env_units * recipe.env.num_cpus
    assert recipe.env.max_sessions <= env_units * groups["env"]["maxReplicas"]
    assert env_name not in _start_resources(groups["gpu"])
    assert "resources" not in spec["headGroupSpec"]["rayStartParams"]

    gpus = int(groups["gpu"]["rayStartParams"]["num-gpus"])
    limits = _containers(groups["gpu"])[0]["resources"]["limits"]
    assert int(limits["nvidia.com/gpu"]) == gpus
    trainer = _worker_resources(recipe)
    need = recipe.train.num_workers * trainer["GPU"]
    need += recipe.policy.min_replicas * replica_options["num_gpus"]
    assert gpus >= need
    for part in (spec["headGroupSpec"], *groups.values()):
        for c in _containers(part):
            names = {e["name"]: e for e in c.get("env", [])}
            # every secret the recipe reads (the DSN, the desktops' token: issue 45, point 7)
            # comes from a Secret on every node, never a literal value
            for var in _secret_variables(recipe):
                assert "secretKeyRef" in names[var]["valueFrom"], (part.get("groupName"), var)
            assert c["image"] == _containers(spec["headGroupSpec"])[0]["image"]
        assert part["template"]["spec"]["securityContext"]["runAsNonRoot"] is True


def _secret_variables(config: Config) -> set[str]:
    """The environment variables a config reads secrets from."""
    names = {config.store.dsn_env, config.env.desktop.token_env, config.policy.auth_token_env}
    return {n for n in names if n}


def test_the_recipe_names_its_secrets_and_the_job_waits_for_a_clean_stop(recipe: Config) -> None:
    assert _secret_variables(recipe) == {"DART_RAY_DB_DSN", "DART_RAY_ENV_TOKEN"}
    for path in ("kuberay/rayjob.yaml", "jobs/runtime-env.yaml"):
        spec = _yaml(path)
        env = yaml.safe_load(spec["spec"]["runtimeEnvYAML"]) if "spec" in spec else spec
        # Ray SIGKILLs a stopped job's driver 3 s after SIGTERM unless told otherwise
        assert int(env["env_vars"]["RAY_JOB_STOP_WAIT_TIME_S"]) >= 120, path


def test_kuberay_rayjob_runs_the_recipe_on_that_cluster() -> None:
    job = _yaml("kuberay/rayjob.yaml")
    assert (job["apiVersion"], job["kind"]) == ("ray.io/v1", "RayJob")
    spec = job["spec"]
    assert spec["clusterSelector"]["ray.io/cluster"] == _rayclusters()["metadata"]["name"]
    ray.runtime_env.RuntimeEnv(**yaml.safe_load(spec["runtimeEnvYAML"]))
    argv = shlex.split(spec["entrypoint"])
    assert argv[:2] == ["dart-ray", "train"]
    args = build_parser().parse_args(argv[1:])
    # the path is inside the image; here the same file is in the repository
    config = load_config(REPO / Path(args.config).relative_to(IMAGE_HOME), args.overrides)
    assert config.cluster.address == "auto" and config.policy.engine == "vllm"


def test_job_submission_runtime_env() -> None:
    spec = _yaml("jobs/runtime-env.yaml")
    env = ray.runtime_env.RuntimeEnv(**spec)
    assert {".venv", ".git", "runs"} <= set(env["excludes"])
    secretish = [k for k in spec.get("env_vars", {}) if "PASSWORD" in k or "DSN" in k]
    assert secretish == []  # runtime_env is shown on the dashboard


def test_images_are_the_same_everywhere() -> None:
    aws, local = _yaml("aws.yaml"), _yaml("local.yaml")
    images = {
        aws["docker"]["image"],
        local["docker"]["image"],
        _containers(_rayclusters()["spec"]["headGroupSpec"])[0]["image"],
        _yaml("kuberay/rayjob.yaml")["spec"]["submitterPodTemplate"]["spec"]["containers"][0][
            "image"
        ],
    }
    assert len(images) == 1
