"""A small LangGraph agent for the tests and the example: a fake chat model (no
network) that streams its answer token by token, a step that can be made slow,
and a step that asks a human (``interrupt()``)."""

from __future__ import annotations

import asyncio
import operator
import os
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.config import get_stream_writer
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.pregel import Pregel
from langgraph.types import interrupt

__all__ = ["SLOW_ENV", "State", "build_agent", "env_pause"]

#: Seconds the ``slow`` step of a message containing "slow" sleeps in this process.
SLOW_ENV = "TENURE_TEST_SLOW"


class State(MessagesState):
    steps: Annotated[list[str], operator.add]


async def env_pause() -> None:
    await asyncio.sleep(float(os.environ.get(SLOW_ENV, "0")))


def _text(state: State) -> str:
    return str(state["messages"][-1].content)


def build_agent(
    checkpointer: BaseCheckpointSaver[Any], pause: Callable[[], Awaitable[None]] = env_pause
) -> Pregel[Any, Any, Any, Any]:
    """think -> slow -> chat -> approve: ``slow`` waits on ``pause`` for a message
    containing "slow"; ``approve`` asks a human for a message containing "approve"."""

    def think(state: State) -> dict[str, Any]:
        return {"steps": ["think"]}

    async def slow(state: State) -> dict[str, Any]:
        if "slow" in _text(state):
            get_stream_writer()({"pausing": "slow"})  # "think" is checkpointed by now
            await pause()
        return {"steps": ["slow"]}

    async def chat(state: State) -> dict[str, Any]:
        answer = AIMessage(content=f"you said: {_text(state)}")
        model = GenericFakeChatModel(messages=iter([answer]))
        return {"messages": [await model.ainvoke(state["messages"])], "steps": ["chat"]}

    def approve(state: State) -> dict[str, Any]:
        asked = any("approve" in str(m.content) for m in state["messages"][-2:-1])
        if not asked:
            return {"steps": ["approve"]}
        answer = interrupt({"question": "approve?"})
        return {"messages": [("ai", f"approved: {answer}")], "steps": ["approve"]}

    builder = StateGraph(State)
    for name, node in (("think", think), ("slow", slow), ("chat", chat), ("approve", approve)):
        builder.add_node(name, node)
    builder.add_edge(START, "think")
    builder.add_edge("think", "slow")
    builder.add_edge("slow", "chat")
    builder.add_edge("chat", "approve")
    builder.add_edge("approve", END)
    return builder.compile(checkpointer=checkpointer)
