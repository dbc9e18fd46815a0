"""Tenant isolation inside one build actor: a tenant's output must not depend on which tenant the
same actor built before it. With one actor every tenant goes through the same worker, so state
that leaks between tenants (e.g. a per-worker cache of parsed turns) shows up here."""
from __future__ import annotations

from collections import Counter

import pytest

from tests.jobs.conftest import ALL, node_rows, run_cli, write_jsonl

pytestmark = pytest.mark.ray


def test_jobs_isolation_one_actor_builds_every_tenant_on_its_own(ray_local, tmp_path):
    inp = write_jsonl(tmp_path / "in.jsonl", ALL)
    store = tmp_path / "store"
    res = run_cli(["build", "--incremental", "--input", str(inp), "--format", "jsonl", "--out", str(store),
                   "--num-cpus", "1"])
    assert res.exit_code == 0, res.output + repr(res.exception)
    rows = node_rows(store)
    dup = [nid for nid, n in Counter(r[0] for r in rows).items() if n > 1]
    assert not dup, f"{len(dup)} node ids written more than once, e.g. {dup[:3]}"
    facts = {t: [r[3] for r in rows if r[1] == t and r[2] == "fact"] for t in ALL}
    assert all(facts.values()), {t: len(v) for t, v in facts.items()}
    for tenant, texts in facts.items():
        others = [o.title() for o in ALL if o != tenant]
        leaked = [x for x in texts if any(o in x for o in others)]
        assert not leaked, f"{tenant} holds another tenant's facts: {leaked[:2]}"
