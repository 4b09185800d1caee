"""The operator as a Kopf operator: Kopf hosts the process and watches the FencedLeases.

``fencedlease run`` calls :func:`run_operator`, which runs :func:`kopf.operator` standalone
(no peering: our own election, ``fencedlease.election``, picks the one writing replica, and
every replica keeps watching so its caches stay hot; Kopf's peering would pause the
standbys' watches). Someone used to Kopf can run the same handlers with
``kopf run -m fencedlease.kopfapp --standalone --all-namespaces`` (or ``--namespace N``;
importing this module registers them in Kopf's default registry); the settings then come from
the environment (``FENCEDLEASE_*``, docs/operations.md).

The handlers, on Kopf's public API only:

* ``@kopf.on.startup`` builds and starts what the composition root builds
  (:func:`fencedlease.app.start`: etcd store, Kubernetes client, election, controller,
  webhook for ``role=all``, metrics, ``/healthz`` and ``/readyz``), and tunes Kopf
  (:func:`tune`); ``@kopf.on.cleanup`` stops it (:meth:`fencedlease.app.Process.close`);
* ``@kopf.on.login`` hands Kopf the credentials our Kubernetes client loaded (in-cluster or
  the kubeconfig), so both talk to the API server as the same identity;
* ``@kopf.on.probe`` answers Kopf's liveness endpoint (``--liveness``, or
  ``FENCEDLEASE_KOPF_LIVENESS_PORT``) from the facts of our liveness decision
  (:mod:`fencedlease.health`): failing, it raises and Kopf answers 500. Kopf has no
  readiness endpoint: ``/readyz`` stays ours;
* ``@kopf.on.event`` for FencedLeases hands each event to the controller's cache
  (``controller/handlers.py``, :func:`~fencedlease.controller.handlers.on_lease`). Only
  event handlers: Kopf writes nothing to a FencedLease (no finalizer, no progress or
  diff-base annotation); the finalizer is the reconciler's.

Pods, FencedArtifacts, FencedReleases, FencedClaims, FencePolicies and fenced objects stay on
our :class:`~fencedlease.watching.ListWatch` (docs/design.md, "What is Kopf's and what is
ours"). A SIGTERM still resigns the election before anything stops: the handler that
:func:`fencedlease.app.start` installs replaces Kopf's, then stops Kopf.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable
from typing import Any

import kopf

from fencedlease import app
from fencedlease.controller.handlers import on_lease
from fencedlease.models import GROUP, LEASES, VERSION
from fencedlease.settings import Role, Settings, StartupError

log = logging.getLogger(__name__)

registry = kopf.OperatorRegistry()
"""The operator's handlers, made Kopf's default registry (what ``kopf run -m
fencedlease.kopfapp`` runs). A plain registry: Kopf's default one adds fallback logins
through whichever Kubernetes client is installed, importing the synchronous ``kubernetes``
client's models to ask; our ``@kopf.on.login`` is the one login."""
kopf.set_default_registry(registry)


def tune(settings: kopf.OperatorSettings) -> None:
    """Kopf's settings for this operator.

    * standalone: no peering (our election decides who writes; every replica watches);
    * no Kubernetes Events from Kopf's log lines (our Events come from the leader only);
    * the persistence settings only matter to change handlers (``on.create/update/delete``,
      ``on.resume``), which this operator has none of: with event handlers only, Kopf adds
      no finalizer and stores no progress or diff base on the objects (checked through a
      real API server by ``tests/integration/test_operator.py``); an event handler's return
      value would be stored in the object's status, so ours return nothing;
    """
    settings.peering.standalone = True
    settings.posting.enabled = False


def quiet_kopf() -> None:
    """``fencedlease run`` logs Kopf's line per handled event and per probe ("Handler ...
    succeeded.") only at ``-v`` (``kopf run`` keeps its own ``--verbose``/``--quiet``)."""
    if logging.getLogger("fencedlease").getEffectiveLevel() <= logging.DEBUG:
        return
    for name in ("kopf.objects", "kopf.activities.probe"):
        logging.getLogger(name).setLevel(logging.WARNING)


