"""Build the pinned binaries (etcd, kube-apiserver, kubectl, helm; node tools) from Go modules;
take promtool from Debian's package where apt can fetch it.

Binaries are built once per pinned version into a cache outside the repository::

    ${FENCEDLEASE_CACHE:-~/.cache/fencedlease}/bin/<tool>-<version>/<binary>

A second call finds them and returns immediately.  Each tool is built in a small wrapper Go
module (``.../src/<tool>-<version>/``) so that modules with ``replace`` directives of their own
(k8s.io/kubernetes replaces every staging module with ``./staging/...``) can be built with
``go build``: the wrapper ``replace``s each staging module with its matching ``v0.x`` release.

Run ``python -m fencedlease.local.binaries`` (or ``make binaries``) to build the control plane's
tools up front; ``python -m fencedlease.local.binaries --node`` (``make binaries NODE=1``) adds
the node's: kubelet, kube-controller-manager, kube-scheduler, kube-proxy (the same wrapper module
and version as kube-apiserver) and CoreDNS.  ``python -m fencedlease.local.binaries minio``
(``make minio``) builds the S3 server of the S3 fence's tests (docs/fences.md).

promtool (``promtool test rules`` of the chart's alerts) comes from Debian's ``prometheus``
package, pinned (:data:`PROMTOOL_DEBIAN`): ``apt-get download`` and ``dpkg-deb -x``, nothing
installed, a 19 MB download. Its Go build (Prometheus 3.16) fetched 1.9 GB of modules and took
8 minutes of a cold run on this machine; it remains the fallback where the package cannot be had
(no apt, or the pinned version gone from the mirror).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import fcntl
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ETCD_VERSION = "v3.6.16"
KUBERNETES_VERSION = "v1.37.2"
HELM_VERSION = "v3.22.0"
COREDNS_VERSION = "v1.14.7"
PROMETHEUS_MODULE_VERSION = "v0.316.0"  # the Go module's version of Prometheus 3.16 (promtool)
# MinIO tags no module versions: `go list -m github.com/minio/minio@latest` resolves this
# pseudo-version (the S3 fence's tests; docs/fences.md).
MINIO_VERSION = "v0.0.0-20260212201848-7aac2a2c5b7c"
# go-containerregistry's crane: `crane registry serve`, the loopback OCI registry of `make e2e`
# (local/registry.py), and `crane push` of the release's image archive to it.
CRANE_VERSION = "v0.22.1"


class BuildError(RuntimeError):
    """A Go build failed; the message says which step and how to retry."""


@dataclasses.dataclass(frozen=True)
class Debian:
    """Binaries taken from a pinned Debian package (``apt-get download``, ``dpkg-deb -x``)."""

    package: str
    version: str
    paths: tuple[tuple[str, str], ...]  # (binary name, its path inside the package)


# Debian bookworm's Prometheus 2.42: the chart's alerts must hold on a Prometheus this old too.
PROMTOOL_DEBIAN = Debian("prometheus", "2.42.0+ds-5+deb12u1", (("promtool", "usr/bin/promtool"),))


_KUBERNETES_MODULE = "k8s.io/kubernetes"


@dataclasses.dataclass(frozen=True)
class Tool:
    name: str
    version: str
    binaries: tuple[tuple[str, str], ...]  # (binary name, Go package path)
    modules: tuple[str, ...]  # the Go modules the wrapper module requires (at ``version``)
    node: bool = False  # only `local up --node` needs it: not built by default
    extra: bool = False  # only some tests need it: built by name (`make minio`), or on first use
    debian: Debian | None = None  # taken from this package where apt can fetch it
    # Bumped when the build itself changes (its flags), not the version: the cache key changes,
    # so a binary cached by the older build is rebuilt once.
    revision: int = 0

    @property
    def kubernetes(self) -> bool:
        return _KUBERNETES_MODULE in self.modules

    @property
    def cache_name(self) -> str:
        """``<name>-<version>[-r<revision>]``: the tool's cache directory and build lock."""
        return f"{self.name}-{self.version}" + (f"-r{self.revision}" if self.revision else "")


def _kubernetes_tool(name: str, commands: tuple[str, ...], node: bool = False) -> Tool:
    binaries = tuple((cmd, f"{_KUBERNETES_MODULE}/cmd/{cmd}") for cmd in commands)
    return Tool(name, KUBERNETES_VERSION, binaries, (_KUBERNETES_MODULE,), node)


