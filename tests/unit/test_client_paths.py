"""Names into URLs and secrets into messages (issue 42, items 15-18 and 21): one validator where
every request is built, one redactor where every configuration error is rendered, one exit-code
table, one line per error.  Client only (``make test-pythons`` runs it on Python 3.9)."""

from __future__ import annotations

import base64
import datetime as dt
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from fencedlease.client import Claimer, ConfigError, KubeClient, KubeConfig, Releaser, kubectl
from fencedlease.client.cli import main as client_main
from fencedlease.client.cli_common import EXIT_ERROR, EXIT_USAGE
from fencedlease.client.errors import ApiError, RequestInfo, TransportError
from fencedlease.client.kubeconfig import failing, redact, user_secrets
from fencedlease.client.plans import Reply
from fencedlease.client.validation import InvalidInput, api_path

TRAVERSAL = "a/../../../../../../../api/v1/namespaces/NS/configmaps/victim"
TRAVERSAL_FRAGMENT = "a/../../../../../../../api/v1/namespaces/NS/configmaps/victim2#"


class Recording:
    """A KubeClient whose requests are recorded and answered 200 instead of sent."""

    def __init__(self) -> None:
        self.sent: list[httpx.Request] = []
        self.kube = KubeClient(KubeConfig(server="https://127.0.0.1:1", namespace="ns"))

        def answer(request: httpx.Request) -> httpx.Response:
            self.sent.append(request)
            return httpx.Response(200, json={"kind": "Status", "status": "Success"})

        self.kube._http = httpx.Client(
            base_url="https://127.0.0.1:1", transport=httpx.MockTransport(answer)
        )


@pytest.mark.parametrize(
    "path",
    [
        "/apis/fencedlease.io/v1alpha1/namespaces/ns/fencedreleases/x-" + TRAVERSAL,
        "/api/v1/namespaces/ns/configmaps/..",
        "/api/v1/namespaces/ns/configmaps/.",
        "/api/v1/namespaces/ns/configmaps/a#",
        "/api/v1/namespaces/ns/configmaps/a?dryRun=All",
        "/api/v1/namespaces/ns/configmaps/a%2F..%2Fb",
        "/api/v1/namespaces/ns/configmaps/a b",
        "/api/v1/namespaces/ns/configmaps/a\\b",
        "/api/v1/namespaces/ns/configmaps/\u0430",  # a Cyrillic a
        "/api/v1/namespaces/ns//configmaps",
        "/api/v1/namespaces/ns/configmaps/",
        "/api/v1/namespaces/Bad_NS/configmaps",
        "/apis/g.io/v1/namespaces/a.b/things",
        "api/v1/pods",
        "/",
        "",
    ],
)
def test_api_path_refuses_what_is_not_a_kubernetes_name(path: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        api_path(path)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/namespaces/ns/pods/web-0",
        "/api/v1/namespaces/ns",
        "/apis/fencedlease.io/v1alpha1/namespaces/ns/fencedartifacts/cart/status",
        "/apis/rbac.authorization.k8s.io/v1/clusterroles/system:controller:job-controller",
        "/apis/fencedlease.io/v1alpha1/fencedleases",
        "/apis/authentication.k8s.io/v1/selfsubjectreviews",
        "/version",
    ],
)
def test_api_path_takes_kubernetes_paths(path: str) -> None:
    assert api_path(path) == path


def test_every_request_is_checked_where_it_is_built() -> None:
    """The one place: ``KubeClient.request`` refuses the path before anything is sent, whoever
    made it (here the SDK's rejoin and claim withdrawal with the reproductions, and a raw
    request)."""
    client = Recording()
    releaser = Releaser(client.kube, pod="p", pod_uid="uid")
    with pytest.raises(InvalidInput, match="fencedreleases name"):
        releaser.rejoin("x", TRAVERSAL)
    claimer = Claimer(client.kube, pod="p", pod_uid="uid")
    with pytest.raises(InvalidInput, match="invalid FencedClaim name"):
        claimer.done("t", TRAVERSAL_FRAGMENT)
    with pytest.raises(InvalidInput, match="invalid FencedClaim name"):
        claimer.claim("t", TRAVERSAL_FRAGMENT, wait=0)
    with pytest.raises(InvalidInput, match=r"segment '\.\.'"):
        client.kube.request("DELETE", "/apis/fencedlease.io/v1alpha1/namespaces/ns/x/" + TRAVERSAL)
    assert client.sent == []
    client.kube.request("DELETE", "/api/v1/namespaces/ns/configmaps/fine")
    assert [r.url.path for r in client.sent] == ["/api/v1/namespaces/ns/configmaps/fine"]


