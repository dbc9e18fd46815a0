"""Memory views (memlib/io/memory_view.py): the build writes what ``auto``'s memory signals read (fact
and event vectors, their citations, the graph's arrays) beside each part's node and turn views; a
cold tenant maps it and ranks exactly as from Lance and the graph file; a damaged, unchecksummed or
disagreeing view is never trusted; a store written before them still answers, and gets them when a
build carries its parts."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from memlib.config import GraphConfig
from memlib.graph.memory_arrays import memory_views_from_tables
from memlib.graph.variants import gaama_transition, transition_key
from memlib.io.checksums import crc_of
from memlib.io.memory_view import MEMORY_KINDS, VIEW_MEMORY, read_memory_view
from memlib.io.reader_checks import FILES_KEY
from memlib.io.store import MANIFEST, StoreReader, StoreWriter
from memlib.io.views import ViewError, read_batches, view_path, write_view
from memlib.retrieve import memory
from memlib.retrieve.kernels import run_search
from memlib.retrieve.registry import get_strategy
from memlib.retrieve.signals import turn_frame
from tests.retrieve.conftest import retrieve_config

pytestmark = pytest.mark.ray
QUERIES = ["Where will Lena work from August 2024?", "What did Raj do last week?", "kitten shelter adoption"]


def _cache(store: Path):
    from memlib.embed import get_embedder
    from memlib.retrieve.tenant_cache import TenantCache

    return TenantCache(store, embedder=get_embedder(retrieve_config().embed))


def _answers(store: Path) -> dict:
    cache, out = _cache(store), {}
    auto = get_strategy("auto", retrieve_config(), disk_cache=False)
    for tenant in cache.tenants():
        for q in QUERIES:
            res = run_search(cache.get(tenant), auto, q, 10)
            out[tenant, q] = [(n.node_id, float(n.score), sorted(n.signals.items())) for n in res.nodes]
    return out


def _copy(store: Path, dst: Path, keep_memory: bool = True) -> Path:
    shutil.copytree(store, dst)
    if not keep_memory:
        shutil.rmtree(StoreReader(dst).version_dir / VIEW_MEMORY)
    return dst


def _republish_checksum(store: Path, path: Path) -> None:
    """Record ``path``'s present bytes in the published manifest (a view the manifest vouches for)."""
    r = StoreReader(store)
    m = json.loads((store / MANIFEST).read_text())
    m[FILES_KEY][path.relative_to(r.version_dir).as_posix()] = crc_of(path)
    (store / MANIFEST).write_text(json.dumps(m))


def test_the_build_writes_a_memory_view_that_maps_to_the_same_arrays(sample_store):
    r = StoreReader(sample_store)
    cache = _cache(sample_store)
    for tenant in r.tenants():
        f = view_path(r.version_dir, VIEW_MEMORY, r.part_of(tenant))
        assert f.relative_to(r.version_dir).as_posix() in r.manifest[FILES_KEY]  # checksummed at publish
        index = cache.get(tenant)
        frame = turn_frame(index)
        view = memory.memory_view(index)
        assert view is not None and view.kinds == MEMORY_KINDS and view.graph is not None
        for kinds in (MEMORY_KINDS, ("fact",)):
            mapped = memory.memory_frame(index, frame, kinds)
            built = memory.MemoryFrame(index, frame, kinds)  # from the node columns and Lance
            for name in ("cite_row", "cite_ptr", "rows"):
                assert np.array_equal(getattr(mapped, name), getattr(built, name)), (tenant, kinds, name)
            assert mapped.node_ids == built.node_ids and list(mapped.kind) == list(built.kind)
            assert mapped.vectors.tobytes() == built.vectors.tobytes()
        graph, loaded = memory.tenant_graph(index), index.graph  # the view's arrays, graph-tool's load
        assert graph is not loaded and list(graph.ids) == list(loaded.ids)
        for name in ("kind", "time", "importance", "src", "dst", "edge_kind", "weight", "relation", "degree"):
            a, b = getattr(graph, name), getattr(loaded, name)
            assert a.dtype == b.dtype and np.array_equal(a, b, equal_nan=True), name
        assert (graph.node_kinds, graph.edge_kinds, graph.relations) == \
            (loaded.node_kinds, loaded.edge_kinds, loaded.relations)
        adj, ref = graph.adjacency(), loaded.adjacency()
        assert all(np.array_equal(getattr(adj, n), getattr(ref, n)) for n in ("indptr", "nbr", "eid", "fwd"))
        key = transition_key(GraphConfig())  # the PPR's transition as the build made it
        stored, made = graph._cache[key], gaama_transition(loaded, GraphConfig())
        assert stored.pt.data.tobytes() == made.pt.data.tobytes() and (stored.pt != made.pt).nnz == 0
        assert stored.prob.tobytes() == made.prob.tobytes() and np.array_equal(stored.sink, made.sink)


