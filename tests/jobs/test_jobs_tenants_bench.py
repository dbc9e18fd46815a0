"""The synthetic enterprise of `memlib bench tenants` (fast) and the bench at a small size (slow)."""
from __future__ import annotations

import json
from datetime import datetime

import pytest

from tests.jobs.conftest import run_cli


@pytest.fixture(scope="module")
def templates(shared_data):
    from jobs.bench.enterprise import iter_files, session_templates

    return session_templates(iter_files([str(shared_data / "locomo_dev3.json"),
                                         str(shared_data / "longmemeval_s_dev24.json")]))


def test_enterprise_tenants_are_real_sessions_cut_to_the_turn_budget(templates, tmp_path):
    from jobs.bench.enterprise import make_enterprise
    from memlib.io.readers import iter_tenants

    assert len(templates) > 1000  # every session of both files
    ent = make_enterprise(templates, 250, 1250)
    assert len(ent.tenants) == 250 and 1000 <= ent.turns <= 1250
    assert max(len(r) for r in ent.tenants.values()) == 5
    first = ent.tenants["u0000000"]
    assert [r["text"] for r in first] == [t["text"] for t in templates[0][:5]]
    # the same template under another id is another tenant, on other dates
    small = make_enterprise(templates[:3], 6)
    a, b = small.tenants["u0000000"], small.tenants["u0000003"]
    assert [r["text"] for r in a] == [r["text"] for r in b] and a[0]["session_time"] != b[0]["session_time"]
    path = ent.write(tmp_path / "ent.jsonl")
    read = list(iter_tenants(path, "jsonl"))
    assert sum(r.turns.num_rows for r in read) == ent.turns and sum(r.quarantine.num_rows for r in read) == 0


def test_enterprise_mix_and_nightly_sessions(templates):
    from jobs.bench.enterprise import make_enterprise, pick, regroup, with_new_session

    mixed = make_enterprise(templates, 200, 6000, mix=True)
    sizes = sorted(len({r["session_id"] for r in recs}) for recs in mixed.tenants.values())
    assert sizes[0] == 1 and sizes[-1] > 3 and mixed.turns <= 6000 + 200  # at least a turn per tenant
    ent = make_enterprise(templates, 100, 500)
    few = pick(list(ent.tenants), 0.05)
    assert len(few) == 5 and pick(list(ent.tenants), 0.05) == few  # the same tenants every time
    new = with_new_session(ent, templates, few, 5)
    for t in ent.tenants:
        grew = len(new.tenants[t]) - len(ent.tenants[t])
        assert grew == (len([r for r in new.tenants[t] if r["session_id"] == "n1"]) if t in few else 0)
        if t in few:
            old_last = max(datetime.fromisoformat(r["session_time"]) for r in ent.tenants[t])
            assert all(datetime.fromisoformat(r["session_time"]) > old_last
                       for r in new.tenants[t] if r["session_id"] == "n1")
    grouped = regroup(ent, 10)
    assert len(grouped.tenants) == 10 and grouped.turns == ent.turns


@pytest.mark.slow
def test_bench_tenants_small(shared_data, tmp_path):
    res = run_cli(["bench", "tenants", "--tenants", "24", "--turns", "96", "--touched", "0.1", "--groups", "2",
                   "--templates", f"{shared_data / 'locomo_dev3.json'}", "--workdir", str(tmp_path)])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output.strip().splitlines()[-1])
    assert out["tenants"] == 24 and out["build"]["built"] == 24 and out["store"]["tenants"] == 24
    assert out["nightly_touched"]["built"] == out["nightly_touched"]["touched"] == 2
    assert out["nightly_every"]["built"] == 24
    frag = out["store_after_nightly"]["lance_fragments"]
    assert max(frag.values()) <= 6  # a handful of commits per run, not one per tenant
    assert out["baseline"]["built"] == 2 and out["turns_per_s_ratio"] > 0
