"""A small Kubernetes API client for the fencedlease client (sync and asyncio, over httpx).

Only what a worker needs (read its Pod or lease, write a FencedArtifact), without the weight of
the operator's ``kubernetes_asyncio``/Kopf stack.  Configuration and credentials come from the
official ``kubernetes`` config loader (:mod:`fencedlease.client.kubeconfig`): kubeconfig files
(``$KUBECONFIG``, several merged; ``~/.kube/config``) with contexts and exec plugins, or,
inside a Pod, the mounted service account.
"""

from __future__ import annotations

import os
import ssl
import tempfile
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing's from 3.11 on

import httpx

from fencedlease.client.contract import ARTIFACTS, GROUP, LEASES, VERSION
from fencedlease.client.errors import ConfigError, RequestInfo, TransportError
from fencedlease.client.kubeconfig import SERVICE_ACCOUNT_DIR, load_in_cluster, load_kubeconfig
from fencedlease.client.plans import Options, Reply, Request, Run
from fencedlease.client.validation import api_path, dns_label, dns_subdomain


@dataclass(frozen=True)
class KubeConfig:
    """Where the API server is and who we are.  Build one with :meth:`load`, or directly.

    ``authorization``, when set, gives the ``Authorization`` header value for each request (the
    kubeconfig loader's: exec plugins, refreshed tokens); else ``token_file`` (re-read on every
    request), else ``token``."""

    server: str
    namespace: str = "default"
    ca_file: str | None = None
    ca_data: bytes | None = None
    token: str | None = field(default=None, repr=False)  # credentials are never shown
    token_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    cert_data: bytes | None = None
    key_data: bytes | None = field(default=None, repr=False)
    insecure: bool = False
    timeout: float = 10.0
    tls_server_name: str | None = None
    authorization: Callable[[], str | None] | None = field(default=None, compare=False, repr=False)

    @classmethod
    def load(
        cls,
        kubeconfig: str | os.PathLike[str] | None = None,
        *,
        context: str | None = None,
        timeout: float | None = None,
    ) -> KubeConfig:
        """``kubeconfig`` if given (one file, or several separated by ``os.pathsep``), else
        ``$KUBECONFIG`` (all its files, merged as kubectl does), else the in-cluster service
        account (inside a Pod), else ``~/.kube/config``.  ``context``: default the
        ``current-context``; ``timeout``: seconds per request (default 10).  Raises
        :class:`ConfigError`."""
        config = cls._load(kubeconfig, context)
        return config if timeout is None else replace(config, timeout=timeout)

    @classmethod
    def _load(cls, kubeconfig: str | os.PathLike[str] | None, context: str | None) -> KubeConfig:
        if kubeconfig is not None:
            return cls.from_kubeconfig(kubeconfig, context=context)
        env = os.environ.get("KUBECONFIG")
        if env and any(env.split(os.pathsep)):
            return cls.from_kubeconfig(env, context=context)
        if os.environ.get("KUBERNETES_SERVICE_HOST") and context is None:
            return cls.in_cluster()
        home = Path.home() / ".kube" / "config"
        if home.exists():
            return cls.from_kubeconfig(home, context=context)
        raise ConfigError(
            "no Kubernetes configuration: set KUBECONFIG, pass --kubeconfig, or run in a Pod"
        )

    @classmethod
    def in_cluster(cls, directory: Path = SERVICE_ACCOUNT_DIR) -> KubeConfig:
        """The mounted service account (``KUBERNETES_SERVICE_HOST``/``_PORT``); its token is
        re-read as the kubelet rotates it."""
        if not os.environ.get("KUBERNETES_SERVICE_HOST"):
            raise ConfigError("not in a Pod: KUBERNETES_SERVICE_HOST is not set")
        cfg, namespace, authorization = load_in_cluster(Path(directory))
        return cls._from_library(cfg, namespace, authorization)

    @classmethod
    def from_kubeconfig(
        cls, path: str | os.PathLike[str], *, context: str | None = None
    ) -> KubeConfig:
        """``path`` (one file, or several separated by ``os.pathsep``) and ``context``, read
        by the official ``kubernetes`` config loader (:mod:`fencedlease.client.kubeconfig`)."""
        cfg, namespace, authorization = load_kubeconfig(path, context)
        return cls._from_library(cfg, namespace, authorization)

    @classmethod
    def _from_library(
        cls, cfg: Any, namespace: str, authorization: Callable[[], str | None]
    ) -> KubeConfig:
        return cls(
            server=str(cfg.host).rstrip("/"),
            namespace=namespace,
            ca_file=cfg.ssl_ca_cert or None,
            cert_file=cfg.cert_file or None,
            key_file=cfg.key_file or None,
            insecure=not cfg.verify_ssl,
            tls_server_name=getattr(cfg, "tls_server_name", None) or None,
            authorization=authorization,
        )

    def ssl_context(self) -> ssl.SSLContext:
        """The TLS context; a CA or client certificate that cannot be loaded is a
        :class:`ConfigError` (one line), not an ``ssl``/``OSError`` traceback."""
        try:
            return self._ssl_context()
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            raise ConfigError(
                f"cannot load the TLS configuration for {self.server}: {exc}"
            ) from exc

    def _ssl_context(self) -> ssl.SSLContext:
        if self.insecure:
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        elif self.ca_data is not None:
            ctx = ssl.create_default_context(cadata=self.ca_data.decode())
        elif self.ca_file is not None:
            ctx = ssl.create_default_context(cafile=self.ca_file)
        else:
            ctx = ssl.create_default_context()
        # Python 3.13's default adds X.509 strict mode, which refuses certificates kubectl
        # (Go) accepts: an API server CA without an Authority Key Identifier, for one.
        ctx.verify_flags &= ~ssl.VERIFY_X509_STRICT
        if self.cert_file and self.key_file:
            ctx.load_cert_chain(self.cert_file, self.key_file)
        elif self.cert_data and self.key_data:
            # The ssl module loads client certificates from files only: write them to a
            # private temporary directory just long enough to load them.
            with tempfile.TemporaryDirectory(prefix="fencedlease-") as tmp:
                cert, key = Path(tmp) / "cert.pem", Path(tmp) / "key.pem"
                cert.write_bytes(self.cert_data)
                key.touch(mode=0o600)
                key.write_bytes(self.key_data)
                ctx.load_cert_chain(str(cert), str(key))
        return ctx

    def headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": "fencedlease-client"}
        if self.authorization is not None:
            value = self.authorization()
            if value:
                headers["Authorization"] = value
            return headers
        token = self.token
        if self.token_file:
            try:
                token = Path(self.token_file).read_text().strip()
            except OSError as exc:
                raise ConfigError(f"cannot read token file {self.token_file}: {exc}") from exc
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return headers


