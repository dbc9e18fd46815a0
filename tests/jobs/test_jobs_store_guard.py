"""Operator mistakes and concurrent runs on one store:
each is a one-line error (exit 2) before any work, and no second build can run on a store
while another one writes it."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from jobs.builder.plan import ForgetList
from memlib.io.errors import InputError
from tests.jobs.conftest import run_cli, write_jsonl


def _one_line_error(res, *words: str) -> None:
    assert res.exit_code == 2, res.output + repr(res.exception)
    assert "Traceback" not in res.output and all(w in res.output for w in words), res.output
    assert len([ln for ln in res.output.splitlines() if ln.strip()]) == 1, res.output


@pytest.mark.parametrize("content, words", [
    (None, ("not found",)),
    ("gus".encode("utf-16"), ("UTF-8",)),
    (b"gus\nma ya\n", ("line 2", "ma ya")),
    (b"gus/\n", ("line 1",)),
])
def test_bad_forget_file_is_a_one_line_error(tmp_path, content, words):
    path = tmp_path / "forget.txt"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(InputError) as exc:
        ForgetList.load(path)
    assert all(w in str(exc.value) for w in words) and "\n" not in str(exc.value)
    inp = write_jsonl(tmp_path / "in.jsonl", ["gus"])
    res = run_cli(["build", "-i", str(inp), "-f", "jsonl", "-o", str(tmp_path / "store"), "--delete", str(path)])
    _one_line_error(res, *words)
    assert not (tmp_path / "store" / "manifest.json").exists()


def test_forget_file_accepts_comments_bom_and_conversations(tmp_path):
    path = tmp_path / "forget.txt"
    path.write_bytes(b"\xef\xbb\xbfgus  # gone\n\ndora/dora-b\n")
    f = ForgetList.load(path)
    assert f.tenants == {"gus"} and f.conversations == {("dora", "dora-b")}


def _store(tmp_path: Path) -> Path:
    from memlib.io.store import StoreWriter

    store = tmp_path / "store"
    w = StoreWriter(store, dim=8)
    w.publish({"tenants": {}})
    return store


def test_rollback_to_a_malformed_version_is_a_one_line_error(tmp_path):
    store = _store(tmp_path)
    _one_line_error(run_cli(["build", "--out", str(store), "--rollback", "abc"]), "abc")


def test_corrupt_manifest_is_a_one_line_error(tmp_path):
    store = _store(tmp_path)
    (store / "manifest.json").write_text('{"version": "v0000', encoding="utf-8")
    inp = write_jsonl(tmp_path / "in.jsonl", ["gus"])
    res = run_cli(["build", "--incremental", "-i", str(inp), "-f", "jsonl", "-o", str(store)])
    _one_line_error(res, "manifest.json", "--rollback")


def test_a_second_build_on_a_store_being_written_is_refused(tmp_path):
    from jobs.builder.lock import StoreBusy, store_lock

    store = _store(tmp_path)
    inp = write_jsonl(tmp_path / "in.jsonl", ["gus"])
    before = json.loads((store / "manifest.json").read_text())["version"]
    with store_lock(store):
        res = run_cli(["build", "--incremental", "-i", str(inp), "-f", "jsonl", "-o", str(store)])
        _one_line_error(res, "another memlib process")
        for args in (["--compact"], ["--rollback", before]):
            _one_line_error(run_cli(["build", "--out", str(store), *args]), "another memlib process")
        with pytest.raises(StoreBusy):
            with store_lock(store):
                pass
    assert json.loads((store / "manifest.json").read_text())["version"] == before


def test_nightly_entrypoint_reports_an_unusable_input_in_one_line(tmp_path, capsys):
    from jobs.nightly import main

    inp = tmp_path / "in.jsonl"
    inp.write_bytes(b"")
    assert main(["--input", str(inp), "--format", "jsonl", "--out", str(tmp_path / "store")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "empty" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("args", [["--compact"], ["--rollback", "v000001"]])
def test_maintenance_on_a_path_that_is_no_store_creates_nothing(tmp_path, args):
    """--compact (it printed a 43-line traceback) and --rollback on a mistyped path: one line, and
    no directory or lock file is made there."""
    typo = tmp_path / "stroe"
    _one_line_error(run_cli(["build", "--out", str(typo), *args]), "not a memlib store")
    assert not typo.exists()


@pytest.fixture()
def read_only_dir(tmp_path):
    """A read-only file system (root ignores permission bits, so a tmpfs mounted read-only)."""
    import subprocess

    mnt = tmp_path / "ro"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(mnt)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a read-only tmpfs here")
    yield mnt
    subprocess.run(["umount", str(mnt)], check=False)


def test_building_into_a_read_only_store_is_a_one_line_error(tmp_path, read_only_dir):
    """Before: `OSError: [Errno 30] Read-only file system: '.../.memlib.lock'`, a traceback."""
    inp = write_jsonl(tmp_path / "in.jsonl", ["dora"])
    for out, extra in ((read_only_dir, ["--incremental"]), (read_only_dir / "store", [])):
        res = run_cli(["build", "--input", str(inp), "--format", "jsonl", "--out", str(out), *extra])
        lines = [ln for ln in res.output.splitlines() if ln.strip()]
        assert res.exit_code == 2 and len(lines) == 1, res.output + repr(res.exception)
        assert "cannot write the store (Read-only file system" in lines[0], lines
