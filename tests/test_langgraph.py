"""The LangGraph store adapter against the real ``langgraph`` package: a compiled graph with an
in-memory checkpointer (no LLM) keeps and recalls memories through ``HybridMemStore``."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import Any, TypedDict

import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.store.base import (
    BaseStore,
    GetOp,
    Item,
    ListNamespacesOp,
    MatchCondition,
    PutOp,
    SearchOp,
)

from hybridmem import InvalidInputError, Memory
from hybridmem.langgraph import CATEGORY, HybridMemStore


class State(TypedDict, total=False):
    message: str
    recalled: list[str]


def _graph(store: BaseStore) -> Any:
    """Store the user's message, then recall what the user said that fits it best."""

    def remember(state: State, config: RunnableConfig, *, store: BaseStore) -> State:
        user = config["configurable"]["user_id"]
        n = len(store.search((user, "said"), limit=100))
        store.put((user, "said"), f"m{n}", {"text": state["message"]})
        return {}

    def recall(state: State, config: RunnableConfig, *, store: BaseStore) -> State:
        user = config["configurable"]["user_id"]
        hits = store.search((user,), query=state["message"], limit=2)
        return {"recalled": [h.value["text"] for h in hits]}

    builder = StateGraph(State)
    builder.add_node("remember", remember)
    builder.add_node("recall", recall)
    builder.add_edge(START, "remember")
    builder.add_edge("remember", "recall")
    builder.add_edge("recall", END)
    return builder.compile(checkpointer=InMemorySaver(), store=store)


def test_a_compiled_graph_keeps_memories_per_user(mem: Memory, unique_user: str) -> None:
    graph = _graph(HybridMemStore(mem))
    alice = {"configurable": {"thread_id": "t-alice", "user_id": unique_user}}
    bob = {"configurable": {"thread_id": "t-bob", "user_id": unique_user + "-bob"}}
    graph.invoke({"message": "I bought a ROG laptop"}, alice)
    graph.invoke({"message": "I live in Lyon"}, alice)
    graph.invoke({"message": "I love ramen"}, bob)
    out = graph.invoke({"message": "which laptop do I have?"}, alice)
    assert "I bought a ROG laptop" in out["recalled"]
    assert "I love ramen" not in out["recalled"]  # users never see each other's memories
    # the checkpointer kept the thread's state; the memories are hybridmem memories
    assert graph.get_state(alice).values["recalled"] == out["recalled"]
    assert {h.item.text for h in mem.search(unique_user, "Lyon")} >= {'{"text": "I live in Lyon"}'}
    assert all(i.category == CATEGORY and i.kind == "turn" for i in mem.list(unique_user))


def test_batch_get_put_search_and_namespaces(mem: Memory, unique_user: str) -> None:
    store = HybridMemStore(mem)
    prefs, trips = (unique_user, "prefs"), (unique_user, "trips", "2025")
    store.batch([
        PutOp(prefs, "food", {"text": "Likes spicy ramen", "n": 3}),
        PutOp(prefs, "same", {"text": "Likes spicy ramen", "n": 5}),  # equal text, own item
        PutOp(trips, "lisbon", {"text": "Flies to Lisbon in May", "n": 1}, index=["text"]),
        PutOp(prefs, "hidden", {"text": "Secret ramen stash"}, index=False),
    ])
    got = store.batch([GetOp(prefs, "food"), GetOp(prefs, "missing")])
    assert isinstance(got[0], Item) and got[0].value == {"text": "Likes spicy ramen", "n": 3}
    assert got[0].namespace == prefs and got[1] is None

    found = store.search((unique_user,), query="ramen")
    assert {i.key for i in found} == {"food", "same", "lisbon"}  # hidden: index=False
    assert all(i.score is not None for i in found) and found[0].key in {"food", "same"}
    assert [i.key for i in store.search((unique_user,), filter={"n": {"$gte": 3}})] == [
        "food", "same"]
    assert [i.key for i in store.search(prefs, filter={"text": "Secret ramen stash"})] == [
        "hidden"]
    assert [i.key for i in store.search((unique_user, "trips"))] == ["lisbon"]
    assert store.search((unique_user, "nowhere")) == []

    store.put(prefs, "food", {"text": "Likes sushi"})  # a new value replaces, in place
    assert store.get(prefs, "food").value == {"text": "Likes sushi"}  # type: ignore[union-attr]
    assert len(store.search(prefs, limit=10)) == 3
    store.delete(prefs, "same")
    assert store.get(prefs, "same") is None

    (names,) = store.batch([ListNamespacesOp(
        match_conditions=(MatchCondition("prefix", (unique_user,)),))])
    assert names == [prefs, trips]
    assert store.list_namespaces(prefix=(unique_user,), max_depth=2) == [
        prefs, (unique_user, "trips")]
    assert store.list_namespaces(prefix=(unique_user, "*"), suffix=("2025",)) == [trips]
    assert store.batch([SearchOp((unique_user + "-other",))]) == [[]]


def test_async_calls_and_an_async_graph(mem: Memory, unique_user: str) -> None:
    store = HybridMemStore(mem)

    async def run() -> list[str]:
        await store.aput((unique_user, "notes"), "a", {"text": "Works from home on Fridays"})
        got = await store.aget((unique_user, "notes"), "a")
        assert got is not None and got.value == {"text": "Works from home on Fridays"}
        out = await _graph(store).ainvoke(
            {"message": "when do I work from home?"},
            {"configurable": {"thread_id": "t", "user_id": unique_user}})
        return list(out["recalled"])

    assert "Works from home on Fridays" in asyncio.run(run())


def test_what_cannot_map_is_refused(mem: Memory) -> None:
    store = HybridMemStore(mem)
    with pytest.raises(InvalidInputError, match="user id"):
        store.batch([SearchOp(())])  # a search across every user
    with pytest.raises(InvalidInputError, match="naming the user"):
        store.list_namespaces()
    with pytest.raises(InvalidInputError, match="labels"):
        store.put(("u", *[f"l{i}" for i in range(9)]), "k", {"text": "too deep"})
    with pytest.raises(InvalidInputError):
        store.put(("bad user/id",), "k", {"text": "not a valid user id"})
    with pytest.raises(InvalidInputError, match="Memory"):
        HybridMemStore("not a memory")  # type: ignore[arg-type]


def test_a_missing_extra_names_the_install_command() -> None:
    done = subprocess.run(
        [sys.executable, "-c", "import sys; sys.modules['langgraph'] = None; "
         "import hybridmem.langgraph"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "pip install 'hybridmem[langgraph]'" in done.stderr


def test_a_contradicting_item_never_hides_another(mem: Memory, unique_user: str) -> None:
    """hybridmem supersedes "I live in Lyon" with "I live in Paris"; the store still has both."""
    store = HybridMemStore(mem)
    home = (unique_user, "home")
    store.put(home, "2023", {"text": "I live in Lyon"}, index=["text"])
    store.put(home, "2024", {"text": "I live in Paris"}, index=["text"])
    assert [getattr(store.get(home, k), "value", None) for k in ("2023", "2024")] == [
        {"text": "I live in Lyon"}, {"text": "I live in Paris"}]
    assert {i.key for i in store.search(home, query="where do I live?")} == {"2023", "2024"}
    store.put(home, "2023", {"text": "I live in Lyon, near the river"}, index=["text"])
    assert len(store.search(home)) == 2  # the put updated the one item, made no second
