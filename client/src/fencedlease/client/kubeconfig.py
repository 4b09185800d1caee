"""Kubernetes configuration and credentials through the official ``kubernetes`` config loader.

Why that library (docs/client.md): it is the reference implementation maintained with the
Kubernetes project, and it already does what a worker meets on real clusters: ``exec``
credential plugins (EKS, GKE, AKS), ``auth-provider`` (OIDC, legacy GCP/Azure), several
``$KUBECONFIG`` files merged, contexts, client certificates and CA data, expiring tokens
refreshed, in-cluster service-account tokens re-read as they rotate.  It pulls no Kopf, gRPC or
pydantic.  We use only its configuration half: the requests stay on httpx (sync and asyncio
alike, :mod:`fencedlease.client.api`); the library fills a ``kubernetes.client.Configuration``
and we read the server, TLS files and ``Authorization`` value from it on every request (so its
refresh hook runs: an exec plugin is run again when its credential expires).

Two places where the library differs from kubectl are corrected here: with several files in
``$KUBECONFIG`` the *first* file that sets ``current-context`` wins (the library lets the last
one win), and a failing exec plugin is an error (the library only logs it and sends the request
without credentials).  Every failure is a :class:`~fencedlease.client.errors.ConfigError` with
one line of explanation, with every credential redacted (:func:`redact`, applied where the
errors are made: :func:`failing`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from fencedlease.client.errors import ConfigError

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")

REDACTED = "<redacted>"
SECRET_KEYS = (
    "token",
    "id-token",
    "refresh-token",
    "access-token",
    "access_token",
    "client-secret",
    "client-key-data",
    "password",
    "secret",
    "apiKey",
    "api-key",
)
"""Keys whose values are credentials wherever they appear in a message: ``key: value``,
``'key': 'value'``, ``"key": "value"``, ``key=value``."""
_KEYS = "|".join(re.escape(k) for k in SECRET_KEYS)
_SECRET_VALUE = re.compile(
    r"""(?P<key>['"]?(?<![\w-])(?:"""  # a whole key: not fencingToken's "Token"
    + _KEYS
    + r""")['"]?\s*[:=]\s*)(?P<quote>['"]?)(?P<value>[^'"\s,}\]]+)""",
    re.IGNORECASE,
)
_ENV_VALUE = re.compile(
    r"""(?P<key>['"]?name['"]?\s*[:=]\s*['"]?[\w.-]+['"]?,?\s*['"]?value['"]?\s*[:=]\s*)"""
    r"""(?P<quote>['"]?)(?P<value>[^'"\s,}\]]+)"""
)
"""An exec plugin's ``env`` entry, ``{name: X, value: <secret>}``, in any rendering."""
_BEARER = re.compile(r"(?P<key>\b(?:Bearer|Basic)\s+)(?P<quote>)(?P<value>[A-Za-z0-9._~+/=-]+)")
_NOT_SECRET = frozenset(
    {
        "name",
        "command",
        "apiVersion",
        "interactiveMode",
        "installHint",
        "provideClusterInfo",
        "username",
        "client-certificate",  # file paths, which an error about them must name
        "client-key",
        "tokenFile",
        "idp-issuer-url",
        "client-id",
    }
)
"""Keys of a kubeconfig user whose values are not credentials (and name what failed)."""


def redact(text: str, secrets: frozenset[str] = frozenset()) -> str:
    """``text`` with every credential replaced by ``<redacted>``: each of ``secrets`` (the
    values of the kubeconfig's users, :func:`user_secrets`) wherever it appears, and whatever
    follows a credential's key (:data:`SECRET_KEYS`) or ``Bearer``."""
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, REDACTED).replace(_fold(secret), REDACTED)
    for pattern in (_SECRET_VALUE, _ENV_VALUE, _BEARER):
        text = pattern.sub(lambda m: f"{m['key']}{m['quote']}{REDACTED}", text)
    return text


def redacted_line(text: str, limit: int) -> str:
    """``text`` as one line for a message: whitespace folded (so a credential's key and its
    value on separate lines are still seen together), credentials redacted (:func:`redact`),
    at most ``limit`` characters. The client's commands (``cli_error``) and the operator's
    ``fencedlease etcd`` (``kube_error``) render their errors with it."""
    return redact(" ".join(text.split()))[:limit]


