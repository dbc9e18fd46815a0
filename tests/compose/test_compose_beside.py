"""The tenant steps that run on a side thread (memlib.compose.beside): the clue step beside the
extraction steps, the node fallbacks table beside finalize. The state they
leave is the one of the steps run in sequence (the same tables in the same order), and the
tenant fails with the error it would fail with in sequence."""
from __future__ import annotations

import threading
import time
from concurrent.futures import Future

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from memlib.compose import beside, reference
from memlib.compose.beside import THREAD_PREFIX, WAIT, BesideSteps
from memlib.compose.published_parts import PublishedParts
from memlib.compose.recipe import Step
from memlib.compose.reuse import PreviousTenant


def test_results_are_applied_at_the_join_in_the_order_started_on_the_calling_thread():
    beside, applied, ran_on = BesideSteps(), [], []
    slow = threading.Event()

    def step(name, wait):
        ran_on.append(threading.current_thread().name)
        if wait:
            slow.wait(5)
        return name

    beside.start("a", step, "a", True, apply=lambda r: applied.append((r, threading.current_thread().name)))
    beside.start("b", step, "b", False, apply=lambda r: applied.append((r, threading.current_thread().name)))
    time.sleep(0.05)
    assert applied == []  # nothing is applied before the join
    slow.set()
    beside.join()
    beside.close()
    here = threading.current_thread().name
    assert applied == [("a", here), ("b", here)]
    assert all(name.startswith(THREAD_PREFIX) for name in ran_on)
    assert set(beside.seconds) == {"a", "b", WAIT}


def test_join_upto_a_name_leaves_the_steps_started_after_it():
    beside, applied = BesideSteps(), []
    beside.join("clues")  # none pending: nothing to wait for
    beside.start("clues", lambda: 1, apply=applied.append)
    beside.start("node_fallbacks", lambda: 2, apply=applied.append)
    beside.join("clues")
    assert applied == [1]
    beside.join("clues")  # none pending any more
    assert applied == [1]
    beside.join()
    beside.close()
    assert applied == [1, 2]


def test_a_failed_side_step_is_raised_at_the_join_and_before_a_later_error():
    def fails():
        time.sleep(0.1)
        raise ValueError("side")

    beside = BesideSteps()
    beside.start("x", fails, apply=lambda r: None)
    with pytest.raises(ValueError, match="side"):
        beside.join()
    with pytest.raises(ValueError, match="side"):  # the failed step stays first for raise_first
        beside.raise_first()
    beside.start("x", fails, apply=lambda r: None)
    with pytest.raises(ValueError, match="side"):
        try:
            raise RuntimeError("a later step")
        except RuntimeError:
            beside.raise_first()
            raise
    beside.close()


@pytest.fixture(scope="module")
def tenant(locomo_path):
    from memlib.compose.recipe import DEFAULT_RECIPE, get_recipe
    from memlib.compose.reference import StepTools, TenantSessions, embed_turns, tenant_steps
    from memlib.compose.sessions import SessionOutput, session_keys, session_local, split_sessions
    from memlib.compose.vectors import TurnEncoder, TurnVectors, blends, own_pass
    from memlib.config import MemlibConfig
    from memlib.io.readers import read_input

    cfg = MemlibConfig()
    turns = read_input(str(locomo_path), "locomo").turns
    first = turns.column("tenant_id").unique().to_pylist()[0]
    sessions = split_sessions(turns.filter(pc.equal(turns.column("tenant_id"), first)))[:5]
    encoder = TurnEncoder(cfg, threads=2)
    plan = get_recipe(DEFAULT_RECIPE)
    nlp = None
    made = []
    for s in sessions:
        key = session_keys(s, "k")[0].as_py()
        tv = embed_turns(s, None, cfg, encoder)
        out, nlp = session_local((s, tv.vectors, key), cfg, plan, nlp)
        made.append((s, out, tv, key))
    tools = StepTools(nlp, {}, own_pass(cfg, encoder if blends(cfg) else encoder.passages))

    def build(n, previous=None):
        chosen = made[:n]
        return tenant_steps(TenantSessions(pa.concat_tables([s for s, *_ in chosen]),
                                           SessionOutput.concat([o for _, o, _, _ in chosen]),
                                           TurnVectors.concat([v for *_, v, _ in chosen], cfg.embed.dim),
                                           [k for *_, k in chosen], previous), cfg, plan, tools)

    return build


