"""Sans-IO request plans and what drives them (one plan, a sync and an asyncio driver).

A plan is a generator: it yields each :class:`Request` (or :class:`Sleep`) it wants made and is
sent the answer (a :class:`~fencedlease.client.api.Reply`, ``None`` after a sleep); its return
value is the result.  All the deciding is in the plan; a driver only does the I/O each step
asks for.  :class:`Run` steps a plan for a driver, so the sync and the asyncio driver of a plan
differ only in their calls and their awaits: the API clients (:mod:`.api`, whose plan is a
fenced client's stamping, :mod:`.fenced`), :func:`drive` / :func:`drive_async` (publish,
release, claims: :mod:`.publish`, :mod:`.podrequests`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Optional, TypedDict, TypeVar, Union

from fencedlease.client.errors import RequestInfo, TransportError

if TYPE_CHECKING:
    from fencedlease.client.api import AsyncKubeClient, KubeClient, Reply

S = TypeVar("S")
A = TypeVar("A")
R = TypeVar("R")


class Options(TypedDict, total=False):
    """The keyword arguments of ``KubeClient.request`` (and of :class:`Request`)."""

    body: Any
    content_type: str | None
    params: dict[str, str] | None


@dataclass(frozen=True)
class Request:
    """An API request a plan wants made, as ``KubeClient.request`` takes it."""

    method: str
    path: str
    body: Any = None
    content_type: str | None = None
    params: dict[str, str] | None = None

    def options(self) -> Options:
        return {"body": self.body, "content_type": self.content_type, "params": self.params}


@dataclass(frozen=True)
class Sleep:
    """A pause the plan wants (backoff, polling)."""

    seconds: float


Step = Union[Request, Sleep]
Plan = Generator[Step, Optional["Reply"], R]


class Run(Generic[S, A, R]):
    """A plan being driven: iterate it for its steps and set :attr:`answer` to each one's
    answer (left ``None``: the plan is sent ``None``); :attr:`result` once it is done.

    With ``calls``, the request of each answer is appended to it (for logs and tests)."""

    def __init__(self, steps: Generator[S, A, R], calls: list[RequestInfo] | None = None) -> None:
        self.steps = steps
        self.calls = calls
        self.answer: A | None = None

    def __iter__(self) -> Iterator[S]:
        try:
            step = next(self.steps)
            while True:
                self.answer = None
                yield step
                step = self.steps.send(self.answer)  # type: ignore[arg-type]
        except StopIteration as done:
            self.result: R = done.value

    @contextmanager
    def answering(self) -> Iterator[None]:
        """Around a step's I/O: a transport error is answered as a reply with status 0."""
        try:
            yield
        except TransportError as exc:
            self.answer = _transport_reply(exc)  # type: ignore[assignment]
        request = getattr(self.answer, "request", None)
        if self.calls is not None and request is not None:
            self.calls.append(request)


def _transport_reply(exc: TransportError) -> Reply:
    from fencedlease.client.api import Reply

    return Reply(exc.request, 0, {"kind": "Status", "reason": "Transport", "message": str(exc)})


Calls = Optional[list[RequestInfo]]
Sleeper = Callable[[float], Any]


def drive(
    steps: Plan[R], client: KubeClient, sleep: Sleeper = time.sleep, calls: Calls = None
) -> R:
    """Run a plan with ``client``: each :class:`Request` sent (a transport error answered as
    status 0), each :class:`Sleep` slept; the plan's result. :func:`drive_async` is its asyncio
    twin."""
    run = Run(steps, calls)
    for step in run:
        with run.answering():
            if isinstance(step, Sleep):
                sleep(step.seconds)
                continue
            run.answer = client.request(step.method, step.path, **step.options())
    return run.result


async def drive_async(
    steps: Plan[R],
    client: AsyncKubeClient,
    sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    calls: Calls = None,
) -> R:
    """:func:`drive` with an asyncio client."""
    run = Run(steps, calls)
    for step in run:
        with run.answering():
            if isinstance(step, Sleep):
                await sleep(step.seconds)
                continue
            run.answer = await client.request(step.method, step.path, **step.options())
    return run.result
