"""A small Kubernetes API client for the fencedlease client (sync and asyncio, over httpx).

Only what a worker needs (read its Pod or lease, write a FencedArtifact), without the weight of
the operator's ``kubernetes_asyncio``/Kopf stack.  Configuration comes from a kubeconfig file
(``$KUBECONFIG``, ``~/.kube/config``) or, inside a Pod, from the mounted service account
(whose token is re-read on every request: projected tokens rotate).
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from fencedlease.client.errors import (
    ApiError,
    ConfigError,
    RequestInfo,
    ResponseInfo,
    TransportError,
)
from fencedlease.client.validation import dns_label, dns_subdomain

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


@dataclass(frozen=True, slots=True)
class KubeConfig:
    """Where the API server is and who we are.  Build one with :meth:`load`, or directly."""

    server: str
    namespace: str = "default"
    ca_file: str | None = None
    ca_data: bytes | None = None
    token: str | None = None
    token_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    cert_data: bytes | None = None
    key_data: bytes | None = None
    insecure: bool = False
    timeout: float = 10.0

    @classmethod
    def load(
        cls, kubeconfig: str | os.PathLike[str] | None = None, *, context: str | None = None
    ) -> KubeConfig:
        """``kubeconfig`` if given, else ``$KUBECONFIG``, else the in-cluster service account
        (inside a Pod), else ``~/.kube/config``."""
        if kubeconfig is not None:
            return cls.from_kubeconfig(kubeconfig, context=context)
        env = os.environ.get("KUBECONFIG")
        if env:
            first = next((p for p in env.split(os.pathsep) if p), None)
            if first:
                return cls.from_kubeconfig(first, context=context)
        if os.environ.get("KUBERNETES_SERVICE_HOST"):
            return cls.in_cluster()
        home = Path.home() / ".kube" / "config"
        if home.exists():
            return cls.from_kubeconfig(home, context=context)
        raise ConfigError(
            "no Kubernetes configuration: set KUBECONFIG, pass --kubeconfig, or run in a Pod"
        )

    @classmethod
    def in_cluster(cls, directory: Path = SERVICE_ACCOUNT_DIR) -> KubeConfig:
        host = os.environ.get("KUBERNETES_SERVICE_HOST")
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if not host:
            raise ConfigError("not in a Pod: KUBERNETES_SERVICE_HOST is not set")
        if ":" in host:
            host = f"[{host}]"
        token_file = directory / "token"
        if not token_file.exists():
            raise ConfigError(f"no service-account token at {token_file}")
        ns_file = directory / "namespace"
        namespace = ns_file.read_text().strip() if ns_file.exists() else "default"
        return cls(
            server=f"https://{host}:{port}",
            namespace=os.environ.get("POD_NAMESPACE") or namespace,
            ca_file=str(directory / "ca.crt"),
            token_file=str(token_file),
        )

    @classmethod
    def from_kubeconfig(
        cls, path: str | os.PathLike[str], *, context: str | None = None
    ) -> KubeConfig:
        import yaml  # only needed here (a dependency of fencedlease already)

        source = Path(path).expanduser()
        try:
            raw = yaml.safe_load(source.read_text()) or {}
        except OSError as exc:
            raise ConfigError(f"cannot read kubeconfig {source}: {exc}") from exc
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            raise ConfigError(f"kubeconfig {source} is not valid YAML: {exc}") from exc
        if not isinstance(raw, dict):
            raise ConfigError(f"kubeconfig {source} is not a mapping")

        def named(kind: str, name: str | None) -> dict[str, Any]:
            for item in raw.get(kind) or []:
                if isinstance(item, dict) and item.get("name") == name:
                    value = item.get(kind[:-1]) or {}
                    return value if isinstance(value, dict) else {}
            raise ConfigError(f"kubeconfig {source}: no {kind[:-1]} named {name!r}")

        ctx_name = context or raw.get("current-context")
        if not ctx_name:
            raise ConfigError(f"kubeconfig {source}: no current-context")
        ctx = named("contexts", ctx_name)
        cluster = named("clusters", ctx.get("cluster"))
        user = named("users", ctx.get("user")) if ctx.get("user") else {}
        base = source.parent

        def rel(value: Any) -> str | None:
            if not value:
                return None
            p = Path(str(value)).expanduser()
            return str(p if p.is_absolute() else base / p)

        def data(value: Any) -> bytes | None:
            if not value:
                return None
            try:
                return base64.b64decode(str(value), validate=True)
            except ValueError as exc:
                raise ConfigError(f"kubeconfig {source}: bad base64 data: {exc}") from exc

        server = cluster.get("server")
        if not server:
            raise ConfigError(f"kubeconfig {source}: cluster {ctx.get('cluster')!r} has no server")
        return cls(
            server=str(server).rstrip("/"),
            namespace=str(ctx.get("namespace") or "default"),
            ca_file=rel(cluster.get("certificate-authority")),
            ca_data=data(cluster.get("certificate-authority-data")),
            insecure=bool(cluster.get("insecure-skip-tls-verify", False)),
            token=user.get("token"),
            token_file=rel(user.get("tokenFile")),
            cert_file=rel(user.get("client-certificate")),
            key_file=rel(user.get("client-key")),
            cert_data=data(user.get("client-certificate-data")),
            key_data=data(user.get("client-key-data")),
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
        token = self.token
        if self.token_file:
            try:
                token = Path(self.token_file).read_text().strip()
            except OSError as exc:
                raise ConfigError(f"cannot read token file {self.token_file}: {exc}") from exc
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return headers


@dataclass(frozen=True, slots=True)
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

    def raise_for_status(self) -> Reply:
        if not self.ok:
            info = self.info()
            raise ApiError(
                f"{self.request}: HTTP {self.status_code} {info.reason}: {info.message}",
                request=self.request,
                response=info,
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


def _decode(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return response.text


def _headers(config: KubeConfig, content_type: str | None) -> dict[str, str]:
    headers = config.headers()
    if content_type:
        headers["Content-Type"] = content_type
    return headers


class KubeClient:
    """Synchronous API client.  Use as a context manager, or call :meth:`close`."""

    def __init__(self, config: KubeConfig | None = None) -> None:
        self.config = config or KubeConfig.load()
        self._http = httpx.Client(
            base_url=self.config.server,
            verify=self.config.ssl_context(),
            timeout=self.config.timeout,
        )

    @property
    def namespace(self) -> str:
        return self.config.namespace

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        content_type: str | None = None,
        params: dict[str, str] | None = None,
    ) -> Reply:
        info = RequestInfo(method, f"{self.config.server}{path}")
        try:
            response = self._http.request(
                method,
                path,
                json=body,
                params=params,
                headers=_headers(self.config, content_type),
            )
        except httpx.HTTPError as exc:
            raise TransportError(f"{info}: {type(exc).__name__}: {exc}", request=info) from exc
        return Reply(info, response.status_code, _decode(response))

    def get(self, path: str, params: dict[str, str] | None = None) -> dict[str, Any]:
        return self.request("GET", path, params=params).raise_for_status().json()

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> KubeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncKubeClient:
    """Asyncio API client.  Use as an async context manager, or await :meth:`aclose`."""

    def __init__(self, config: KubeConfig | None = None) -> None:
        self.config = config or KubeConfig.load()
        self._http = httpx.AsyncClient(
            base_url=self.config.server,
            verify=self.config.ssl_context(),
            timeout=self.config.timeout,
        )

    @property
    def namespace(self) -> str:
        return self.config.namespace

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        content_type: str | None = None,
        params: dict[str, str] | None = None,
    ) -> Reply:
        info = RequestInfo(method, f"{self.config.server}{path}")
        try:
            response = await self._http.request(
                method,
                path,
                json=body,
                params=params,
                headers=_headers(self.config, content_type),
            )
        except httpx.HTTPError as exc:
            raise TransportError(f"{info}: {type(exc).__name__}: {exc}", request=info) from exc
        return Reply(info, response.status_code, _decode(response))

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
    from fencedlease.client._contract import ARTIFACTS, GROUP, VERSION

    base = f"/apis/{GROUP}/{VERSION}/namespaces/{dns_label(namespace)}/{ARTIFACTS}"
    return f"{base}/{dns_subdomain(name, 'FencedArtifact name')}" if name is not None else base


def lease_path(namespace: str, name: str | None = None) -> str:
    """The URL path of FencedLeases in ``namespace`` (of ``name`` when given), checked."""
    from fencedlease.client._contract import GROUP, LEASES, VERSION

    base = f"/apis/{GROUP}/{VERSION}/namespaces/{dns_label(namespace)}/{LEASES}"
    return f"{base}/{dns_subdomain(name, 'FencedLease name')}" if name is not None else base


def pod_path(namespace: str, name: str) -> str:
    """The URL path of Pod ``name`` in ``namespace``, checked."""
    return f"/api/v1/namespaces/{dns_label(namespace)}/pods/{dns_subdomain(name, 'Pod name')}"


def events_path(namespace: str) -> str:
    """The URL path of the core Events in ``namespace``, checked."""
    return f"/api/v1/namespaces/{dns_label(namespace)}/events"