def user_secrets(raw: object) -> set[str]:
    """Every string a kubeconfig's ``users`` hold that could be a credential (all but
    :data:`_NOT_SECRET`'s; at least 4 characters), for :func:`redact`."""
    found: set[str] = set()

    def walk(node: object, key: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, str(k))
        elif isinstance(node, list):
            for v in node:
                walk(v, key)
        elif isinstance(node, (str, bytes)) and key not in _NOT_SECRET:
            text = node.decode(errors="replace") if isinstance(node, bytes) else node
            if len(text) >= 4:
                found.add(text)

    if isinstance(raw, dict):
        walk(raw.get("users"), "users")
    return found


@contextlib.contextmanager
def failing(secrets: frozenset[str] = frozenset()) -> Iterator[None]:
    """The one place a configuration error is rendered: a :class:`ConfigError` leaving the
    block is re-raised as one line with ``secrets`` and every credential redacted."""
    try:
        yield
    except ConfigError as exc:
        raise ConfigError(redact(_one_line(exc), secrets)[:1000]) from exc.__cause__


@contextlib.contextmanager
def library_errors() -> Iterator[list[str]]:
    """Collect what the config loader reports only through ``logging.error`` (an exec plugin
    that fails or prints no credential) instead of letting it print on the root logger."""
    errors: list[str] = []

    class _Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.ERROR:
                lines = record.getMessage().strip().splitlines()
                errors.append(_fold(lines[0]) if lines else "(no message)")

    root = logging.getLogger()
    handler = _Collect()
    # With a handler on the root logger, logging.error() does not call basicConfig() either.
    root.addHandler(handler)
    try:
        yield errors
    finally:
        root.removeHandler(handler)


def kubeconfig_paths(value: str | os.PathLike[str]) -> list[Path]:
    """The files of a kubeconfig list (``$KUBECONFIG`` style, ``os.pathsep``-separated), those
    that exist, in order (as kubectl, missing ones are skipped; none at all is an error)."""
    text = os.fspath(value)
    named = [Path(p).expanduser() for p in text.split(os.pathsep) if p]
    found = [p for p in named if p.is_file()]
    if not found:
        what = ", ".join(str(p) for p in named) or repr(text)
        raise ConfigError(f"cannot read kubeconfig {what}: no such file")
    return found


LISTS = ("clusters", "users", "contexts")
"""The top-level keys of a kubeconfig that are lists of ``{name: ..., <kind>: {...}}``."""


def _read(path: Path) -> dict[str, Any] | None:
    """One kubeconfig file, its shape checked (what kubectl requires of the types): a mapping,
    ``clusters``/``users``/``contexts`` lists of mappings with a string ``name`` and a mapping
    entry, ``current-context`` a string."""
    import yaml

    try:
        raw = yaml.safe_load(path.read_bytes())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"kubeconfig {path} is not readable YAML: {_one_line(exc)}") from exc
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ConfigError(f"kubeconfig {path} is not a mapping ({_type(raw)})")
    for key in LISTS:
        items = raw.get(key)
        if items is None:
            continue
        if not isinstance(items, list):
            raise ConfigError(f"kubeconfig {path}: {key} must be a list, not {_type(items)}")
        entry = key[:-1]
        for i, item in enumerate(items):
            where = f"kubeconfig {path}: {key}[{i}]"
            if not isinstance(item, dict):
                raise ConfigError(f"{where} must be a mapping, not {_type(item)}")
            if not isinstance(item.get("name"), str) or not item["name"]:
                raise ConfigError(f"{where} has no name (a non-empty string)")
            if not isinstance(item.get(entry) or {}, dict):
                raise ConfigError(f"{where}.{entry} must be a mapping, not {_type(item[entry])}")
    current = raw.get("current-context")
    if current is not None and not isinstance(current, str):
        raise ConfigError(
            f"kubeconfig {path}: current-context must be a string, not {_type(current)}"
        )
    return raw


def _type(value: object) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), f"{type(value).__name__} {str(value)[:20]!r}"
    )


def _contexts(paths: list[Path]) -> tuple[str | None, set[str], frozenset[str]]:
    """The first ``current-context`` set by ``paths`` (kubectl's rule), every context name, and
    the users' values that could be credentials (redacted from every error)."""
    current: str | None = None
    names: set[str] = set()
    secrets: set[str] = set()
    for path in paths:
        raw = _read(path)
        if raw is None:
            continue
        secrets |= user_secrets(raw)
        if current is None and raw.get("current-context"):
            current = str(raw["current-context"])
        for item in raw.get("contexts") or []:
            names.add(str(item["name"]))
    return current, names, frozenset(secrets)


