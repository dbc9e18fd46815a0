"""cluster/: the launcher YAML, KubeRay manifests and image recipe parse and carry what they need."""
from __future__ import annotations

import importlib
import re
import shlex
from pathlib import Path

import yaml

CLUSTER = Path(__file__).resolve().parents[2] / "cluster"


def _load(name: str) -> dict:
    return yaml.safe_load((CLUSTER / name).read_text(encoding="utf-8"))


def test_jobs_cluster_launcher_yaml():
    c = _load("ray-cluster.yaml")
    for key in ("cluster_name", "max_workers", "provider", "available_node_types", "head_node_type",
                "head_start_ray_commands", "worker_start_ray_commands", "docker"):
        assert key in c, key
    assert c["head_node_type"] in c["available_node_types"]
    assert c["provider"]["type"] and c["docker"]["image"]
    for node in c["available_node_types"].values():
        assert "node_config" in node and "resources" in node
    workers = [n for k, n in c["available_node_types"].items() if k != c["head_node_type"]]
    assert sum(n["max_workers"] for n in workers) <= c["max_workers"]
    assert any("--head" in cmd and "8265" in cmd for cmd in c["head_start_ray_commands"])


def _pod_specs(cluster_spec: dict) -> list[dict]:
    groups = [cluster_spec["headGroupSpec"]] + list(cluster_spec["workerGroupSpecs"])
    return [g["template"]["spec"] for g in groups]


def _check_pods(cluster_spec: dict) -> set[str]:
    images = set()
    assert cluster_spec["rayVersion"].startswith("2.60")
    for spec in _pod_specs(cluster_spec):
        volumes = {v["name"] for v in spec.get("volumes", [])}
        for c in spec["containers"]:
            images.add(c["image"])
            assert c["resources"]["limits"]["memory"] and c["resources"]["requests"]["cpu"]
            assert {m["name"] for m in c.get("volumeMounts", [])} <= volumes
            assert any(m["mountPath"] == "/mnt/memlib" for m in c["volumeMounts"])
    for g in cluster_spec["workerGroupSpecs"]:
        assert g["minReplicas"] <= g["replicas"] <= g["maxReplicas"] and g["groupName"]
    return images


def test_jobs_cluster_rayjob_nightly():
    from jobs.nightly import parser

    j = _load("rayjob-nightly.yaml")
    assert j["apiVersion"] == "ray.io/v1" and j["kind"] == "RayJob" and j["metadata"]["name"]
    argv = shlex.split(j["spec"]["entrypoint"])
    assert argv[:3] == ["python", "-m", "jobs.nightly"]
    args = parser().parse_args(argv[3:])  # the entrypoint's options are the job's real options
    assert args.out.startswith("/mnt/memlib") and args.input.startswith("/mnt/memlib")
    job_env = yaml.safe_load(j["spec"]["runtimeEnvYAML"])
    assert job_env["working_dir"] == "/opt/memlib"
    from pipelines.operators import WORKER_ENV

    assert WORKER_ENV.items() <= job_env["env_vars"].items()  # the operators then ask for no runtime_env
    assert j["spec"]["shutdownAfterJobFinishes"] is True
    assert len(_check_pods(j["spec"]["rayClusterSpec"])) == 1


def test_jobs_cluster_rayservice_retrieval():
    s = _load("rayservice-retrieval.yaml")
    assert s["apiVersion"] == "ray.io/v1" and s["kind"] == "RayService"
    serve = yaml.safe_load(s["spec"]["serveConfigV2"])
    app = serve["applications"][0]
    module, attr = app["import_path"].split(":")
    assert callable(getattr(importlib.import_module(module), attr))
    assert {"store", "config"} <= set(app["args"]) and serve["http_options"]["port"] == 8000
    assert len(_check_pods(s["spec"]["rayClusterConfig"])) == 1


def test_jobs_cluster_image_installs_graph_tool_like_bootstrap():
    docker = (CLUSTER / "Dockerfile").read_text(encoding="utf-8")
    boot = (CLUSTER / "bootstrap.sh").read_text(encoding="utf-8")
    boot_pkgs = set(re.search(r"apt-get install -y -qq --no-install-recommends ([^>]+)>", boot).group(1).split())
    docker_pkgs = set(re.search(r"--no-install-recommends \\\s*\n\s*(.+?)\\", docker, re.S).group(1).split())
    assert boot_pkgs <= docker_pkgs, boot_pkgs - docker_pkgs
    assert "bash cluster/bootstrap.sh" in docker and docker.startswith("#") and "FROM debian:12" in docker
    images = {_load("ray-cluster.yaml")["docker"]["image"]}
    images |= _check_pods(_load("rayjob-nightly.yaml")["spec"]["rayClusterSpec"])
    assert len(images) == 1
