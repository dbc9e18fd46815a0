"""Cluster job submission over the Ray Jobs API (HTTP, the dashboard address of the head).

``submit_build`` uploads the project as the job's working directory (virtualenvs, tests,
stores and caches excluded), sets a runtime env, and runs ``python -m jobs.cli build ...`` on
the cluster. Local paths among the build arguments are made absolute: on a real cluster
they must name storage every node sees (NFS, or an object store URI for the store).
"""
from __future__ import annotations

import os
import shlex
import time
import tomllib
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from ray.job_submission import JobStatus, JobSubmissionClient

REPO = Path(__file__).resolve().parents[1]
PATH_OPTIONS = {"--input", "-i", "--out", "-o", "--config", "--delete"}
EXCLUDES = [".venv", ".venv/**", ".git", "tests", "**/__pycache__", "*.lance", "stores", "cache", "*.parquet",
            "*.gt", "**/*.egg-info"]
TERMINAL = {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED}
DEFAULT_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "HF_HUB_OFFLINE": "1"}


class JobCommand(str, Enum):
    BUILD = "build"
    NIGHTLY = "nightly"


@dataclass
class SubmitOptions:
    address: str = "http://127.0.0.1:8265"
    python: str = "python"
    working_dir: Path = REPO
    with_requirements: bool = False          # add the project's dependencies as a pip runtime env
    env_vars: dict[str, str] = field(default_factory=dict)
    entrypoint_num_cpus: float | None = None
    submission_id: str | None = None


def project_requirements(pyproject: Path = REPO / "pyproject.toml") -> list[str]:
    """The dependency ranges of pyproject.toml (graph-tool is not among them: it comes from the image)."""
    data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    return list(data["project"]["dependencies"])


def absolute_paths(args: list[str], cwd: Path | None = None) -> list[str]:
    """Build arguments with the values of path options made absolute (``--out x`` and ``--out=x``)."""
    cwd = cwd or Path.cwd()
    out, expect_path = [], False
    for arg in args:
        if expect_path:
            out.append(_abs(arg, cwd))
            expect_path = False
            continue
        name, eq, value = arg.partition("=")
        if name in PATH_OPTIONS and eq:
            out.append(f"{name}={_abs(value, cwd)}")
        else:
            out.append(arg)
            expect_path = arg in PATH_OPTIONS
    return out


def _abs(value: str, cwd: Path) -> str:
    return value if "://" in value else str((cwd / value).resolve())


def entrypoint(command: JobCommand, args: list[str], python: str = "python") -> str:
    if command is JobCommand.NIGHTLY:
        return shlex.join([python, "-m", "jobs.nightly", *args])
    return shlex.join([python, "-m", "jobs.cli", "build", *args])


def runtime_env(opts: SubmitOptions) -> dict[str, Any]:
    """The job's runtime environment. It carries the build operators' worker environment, so the
    operators ask for none of their own and run on the job's workers (jobs/local_ray.py
    ``workers_inherit``)."""
    from pipelines.operators import WORKER_ENV

    env: dict[str, Any] = {"working_dir": str(opts.working_dir), "excludes": EXCLUDES,
                           "env_vars": {**DEFAULT_ENV, **WORKER_ENV, **opts.env_vars}}
    if opts.with_requirements:
        env["pip"] = project_requirements(opts.working_dir / "pyproject.toml")
    return env


def client(address: str) -> JobSubmissionClient:
    return JobSubmissionClient(address)


def submit(command: JobCommand, args: list[str], opts: SubmitOptions) -> str:
    """Submit the job; returns its submission id."""
    kwargs: dict[str, Any] = {"entrypoint": entrypoint(command, absolute_paths(args), opts.python),
                              "runtime_env": runtime_env(opts),
                              "metadata": {"memlib": command.value}}
    if opts.submission_id:
        kwargs["submission_id"] = opts.submission_id
    if opts.entrypoint_num_cpus is not None:
        kwargs["entrypoint_num_cpus"] = opts.entrypoint_num_cpus
    return client(opts.address).submit_job(**kwargs)


def status(address: str, job_id: str) -> JobStatus:
    return client(address).get_job_status(job_id)


def logs(address: str, job_id: str) -> str:
    return client(address).get_job_logs(job_id)


def stop(address: str, job_id: str) -> bool:
    return client(address).stop_job(job_id)


def wait(address: str, job_id: str, timeout_s: float = 900.0, poll_s: float = 2.0) -> JobStatus:
    """Poll until the job reaches a terminal state (or ``timeout_s``); returns the last status."""
    deadline = time.monotonic() + timeout_s
    current = status(address, job_id)
    while current not in TERMINAL and time.monotonic() < deadline:
        time.sleep(poll_s)
        current = status(address, job_id)
    return current


def serve_application(args: dict[str, str]):
    """Ray Serve application builder for KubeRay RayService / ``serve run`` (``import_path:
    jobs.submit:serve_application``, ``args: {store: ..., config: ...}``)."""
    from jobs.serve import application
    from memlib.config import load_config

    cfg = load_config(Path(args["config"]) if args.get("config") else None, environ=os.environ)
    return application(args["store"], cfg)
