"""Hostile input to fencedlease.client (issue 31, defects 3, 6 and 7, and the class pass):
names that reach a URL path, tokens that are not integers, grant files that are not ASCII
digits, replies that are not the write that was asked for."""

from __future__ import annotations

import datetime as dt
import decimal
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fencedlease.client import Applied, GrantError, Rejected, RetryPolicy, read_grant_dir
from fencedlease.client.api import artifact_path, events_path, lease_path, pod_path
from fencedlease.client.cli import main as client_main
from fencedlease.client.cli_common import EXIT_ERROR, EXIT_USAGE
from fencedlease.client.errors import RequestInfo
from fencedlease.client.plans import Reply, Sleep
from fencedlease.client.publish import PublishRequest, _request, plan
from fencedlease.client.validation import (
    MAX_TOKEN,
    InvalidInput,
    dns_label,
    dns_subdomain,
    parse_token,
    token,
)

# ----------------------------------------------------------------- names in URL paths (3)

BAD_NAMES = [
    "cart/status",
    "cart/../leases",
    "cart?dryRun=All",
    "cart#x",
    "Cart",
    "-cart",
    "cart-",
    "car t",
    "cart%2Fstatus",
    "",
    "a" * 254,
    "ċart",
    7,
]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_paths_refuse_what_is_not_a_dns_subdomain(name: Any) -> None:
    builds: list[Callable[[], str]] = [
        lambda: artifact_path("ns", name),
        lambda: lease_path("ns", name),
        lambda: pod_path("ns", name),
    ]
    for build in builds:
        with pytest.raises(InvalidInput):
            build()


@pytest.mark.parametrize("namespace", ["a/b", "a.b", "NS", "", "x" * 64, "..", None])
def test_paths_refuse_a_namespace_that_is_not_a_dns_label(namespace: Any) -> None:
    builds: list[Callable[[], str]] = [
        lambda: artifact_path(namespace),
        lambda: lease_path(namespace, "l"),
        lambda: pod_path(namespace, "p"),
        lambda: events_path(namespace),
    ]
    for build in builds:
        with pytest.raises(InvalidInput):
            build()


def test_good_names_pass() -> None:
    assert dns_subdomain("report-july.catalog") == "report-july.catalog"
    assert dns_subdomain("a" * 63 + "." + "b" * 63) is not None
    assert dns_label("team-a1") == "team-a1"
    assert artifact_path("ns", "cat").endswith("/namespaces/ns/fencedartifacts/cat")


def test_publish_request_checks_every_name_before_any_call() -> None:
    common: dict[str, Any] = {
        "object_ref": "x",
        "token": 5,
        "grant": None,
        "operation_id": None,
        "expected_version": None,
        "labels": None,
    }
    for name, namespace, lease in [
        ("cart/status", "ns", "l"),
        ("cart", "a/b", "l"),
        ("cart", "ns", "l/status"),
    ]:
        with pytest.raises(InvalidInput):
            _request(name=name, namespace=namespace, lease=lease, **common)


REQ = PublishRequest("ns", "cat", "lease", 42, "obj", "op-1")


def _artifact(version: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "fencedlease.io/v1alpha1",
        "kind": "FencedArtifact",
        "metadata": {"name": "cat", "namespace": "ns", "resourceVersion": version},
        "spec": {**REQ.spec(), **spec},
    }


def _drive(replies: list[Reply]) -> Any:
    gen = plan(REQ, RetryPolicy(attempts=2, jitter=False))
    answer: Reply | None = None
    while True:
        try:
            step = gen.send(answer)
        except StopIteration as done:
            return done.value
        answer = None if isinstance(step, Sleep) else replies.pop(0)


def _reply(status: int, body: Any) -> Reply:
    return Reply(RequestInfo("PUT", "https://x/cat"), status, body)


@pytest.mark.parametrize(
    "written",
    [
        {"kind": "Status", "status": "Success"},  # a 200 Status, not an object
        {**_artifact("8"), "kind": "Pod"},
        _artifact("8", fencingToken=41),  # someone else's write
        _artifact("8", fencingToken="42"),  # not even an integer
        _artifact("8", objectRef="other"),
        _artifact("8", operationId="op-2"),
        {**_artifact("8"), "metadata": {"name": "other", "namespace": "ns"}},
        "ok",
    ],
)
def test_a_2xx_that_is_not_the_write_asked_for_is_not_applied(written: Any) -> None:
    result = _drive([_reply(200, _artifact("7")), _reply(200, written)])
    assert isinstance(result, Rejected) and result.code == "unexpected_reply", result
    assert not result.ok


def test_a_read_of_something_else_is_not_built_upon() -> None:
    other = {**_artifact("7"), "metadata": {"name": "cart", "namespace": "ns"}}
    result = _drive([_reply(200, other)])
    assert isinstance(result, Rejected) and result.code == "unexpected_reply", result


def test_the_write_asked_for_is_applied() -> None:
    result = _drive([_reply(200, _artifact("7", fencingToken=41)), _reply(200, _artifact("8"))])
    assert isinstance(result, Applied) and result.version == "8"


# ----------------------------------------------------------------- tokens are integers (6)


@pytest.mark.parametrize(
    "value", [True, False, 8.5, 8.0, decimal.Decimal("8"), "8", None, 0, -3, MAX_TOKEN + 1]
)
def test_token_is_a_positive_int64_and_nothing_else(value: Any) -> None:
    with pytest.raises(InvalidInput):
        token(value)
    with pytest.raises(InvalidInput):
        _request(
            name="cat",
            namespace="ns",
            object_ref="x",
            lease="l",
            token=value,
            grant=None,
            operation_id=None,
            expected_version=None,
            labels=None,
        )


