"""The client's configuration through the official kubernetes config loader (issue 34, item 2):
several ``$KUBECONFIG`` files, contexts, exec credential plugins, in-cluster service accounts,
and one clear line for every bad input (the CLI's exit code 1, never a traceback).  The exec
path against a real kube-apiserver: tests/integration/test_client_kubeconfig.py."""

from __future__ import annotations

import base64
import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from fencedlease.client import ConfigError, KubeConfig

CA = (
    "-----BEGIN CERTIFICATE-----\n"
    "MIIBdzCCAR2gAwIBAgIUXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXwCgYIKoZIzj0EAwIw\n"
    "-----END CERTIFICATE-----\n"
)


def kubeconfig(
    path: Path,
    *,
    clusters: list[dict[str, Any]] | None = None,
    users: list[dict[str, Any]] | None = None,
    contexts: list[dict[str, Any]] | None = None,
    current: str | None = None,
) -> Path:
    doc: dict[str, Any] = {"apiVersion": "v1", "kind": "Config"}
    for key, value in (("clusters", clusters), ("users", users), ("contexts", contexts)):
        if value is not None:
            doc[key] = value
    if current is not None:
        doc["current-context"] = current
    path.write_text(yaml.safe_dump(doc))
    return path


def cluster(name: str, server: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "cluster": {"server": server, **extra}}


def context(name: str, cluster_name: str, user: str, namespace: str | None = None) -> Any:
    ctx: dict[str, Any] = {"cluster": cluster_name, "user": user}
    if namespace:
        ctx["namespace"] = namespace
    return {"name": name, "context": ctx}


def exec_plugin(tmp_path: Path, name: str, body: str) -> Path:
    script = tmp_path / name
    script.write_text(f"#!{sys.executable}\n{body}")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def exec_user(name: str, command: Path, *args: str) -> dict[str, Any]:
    return {
        "name": name,
        "user": {
            "exec": {
                "apiVersion": "client.authentication.k8s.io/v1",
                "command": str(command),
                "args": list(args),
                "interactiveMode": "Never",
            }
        },
    }


CREDENTIAL = (
    "import json, sys\n"
    "print(json.dumps({'apiVersion': 'client.authentication.k8s.io/v1',"
    " 'kind': 'ExecCredential', 'status': {'token': sys.argv[1]}}))\n"
)


def test_one_file_relative_ca_and_inline_data(tmp_path: Path) -> None:
    (tmp_path / "ca.crt").write_text(CA)
    path = kubeconfig(
        tmp_path / "kc",
        clusters=[cluster("c", "https://127.0.0.1:6443/", **{"certificate-authority": "ca.crt"})],
        users=[{"name": "u", "user": {"token": "t0k"}}],
        contexts=[context("x", "c", "u", "reports")],
        current="x",
    )
    cfg = KubeConfig.from_kubeconfig(path)
    assert cfg.server == "https://127.0.0.1:6443" and cfg.namespace == "reports"
    assert cfg.ca_file == str(tmp_path / "ca.crt")
    assert cfg.headers()["Authorization"] == "Bearer t0k"
    inline = kubeconfig(
        tmp_path / "inline",
        clusters=[
            cluster(
                "c",
                "https://h:6443",
                **{"certificate-authority-data": base64.b64encode(CA.encode()).decode()},
            )
        ],
        users=[{"name": "u", "user": {"token": "t1"}}],
        contexts=[context("x", "c", "u")],
        current="x",
    )
    cfg = KubeConfig.from_kubeconfig(inline)
    assert cfg.namespace == "default" and cfg.ca_file is not None
    assert Path(cfg.ca_file).read_text() == CA  # the library's temporary copy