def run_cli(*argv: str, tool: str = "fencedlease", env: dict[str, str] | None = None) -> Any:
    module = "fencedlease.client.kubectl" if tool == "kubectl" else "fencedlease.client.cli"
    code = f"import sys; from {module} import main; sys.exit(main())"
    return subprocess.run(
        [sys.executable, "-c", code, *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )


def one_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


def error_lines(kubeconfig: Path) -> list[str]:
    """The one line each command (``kubectl fencedlease status``, ``fencedlease publish``)
    prints with configuration ``kubeconfig``, each having exited ``EXIT_ERROR``."""
    lines = []
    for tool, argv in (
        ("kubectl", ["--kubeconfig", str(kubeconfig), "status"]),
        ("fencedlease", ["publish", "a", "--lease", "l", "--object-ref", "k", "--token", "5",
                         "--kubeconfig", str(kubeconfig)]),
    ):  # fmt: skip
        out = run_cli(*argv, tool=tool)
        assert out.returncode == EXIT_ERROR, out.stderr
        lines.append(one_line(out.stderr))
    return lines


@pytest.mark.parametrize(
    "argv",
    [
        ["release", "x", "--rejoin", "--lease-id", TRAVERSAL],
        ["release", "x/../y", "--rejoin", "--lease-id", "abc"],
        ["release", "x", "--lease-id", "abc", "--token", "+5"],
        ["release", "x", "--lease-id", "abc", "--token", "1_0"],
        ["release", "x", "--lease-id", "abc", "--token", "-5"],
        ["release", "x", "--lease-id", "abc", "--token", "\u0665"],  # Arabic-Indic five
        ["release", "x", "--lease-id", "abc", "--token", "05"],
        ["release", "x", "--lease-id", "abc", "--token", "5", "--wait", "nan"],
        ["publish", "a", "--lease", "l", "--object-ref", "k", "--token", "+5"],
        ["publish", "a", "--lease", "l", "--object-ref", "k", "-n", "Bad/NS"],
        ["publish", "a", "--lease", "l", "--object-ref", "k", "--request-timeout", "0"],
        ["token", "--min-remaining", "-1"],
    ],
)
def test_usage_errors_are_one_line_and_exit_2(argv: list[str]) -> None:
    out = run_cli(*argv)
    assert out.returncode == EXIT_USAGE, out.stderr
    line = one_line(out.stderr)
    assert line.startswith("fencedlease ") and "error:" in line, line


@pytest.mark.parametrize(
    "argv",
    [["status", "Bad_Name"], ["status", "x/status"], ["status", "-n", "Bad/NS"],
     ["-n", "Bad/NS", "status"], ["describe", "a/../b"], ["force-release", "x", "--lease-id",
     "a/b"], ["status", "--request-timeout", "-1"]],
)  # fmt: skip
def test_kubectl_plugin_usage_errors_exit_2(argv: list[str]) -> None:
    out = run_cli(*argv, tool="kubectl")
    assert out.returncode == EXIT_USAGE, out.stderr
    assert one_line(out.stderr).startswith("kubectl fencedlease")


def test_kubectl_plugin_version() -> None:
    with pytest.raises(SystemExit) as done:
        kubectl.build_parser().parse_args(["--version"])
    assert done.value.code == 0


def kubeconfig(path: Path, user: dict[str, Any], **top: Any) -> Path:
    config: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    config.update(top)
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.parametrize(
    "top",
    [
        {"contexts": 5},
        {"contexts": [5]},
        {"contexts": [{"name": 5, "context": {}}]},
        {"contexts": [{"name": "x", "context": "c"}]},
        {"clusters": "c"},
        {"users": {"u": 1}},
        {"current-context": ["x"]},
    ],
)
def test_a_kubeconfig_of_wrong_types_is_one_line_rc_1(tmp_path: Path, top: dict[str, Any]) -> None:
    path = kubeconfig(tmp_path / "config", {"token": "t0ken-value"}, **top)
    with pytest.raises(ConfigError):
        KubeConfig.load(path)
    for line in error_lines(path):
        assert line.startswith(f"error: kubeconfig {path}"), line


SECRETS = {
    "token": "tok-0123456789",
    "client-key-data": base64.b64encode(b"-----BEGIN PRIVATE KEY----- key").decode(),
    "password": "hunter2-password",
    "client-secret": "client-secret-value-1",
    "refresh-token": "refresh-token-value-2",
    "id-token": "id-token-value-3",
    "env": "exec-env-secret-4",
}


def test_redact_hides_every_credential_of_the_users() -> None:
    raw = {
        "users": [
            {
                "name": "u",
                "user": {
                    "token": SECRETS["token"],
                    "client-key-data": SECRETS["client-key-data"],
                    "password": SECRETS["password"],
                    "username": "admin",
                    "auth-provider": {
                        "name": "oidc",
                        "config": {
                            "client-secret": SECRETS["client-secret"],
                            "refresh-token": SECRETS["refresh-token"],
                            "id-token": SECRETS["id-token"],
                        },
                    },
                    "exec": {
                        "command": "aws",
                        "env": [{"name": "AWS_SECRET_ACCESS_KEY", "value": SECRETS["env"]}],
                    },
                },
            }
        ]
    }
    secrets = frozenset(user_secrets(raw))
    message = f"bad: {raw} / {json.dumps(raw)} / {yaml.safe_dump(raw)}"
    with pytest.raises(ConfigError) as failed, failing(secrets):
        raise ConfigError(message)
    text = str(failed.value)
    for value in SECRETS.values():
        assert value not in text
    assert "<redacted>" in text and "AWS_SECRET_ACCESS_KEY" in text and "aws" in text
    assert "\n" not in text
    # Without the file's values, the keys alone are enough (a message from elsewhere).
    for key in ("token", "client-key-data", "password", "client-secret", "refresh-token"):
        assert "s3cr3t" not in redact(f"{{'{key}': 's3cr3t'}} {key}: s3cr3t {key}=s3cr3t")
    assert "s3cr3t" not in redact("{'name': 'X', 'value': 's3cr3t'} Authorization: Bearer s3cr3t")


def test_oidc_without_id_token_prints_no_secret(tmp_path: Path) -> None:
    """The reproduction: an OIDC auth-provider missing its id-token."""
    provider = {
        "name": "oidc",
        "config": {
            "client-id": "cid",
            "client-secret": SECRETS["client-secret"],
            "refresh-token": SECRETS["refresh-token"],
            "idp-issuer-url": "https://issuer.invalid",
        },
    }
    path = kubeconfig(tmp_path / "config", {"auth-provider": provider})
    for line in error_lines(path):
        assert SECRETS["client-secret"] not in line and SECRETS["refresh-token"] not in line


def test_exec_env_values_are_not_printed(tmp_path: Path) -> None:
    """An exec plugin that fails: its env values (secrets) never reach the message."""
    plugin = tmp_path / "plugin"
    plugin.write_text(f'#!/bin/sh\necho "no: $SECRET {SECRETS["token"]}" >&2\nexit 1\n')
    plugin.chmod(0o755)
    exec_ = {
        "apiVersion": "client.authentication.k8s.io/v1",
        "command": str(plugin),
        "env": [{"name": "SECRET", "value": SECRETS["env"]}],
        "interactiveMode": "Never",
    }
    path = kubeconfig(tmp_path / "config", {"exec": exec_, "token": SECRETS["token"]})
    out = run_cli("--kubeconfig", str(path), "status", tool="kubectl")
    assert out.returncode == EXIT_ERROR, out.stderr
    line = one_line(out.stderr)
    assert SECRETS["env"] not in line and SECRETS["token"] not in line, line


def not_found(url: str, details: dict[str, Any] | None) -> Reply:
    body: dict[str, Any] = {"kind": "Status", "reason": "NotFound", "code": 404}
    body["message"] = "the server could not find the requested resource"
    if details is not None:
        body["details"] = details
    return Reply(RequestInfo("GET", url), 404, body)


def test_a_missing_crd_is_said_not_a_missing_lease() -> None:
    url = "https://h/apis/fencedlease.io/v1alpha1/namespaces/ns/fencedleases/jobs"
    with pytest.raises(ApiError) as missing:
        not_found(url, {}).raise_for_status()
    assert missing.value.not_installed
    assert "fencedleases.fencedlease.io is not installed" in str(missing.value)
    assert "helm install" in str(missing.value)
    lease = not_found(url, {"name": "jobs", "group": "fencedlease.io", "kind": "fencedleases"})
    with pytest.raises(ApiError) as gone:
        lease.raise_for_status()
    assert not gone.value.not_installed
    assert not_found("https://h/api/v1/namespaces/ns/pods/p", {}).not_installed() is None


def test_a_refused_connection_says_so() -> None:
    config = KubeConfig(server="https://127.0.0.1:1", timeout=5)
    with KubeClient(config) as kube, pytest.raises(TransportError) as refused:
        kube.request("GET", "/api/v1/namespaces/ns/pods/p")
    assert "cannot connect to the API server" in str(refused.value)
    assert "refused" in str(refused.value).lower()


def test_release_to_a_refused_connection_is_not_http_0(tmp_path: Path) -> None:
    path = kubeconfig(tmp_path / "config", {"token": "x"})
    out = run_cli(
        "release", "jobs", "--lease-id", "abc", "--token", "5", "--pod", "p", "--pod-uid",
        "u", "--kubeconfig", str(path), "--wait", "0",
    )  # fmt: skip
    assert out.returncode == 13, out.stderr
    line = one_line(out.stderr)
    assert "HTTP 0" not in line and "cannot connect to the API server" in line, line


def test_token_dir_that_does_not_exist_is_an_error(tmp_path: Path) -> None:
    missing = tmp_path / "nonexistent"
    out = run_cli("token", "--dir", str(missing))
    assert out.returncode == EXIT_ERROR, out.stderr
    assert one_line(out.stderr) == f"error: grant directory {missing} does not exist"
    (tmp_path / "empty").mkdir()
    assert run_cli("token", "--dir", str(tmp_path / "empty")).returncode == 3  # absent


def test_operator_commands_name_their_distribution() -> None:
    assert client_main(["etcd", "restore"], extensions=[]) == EXIT_USAGE


def test_publish_and_claims_say_the_crd_is_not_installed() -> None:
    """Before: a publish retried the 404s and reported ``unavailable`` (exit code 13)."""
    from fencedlease.client import Rejected, RetryPolicy
    from fencedlease.client.claims import ClaimRefused, ClaimRequest
    from fencedlease.client.claims import plan as claim_plan
    from fencedlease.client.publish import PublishRequest, plan
    from tests.client_fakes import run_plan

    base = "https://h/apis/fencedlease.io/v1alpha1/namespaces/ns"
    missing = not_found(f"{base}/fencedartifacts/cat", {})
    req = PublishRequest("ns", "cat", "lease", 42, "obj", "op-1")
    result, steps = run_plan(plan(req, RetryPolicy(attempts=3, jitter=False)), [missing, missing])
    assert isinstance(result, Rejected) and result.code == "not_installed", result
    assert "fencedartifacts.fencedlease.io is not installed" in result.message
    assert len(steps) == 2  # the read and the create: no retries
    claim = ClaimRequest("t", "i", pod="p", pod_uid="u", namespace="ns", wait=0)
    result, _ = run_plan(claim_plan(claim), [not_found(f"{base}/fencedclaims", {})])
    assert isinstance(result, ClaimRefused) and result.reason == "not_installed"


def test_a_release_without_an_answer_says_why_not_http_0() -> None:
    from fencedlease.client.release import ReleaseRequest
    from fencedlease.client.release import plan as release_plan
    from fencedlease.client.results import Unavailable
    from tests.client_fakes import run_plan

    info = RequestInfo("POST", "https://h/apis/fencedlease.io/v1alpha1/namespaces/ns/x")
    message = f"{info}: cannot connect to the API server: [Errno 111] Connection refused"
    refused = Reply(info, 0, {"kind": "Status", "reason": "Transport", "message": message})
    req = ReleaseRequest("l", "g1", 5, pod="p", pod_uid="u", namespace="ns", wait=0)
    result, _ = run_plan(release_plan(req), [refused])
    assert isinstance(result, Unavailable) and result.message == message


def test_the_fenced_kubernetes_api_client_refuses_dot_segments(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The official client percent-encodes a name (``a/b`` is ``a%2Fb``) but sends ``..`` as it
    is, and urllib3 resolves it: a DELETE of ConfigMap ``..`` would be one of the collection."""
    from kubernetes import client as k8s

    from fencedlease.client.fenced import fenced_api_client
    from fencedlease.client.grant import Grant

    sent: list[str] = []
    monkeypatch.setattr(k8s.ApiClient, "request", lambda self, m, url, *a, **k: sent.append(url))
    configuration = k8s.Configuration(host="https://127.0.0.1:1")
    until = dt.datetime(2100, 1, 1, tzinfo=dt.timezone.utc)
    api = k8s.CoreV1Api(
        fenced_api_client(lambda: Grant(5, "id5", until, "held", "l"), configuration)
    )
    for name in ("..", "a/../..", "x#"):
        with pytest.raises(InvalidInput):
            api.delete_namespaced_config_map(name, "ns")
    assert sent == []


def test_a_config_never_shows_its_credentials() -> None:
    config = KubeConfig(server="https://h", token=SECRETS["token"], key_data=b"KEY-DATA-5")
    assert SECRETS["token"] not in repr(config) and "KEY-DATA-5" not in repr(config)


def test_redact_keeps_what_is_not_a_credential() -> None:
    text = "spec.fencingToken: Invalid value: 5 (stale_fence: token 4 is below the mark 5)"
    assert redact(text) == text
