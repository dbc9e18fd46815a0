"""Inputs on S3-compatible object storage: a real S3 HTTP server (moto) on 127.0.0.1, read
through pyarrow's S3 filesystem by `memlib inspect`, `memlib build` and the nightly
`--incremental` build over a prefix. The store stays on the local filesystem."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.jobs.conftest import node_rows, run_cli

BUCKET = "memlib-in"


@pytest.fixture(scope="module")
def s3_server():
    moto_server = pytest.importorskip("moto.server", reason="needs moto[server] (test extra)")
    srv = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    srv.start()
    host, port = srv.get_host_and_port()
    yield f"http://{host}:{port}"
    srv.stop()


@pytest.fixture()
def s3(s3_server, monkeypatch, tmp_path):
    """Credentials and endpoint in the environment (as a user would set them), a bucket, and a
    staging directory the test can look into."""
    import pyarrow.fs as pafs

    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": s3_server,
                       "MEMLIB__IO__STAGING_DIR": str(tmp_path / "staging")}.items():
        monkeypatch.setenv(key, value)
    fs = pafs.S3FileSystem(endpoint_override=s3_server, region="us-east-1", allow_bucket_creation=True,
                           access_key="testing", secret_key="testing")
    fs.create_dir(BUCKET)

    def put(key: str, local: Path) -> str:
        with fs.open_output_stream(f"{BUCKET}/{key}") as out:
            out.write(local.read_bytes())
        return f"s3://{BUCKET}/{key}"

    return put


def _staging_empty(tmp_path: Path) -> bool:
    d = tmp_path / "staging"
    return not d.exists() or not any(d.iterdir())


def test_inspect_reads_an_s3_object_like_the_local_file(s3, base_store, tmp_path):
    inp, _ = base_store
    uri = s3("raw/in.jsonl", inp)
    remote = run_cli(["inspect", "--input", uri, "--json"])
    local = run_cli(["inspect", "--input", str(inp), "--json"])
    assert remote.exit_code == 0, remote.output
    r, l_ = json.loads(remote.output), json.loads(local.output)
    assert r["input"] == uri
    assert r["summary"] == l_["summary"] and r["summary"]["tenants"] == 4
    assert _staging_empty(tmp_path), "the staged copy is removed after reading"


def test_missing_object_is_a_clear_error(s3, tmp_path):
    uri = f"s3://{BUCKET}/nope/missing.jsonl"
    res = run_cli(["inspect", "--input", uri, "--format", "jsonl"])
    assert res.exit_code != 0
    assert uri in res.output and "no such object" in res.output
    res = run_cli(["build", "--input", uri, "--format", "jsonl", "--out", str(tmp_path / "store")])
    assert res.exit_code != 0 and "no such object" in res.output
    assert not (tmp_path / "store" / "manifest.json").exists()


@pytest.mark.ray
def test_build_and_nightly_from_s3_equal_the_local_build(s3, base_store, tmp_path):
    inp, local_store = base_store
    uri = s3("nightly/2026-11-23/in.jsonl", inp)
    prefix = uri.rsplit("/", 1)[0] + "/"

    store = tmp_path / "store"
    res = run_cli(["build", "--input", uri, "--format", "jsonl", "--out", str(store), "--num-cpus", "2"])
    assert res.exit_code == 0, res.output + repr(res.exception)
    assert node_rows(store) == node_rows(local_store)
    assert json.loads((store / "manifest.json").read_text())["input"]["path"] == uri

    nightly = tmp_path / "nightly"
    for run in (1, 2):
        res = run_cli(["build", "--incremental", "--input", prefix, "--format", "jsonl", "--out", str(nightly),
                       "--num-cpus", "2"])
        assert res.exit_code == 0, res.output + repr(res.exception)
        manifest = json.loads((nightly / "manifest.json").read_text())
        if run == 1:
            assert sorted(manifest["incremental"]["built"]) == ["dora", "emil", "fay", "gus"]
        else:  # unchanged objects (fingerprints do not depend on where they were staged): nothing published
            assert "unchanged" in res.output and manifest["version"] == "v000001"
    assert node_rows(nightly) == node_rows(local_store)
    assert _staging_empty(tmp_path)