def test_auto_ranks_the_same_with_and_without_memory_views(sample_store, tmp_path):
    older = _copy(sample_store, tmp_path / "older", keep_memory=False)
    index = _cache(older).get(StoreReader(older).tenants()[0])
    assert memory.memory_view(index) is None  # a store written before them: Lance and the graph file
    assert _answers(sample_store) == _answers(older)


@pytest.mark.parametrize("damage", ["flipped", "unchecksummed", "disagreeing", "torn"])
def test_a_damaged_or_disagreeing_memory_view_is_not_trusted(sample_store, tmp_path, damage):
    store = _copy(sample_store, tmp_path / "store")
    r = StoreReader(store)
    tenant = r.tenants()[1]
    f = view_path(r.version_dir, VIEW_MEMORY, r.part_of(tenant))
    if damage == "flipped":  # a byte in the vectors: the manifest's checksum catches it
        data = bytearray(f.read_bytes())
        data[len(data) // 2] ^= 0x40
        f.write_bytes(bytes(data))
    elif damage == "unchecksummed":
        m = json.loads((store / MANIFEST).read_text())
        del m[FILES_KEY][f.relative_to(r.version_dir).as_posix()]
        (store / MANIFEST).write_text(json.dumps(m))
    elif damage == "disagreeing":  # whole and vouched for, but made from other turn views
        batches = read_batches(f)
        tables = {t: pa.Table.from_batches([b]) for t, (b, _) in batches.items()}
        metas = {t: meta | ({"turn_ids_crc": meta["turn_ids_crc"] ^ 1} if t == tenant else {})
                 for t, (_, meta) in batches.items()}
        write_view(f, VIEW_MEMORY, tables, metas)
        _republish_checksum(store, f)
    else:
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
        _republish_checksum(store, f)
    r = StoreReader(store)
    index = _cache(store).get(tenant)
    with pytest.raises(ViewError):
        read_memory_view(r, tenant, index.node_ids, index.turn_order)
    assert memory.memory_view(index) is None
    assert _answers(store) == _answers(sample_store)


@pytest.mark.parametrize("keep", [3, 1])
def test_a_store_without_memory_views_gets_them_as_its_parts_are_carried(sample_store, tmp_path, keep):
    """A build carrying the tenants of a store written before memory views links their part (3 of
    its 4 tenants live) or rewrites it (1 of 4), and writes their memory views from Lance and the
    graphs either way; a part rewritten from one that has them copies them."""
    old = _copy(sample_store, tmp_path / "old", keep_memory=False)
    base = StoreReader(old)
    tenants = base.tenants()[:keep]
    w = StoreWriter(old, dim=base.dim)
    carried = w.carry_over(tenants, part_turns=10_000)
    assert set(carried.unremembered) == {carried.parts[t] for t in tenants}
    assert memory_views_from_tables(base, w.version_dir, carried.unremembered) == 1  # as a build's publish does
    manifest = dict(base.manifest, tenants={t: base.manifest["tenants"][t] | {"part": carried.parts[t]}
                                            for t in tenants}, part_tenants=carried.held)
    w.prune_parts(carried.parts)
    new = StoreReader(old, w.publish(manifest))
    cache = _cache(old)
    for tenant in tenants:
        index = cache.get(tenant)
        assert memory.memory_view(index) is not None, tenant
    answers = _answers(old)
    assert answers == {key: v for key, v in _answers(sample_store).items() if key[0] in tenants}
    # and from that version on, a part rewritten carries the memory views over
    w2 = StoreWriter(old, dim=new.dim)
    carried2 = w2.carry_over(tenants[:1], part_turns=10_000)
    assert not carried2.unremembered  # linked or rewritten with the memory view
    m2 = dict(new.manifest, tenants={tenants[0]: new.manifest["tenants"][tenants[0]]
                                     | {"part": carried2.parts[tenants[0]]}}, part_tenants=carried2.held)
    w2.prune_parts(carried2.parts)
    w2.publish(m2)
    assert memory.memory_view(_cache(old).get(tenants[0])) is not None
