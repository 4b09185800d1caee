"""What the client's commands share (``fencedlease token/publish/release``, ``kubectl
fencedlease``): the exit codes (listed in :mod:`fencedlease.client.cli` and docs/client.md),
argparse with one line per usage error and the argument types of names that go into a URL,
the one error line, the cluster arguments, and the grant or a client of the cluster, or the
exit code once the reason is said.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, NoReturn, TypeVar

from fencedlease.client.contract import DEFAULT_DIR
from fencedlease.client.errors import ConfigError, FencedLeaseError, GrantError
from fencedlease.client.grant import Grant, GrantState
from fencedlease.client.sources import read_grant_dir
from fencedlease.client.validation import (
    InvalidInput,
    dns_label,
    dns_subdomain,
    finite,
    parse_token,
)
from fencedlease.client.validation import lease_id as check_lease_id

if TYPE_CHECKING:
    from fencedlease.client.api import KubeClient, KubeConfig

T = TypeVar("T")
Done = TypeVar("Done")

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_ABSENT = 3
EXIT_LOST = 4
EXIT_EXPIRED = 5
EXIT_DUPLICATE = 10
EXIT_STALE_FENCE = 11
EXIT_REJECTED = 12
EXIT_UNAVAILABLE = 13
EXIT_NOT_CURRENT = 14
EXIT_PENDING = 15

STATE_EXIT = {
    GrantState.HELD: EXIT_OK,
    GrantState.ABSENT: EXIT_ABSENT,
    GrantState.LOST: EXIT_LOST,
    GrantState.EXPIRED: EXIT_EXPIRED,
}
RESULT_EXIT = {
    "applied": EXIT_OK,
    "duplicate": EXIT_DUPLICATE,
    "stale_fence": EXIT_STALE_FENCE,
    "unavailable": EXIT_UNAVAILABLE,
    "not_installed": EXIT_ERROR,
}


class Parser(argparse.ArgumentParser):
    """argparse with one line per usage error (``fencedlease publish: error: ...``, exit
    code 2) instead of the whole usage before the reason; ``--help`` still shows it.
    Subcommands' parsers are of the same class (``add_subparsers`` takes the parent's)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


def default_dir() -> str:
    return os.environ.get("FENCEDLEASE_DIR") or DEFAULT_DIR


def grant_or_exit(directory: str, lease: str | None, absent: str = "") -> Grant | int:
    """The grant in ``directory``, or the exit code once the reason is said in one line
    (``absent``: what is missing without it)."""
    if not os.path.isdir(directory):  # a typo, or no volume mounted: not "not granted yet"
        what = "is not a directory" if os.path.exists(directory) else "does not exist"
        err(f"error: grant directory {directory} {what}")
        return EXIT_ERROR
    try:
        grant = read_grant_dir(directory, lease)
    except GrantError as exc:
        err(f"error: {exc}")
        return EXIT_ERROR
    if grant is None:
        err(f"absent: no grant in {directory}{absent}")
        return EXIT_ABSENT
    return grant


def config_or_exit(args: argparse.Namespace) -> tuple[KubeConfig, str] | int:
    """The kubeconfig (``--kubeconfig``, ``--context``) and the namespace to use
    (``--namespace``, else ``POD_NAMESPACE``, else the kubeconfig's), or the exit code once
    the reason is said."""
    from fencedlease.client.api import KubeConfig

    try:
        config = KubeConfig.load(
            args.kubeconfig, context=args.context, timeout=getattr(args, "request_timeout", None)
        )
    except ConfigError as exc:
        err(cli_error(exc))
        return EXIT_ERROR
    return config, args.namespace or os.environ.get("POD_NAMESPACE") or config.namespace


def with_kube(args: argparse.Namespace, call: Callable[[KubeClient, str], Done]) -> Done | int:
    """``call`` with a client of the configured cluster and the namespace to use; or the exit
    code once the reason is said (no configuration, or a :class:`FencedLeaseError`)."""
    from fencedlease.client.api import KubeClient

    loaded = config_or_exit(args)
    if isinstance(loaded, int):
        return loaded
    config, namespace = loaded
    try:
        with KubeClient(config) as kube:
            return call(kube, namespace)
    except FencedLeaseError as exc:
        err(cli_error(exc))
        return EXIT_ERROR


def cli_error(exc: BaseException) -> str:
    """The one line a command prints for an error: ``error: <message>``, whitespace folded,
    credentials redacted (:func:`fencedlease.client.kubeconfig.redact`), at most 1000
    characters."""
    from fencedlease.client.kubeconfig import redacted_line

    return f"error: {redacted_line(str(exc) or type(exc).__name__, 1000)}"


def add_cluster_arguments(p: argparse.ArgumentParser) -> None:
    """The namespace, the kubeconfig and the request timeout of a command that calls the
    API."""
    p.add_argument(
        "-n",
        "--namespace",
        type=namespace_arg,
        help="default: POD_NAMESPACE, else the kubeconfig's",
    )
    p.add_argument("--kubeconfig", help="default: KUBECONFIG, else in-cluster, else ~/.kube")
    p.add_argument("--context", help="kubeconfig context")
    p.add_argument(
        "--request-timeout",
        type=timeout_arg,
        default=None,
        metavar="SECONDS",
        help="give up on one API request after this long (default 10)",
    )


def _argument(check: Callable[[str], T]) -> Callable[[str], T]:
    """An argparse ``type`` from a validator: its one-line :class:`InvalidInput` becomes the
    usage error (exit status 2)."""

    def convert(text: str) -> T:
        try:
            return check(text)
        except InvalidInput as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return convert


token_arg = _argument(parse_token)
lease_id_arg = _argument(check_lease_id)
namespace_arg = _argument(dns_label)
name_arg = _argument(dns_subdomain)


def named(kind: str) -> Callable[[str], str]:
    """The argparse ``type`` of a ``kind`` object's name (a DNS subdomain)."""
    return _argument(lambda text: dns_subdomain(text, f"{kind} name"))


"""argparse ``type``s of the names that go into a URL: a usage error (exit code 2) when the
value is not one the API server takes."""


def attempts_arg(text: str) -> int:
    value = _argument(lambda t: parse_token(t, "attempts"))(text)
    if value > 100:
        raise argparse.ArgumentTypeError(f"attempts must be at most 100, got {value}")
    return value


def timeout_arg(text: str) -> float:
    """``--request-timeout``: seconds, more than 0."""
    value = seconds_arg(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"the timeout must be more than 0, got {text!r:.40}")
    return value


def seconds_arg(text: str) -> float:
    try:
        value = finite(float(text), "seconds")
    except (ValueError, InvalidInput) as exc:
        raise argparse.ArgumentTypeError(f"invalid seconds {text!r:.40}: {exc}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"seconds must not be negative, got {text!r:.40}")
    return value


def err(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