TOOLS: dict[str, Tool] = {
    "etcd": Tool(
        "etcd",
        ETCD_VERSION,
        (("etcd", "go.etcd.io/etcd/server/v3"), ("etcdutl", "go.etcd.io/etcd/etcdutl/v3")),
        ("go.etcd.io/etcd/server/v3", "go.etcd.io/etcd/etcdutl/v3"),
    ),
    # etcdctl: the chart's backup CronJob runs it (`etcdctl snapshot save`; etcdutl cannot
    # snapshot a running member), in the node's etcd image and in
    # tests/integration/test_etcd_backup_cronjob.py. Its own directory: etcd never waits for it.
    "etcdctl": Tool(
        "etcdctl",
        ETCD_VERSION,
        (("etcdctl", "go.etcd.io/etcd/etcdctl/v3"),),
        ("go.etcd.io/etcd/etcdctl/v3",),
    ),
    "kubernetes": _kubernetes_tool("kubernetes", ("kube-apiserver", "kubectl")),
    # Revision 1: linked with the Kubernetes version helm's own Makefile sets (the default of
    # --kube-version, checked against Chart.yaml's kubeVersion), not its source's v1.20.
    "helm": Tool(
        "helm",
        HELM_VERSION,
        (("helm", "helm.sh/helm/v3/cmd/helm"),),
        ("helm.sh/helm/v3",),
        revision=1,
    ),
    # promtool, for `promtool test rules` of the chart's alerts (tests/integration): Debian's
    # package first, the Go module where that cannot be had.
    "promtool": Tool(
        "promtool",
        PROMETHEUS_MODULE_VERSION,
        (("promtool", "github.com/prometheus/prometheus/cmd/promtool"),),
        ("github.com/prometheus/prometheus",),
        debian=PROMTOOL_DEBIAN,
    ),
    # The node's Kubernetes binaries: same wrapper module and version as kube-apiserver, cached
    # in their own directory so that the control plane never waits for them.
    "kubernetes-node": _kubernetes_tool(
        "kubernetes-node",
        ("kubelet", "kube-controller-manager", "kube-scheduler", "kube-proxy"),
        node=True,
    ),
    "coredns": Tool(
        "coredns",
        COREDNS_VERSION,
        (("coredns", "github.com/coredns/coredns"),),
        ("github.com/coredns/coredns",),
        node=True,
    ),
    # The S3-compatible server of the S3 fence's tests (tests/fences): built by `make minio`.
    "minio": Tool(
        "minio",
        MINIO_VERSION,
        (("minio", "github.com/minio/minio"),),
        ("github.com/minio/minio",),
        extra=True,
    ),
    # The loopback OCI registry of `make e2e` (fencedlease.local.registry): built by its step.
    "crane": Tool(
        "crane",
        CRANE_VERSION,
        (("crane", "github.com/google/go-containerregistry/cmd/crane"),),
        ("github.com/google/go-containerregistry",),
        extra=True,
    ),
}