def test_a_valid_token_passes() -> None:
    assert token(8) == 8 and token(MAX_TOKEN) == MAX_TOKEN


# ----------------------------------------------------------------- token text (7)


@pytest.mark.parametrize(
    "text",
    ["٧٥٢", "7_52", "+752", "-752", "0752", "0", "7.5", "7e2", "0x2f0", "752 1", "", "９", "²",  # noqa: RUF001
     str(MAX_TOKEN + 1), "1" * 40],
)  # fmt: skip
def test_token_text_is_ascii_digits_only(text: str) -> None:
    with pytest.raises(InvalidInput):
        parse_token(text)


def test_token_text_ignores_a_final_newline() -> None:
    assert parse_token("752\n") == 752 and parse_token(" 752\r\n") == 752


def _grant_dir(d: Path, token_bytes: bytes, lease_id: bytes = b"5f3a9c0d12ab") -> Path:
    d.mkdir(parents=True, exist_ok=True)
    until = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=60)
    (d / "token").write_bytes(token_bytes)
    (d / "lease-id").write_bytes(lease_id)
    (d / "valid-until").write_text(until.strftime("%Y-%m-%dT%H:%M:%SZ"))
    (d / "state").write_text("held")
    return d


@pytest.mark.parametrize(
    ("token_bytes", "lease_id"),
    [
        (b"\xff\xfe7", b"a7"),  # not UTF-8
        ("٧٥٢".encode(), b"a7"),  # Arabic-Indic digits
        (b"7_52", b"a7"),
        (b"+752", b"a7"),
        (b"752", b""),  # a token without its lease id
        (b"752", b"a7\xff"),
        (b"752", b"a7/../x"),
    ],
)
def test_malformed_grant_files_are_a_grant_error(
    tmp_path: Path, token_bytes: bytes, lease_id: bytes
) -> None:
    d = _grant_dir(tmp_path / "g", token_bytes, lease_id)
    with pytest.raises(GrantError, match="malformed grant"):
        read_grant_dir(d)


def test_the_grant_carries_its_lease_id(tmp_path: Path) -> None:
    g = read_grant_dir(_grant_dir(tmp_path / "g", b"752\n", b"5f3a9c0d12ab\n"))
    assert g is not None and (g.token, g.lease_id) == (752, "5f3a9c0d12ab")


def _run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fencedlease.client", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=dict(os.environ, **(env or {})),
    )


def test_cli_token_and_publish_on_a_non_utf8_token_file(tmp_path: Path) -> None:
    """Defect 7: both commands used to die with a UnicodeDecodeError traceback."""
    d = _grant_dir(tmp_path / "g", b"\xff\xfe\x00")
    kubeconfig = tmp_path / "kubeconfig"  # never reached: the grant is read first
    kubeconfig.write_text("{}")
    token_out = _run_cli("token", "--dir", str(d))
    publish_out = _run_cli(
        "publish", "cat", "--lease", "l", "--object-ref", "x", "--dir", str(d),
        env={"KUBECONFIG": str(kubeconfig)},
    )  # fmt: skip
    for out in (token_out, publish_out):
        assert out.returncode == EXIT_ERROR, out.stderr
        assert "Traceback" not in out.stderr, out.stderr
        assert out.stderr.count("\n") == 1 and "not ASCII" in out.stderr, out.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ["publish", "cat", "--lease", "l", "--object-ref", "x", "--token", "٧"],  # noqa: RUF001
        ["publish", "cat", "--lease", "l", "--object-ref", "x", "--token", "7_52"],
        ["publish", "cat", "--lease", "l", "--object-ref", "x", "--token", "+752"],
        ["publish", "cat", "--lease", "l", "--object-ref", "x", "--attempts", "0"],
        ["token", "--min-remaining", "nan"],
        ["token", "--min-remaining", "inf"],
        ["token", "--min-remaining", "-1"],
    ],
)
def test_cli_numbers_from_the_command_line(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        client_main(argv)
    assert exited.value.code == EXIT_USAGE
    assert "error:" in capsys.readouterr().err


def test_cli_publish_names_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (
        ["publish", "cart/status", "--lease", "l", "--object-ref", "x", "--token", "5"],
        ["publish", "cart", "--lease", "l/x", "--object-ref", "x", "--token", "5"],
        ["publish", "cart", "--lease", "l", "--object-ref", "x", "--token", "5", "-n", "A"],
    ):
        with pytest.raises(SystemExit) as usage:  # argparse's exit, one line (issue 42)
            client_main(argv)
        assert usage.value.code == EXIT_USAGE
        err = capsys.readouterr().err
        assert err.startswith("fencedlease publish: error: argument") and "invalid" in err, err
        assert err.count("\n") == 1, err


@pytest.mark.parametrize(
    "argv",
    [
        ["force-release", "l", "--wait", "nan"],
        ["force-release", "l", "--wait", "-1"],
        ["force-release", "l", "--lease-id", "a/b"],
        ["force-release", "l", "--lease-id", ""],
    ],
)
def test_kubectl_plugin_numbers_and_ids(argv: list[str]) -> None:
    from fencedlease.client.kubectl import main as kubectl_main

    with pytest.raises(SystemExit) as exited:
        kubectl_main(argv)
    assert exited.value.code == EXIT_USAGE


def test_kubectl_plugin_shows_a_forged_status_without_parsing_it() -> None:
    from fencedlease.client.kubectl import _age, _seconds

    now = dt.datetime.now(dt.timezone.utc)
    assert _seconds("ten") == "'ten'" and _seconds(True) == "True" and _seconds(2) == "2s"
    assert _age(5, now) == "5" and _age("not a time", now) == "not a time"
    assert _age("9999-12-31T23:59:59Z", now).startswith("in ")