def test_several_kubeconfig_files_merge_as_kubectl(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Clusters in one file, users and contexts in another; the first current-context wins."""
    first = kubeconfig(
        tmp_path / "a",
        clusters=[cluster("prod", "https://prod:6443"), cluster("dev", "https://dev:6443")],
        current="dev-ctx",
    )
    second = kubeconfig(
        tmp_path / "b",
        users=[{"name": "alice", "user": {"token": "a"}}, {"name": "bob", "user": {"token": "b"}}],
        contexts=[context("dev-ctx", "dev", "alice", "d"), context("prod-ctx", "prod", "bob")],
        current="prod-ctx",
    )
    missing = tmp_path / "missing"
    monkeypatch.setenv("KUBECONFIG", os.pathsep.join([str(missing), str(first), str(second)]))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    cfg = KubeConfig.load()
    assert (cfg.server, cfg.namespace) == ("https://dev:6443", "d")
    assert cfg.headers()["Authorization"] == "Bearer a"
    other = KubeConfig.load(context="prod-ctx")
    assert (other.server, other.namespace) == ("https://prod:6443", "default")
    assert other.headers()["Authorization"] == "Bearer b"


def test_exec_plugin_token_is_sent(tmp_path: Path) -> None:
    plugin = exec_plugin(tmp_path, "plugin", CREDENTIAL)
    path = kubeconfig(
        tmp_path / "kc",
        clusters=[cluster("c", "https://h:6443", **{"insecure-skip-tls-verify": True})],
        users=[exec_user("u", plugin, "from-exec")],
        contexts=[context("x", "c", "u")],
        current="x",
    )
    cfg = KubeConfig.from_kubeconfig(path)
    assert cfg.insecure
    assert cfg.headers()["Authorization"] == "Bearer from-exec"


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ("missing", "cannot read kubeconfig"),
        ("garbage", "not readable YAML"),
        ("list", "not a mapping"),
        ("no-context", "no context named 'nope'"),
        ("no-current", "no current-context"),
        ("exec-fails", "exec"),
        ("exec-missing", "exec"),
        ("exec-empty", "exec"),
        ("no-cluster", "kubeconfig"),
    ],
)
def test_bad_configuration_is_one_line(tmp_path: Path, setup: str, message: str) -> None:
    path = tmp_path / "kc"
    ctx = [context("x", "c", "u")]
    good_cluster = [cluster("c", "https://h:6443")]
    if setup == "garbage":
        path.write_bytes(b"clusters: [\x00\xff")
    elif setup == "list":
        path.write_text("- a\n- b\n")
    elif setup == "no-context":
        kubeconfig(path, clusters=good_cluster, contexts=ctx, current="nope")
    elif setup == "no-current":
        kubeconfig(path, clusters=good_cluster, contexts=ctx)
    elif setup.startswith("exec"):
        body = {
            "exec-fails": "import sys\nprint('no credentials for you', file=sys.stderr)\n"
            "sys.exit(3)\n",
            "exec-empty": "print('{}')\n",
        }.get(setup)
        plugin = exec_plugin(tmp_path, "p", body) if body else tmp_path / "absent-plugin"
        kubeconfig(
            path, clusters=good_cluster, users=[exec_user("u", plugin)], contexts=ctx, current="x"
        )
    elif setup == "no-cluster":
        kubeconfig(path, users=[{"name": "u", "user": {"token": "t"}}], contexts=ctx, current="x")
    with pytest.raises(ConfigError) as raised:
        KubeConfig.from_kubeconfig(path).headers()
    text = str(raised.value)
    assert message in text and "\n" not in text, text


def test_cli_exit_code_and_one_line_for_a_failing_exec_plugin(tmp_path: Path) -> None:
    plugin = exec_plugin(
        tmp_path, "p", "import sys\nprint('token expired: run aws sso login', file=sys.stderr)\n"
        "sys.exit(1)\n"
    )  # fmt: skip
    path = kubeconfig(
        tmp_path / "kc",
        clusters=[cluster("c", "https://127.0.0.1:1")],
        users=[exec_user("u", plugin)],
        contexts=[context("x", "c", "u")],
        current="x",
    )
    env = dict(os.environ, KUBECONFIG=str(path))
    for argv in (
        ["-m", "fencedlease.client", "publish", "cat", "--lease", "l", "--object-ref", "o",
         "--token", "5"],
        ["-m", "fencedlease.client.kubectl", "status"],
    ):  # fmt: skip
        out = subprocess.run(
            [sys.executable, *argv], capture_output=True, text=True, env=env, timeout=60
        )
        assert out.returncode == 1, (argv, out.stderr)
        assert out.stderr.count("\n") == 1 and out.stderr.startswith("error: "), out.stderr
        assert "Traceback" not in out.stderr and "exec" in out.stderr, out.stderr


def test_in_cluster_service_account(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("sa-token-1")
    (sa / "ca.crt").write_text(CA)
    (sa / "namespace").write_text("workers\n")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    cfg = KubeConfig.in_cluster(sa)
    assert (cfg.server, cfg.namespace) == ("https://10.0.0.1:443", "workers")
    assert cfg.ca_file == str(sa / "ca.crt")
    assert cfg.headers()["Authorization"].lower() == "bearer sa-token-1"  # the scheme: any case
    (sa / "token").unlink()
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    with pytest.raises(ConfigError, match="in-cluster"):
        KubeConfig.in_cluster(sa)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST")
    with pytest.raises(ConfigError, match="not in a Pod"):
        KubeConfig.in_cluster(sa)


def test_an_explicit_token_file_is_read_per_request(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("one")
    cfg = KubeConfig(server="https://h", token_file=str(token))
    assert cfg.headers()["Authorization"] == "Bearer one"
    token.write_text("two")
    assert cfg.headers()["Authorization"] == "Bearer two"
    assert json.dumps(cfg.headers())  # plain strings
