"""``memlib serve --open-local``: a service without tokens for one person on their own machine,
refused where others could reach it (another --host, a Ray cluster). No Ray starts: every case is
refused before it would."""
from __future__ import annotations

import pytest
from typer.testing import CliRunner

from jobs.cli import app
from jobs.cli.cmd_serve import is_loopback


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.20", "::", "example.org"])
def test_open_local_is_refused_off_loopback(store, host):
    res = CliRunner().invoke(app, ["serve", "--store", str(store), "--open-local", "--host", host])
    assert res.exit_code == 2, res.output
    assert f"--open-local serves without tokens, so only on loopback: --host {host}" in res.output
    assert "Traceback" not in res.output and len(res.output.strip().splitlines()) == 1


def test_open_local_is_refused_on_a_cluster(store, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "ray://10.0.0.5:10001")
    res = CliRunner().invoke(app, ["serve", "--store", str(store), "--open-local"])
    assert res.exit_code == 2 and "not on a Ray cluster (ray://10.0.0.5:10001)" in res.output, res.output


def test_loopback_names():
    assert all(map(is_loopback, ["127.0.0.1", "127.8.0.1", "::1", "[::1]", "localhost", "LOCALHOST"]))
    assert not any(map(is_loopback, ["0.0.0.0", "::", "10.0.0.1", "example.org", ""]))