def cache_root() -> Path:
    env = os.environ.get("FENCEDLEASE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "fencedlease"


def tool_dir(tool: Tool) -> Path:
    """Where the Go build of ``tool`` goes."""
    return cache_root() / "bin" / tool.cache_name


def debian_dir(tool: Tool, debian: Debian) -> Path:
    """Where the binaries of ``tool`` taken from its Debian package go."""
    return cache_root() / "bin" / f"{tool.name}-deb-{debian.version}"


def binary_path(binary: str) -> Path:
    """Path of a built binary (built on first use)."""
    for tool in TOOLS.values():
        for name, _ in tool.binaries:
            if name == binary:
                return ensure(tool.name) / name
    raise KeyError(f"unknown binary {binary!r}")


def _log(msg: str) -> None:
    print(f"[fencedlease build] {msg}", file=sys.stderr, flush=True)


def go_tool() -> str:
    go = shutil.which("go")
    if go is None:
        raise BuildError(
            "the 'go' toolchain is not on PATH; install Go (>= 1.26) and run 'make binaries' again"
        )
    return go


def _run(cmd: list[str], cwd: Path, step: str, tool: Tool, progress: bool = False) -> None:
    env = dict(os.environ, GOFLAGS="-buildvcs=false", CGO_ENABLED="0")
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert proc.stdout is not None
    tail: collections.deque[str] = collections.deque(maxlen=40)
    last = start
    for count, line in enumerate(proc.stdout, 1):
        tail.append(line.rstrip())
        now = time.monotonic()
        if progress and now - last >= 15:
            _log(f"{tool.name}: {step}: {count} packages so far, {now - start:.0f}s elapsed")
            last = now
    rc = proc.wait()
    if rc != 0:
        raise BuildError(
            f"{tool.name} {tool.version}: '{step}' failed (exit {rc}) in {cwd}:\n"
            + "\n".join(tail)
            + f"\nFix the cause (network to the Go module proxy? disk space?) and retry with "
            f"'make binaries'; remove {cwd} to start that build from scratch."
        )


def _kubernetes_replaces(workdir: Path, tool: Tool) -> list[str]:
    out = subprocess.run(
        [go_tool(), "list", "-m", "-f", "{{.GoMod}}", f"k8s.io/kubernetes@{tool.version}"],
        cwd=workdir,
        capture_output=True,
        text=True,
        env=dict(os.environ, GO111MODULE="on"),
    )
    if out.returncode != 0:
        raise BuildError(f"cannot fetch k8s.io/kubernetes@{tool.version} go.mod: {out.stderr}")
    staging = re.findall(
        r"^\s*(k8s\.io/[\w.-]+)\s+=>\s+\./staging/", Path(out.stdout.strip()).read_text(), re.M
    )
    minor = tool.version.lstrip("v").split(".", 1)[1]
    return [f"{mod} => {mod} v0.{minor}" for mod in staging]


def _module_version(workdir: Path, module: str) -> str:
    """The version of ``module`` in the wrapper module's build list (after ``go mod tidy``)."""
    out = subprocess.run(
        [go_tool(), "list", "-m", "-f", "{{.Version}}", module],
        cwd=workdir,
        capture_output=True,
        text=True,
        env=dict(os.environ, GOFLAGS="-buildvcs=false"),
    )
    if out.returncode != 0 or not out.stdout.strip():
        raise BuildError(f"go list -m {module} in {workdir} failed: {out.stderr.strip()}")
    return out.stdout.strip()


def helm_kube_version(client_go: str) -> tuple[str, str]:
    """The default Kubernetes version helm is linked with, as helm's Makefile computes it from
    the k8s.io/client-go it builds with: v0.37.0 -> ("1", "37")."""
    major, minor = client_go.lstrip("v").split(".")[:2]
    return str(int(major) + 1), minor


def _ldflags(tool: Tool, workdir: Path) -> str:
    if tool.kubernetes:
        major, minor, _ = tool.version.lstrip("v").split(".")
        flags = []
        for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
            flags += [
                f"-X {pkg}.gitVersion={tool.version}",
                f"-X {pkg}.gitMajor={major}",
                f"-X {pkg}.gitMinor={minor}",
                f"-X {pkg}.gitTreeState=clean",
                f"-X {pkg}.buildDate=1970-01-01T00:00:00Z",
            ]
        return " ".join(flags)
    if tool.name == "helm":
        # helm's Makefile (v3.22): LDFLAGS += -X .../pkg/lint/rules.k8sVersionMajor=... and
        # pkg/chartutil's, from `go list -m k8s.io/client-go` (major + 1, minor). Without them
        # helm's default kube-version is v1.20 and `helm lint`/`template` fail the chart's
        # kubeVersion unless given --kube-version.
        major, minor = helm_kube_version(_module_version(workdir, "k8s.io/client-go"))
        flags = [f"-X helm.sh/helm/v3/internal/version.version={tool.version}"]
        for pkg in ("helm.sh/helm/v3/pkg/lint/rules", "helm.sh/helm/v3/pkg/chartutil"):
            flags += [f"-X {pkg}.k8sVersionMajor={major}", f"-X {pkg}.k8sVersionMinor={minor}"]
        return " ".join(flags)
    return ""


@contextlib.contextmanager
def _build_lock(tool: Tool) -> Iterator[None]:
    """One build of a tool at a time on this machine: concurrent callers (a test run, `make
    chaos`, a second checkout) share the cache, and two builds would write the same
    ``.partial`` directory. The others wait, then find the binaries built."""
    locks = cache_root() / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    with open(locks / f"{tool.cache_name}.lock", "w") as handle:
        if not _try_lock(handle.fileno()):
            _log(f"{tool.name}: another process is building it; waiting")
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _built(tool: Tool, out: Path) -> bool:
    return all((out / b).exists() for b, _ in tool.binaries)


_NO_DEBIAN: set[str] = set()  # tools whose Debian package could not be had (this process)


def ensure(name: str) -> Path:
    """Build (or fetch) tool ``name`` unless its binaries are already cached; return its bin
    directory. A tool with a Debian package uses the package's binaries wherever apt can fetch
    them (so that every machine tests with the same ones), its Go build only where it cannot."""
    tool = TOOLS[name]
    debian = tool.debian if name not in _NO_DEBIAN else None
    out = debian_dir(tool, debian) if debian is not None else tool_dir(tool)
    if _built(tool, out):
        return out
    with _build_lock(tool):
        if debian is not None and not _built(tool, out):
            try:
                return _fetch_debian(tool, debian)
            except BuildError as exc:
                _NO_DEBIAN.add(name)
                _log(f"{tool.name}: {exc}; building it from its Go module instead")
                out = tool_dir(tool)
        if not _built(tool, out):
            _build(tool, out)
    return out


def _fetch_debian(tool: Tool, debian: Debian) -> Path:
    """``apt-get download`` the pinned package and extract its binaries: no root needed,
    nothing installed. As root, with apt's lists missing, ``apt-get update`` once first."""
    apt, dpkg = shutil.which("apt-get"), shutil.which("dpkg-deb")
    if apt is None or dpkg is None:
        raise BuildError("no apt-get or dpkg-deb on this machine")
    spec = f"{debian.package}={debian.version}"
    out = debian_dir(tool, debian)
    out.parent.mkdir(parents=True, exist_ok=True)
    _log(f"{tool.name}: taking it from Debian's {spec} (first use only; cached in {out})")
    try:
        return _extract_debian(debian, apt, dpkg, out)
    except (OSError, subprocess.SubprocessError) as exc:
        raise BuildError(f"taking {spec} failed: {exc}") from exc


def _extract_debian(debian: Debian, apt: str, dpkg: str, out: Path) -> Path:
    spec = f"{debian.package}={debian.version}"
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        got = _apt_download(apt, spec, Path(tmp))
        if got.returncode != 0 and os.geteuid() == 0:
            subprocess.run([apt, "update", "-qq"], capture_output=True, timeout=600)
            got = _apt_download(apt, spec, Path(tmp))
        debs = sorted(Path(tmp).glob("*.deb"))
        if got.returncode != 0 or not debs:
            raise BuildError(f"apt-get download {spec} failed: {got.stderr.strip()[-400:]}")
        tree = Path(tmp) / "tree"
        subprocess.run([dpkg, "-x", str(debs[0]), str(tree)], check=True, timeout=300)
        missing = [inside for _, inside in debian.paths if not (tree / inside).is_file()]
        if missing:
            raise BuildError(f"{spec} has no {', '.join(missing)}")
        partial = out.with_name(out.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()
        for binary, inside in debian.paths:
            shutil.copy2(tree / inside, partial / binary)
        if out.exists():
            shutil.rmtree(out)
        partial.rename(out)
    return out


def _apt_download(apt: str, spec: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [apt, "download", "-qq", spec], cwd=cwd, capture_output=True, text=True, timeout=600
    )


def _build(tool: Tool, out: Path) -> None:
    go = go_tool()
    work = cache_root() / "src" / tool.cache_name
    work.mkdir(parents=True, exist_ok=True)
    _log(f"building {tool.name} {tool.version} from Go modules (first use only; cached in {out})")
    requires = [f"{module} {tool.version}" for module in tool.modules]
    replaces = _kubernetes_replaces(work, tool) if tool.kubernetes else []
    gomod = "module fencedlease.local/build\n\ngo 1.26\n\nrequire (\n"
    gomod += "".join(f"\t{r}\n" for r in requires) + ")\n"
    if replaces:
        gomod += "\nreplace (\n" + "".join(f"\t{r}\n" for r in replaces) + ")\n"
    imports = "".join(f'\t_ "{pkg}"\n' for _, pkg in tool.binaries)
    (work / "tools.go").write_text(f"//go:build tools\n\npackage tools\n\nimport (\n{imports})\n")
    if not (work / "go.mod").exists() or (work / "go.mod.src").read_text() != gomod:
        (work / "go.mod").write_text(gomod)
        (work / "go.mod.src").write_text(gomod)
        (work / "go.sum").unlink(missing_ok=True)
    _log(f"{tool.name}: resolving modules (go mod tidy)")
    _run([go, "mod", "tidy"], work, "go mod tidy", tool)
    tmp = out.with_name(out.name + ".partial")
    tmp.mkdir(parents=True, exist_ok=True)
    for binary, pkg in tool.binaries:
        _log(f"{tool.name}: compiling {binary} ({pkg})")
        t0 = time.monotonic()
        ldflags = f"-s -w {_ldflags(tool, work)}".strip()
        cmd = [go, "build", "-v", "-trimpath", "-ldflags", ldflags]
        _run([*cmd, "-o", str(tmp / binary), pkg], work, f"go build {binary}", tool, progress=True)
        _log(f"{tool.name}: {binary} built in {time.monotonic() - t0:.0f}s")
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)


def default_tools(node: bool = False) -> list[str]:
    """The control plane's tools; with ``node``, the node's too (never the extra ones)."""
    return [name for name, tool in TOOLS.items() if (node or not tool.node) and not tool.extra]


def ensure_all(names: list[str] | None = None) -> None:
    for name in names or default_tools():
        ensure(name)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    node = "--node" in args
    names = [a for a in args if a != "--node"]
    unknown = [n for n in names if n not in TOOLS]
    if unknown:
        print(f"error: unknown tool(s) {unknown}; known: {', '.join(TOOLS)}", file=sys.stderr)
        return 2
    names = names or default_tools(node)
    try:
        ensure_all(names)
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for name in names:
        print(ensure(name))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