def load_kubeconfig(
    value: str | os.PathLike[str], context: str | None
) -> tuple[Any, str, Callable[[], str | None]]:
    """The library's ``Configuration`` for ``value`` (one file or a ``$KUBECONFIG`` list) and
    ``context`` (default: the first ``current-context``), the context's namespace, and the
    ``Authorization`` header value function (re-evaluated per request)."""
    paths = kubeconfig_paths(value)
    where = os.pathsep.join(str(p) for p in paths)
    with failing():
        current, names, secrets = _contexts(paths)
    with failing(secrets):
        return _load(where, context or current, names, secrets)


def _load(
    where: str, context: str | None, names: set[str], secrets: frozenset[str]
) -> tuple[Any, str, Callable[[], str | None]]:
    if not context:
        raise ConfigError(f"kubeconfig {where}: no current-context (pass --context)")
    if context not in names:
        raise ConfigError(f"kubeconfig {where}: no context named {context!r}")
    try:
        from kubernetes.client import Configuration
        from kubernetes.config.config_exception import ConfigException
        from kubernetes.config.kube_config import KubeConfigLoader, KubeConfigMerger
    except ImportError as exc:  # pragma: no cover - a dependency of fencedlease-client
        raise ConfigError(f"the kubernetes package is missing: {exc}") from exc
    cfg = Configuration()
    with library_errors() as errors:
        try:
            merged = KubeConfigMerger(where).config
            if merged is None:
                raise ConfigError(f"kubeconfig {where}: no configuration found")
            loader = KubeConfigLoader(
                config_dict=merged, config_base_path=None, active_context=context
            )
            loader.load_and_set(cfg)
        except ConfigError:
            raise
        except (ConfigException, OSError, ValueError, TypeError, KeyError) as exc:
            raise ConfigError(f"kubeconfig {where}: {_one_line(exc)}") from exc
        except Exception as exc:  # yaml errors and whatever a malformed file makes it raise
            raise ConfigError(
                f"kubeconfig {where}: {type(exc).__name__}: {_one_line(exc)}"
            ) from exc
    if errors:
        raise ConfigError(
            f"kubeconfig {where}, context {context}: no credentials (exec plugin): {errors[-1]}"
        )
    if not cfg.host:
        raise ConfigError(f"kubeconfig {where}: context {context!r} has no cluster server")
    namespace = str((loader.current_context.get("context") or {}).get("namespace") or "default")
    return cfg, namespace, _authorization(cfg, f"kubeconfig {where}, context {context}", secrets)


def load_in_cluster(directory: Path) -> tuple[Any, str, Callable[[], str | None]]:
    """The library's in-cluster ``Configuration`` (the service account mounted in
    ``directory``; its token is re-read as it rotates), the Pod's namespace and the
    ``Authorization`` header function."""
    from kubernetes.client import Configuration
    from kubernetes.config.config_exception import ConfigException
    from kubernetes.config.incluster_config import InClusterConfigLoader

    token_file, ca_file = directory / "token", directory / "ca.crt"
    cfg = Configuration()
    try:
        InClusterConfigLoader(
            token_filename=str(token_file), cert_filename=str(ca_file)
        ).load_and_set(cfg)
    except (ConfigException, OSError, ValueError) as exc:
        raise ConfigError(f"in-cluster configuration ({directory}): {_one_line(exc)}") from exc
    ns_file = directory / "namespace"
    try:
        namespace = ns_file.read_text().strip() if ns_file.exists() else "default"
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {ns_file}: {_one_line(exc)}") from exc
    return cfg, os.environ.get("POD_NAMESPACE") or namespace, _authorization(cfg, "in-cluster")


def _authorization(
    cfg: Any, where: str, secrets: frozenset[str] = frozenset()
) -> Callable[[], str | None]:
    def authorization() -> str | None:
        with failing(secrets):
            return _credentials(cfg, where)

    return authorization


def _credentials(cfg: Any, where: str) -> str | None:
    """The ``Authorization`` header value the library's configuration gives now."""
    with library_errors() as errors:
        try:
            value = cfg.get_api_key_with_prefix("BearerToken") or cfg.get_api_key_with_prefix(
                "authorization"
            )
        except Exception as exc:  # the refresh hook re-runs the exec plugin / re-reads
            raise ConfigError(f"{where}: credentials: {_one_line(exc)}") from exc
    if errors:
        raise ConfigError(f"{where}: no credentials (exec plugin): {errors[-1]}")
    if value:
        return str(value)
    if cfg.username or cfg.password:
        return str(cfg.get_basic_auth_token())
    return None


def _one_line(exc: BaseException) -> str:
    """An exception's message on one line (cut to length only once redacted: :func:`failing`)."""
    return _fold(str(exc)) or type(exc).__name__


def _fold(text: str) -> str:
    return " ".join(text.split())
