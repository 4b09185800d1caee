"""The architecture of docs/design.md, enforced: no module imports from a higher floor (relative
imports included), the parts (controller, webhook, registration, client) never import each
other (only the composition root sees the controller, the webhook and the registration), and
only the composition root builds the process's adapters and starts its parts."""

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
    "watching": 2,  # the list-watch loop that feeds the controller's caches
    "controller": 3,  # the two parts, siblings
    "webhook": 3,
    "registration": 3,  # the webhook configuration: registered (local mode) or guarded (chart)
    "client": 0,  # its own distribution, under the operator: imports nothing of it
    "app": 4,  # the composition root
    "cli": 5,
    # Kopf's host of the process (`fencedlease run`, `kopf run -m fencedlease.kopfapp`): an
    # entry point over the composition root, whose start/close its startup/cleanup call
    "kopfapp": 5,
    "__main__": 5,
    "local": 5,  # developer machinery, a CLI entry point (tests/unit/test_run_path_imports.py)
    "etcdbackup": 5,  # `fencedlease etcd ...`: backup retention and restore, loaded by the CLI
}


def room(module: str) -> str:
    """``fencedlease.controller.reconciler`` → ``controller``."""
    return module.split(".")[1] if module.count(".") >= 1 else ""


def sources() -> list[Path]:
    """Every module of the three distributions' portions."""
    return [p for package in PACKAGES for p in sorted(package.rglob("*.py"))]


def module_of(path: Path) -> str:
    """``.../fencedlease/controller/reconciler.py`` → ``fencedlease.controller.reconciler``
    (a package's ``__init__.py``: the package)."""
    package = next(pkg for pkg in PACKAGES if path.is_relative_to(pkg))
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def absolute(source: str, is_package: bool, node: ast.ImportFrom) -> list[str]:
    """The modules ``node`` (in module ``source``) imports from, absolute: a relative import
    (``from .x import y``, ``from .. import z``) resolved against ``source``'s package; a
    name imported from a package may be a module of it, so both are returned."""
    if node.level == 0:
        base = node.module or ""
    else:
        package = source.split(".") if is_package else source.split(".")[:-1]
        anchor = package[: len(package) - (node.level - 1)]
        base = ".".join([*anchor, *([node.module] if node.module else [])])
    if base == "fencedlease" or node.module is None:
        return [f"{base}.{a.name}" if a.name != "__version__" else base for a in node.names]
    return [base]


def imports() -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    for path in sources():
        source = module_of(path)
        if path.name == "__init__.py" and source == "fencedlease":
            source = "fencedlease.__init__"
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = absolute(source, path.name == "__init__.py", node)
                names = ["fencedlease.__init__" if n == "fencedlease" else n for n in names]
                found.extend((source, n) for n in names if n.startswith("fencedlease."))
            elif isinstance(node, ast.Import):
                found.extend(
                    (source, a.name) for a in node.names if a.name.startswith("fencedlease.")
                )
    return found


def test_relative_imports_are_resolved() -> None:
    def resolved(source: str, is_package: bool, statement: str) -> list[str]:
        node = ast.parse(statement).body[0]
        assert isinstance(node, ast.ImportFrom)
        return absolute(source, is_package, node)

    reconciler = "fencedlease.controller.reconciler"
    assert resolved(reconciler, False, "from .pods import PodInfo") == [
        "fencedlease.controller.pods"
    ]
    assert resolved(reconciler, False, "from ..webhook import leases") == ["fencedlease.webhook"]
    assert resolved(reconciler, False, "from .. import metrics") == ["fencedlease.metrics"]
    assert resolved("fencedlease.webhook", True, "from .server import A") == [
        "fencedlease.webhook.server"
    ]
    assert resolved(reconciler, False, "from fencedlease import __version__") == ["fencedlease"]


def test_every_room_has_a_floor() -> None:
    rooms = {room(src) for src, _ in imports()} | {room(dst) for _, dst in imports()}
    assert rooms - {""} <= set(FLOORS), rooms - set(FLOORS)


def test_no_module_imports_from_a_higher_floor() -> None:
    upward = [
        (src, dst) for src, dst in imports() if room(src) and FLOORS[room(dst)] > FLOORS[room(src)]
    ]
    assert upward == []


PARTS = ("controller", "webhook", "registration", "client")


def test_the_parts_are_siblings_that_share_no_import() -> None:
    """The controller, the webhook and the webhook configuration's registration meet only in
    the composition root; the client (the application side: SDK, CLI commands, SQL fence)
    never imports any of them, nor they it."""
    crossing = [
        (src, dst)
        for src, dst in imports()
        if room(src) in PARTS and room(dst) in PARTS and room(src) != room(dst)
    ]
    assert crossing == []


def test_the_client_distribution_imports_only_itself() -> None:
    """fencedlease-client installs without the operator: nothing in it may import the rest."""
    outside = [
        (src, dst) for src, dst in imports() if room(src) == "client" and room(dst) != "client"
    ]
    assert outside == []
    assert any(room(src) == "client" for src, _ in imports())  # the client was scanned


BUILDS = {
    "EtcdStore": "the etcd store",
    "EtcdStore.from_settings": "the etcd store",
    "KubeApi.create": "the Kubernetes client",
    "LeaseElection": "the leader election",
    "Controller.build": "the controller part",
    "start_webhook": "the webhook part",
    "start_registration": "the registration part",
}
"""What only the composition root builds or starts."""


def called(func: ast.expr) -> str:
    """``f(...)`` → ``f``; ``A.f(...)`` → ``A.f``; anything else → ``""``."""
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        return f"{func.value.id}.{func.attr}"
    return ""


def test_only_the_composition_root_builds_adapters_and_starts_parts() -> None:
    """docs/design.md, "Floors": ``app.py`` builds the process's adapters (etcd store,
    Kubernetes client, election) and starts the parts; a part assembles only its own insides
    from what it is handed (``Controller.build``, ``start_webhook``, ``start_registration``,
    ``AdmissionServer``)."""
    outside = [
        (module_of(path), called(node.func))
        for path in sources()
        # client/ is the application side: it builds its own SDK clients, not the process's
        if room(module_of(path)) not in {"app", "client"}
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call) and called(node.func) in BUILDS
    ]
    assert outside == []