def _decode(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return response.text


def _extensions(config: KubeConfig) -> dict[str, Any]:
    """The kubeconfig's ``tls-server-name``: the name sent (SNI) and verified."""
    return {"sni_hostname": config.tls_server_name} if config.tls_server_name else {}


def _headers(config: KubeConfig, content_type: str | None) -> dict[str, str]:
    headers = config.headers()
    if content_type:
        headers["Content-Type"] = content_type
    return headers


H = TypeVar("H", httpx.Client, httpx.AsyncClient)


class _Client(Generic[H]):
    """What the two clients share: the configuration, how a request is built and its answer
    read, and the plan of a call (one request; a fenced client's stamping plan, :mod:`.fenced`).
    :class:`KubeClient` and :class:`AsyncKubeClient` differ only in the httpx client they hold
    and the call that sends (and its await)."""

    http_class: Callable[..., H]

    def __init__(self, config: KubeConfig | None = None) -> None:
        self.config = config or KubeConfig.load()
        verify = self.config.ssl_context()
        self._http: H = self.http_class(
            base_url=self.config.server, verify=verify, timeout=self.config.timeout
        )

    @property
    def namespace(self) -> str:
        return self.config.namespace

    def _plan(self, request: Request) -> Generator[Request, Reply, Reply]:
        """The requests of one call: here the request itself (see :mod:`.fenced`)."""
        return (yield request)

    def _build(self, send: Request) -> tuple[RequestInfo, httpx.Request]:
        """The one place every request is made: its path is checked here
        (:func:`~fencedlease.client.validation.api_path`), whoever built it."""
        path = api_path(send.path)
        info = RequestInfo(send.method, f"{self.config.server}{path}")
        request = self._http.build_request(
            send.method,
            path,
            json=send.body,
            params=send.params,
            headers=_headers(self.config, send.content_type),
            extensions=_extensions(self.config),
        )
        return info, request


@contextmanager
def _sending(info: RequestInfo, timeout: float) -> Iterator[None]:
    """Around a send: an httpx failure is a :class:`TransportError` naming the request and
    saying what happened (refused, timed out) in words."""
    try:
        yield
    except httpx.TimeoutException as exc:
        what = f"no answer from the API server within {timeout:g}s (--request-timeout)"
        raise TransportError(f"{info}: {what}", request=info) from exc
    except httpx.ConnectError as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        what = f"cannot connect to the API server: {reason}"
        raise TransportError(f"{info}: {what}", request=info) from exc
    except httpx.HTTPError as exc:
        raise TransportError(f"{info}: {type(exc).__name__}: {exc}", request=info) from exc


def _reply(info: RequestInfo, response: httpx.Response) -> Reply:
    return Reply(info, response.status_code, _decode(response))


class KubeClient(_Client[httpx.Client]):
    """Synchronous API client.  Use as a context manager, or call :meth:`close`."""

    http_class = httpx.Client

    def request(self, method: str, path: str, **options: Unpack[Options]) -> Reply:
        """Send ``method`` ``path`` (keywords ``body``, ``content_type``, ``params``)."""
        run = Run(self._plan(Request(method, path, **options)))
        for send in run:
            info, request = self._build(send)
            with _sending(info, self.config.timeout):
                run.answer = _reply(info, self._http.send(request))
        return run.result

    def get(self, path: str, params: dict[str, str] | None = None) -> dict[str, Any]:
        return self.request("GET", path, params=params).raise_for_status().json()

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> KubeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncKubeClient(_Client[httpx.AsyncClient]):
    """Asyncio API client.  Use as an async context manager, or await :meth:`aclose`."""

    http_class = httpx.AsyncClient

    async def request(self, method: str, path: str, **options: Unpack[Options]) -> Reply:
        """See :meth:`KubeClient.request`."""
        run = Run(self._plan(Request(method, path, **options)))
        for send in run:
            info, request = self._build(send)
            with _sending(info, self.config.timeout):
                run.answer = _reply(info, await self._http.send(request))
        return run.result

    async def get(self, path: str, params: dict[str, str] | None = None) -> dict[str, Any]:
        return (await self.request("GET", path, params=params)).raise_for_status().json()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncKubeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def artifact_path(namespace: str, name: str | None = None) -> str:
    """The URL path of FencedArtifacts in ``namespace`` (of ``name`` when given).  Both are
    checked (a DNS label and a DNS subdomain): an unchecked ``cart/status`` would address the
    status subresource."""
    base = f"/apis/{GROUP}/{VERSION}/namespaces/{dns_label(namespace)}/{ARTIFACTS}"
    return f"{base}/{dns_subdomain(name, 'FencedArtifact name')}" if name is not None else base


def lease_path(namespace: str, name: str | None = None) -> str:
    """The URL path of FencedLeases in ``namespace`` (of ``name`` when given), checked."""
    base = f"/apis/{GROUP}/{VERSION}/namespaces/{dns_label(namespace)}/{LEASES}"
    return f"{base}/{dns_subdomain(name, 'FencedLease name')}" if name is not None else base


def pod_path(namespace: str, name: str) -> str:
    """The URL path of Pod ``name`` in ``namespace``, checked."""
    return f"/api/v1/namespaces/{dns_label(namespace)}/pods/{dns_subdomain(name, 'Pod name')}"


def events_path(namespace: str) -> str:
    """The URL path of the core Events in ``namespace``, checked."""
    return f"/api/v1/namespaces/{dns_label(namespace)}/events"