class _UserMistakes(logging.Filter):
    """Kopf logs a failed startup handler with its traceback; a :class:`StartupError` is a
    user's mistake with a message that says what to do: one line, no traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, StartupError):
            record.msg, record.args = "cannot start: %s", (error,)
            record.exc_info, record.exc_text = None, None
        return True


logging.getLogger("kopf.activities.startup").addFilter(_UserMistakes())


def process_of(memo: Any) -> app.Process:
    """The process the startup handler built (``memo.process``)."""
    process: app.Process = memo.process
    return process


def _interrupt_kopf() -> None:
    """Stop Kopf when it was not given a stop flag (``kopf run``): its SIGINT handler does."""
    signal.raise_signal(signal.SIGINT)


@kopf.on.startup(errors=kopf.ErrorsMode.PERMANENT)
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """Build and start the process (``fencedlease run`` hands its settings and stop flag
    in ``memo``; ``kopf run`` reads the settings from the environment and stops on SIGINT,
    so only SIGTERM is taken over from Kopf)."""
    tune(settings)
    ours = memo.get("settings") or Settings.from_env({})
    stop: Callable[[], None] | None = memo.get("stop")
    signals = app.STOP_SIGNALS if stop is not None else (signal.SIGTERM,)
    memo.process = await app.start(
        ours, stop=stop or _interrupt_kopf, on_ready=memo.get("on_ready"), signals=signals
    )


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    """Stop what the startup handler started (the election is released last)."""
    process: app.Process | None = memo.get("process")
    if process is not None:
        await process.close()


@kopf.on.login(errors=kopf.ErrorsMode.PERMANENT)
async def login(memo: kopf.Memo, **kwargs: Any) -> kopf.ConnectionInfo | None:
    """Our Kubernetes client's credentials (in-cluster or the kubeconfig, as loaded by
    :func:`fencedlease.kube.load_config`; a rotated service account token is read again)."""
    process: app.Process | None = memo.get("process")
    if process is None:  # not started: Kopf's own loaders find the same sources
        return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)
    config = process.kube.api.configuration
    bearer = await config.get_api_key_with_prefix("BearerToken")
    token = str(bearer).removeprefix("Bearer ").strip() if bearer else None
    return kopf.ConnectionInfo(
        server=str(config.host),
        ca_path=config.ssl_ca_cert,
        insecure=not config.verify_ssl,
        token=token or None,
        certificate_path=config.cert_file,
        private_key_path=config.key_file,
        proxy_url=config.proxy,
    )


@kopf.on.probe(id="fencedlease", errors=kopf.ErrorsMode.PERMANENT)
def liveness(memo: kopf.Memo, **_: Any) -> dict[str, Any]:
    """Kopf's liveness endpoint: what ``/healthz?verbose`` decides from; not live (a
    scheduler stuck, a watch silent, etcd unreachable past its bound): raise, Kopf answers
    500."""
    probes = process_of(memo).probes
    verdict = probes.liveness()
    if not verdict.ok:
        raise kopf.PermanentError("; ".join(verdict.reasons))
    return {**verdict.as_json(), **probes.observed()}


@kopf.on.event(GROUP, VERSION, LEASES)
async def fenced_lease(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    """One FencedLease event (``type`` ``None``: listed) to the controller's cache."""
    controller = process_of(memo).controller
    if controller is not None:
        on_lease(controller, event)


async def run_operator(
    settings: Settings,
    *,
    stop_flag: asyncio.Event | None = None,
    on_ready: Callable[[], None] | None = None,
) -> None:
    """Run the process for ``settings.role`` until ``stop_flag`` is set (or forever): under
    Kopf when it has a controller, else the webhook alone (:func:`fencedlease.app.serve_webhook`).
    A startup that fails on a user's mistake raises its :class:`StartupError`."""
    if settings.role is Role.WEBHOOK:
        await app.serve_webhook(settings, stop_flag=stop_flag, on_ready=on_ready)
        return
    stop = stop_flag or asyncio.Event()
    memo = kopf.Memo(settings=settings, stop=stop.set, on_ready=on_ready)
    kopf_settings = kopf.OperatorSettings()
    tune(kopf_settings)
    quiet_kopf()
    port = settings.kopf_liveness_port
    try:
        await kopf.operator(
            registry=registry,
            settings=kopf_settings,
            standalone=True,
            clusterwide=settings.namespace is None,
            namespaces=[settings.namespace] if settings.namespace else (),
            memo=memo,
            stop_flag=stop,
            liveness_endpoint=f"http://0.0.0.0:{port}/healthz" if port else None,
        )
    except Exception as error:  # Kopf's wrapper of a failed startup: our own error instead
        if isinstance(error.__cause__, StartupError):
            raise error.__cause__ from None
        raise
    finally:
        process: app.Process | None = memo.get("process")
        if process is not None:  # Kopf cancelled before its cleanup: close it here
            await process.close()


__all__ = ["StartupError", "registry", "run_operator", "tune"]
