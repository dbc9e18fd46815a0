"""Outdated-fact detection (PersonalAI) through the LLM.

For every session with new facts, earlier facts of the same conversation that share content
words with them are shown to the model next to the new facts; each replacement it reports
becomes a SUPERSEDES edge (new -> old) and closes the old fact's ``valid_to`` at the new
fact's ``valid_from``. A failed call changes nothing and stays recorded in ``llm_calls``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import polars as pl
import pyarrow as pa

from memlib.extract.base import ExtractionContext, ExtractResult
from memlib.extract.llm_common import call_units, client_of, numbered
from memlib.extract.tables import edge_table
from memlib.ids import make_id
from memlib.llm.models import OutdatedOut, Task
from memlib.schema import NODES_NO_EMBEDDING, EdgeKind, NodeKind, conform

MAX_NEW = 10
MAX_OLD = 8
FACT_CHARS = 140
_WORD = re.compile(r"[a-z][a-z']{3,}")
_STOP = frozenset("that this with have from they their there what when will would about been were into just "
                  "your also than then them some very really".split())


def _words(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if w not in _STOP}


@dataclass(frozen=True)
class _Check:
    unit_id: str
    tenant_id: str
    new: list[dict]
    old: list[dict]


def _checks(facts: pl.DataFrame) -> list[_Check]:
    checks = []
    for (tenant, conv), grp in facts.group_by(["tenant_id", "conversation_id"], maintain_order=True):
        rows = grp.sort("time").to_dicts()
        for sid in dict.fromkeys(r["session_id"] for r in rows if r["_new"]):
            new = [r for r in rows if r["session_id"] == sid and r["_new"]][:MAX_NEW]
            start = min(r["time"] for r in new) if new[0]["time"] is not None else None
            earlier = [r for r in rows if r["session_id"] != sid and start is not None
                       and r["time"] is not None and r["time"] < start]
            vocab = set().union(*(_words(r["text"]) for r in new))
            scored = sorted(((len(_words(r["text"]) & vocab), i) for i, r in enumerate(earlier)), reverse=True)
            old = [earlier[i] for score, i in scored[:MAX_OLD] if score > 0]
            if old:
                uid = make_id("llmunit", Task.OUTDATED.value, tenant, conv, sid,
                              *sorted(r["node_id"] for r in new + old))
                checks.append(_Check(uid, tenant, new, old))
    return checks


def _fact_frame(ctx: ExtractionContext, res: ExtractResult) -> pl.DataFrame:
    cols = ["node_id", "tenant_id", "conversation_id", "session_id", "text", "time", "valid_from", "kind"]
    new = pl.from_arrow(res.nodes.select(cols)).with_columns(pl.lit(True).alias("_new"))
    parts = [new]
    if ctx.facts is not None and ctx.facts.num_rows:
        old = (pl.from_arrow(conform(ctx.facts, NODES_NO_EMBEDDING).select(cols))
               .with_columns(pl.lit(False).alias("_new")))
        parts.append(old.filter(~pl.col("node_id").is_in(new["node_id"])))
    return pl.concat(parts).filter(pl.col("kind") == NodeKind.FACT.value)


def _close(nodes: pa.Table, closes: dict[str, object]) -> pa.Table:
    if not closes:
        return nodes
    df = pl.from_arrow(nodes)
    upd = pl.DataFrame({"node_id": list(closes), "_to": list(closes.values())},
                       schema={"node_id": pl.Utf8, "_to": df.schema["valid_to"]})
    df = (df.join(upd, on="node_id", how="left")
          .with_columns(pl.coalesce("_to", "valid_to").alias("valid_to")).drop("_to"))
    return conform(df.to_arrow(), NODES_NO_EMBEDDING, name="nodes")


def supersede(ctx: ExtractionContext, res: ExtractResult) -> ExtractResult:
    """``res`` plus SUPERSEDES edges and closed ``valid_to`` of replaced facts."""
    res = res.conformed("facts")
    facts = _fact_frame(ctx, res)
    checks = _checks(facts) if facts.height else []
    if not checks:
        return res
    client = client_of(ctx)
    by_id = {c.unit_id: c for c in checks}
    calls = call_units(client, Task.OUTDATED, list(by_id.values()), _variables, ctx.config.llm.concurrency)
    edges, closes = [], {}
    for call in calls:
        if not call.ok:
            continue
        chk = by_id[call.unit_id]
        out: OutdatedOut = call.output
        for rep in out.replaced:
            if 0 <= rep.new < len(chk.new) and 0 <= rep.old < len(chk.old):
                new, old = chk.new[rep.new], chk.old[rep.old]
                edges.append({"tenant_id": chk.tenant_id, "src": new["node_id"], "dst": old["node_id"],
                              "kind": EdgeKind.SUPERSEDES, "provenance": []})
                closes[old["node_id"]] = new["valid_from"] or new["time"]
    nodes = _close(res.nodes, closes)
    if ctx.facts is not None and ctx.facts.num_rows:
        prior = conform(ctx.facts, NODES_NO_EMBEDDING)
        touched = prior.filter(pl.from_arrow(prior.select(["node_id"]))["node_id"]
                               .is_in(list(closes)).to_arrow())
        nodes = pa.concat_tables([nodes, _close(touched, closes)])
    return ExtractResult(nodes, pa.concat_tables([res.edges, edge_table(edges)]))


def _variables(chk: _Check) -> dict[str, str]:
    return {"new_facts": numbered([r["text"][:FACT_CHARS] for r in chk.new]),
            "old_facts": numbered([f"({r['time']:%Y-%m-%d}) {r['text'][:FACT_CHARS]}" if r["time"]
                                   else r["text"][:FACT_CHARS] for r in chk.old])}
