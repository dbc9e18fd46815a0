"""The container: the build context leaves out the venv, stores, tests and git;
the node image installs the runtime dependencies only; the manifests name the image as one
parameter, ``${MEMLIB_IMAGE}``, that ``envsubst`` fills in (no placeholder registry to edit)."""
from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "cluster"
MANIFESTS = ("ray-cluster.yaml", "rayjob-nightly.yaml", "rayservice-retrieval.yaml")


def images(doc) -> list[str]:
    """Every ``image`` value of a parsed manifest (pods and the ray up docker section alike)."""
    if isinstance(doc, dict):
        return [v for k, v in doc.items() if k == "image" and isinstance(v, str)] + \
            [i for v in doc.values() for i in images(v)]
    if isinstance(doc, list):
        return [i for v in doc for i in images(v)]
    return []


@pytest.mark.parametrize("name", MANIFESTS)
def test_the_image_is_one_parameter(name):
    text = (CLUSTER / name).read_text(encoding="utf-8")
    assert "example" not in text
    assert set(images(yaml.safe_load(text))) == {"${MEMLIB_IMAGE}"}


@pytest.mark.skipif(shutil.which("envsubst") is None, reason="envsubst (gettext-base) not installed")
@pytest.mark.parametrize("name", MANIFESTS)
def test_envsubst_fills_in_the_image(name):
    out = subprocess.run(["envsubst", "$MEMLIB_IMAGE"], input=(CLUSTER / name).read_text(encoding="utf-8"),
                         capture_output=True, text=True, check=True,
                         env={"MEMLIB_IMAGE": "registry.test/team/memlib:1.2.3", "PATH": "/usr/bin:/bin"})
    assert set(images(yaml.safe_load(out.stdout))) == {"registry.test/team/memlib:1.2.3"}


def dockerignore() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
    return [ln.strip().rstrip("/") for ln in lines if ln.strip() and not ln.startswith("#")]


def test_the_build_context_leaves_out_venv_stores_tests_and_git():
    ignored = set(dockerignore())
    assert {".venv", ".git", "stores", "demo-store", "tests", "*.lance"} <= ignored
    docker = (CLUSTER / "Dockerfile").read_text(encoding="utf-8")
    copied = re.findall(r"^COPY (?:--chown=\S+ )?(.+?) \S+$", docker, re.M)
    sources = {s for line in copied for s in line.split()}
    assert {"memlib", "jobs", "pipelines", "prompts", "cluster", "pyproject.toml"} <= sources
    assert not sources & ignored  # nothing the image copies is left out of the context


def install_spec(env: dict[str, str]) -> str:
    """What cluster/bootstrap.sh hands to pip install -e, with the environment ``env``."""
    boot = (CLUSTER / "bootstrap.sh").read_text(encoding="utf-8")
    extras = re.search(r"^EXTRAS=.*$", boot, re.M).group(0)
    spec = re.search(r'-e ("[^"]+")', boot).group(1)
    out = subprocess.run(["bash", "-c", f"{extras}; printf %s {spec}"], capture_output=True, text=True,
                         check=True, env={"PATH": "/usr/bin:/bin", **env})
    return out.stdout


def test_the_node_image_installs_no_test_extras():
    assert install_spec({}) == ".[test]"  # make test / make demo: as before
    assert install_spec({"MEMLIB_EXTRAS": ""}) == "."
    docker = (CLUSTER / "Dockerfile").read_text(encoding="utf-8")
    assert re.search(r"^RUN .*MEMLIB_EXTRAS= bash cluster/bootstrap\.sh$", docker, re.M)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    runtime = {re.split(r"[<>=\[ ]", d)[0].lower() for d in project["dependencies"]}
    test_only = {re.split(r"[<>=\[ ]", d)[0].lower() for d in project["optional-dependencies"]["test"]}
    assert runtime & test_only == set()
