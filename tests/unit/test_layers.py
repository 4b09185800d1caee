"""The architecture of docs/design.md, enforced: no module imports from a higher floor, and the
controller and the webhook never import each other (only the composition root sees both)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = (
    ROOT / "operator" / "fencedlease",
    ROOT / "client" / "src" / "fencedlease",
    ROOT / "local" / "src" / "fencedlease",
)
"""The three distributions' portions of the ``fencedlease`` package: the operator's, the
client's (client/pyproject.toml) and the local machinery's (local/pyproject.toml)."""

FLOORS = {
    "__init__": 0,  # the version string
    "health": 1,  # liveness and readiness decisions (pure, injected clock)
    "authority": 0,  # pure decisions: no I/O
    "models": 1,
    "settings": 1,
    "store": 2,  # adapters, one floor: etcd, Kubernetes API, Events, metrics, TLS material
    "kube": 2,
    "events": 2,
    "metrics": 2,
    "pki": 2,
    "election": 2,  # the controller replicas' leader election (pure decisions + its adapter)
    "controller": 3,  # the two parts, siblings
    "webhook": 3,
    "client": 0,  # its own distribution, under the operator: imports nothing of it
    "app": 4,  # the composition root
    "cli": 5,
    "__main__": 5,
    "local": 5,  # developer machinery, loaded lazily by the CLI
    "etcdbackup": 5,  # `fencedlease etcd ...`: backup retention and restore, loaded by the CLI
}


def room(module: str) -> str:
    """``fencedlease.controller.reconciler`` → ``controller``."""
    return module.split(".")[1] if module.count(".") >= 1 else ""


def imports() -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    for package, path in ((pkg, p) for pkg in PACKAGES for p in pkg.rglob("*.py")):
        rel = path.relative_to(package.parent).with_suffix("")
        source = ".".join(rel.parts)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
                if node.module == "fencedlease":  # from fencedlease import metrics, __version__
                    names = [
                        f"fencedlease.{a.name}"
                        if a.name != "__version__"
                        else "fencedlease.__init__"
                        for a in node.names
                    ]
                found.extend((source, n) for n in names if n.startswith("fencedlease."))
            elif isinstance(node, ast.Import):
                found.extend(
                    (source, a.name) for a in node.names if a.name.startswith("fencedlease.")
                )
    return found


def test_every_room_has_a_floor() -> None:
    rooms = {room(src) for src, _ in imports()} | {room(dst) for _, dst in imports()}
    assert rooms - {""} <= set(FLOORS), rooms - set(FLOORS)


def test_no_module_imports_from_a_higher_floor() -> None:
    upward = [
        (src, dst) for src, dst in imports() if room(src) and FLOORS[room(dst)] > FLOORS[room(src)]
    ]
    assert upward == []


def test_controller_and_webhook_share_no_import() -> None:
    crossing = [
        (src, dst) for src, dst in imports() if {room(src), room(dst)} == {"controller", "webhook"}
    ]
    assert crossing == []


def test_the_client_distribution_imports_only_itself() -> None:
    """fencedlease-client installs without the operator: nothing in it may import the rest."""
    outside = [
        (src, dst) for src, dst in imports() if room(src) == "client" and room(dst) != "client"
    ]
    assert outside == []
    assert any(room(src) == "client" for src, _ in imports())  # the client was scanned
