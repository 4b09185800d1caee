"""Sans-IO request plans and what drives them (one plan, a sync and an asyncio driver).

A plan is a generator: it yields each :class:`Request` (or :class:`Sleep`) it wants made and is
sent the answer (a :class:`Reply`, ``None`` after a sleep); its return value is the result.
All the deciding is in the plan; a driver only does the I/O each step asks for.  :class:`Run`
steps a plan for a driver, so the sync and the asyncio driver of a plan differ only in their
calls and their awaits: the API clients (:mod:`.api`, whose plan is a fenced client's stamping,
:mod:`.fenced`), :func:`drive` / :func:`drive_async` (publish, release, claims, the grant
sources that read the API: :mod:`.publish`, :mod:`.podrequests`, :mod:`.sources`).

The request and its answer (:class:`Request`, :class:`Reply`) are defined here, under the API
client that sends them (:mod:`.api` imports this module; this module imports no sender: a
driver is handed one, :class:`Sender` / :class:`AsyncSender`).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Optional, Protocol, TypedDict, TypeVar, Union

from fencedlease.client.contract import GROUP
from fencedlease.client.errors import ApiError, RequestInfo, ResponseInfo, TransportError

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing's from 3.11 on

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


@dataclass(frozen=True)
class Reply:
    """An HTTP response of the API server, decoded."""

    request: RequestInfo
    status_code: int
    body: Any

    @property
    def ok(self) -> bool:
        return 200 <= self.status_code < 300

    def info(self) -> ResponseInfo:
        """The Kubernetes ``Status`` of an error response (reason and message)."""
        body = self.body
        if isinstance(body, dict) and body.get("kind") == "Status":
            return ResponseInfo(
                self.status_code,
                str(body.get("reason") or ""),
                str(body.get("message") or ""),
                body,
            )
        text = body if isinstance(body, str) else json.dumps(body)
        return ResponseInfo(self.status_code, "", text[:2000], body)

    def not_installed(self) -> str | None:
        """When this is the API server's 404 for a resource *type* it does not serve (not a
        missing object): what to say, naming the CRD to install."""
        return not_installed(self.request, self.status_code, self.body)

    def raise_for_status(self) -> Reply:
        if not self.ok:
            info = self.info()
            missing = self.not_installed()
            raise ApiError(
                missing or f"{self.request}: HTTP {self.status_code} {info.reason}: {info.message}",
                request=self.request,
                response=info,
                not_installed=missing is not None,
            )
        return self

    def json(self) -> dict[str, Any]:
        if not isinstance(self.body, dict):
            raise ApiError(
                f"{self.request}: expected a JSON object",
                request=self.request,
                response=self.info(),
            )
        return self.body


INSTALL_HINT = (
    "install fencedlease (helm install fencedlease charts/fencedlease, docs/install.md), "
    "or check the context (--context) names the cluster it runs in"
)


def not_installed(request: RequestInfo, status_code: int, body: Any) -> str | None:
    """For a 404 on a fencedlease resource that names no object (the API server does not
    serve the type: ``the server could not find the requested resource``): a message that
    the CRD is not installed, with :data:`INSTALL_HINT`; else ``None``."""
    marker = f"/apis/{GROUP}/"
    if status_code != 404 or marker not in request.url:
        return None
    if isinstance(body, dict):
        details = body.get("details")
        if isinstance(details, dict) and details.get("name"):
            return None  # an object of a served type is missing
    parts = request.url.split(marker, 1)[1].split("?")[0].split("/")[1:]  # after the version
    if parts[:1] == ["namespaces"]:
        parts = parts[2:]
    crd = f"{parts[0]}.{GROUP}" if parts and parts[0] else f"of the {GROUP} API group"
    return f"{request}: the CRD {crd} is not installed in this cluster: {INSTALL_HINT}"


class Sender(Protocol):
    """What :func:`drive` sends with: :class:`~fencedlease.client.api.KubeClient`."""

    def request(self, method: str, path: str, **options: Unpack[Options]) -> Reply: ...


class AsyncSender(Protocol):
    """What :func:`drive_async` sends with: :class:`~fencedlease.client.api.AsyncKubeClient`."""

    async def request(self, method: str, path: str, **options: Unpack[Options]) -> Reply: ...


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
    return Reply(exc.request, 0, {"kind": "Status", "reason": "Transport", "message": str(exc)})


Calls = Optional[list[RequestInfo]]
Sleeper = Callable[[float], Any]


def drive(steps: Plan[R], client: Sender, sleep: Sleeper = time.sleep, calls: Calls = None) -> R:
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
    client: AsyncSender,
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
