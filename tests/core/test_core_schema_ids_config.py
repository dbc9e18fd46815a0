"""Data model foundations: schemas round-trip through Parquet and Lance, ids are stable,
config loading follows its documented precedence."""
from __future__ import annotations

import datetime as dt

import lancedb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from memlib import ids, schema
from memlib.config import ConfigError, MemlibConfig, load_config


def _value(field: pa.Field, i: int):
    t = field.type
    if pa.types.is_string(t):
        return f"{field.name}-{i}"
    if pa.types.is_integer(t):
        return i
    if pa.types.is_floating(t):
        return 0.5 + i
    if pa.types.is_timestamp(t):
        return dt.datetime(2023, 5, 8, 13, 56, tzinfo=dt.timezone.utc)
    if pa.types.is_binary(t):  # vectors stored as their bytes
        return np.linspace(0, 1, 8, dtype=np.float32).tobytes() + bytes([i])
    if pa.types.is_fixed_size_list(t):
        return list(np.linspace(0, 1, t.list_size, dtype=np.float32))
    if pa.types.is_list(t) and pa.types.is_integer(t.value_type):
        return [i, i + 7]
    if pa.types.is_list(t):
        return [f"turn:{i}", f"turn:{i + 1}"]
    raise AssertionError(f"no sample value for {field}")


def _sample(sch: pa.Schema, n: int = 3) -> pa.Table:
    return pa.table({f.name: pa.array([_value(f, i) for i in range(n)], f.type) for f in sch}, schema=sch)


@pytest.mark.parametrize("name", sorted(schema.TABLES))
def test_every_table_round_trips_through_parquet(tmp_path, name):
    sch = schema.TABLES[name]
    table = _sample(sch)
    pq.write_table(table, tmp_path / f"{name}.parquet")
    back = pq.read_table(tmp_path / f"{name}.parquet")
    schema.check(schema.conform(back, sch, name=name), sch, name=name)
    assert back.to_pylist() == table.to_pylist()


@pytest.mark.parametrize("name", sorted(schema.TABLES))
def test_every_table_round_trips_through_lance(tmp_path, name):
    sch = schema.TABLES[name]
    table = _sample(sch)
    db = lancedb.connect(str(tmp_path / "db"))
    db.create_table(name, data=table)
    back = db.open_table(name).to_arrow()
    back = schema.conform(back, sch, name=name)
    schema.check(back, sch, name=name)
    assert back.to_pylist() == table.to_pylist()


def test_conform_fills_optional_columns_and_names_missing_required_ones():
    t = pa.table({"tenant_id": ["t"], "src": ["a"], "dst": ["b"], "kind": ["NEXT"]})
    out = schema.conform(t, schema.EDGES, name="edges")
    assert out.column("weight").null_count == 1
    with pytest.raises(schema.SchemaError, match="edges: required column 'kind'"):
        schema.conform(t.drop(["kind"]), schema.EDGES, name="edges")
    with pytest.raises(schema.SchemaError, match="edges.src: 1 null"):
        schema.conform(t.set_column(1, "src", pa.array([None], pa.string())), schema.EDGES, name="edges")


def test_ids_are_deterministic_distinct_and_pinned():
    a = ids.turn_node_id("conv-26", "conv-26", "D1:3")
    assert a == ids.turn_node_id("conv-26", "conv-26", "D1:3")
    assert a.startswith("turn:") and len(a) == len("turn:") + ids.HEX_LEN
    assert a != ids.turn_node_id("conv-30", "conv-26", "D1:3")
    # parts are separated, not concatenated
    assert ids.make_id("fact", "ab", "c") != ids.make_id("fact", "a", "bc")
    assert ids.make_id("fact", None) != ids.make_id("fact", "")
    # pinned: a change here silently re-ids every store (breaks incremental rebuilds)
    assert ids.digest("memlib") == "5c2ed2fb9e17c4702649"


@pytest.mark.parametrize("call, args, expected", [
    ("content_hash", ("plain text \xe9",), "4a5a3d34dfeac384b0a3dc492f156eb2"),
    ("content_hash", ("a\x1fb",), "40cfa07e0c3371ba3354243717215019"),
    ("content_hash", ("x\x00y\x1b\x1ez",), "3090c71296e96cb0a995992aa90d072a"),
    ("content_hash", (7,), "9e287f590d2dcbbf387bfb70928e621d"),
    ("turn_node_id", ("t", "c\x1fx", "s"), "turn:aff1d03e4ba40d0f7aed"),
    ("turn_node_id", ("t", "c", "x\x1es"), "turn:8b449e01079bde23384b"),
    ("make_id", ("fact", "a\x1b", None), "fact:3de1b186fa2f796deeea"),
    ("digest", ("a\x00", "b"), "0d4feb6e868e3bb9e2d7"),
])
def test_ids_of_escaped_bytes_are_pinned(call, args, expected):
    # the fast paths (content_hash hashed directly, memchr checks for the escaped bytes) give the
    # ids stored stores hold, also for parts holding the separators, NUL or ESC
    assert getattr(ids, call)(*args) == expected


def test_config_precedence_defaults_file_env_overrides(tmp_path):
    assert load_config(environ={}).retrieve.k == MemlibConfig().retrieve.k
    toml = tmp_path / "c.toml"
    toml.write_text("[retrieve]\nk = 7\n[llm]\nmodel = 'from-file'\n")
    cfg = load_config(toml, environ={})
    assert (cfg.retrieve.k, cfg.llm.model) == (7, "from-file")
    cfg = load_config(toml, environ={"MEMLIB__RETRIEVE__K": "8"})
    assert (cfg.retrieve.k, cfg.llm.model) == (8, "from-file")
    cfg = load_config(toml, ["retrieve.k=9"], environ={"MEMLIB__RETRIEVE__K": "8"})
    assert cfg.retrieve.k == 9
    yml = tmp_path / "c.yaml"
    yml.write_text("graph:\n  damping: 0.5\n")
    assert load_config(yml, environ={}).graph.damping == 0.5


def test_config_reads_the_environment_only_where_an_entrypoint_passes_it(monkeypatch):
    # nothing below the entrypoints reads the process environment: load_config without ``environ``
    # ignores MEMLIB__ variables; the Python API and the CLI pass os.environ down
    from jobs.cli.common import get_config
    from memlib.api import load_settings

    monkeypatch.setenv("MEMLIB__RETRIEVE__K", "11")
    assert load_config().retrieve.k == MemlibConfig().retrieve.k != 11
    assert load_settings().retrieve.k == 11
    assert get_config(None, None).retrieve.k == 11
    assert load_settings(None, {"retrieve.k": 12}).retrieve.k == 12


def test_config_errors_are_clear_and_secrets_masked(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.toml", environ={})
    with pytest.raises(ConfigError, match="invalid configuration"):
        load_config(None, ["retrieve.no_such_key=1"], environ={})
    with pytest.raises(ConfigError, match="section.key=value"):
        load_config(None, ["retrieve.k"], environ={})
    cfg = load_config(None, ["llm.api_key=sk-secret-123"], environ={})
    assert cfg.llm.api_key.get_secret_value() == "sk-secret-123"
    assert "sk-secret-123" not in str(cfg.snapshot()) and "sk-secret-123" not in repr(cfg)