class _InLine:
    """An executor that runs each step where it is submitted: the steps in sequence, as before the
    side thread."""

    def __init__(self, *args, **kwargs) -> None:
        pass

    def submit(self, fn, *args) -> Future:
        future = Future()
        try:
            future.set_result(fn(*args))
        except Exception as exc:  # noqa: BLE001 - kept in the future, as an executor does
            future.set_exception(exc)
        return future

    def shutdown(self, wait: bool = True) -> None:
        pass


def _recorded(monkeypatch) -> tuple[list, list]:
    """The state's nodes and edges as the embed step starts, and finalize's inputs, per build."""
    before_embed, finalized = [], []
    real_embed, real_finalize = reference.TENANT_STEPS[Step.EMBED_NODES], reference.finalize

    def embed(state):
        before_embed.append((state.all_nodes(), state.all_edges()))
        return real_embed(state)

    def finalize(nodes, edges, dim):
        finalized.append((nodes, edges))
        return real_finalize(nodes, edges, dim)

    monkeypatch.setitem(reference.TENANT_STEPS, Step.EMBED_NODES, embed)
    monkeypatch.setattr(reference, "finalize", finalize)
    return before_embed, finalized


@pytest.mark.parametrize("reused", [False, True])
def test_the_side_thread_leaves_the_state_of_the_steps_in_sequence(tenant, monkeypatch, reused):
    previous = None
    if reused:
        published = tenant(4)
        previous = PreviousTenant.of(published.nodes, PublishedParts.of(published.edges, published.fallbacks,
                                                                        published.token_sums))
    before_embed, finalized = _recorded(monkeypatch)
    threads = []
    real_clues = reference.steps.clue_tables

    def clue_tables(state):
        threads.append(threading.current_thread().name)
        return real_clues(state)

    monkeypatch.setattr(reference.steps, "clue_tables", clue_tables)
    got = tenant(5, previous)
    with monkeypatch.context() as m:
        m.setattr(beside, "ThreadPoolExecutor", _InLine)
        m.setattr(reference, "BESIDE_CLUES", frozenset())  # its rows added before the next step starts
        want = tenant(5, previous)
    assert threads[0].startswith(THREAD_PREFIX) and not threads[1].startswith(THREAD_PREFIX)
    for (nodes, edges), (nodes_in_sequence, edges_in_sequence) in (before_embed, finalized):
        assert nodes.equals(nodes_in_sequence) and edges.equals(edges_in_sequence)  # the same rows, same order
    for name in ("nodes", "edges", "segments", "fallbacks", "token_sums"):
        assert getattr(got, name).equals(getattr(want, name)), name
    assert got.fallbacks is not None and got.fallbacks.num_rows > 0
    assert got.reused == want.reused and bool(got.reused.get("appended_only")) == reused
    assert {"clues", "node_fallbacks"} <= set(got.timings)


def test_the_clue_steps_error_fails_the_tenant_before_a_later_steps(tenant, monkeypatch):
    def clue_tables(state):
        time.sleep(0.2)  # the facts step has failed by now
        raise ValueError("the clue step failed")

    def facts(state):
        raise RuntimeError("the facts step failed")

    monkeypatch.setattr(reference.steps, "clue_tables", clue_tables)
    monkeypatch.setitem(reference.TENANT_STEPS, Step.FACTS, facts)
    with pytest.raises(ValueError, match="the clue step failed"):
        tenant(2)
    monkeypatch.setattr(reference.steps, "clue_tables", lambda state: (_ for _ in ()).throw(KeyError("clues")))
    monkeypatch.setitem(reference.TENANT_STEPS, Step.FACTS, lambda state: None)
    with pytest.raises(KeyError, match="clues"):
        tenant(2)
