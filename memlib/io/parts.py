"""Parts: a store version's Parquet tables hold whole tenants per file (memlib.io.store). What a
nightly run does with them: carry unchanged tenants over by part, prune what it no longer holds."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import pyarrow as pa
import pyarrow.parquet as pq

from memlib.io.files import StoreError, link_or_copy, of_tenants, part_id, replace_part, safe_name
from memlib.io.views import (
    ALL_VIEWS,
    VIEW_MEMORY,
    VIEW_SUFFIX,
    VIEW_TABLES,
    ViewError,
    read_batches,
    view_path,
    views_from_tables,
    write_view,
)

GRAPHS = "graphs"
PART_KEY = "part"  # a tenant's entry in the manifest names its part
TENANT_TABLES = ("turns", "segments", "edges", "questions", "llm_calls", "node_fallbacks", "token_sums", "matrix_refs",
                 "node_importance")


@dataclass
class Carried:
    """What :meth:`PartsCarrier.carry_over` did: each carried tenant's part in the new version, and
    every tenant each of those parts holds rows of (live or dead)."""
    parts: dict[str, str] = field(default_factory=dict)
    held: dict[str, list[str]] = field(default_factory=dict)
    # carried parts without a memory view (a store written before them), part -> its carried tenants:
    # the caller writes them (memlib/graph/memory_arrays.py ``memory_views_from_tables``)
    unremembered: dict[str, list[str]] = field(default_factory=dict)


class PartsCarrier:
    """Carry-over and pruning of parts, for a store writer (``self.base``: the published version's
    reader or None, ``self.version_dir``, ``self.version``; ``write_table``, ``write_graphs``)."""

    base: Any
    version_dir: Path
    version: str

    def carry_over(self, tenants: Iterable[str], *, part_turns: int = 512, purge: Iterable[str] = ()) -> Carried:
        """Bring unchanged published tenants into this version without recomputing them: a part
        holding any of them is hard-linked (one link per file, whatever its number of tenants), and
        the rows of its tenants rebuilt or removed since stay in it, dead (readers skip them: the
        manifest names each live tenant's part and every tenant a part holds). A part is compacted
        instead (its carried tenants rewritten, with those of other such parts, into new parts of
        about ``part_turns`` turns) when it would be less than half live, or when it holds rows,
        live or dead, of a tenant in ``purge`` (forgotten, or deleted: nothing of it may stay). So a
        run costs a link per carried part, and rows are rewritten only once their part is half dead."""
        if self.base is None:
            raise StoreError("cannot carry over tenants: the store has no published version")
        carried, purge, out = set(tenants), set(purge), Carried()
        info, held = self.base.manifest.get("tenants", {}), self.base.held()
        remnants: list[str] = []
        unviewed: dict[str, list[str]] = {}  # new parts whose views come from the tables (written before views)
        unremembered: dict[str, list[str]] = {}  # parts whose memory view comes from the tables (written before it)
        for part, members in self.base.parts().items():
            keep = [t for t in members if t in carried]
            if not keep:
                continue
            holds = held.get(part, members)
            # a store written before parts (a file per tenant, no part in the manifest) is packed
            # into parts as its tenants are carried: the next build upgrades it
            legacy = members == [part] and PART_KEY not in (info.get(part) or {})
            if not legacy and 2 * len(keep) >= len(holds) and not purge.intersection(holds):
                self._link_part(part)
                if not view_path(self.version_dir, VIEW_TABLES[0], part).exists():
                    unviewed[part] = keep
                elif not view_path(self.version_dir, VIEW_MEMORY, part).exists():
                    unremembered[part] = keep
                out.parts.update((t, part) for t in keep)
                out.held[part] = sorted(holds)
            else:
                remnants += keep
        group: list[str] = []
        turns = 0
        for tenant in remnants + [""]:  # "" flushes the last group
            n = int((info.get(tenant) or {}).get("turns") or 0)
            if group and (not tenant or turns + n > part_turns):
                new = self._rewrite_part(group, unviewed, unremembered)
                out.parts.update((t, new) for t in group)
                out.held[new] = sorted(group)
                group, turns = [], 0
            if tenant:
                group.append(tenant)
                turns += n
        views_from_tables(self.base, self.version_dir, unviewed)
        out.unremembered = {**unviewed, **unremembered}
        return out

    def prune_parts(self, parts: dict[str, str], check: Iterable[str] = ()) -> None:
        """Make this version's files hold exactly the tenants of ``parts`` (tenant -> part): files of
        parts no tenant is in are removed (left by an interrupted run whose tenants were then
        rebuilt), and the parts named in ``check`` (a resumed run's) lose rows of other tenants."""
        members: dict[str, list[str]] = {}
        for tenant, part in parts.items():
            members.setdefault(part, []).append(tenant)
        for name in (*TENANT_TABLES, GRAPHS, *ALL_VIEWS):
            d = self.version_dir / name
            for f in sorted(d.iterdir()) if d.is_dir() else []:
                if f.suffix not in (".parquet", ".gt", VIEW_SUFFIX):
                    continue
                if f.stem not in members:
                    f.unlink()
                elif f.stem in check and f.suffix == ".parquet":
                    t = pq.read_table(f)
                    kept = of_tenants(t, members[f.stem])
                    if kept.num_rows != t.num_rows:
                        replace_part(kept, f)
                elif f.stem in check:
                    self._rewrite_view(name, [f], members[f.stem], f)

    def _link_part(self, part: str) -> None:
        base = self.base.version_dir
        for name in (*TENANT_TABLES, GRAPHS, *ALL_VIEWS):
            src = base / name / f"{safe_name(part)}{VIEW_SUFFIX if name in ALL_VIEWS else '.parquet'}"
            if src.exists():
                dst = self.version_dir / name / src.name
                dst.parent.mkdir(parents=True, exist_ok=True)
                link_or_copy(src, dst)
        old = self.base.graph_path(part)  # a store written before parts: the tenant's own .gt
        if old.exists():
            link_or_copy(old, self.graph_path(part))

    def _rewrite_part(self, tenants: list[str], unviewed: dict[str, list[str]],
                      unremembered: dict[str, list[str]]) -> str:
        """Copy ``tenants``' rows from their published parts into one new part of this version
        (with their views; a part whose views cannot be copied goes into ``unviewed``, whose views
        the caller writes from the tables in one read of them, and one whose memory view cannot
        be copied into ``unremembered``)."""
        new = part_id(tenants, f"{self.version}/carried")
        sources = sorted({self.base.part_of(t) for t in tenants})
        for name in (*TENANT_TABLES, GRAPHS):
            d = self.base.version_dir / name
            tables = [of_tenants(pq.read_table(f), tenants) for p in sources if (f := d / f"{p}.parquet").exists()]
            tables = [t for t in tables if t.num_rows]
            if name == GRAPHS:  # and the .gt files of a store written before parts
                graphs = {t: g for table in tables for t, g in zip(table.column("tenant_id").to_pylist(),
                                                                   table.column("graph").to_pylist())}
                graphs.update((t, self.base.graph_path(t).read_bytes()) for t in tenants
                              if self.base.part_of(t) == t and self.base.graph_path(t).exists())
                self.write_graphs(new, graphs)
            elif tables:
                self.write_table(name, new, pa.concat_tables(tables, promote_options="permissive"))
        copied = [self._rewrite_view(name, [view_path(self.base.version_dir, name, p) for p in sources], tenants,
                                     view_path(self.version_dir, name, new)) for name in VIEW_TABLES]
        if not all(copied):  # some source part had no view (a store written before them)
            unviewed[new] = tenants
        elif not self._rewrite_view(VIEW_MEMORY, [view_path(self.base.version_dir, VIEW_MEMORY, p) for p in sources],
                                    tenants, view_path(self.version_dir, VIEW_MEMORY, new)):
            unremembered[new] = tenants  # its node rows keep their order: the memory view's rows still hold
        return new

    @staticmethod
    def _rewrite_view(name: str, sources: list[Path], tenants: list[str], out: Path) -> bool:
        """View ``name`` of ``tenants`` from the view files ``sources`` into ``out``; False (``out``
        not written) when a tenant is in none of them or a file cannot be read."""
        found: dict[str, tuple[pa.Table, dict]] = {}
        try:
            for f in sources:
                for t, (batch, meta) in read_batches(f).items():
                    if t in tenants:
                        found.setdefault(t, (pa.Table.from_batches([batch]), meta))
        except (ViewError, OSError, ValueError):
            found = {}
        if set(found) != set(tenants):
            out.unlink(missing_ok=True)
            return False
        write_view(out, name, {t: found[t][0] for t in tenants}, {t: found[t][1] for t in tenants})
        return True

