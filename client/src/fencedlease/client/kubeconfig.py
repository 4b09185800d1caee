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
one line of explanation.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from fencedlease.client.errors import ConfigError

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


@contextlib.contextmanager
def library_errors() -> Iterator[list[str]]:
    """Collect what the config loader reports only through ``logging.error`` (an exec plugin
    that fails or prints no credential) instead of letting it print on the root logger."""
    errors: list[str] = []

    class _Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.ERROR:
                errors.append(record.getMessage().strip().splitlines()[0][:500])

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


def _contexts(paths: list[Path]) -> tuple[str | None, set[str]]:
    """The first ``current-context`` set by ``paths`` (kubectl's rule) and every context name."""
    import yaml

    current: str | None = None
    names: set[str] = set()
    for path in paths:
        try:
            raw = yaml.safe_load(path.read_bytes())
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"kubeconfig {path} is not readable YAML: {_one_line(exc)}") from exc
        if raw is None:
            continue
        if not isinstance(raw, dict):
            raise ConfigError(f"kubeconfig {path} is not a mapping")
        if current is None and raw.get("current-context"):
            current = str(raw["current-context"])
        for item in raw.get("contexts") or []:
            if isinstance(item, dict) and item.get("name"):
                names.add(str(item["name"]))
    return current, names


def load_kubeconfig(
    value: str | os.PathLike[str], context: str | None
) -> tuple[Any, str, Callable[[], str | None]]:
    """The library's ``Configuration`` for ``value`` (one file or a ``$KUBECONFIG`` list) and
    ``context`` (default: the first ``current-context``), the context's namespace, and the
    ``Authorization`` header value function (re-evaluated per request)."""
    paths = kubeconfig_paths(value)
    where = os.pathsep.join(str(p) for p in paths)
    current, names = _contexts(paths)
    context = context or current
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
    return cfg, namespace, _authorization(cfg, f"kubeconfig {where}, context {context}")


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


def _authorization(cfg: Any, where: str) -> Callable[[], str | None]:
    def authorization() -> str | None:
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

    return authorization


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return " ".join(text.split())[:500]
