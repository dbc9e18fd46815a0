"""``memlib inspect --store STORE``: per tenant, nodes and edges by kind, the top-degree
hubs and the top-importance nodes of the published version. Reads the tables (polars);
the graph file is only reported (path and size), never loaded."""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow.parquet as pq
import typer

from memlib.io.store import TENANT_TABLES, StoreReader

TOP = 5
TEXT_CHARS = 60


def _short(text: str | None) -> str:
    text = (text or "").replace("\n", " ")
    return text if len(text) <= TEXT_CHARS else text[: TEXT_CHARS - 1] + "…"


def _counts(df: pl.DataFrame, column: str) -> dict[str, int]:
    if df.is_empty():
        return {}
    g = df.group_by(column).len().sort(["len", column], descending=[True, False])
    return dict(zip(g[column].to_list(), g["len"].to_list()))


def hubs(edges: pl.DataFrame, nodes: pl.DataFrame, top: int = TOP) -> pl.DataFrame:
    """Vertices with the most incident edges (both directions), with kind and text."""
    ends = pl.concat([edges.select(pl.col("src").alias("node_id")), edges.select(pl.col("dst").alias("node_id"))])
    deg = ends.group_by("node_id").len().rename({"len": "degree"})
    return (deg.join(nodes.select("node_id", "kind", "text"), on="node_id", how="left")
            .sort(["degree", "node_id"], descending=[True, False]).head(top))


def top_importance(nodes: pl.DataFrame, top: int = TOP) -> pl.DataFrame:
    return (nodes.filter(pl.col("importance").is_not_null())
            .sort(["importance", "node_id"], descending=[True, False]).head(top)
            .select("node_id", "kind", "importance", "text"))


def tenant_summary(reader: StoreReader, tenant: str, top: int = TOP) -> dict[str, Any]:
    nodes = pl.from_arrow(reader.nodes(tenant, columns=["node_id", "kind", "text", "importance"]))
    edges = pl.from_arrow(reader.edges(tenant).select(["src", "dst", "kind"]))
    graph = reader.graph_bytes(tenant)
    return {
        "tenant": tenant,
        "nodes": nodes.height, "nodes_by_kind": _counts(nodes, "kind"),
        "edges": edges.height, "edges_by_kind": _counts(edges, "kind"),
        "hubs": hubs(edges, nodes, top).to_dicts() if edges.height else [],
        "top_importance": top_importance(nodes, top).to_dicts() if nodes.height else [],
        "graph_file": str(reader.graph_file(tenant)) if graph is not None else None,
        "graph_bytes": len(graph) if graph is not None else None,
    }


def _echo_tenant(s: dict[str, Any]) -> None:
    typer.echo(f"tenant {s['tenant']}: {s['nodes']} nodes, {s['edges']} edges; "
               f"graph {s['graph_file'] or '(none)'}" + (f" ({s['graph_bytes']} bytes)" if s["graph_bytes"] else ""))
    typer.echo("  nodes by kind: " + (", ".join(f"{k} {v}" for k, v in s["nodes_by_kind"].items()) or "-"))
    typer.echo("  edges by kind: " + (", ".join(f"{k} {v}" for k, v in s["edges_by_kind"].items()) or "-"))
    typer.echo("  top-degree hubs:")
    for h in s["hubs"]:
        typer.echo(f"    {h['degree']:>6}  {h['kind'] or '?':<10} {h['node_id']}  {_short(h['text'])}")
    typer.echo("  top importance:")
    for n in s["top_importance"]:
        typer.echo(f"    {n['importance']:.3f}  {n['kind']:<10} {n['node_id']}  {_short(n['text'])}")


def tenant_problem(reader: StoreReader, tenant: str) -> str | None:
    """Why a tenant of the published version cannot be served (a file not of the checksum the
    manifest records, a Parquet partition that does not decode, a graph file that does not load,
    Lance rows not of their checksum), or ``None``. ``memlib verify`` makes the same checks, and more."""
    damaged = reader.damaged_files(tenant)
    if damaged:
        return f"files damaged: {', '.join(damaged[:3])}"
    for name in TENANT_TABLES:
        path = reader.table_file(name, tenant)
        if path.exists():
            try:
                pq.read_table(path)
            except Exception as exc:  # noqa: BLE001 - any decoding failure names the file
                return f"{name}/{path.name} unreadable: {' '.join(str(exc).split())[:200]}"
    gpath = reader.graph_file(tenant)
    if gpath.exists():
        from memlib.graph.build import load

        try:
            graph = reader.graph_bytes(tenant)
            if graph is not None:
                load(graph)
        except Exception as exc:  # noqa: BLE001 - graph-tool raises C++ errors of many types
            return f"graphs/{gpath.name} unreadable: {' '.join(str(exc).split())[:200]}"
    lance = reader.lance_damage(tenant)  # its Lance rows against the content checksum written with them
    return str(lance[0]) if lance else None


def run(store_path: str | Path, top: int = TOP, echo: bool = True) -> list[dict[str, Any]]:
    """Print the summary of every tenant of the store; return the summaries. A tenant whose files
    cannot be read is printed as BROKEN with the reason (its summary has ``broken``); a tenant
    whose last build failed, and that is served as it was published before, says so (``failed``)."""
    say = typer.echo if echo else (lambda *a, **k: None)
    reader = StoreReader(store_path)
    say(f"store {reader.path} version {reader.version}: {len(reader.tenants())} tenant(s)")
    entries = reader.manifest.get("tenants", {})
    out = []
    for tenant in reader.tenants():
        problem = tenant_problem(reader, tenant)
        if problem is not None:
            if echo:
                typer.secho(f"BROKEN tenant {tenant}: {problem}", fg=typer.colors.RED)
            out.append({"tenant": tenant, "broken": problem})
            continue
        s = tenant_summary(reader, tenant, top)
        if echo:
            _echo_tenant(s)
        if entries.get(tenant, {}).get("status") == "failed":
            s["failed"] = entries[tenant].get("error")
            say(f"  last build FAILED, served as published before: {s['failed']}")
        out.append(s)
    return out


def quarantine_summary(store_path: str | Path) -> dict[str, Any]:
    """The published version's quarantined input records: how many, by reason, and where."""
    reader = StoreReader(store_path)
    codes = reader.table("quarantine", columns=["reason_code"]).column("reason_code").to_pylist()
    return {"records": len(codes), "by_reason": dict(sorted(Counter(codes).items())),
            "table": str(reader.version_dir / "quarantine")}
