"""``make release`` end to end (scripts/release.py, docs/release.md): a release of the version the
tree carries, built into a temporary directory with a signing key the test generates (gpg,
RSA: Helm's OpenPGP reads legacy keyrings), then every artifact verified as a user would:

- ``sha256sum -c SHA256SUMS`` passes and ``SHA256SUMS.asc`` verifies with the public key;
- ``helm verify`` accepts the chart with its ``.prov``; the chart installs from the ``.tgz`` on
  the local API server (``helm install``, the image by the release's digest);
- the wheels install into a fresh venv (no index) and report the version;
- the image archive's digest is its manifest's, it carries the license and the version label;
  the SBOM is CycloneDX 1.6, valid against the schema, and lists the release's distributions;
- the krew manifest's sha256 is its archive's;
- a tampered file fails: its checksum, the chart's provenance, the checksums' signature.

The image is built like ``make e2e`` builds it (buildah, root) and cached by content: with the
version the tree carries its inputs are the e2e image's, so after the first build of either
this test takes about a minute (docs/release.md, "Timing")."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import tomllib
import uuid
import zipfile
from pathlib import Path

import pytest
import yaml

from fencedlease.local.binaries import binary_path
from fencedlease.local.cluster import LocalCluster

ROOT = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
KEY = "fencedlease release test <release@fencedlease.test>"

pytestmark = pytest.mark.timeout(3600)  # a cold image build; warm: about a minute


def sh(
    *cmd: str | Path, env: dict[str, str] | None = None, check: bool = True, cwd: Path | None = None
) -> str:
    done = subprocess.run(
        [str(c) for c in cmd], capture_output=True, text=True, env=env, cwd=cwd, check=False
    )
    if check:
        assert done.returncode == 0, f"{cmd}: {done.stdout}\n{done.stderr}"
    return str(done.stdout) + str(done.stderr)


def gpg_env(home: Path) -> dict[str, str]:
    return {**os.environ, "GNUPGHOME": str(home)}


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A throwaway signing key: its GNUPGHOME, the legacy secret keyring helm signs with, and
    the public keyring a user verifies with."""
    if shutil.which("gpg") is None:
        pytest.fail("gpg is missing: apt-get install gnupg (make release signs with it)")
    base = tmp_path_factory.mktemp("gpg")
    home = base / "home"
    home.mkdir(mode=0o700)
    env = gpg_env(home)
    sh(
        "gpg", "--batch", "--pinentry-mode", "loopback", "--passphrase", "",
        "--quick-generate-key", KEY, "rsa2048", "sign", "1d", env=env,
    )  # fmt: skip
    secring, pubring = base / "secring.gpg", base / "pubring.gpg"
    with secring.open("wb") as out:
        subprocess.run(
            ["gpg", "--batch", "--pinentry-mode", "loopback", "--passphrase", "",
             "--export-secret-keys", KEY],
            env=env, stdout=out, check=True,
        )  # fmt: skip
    with pubring.open("wb") as out:
        subprocess.run(["gpg", "--batch", "--export", KEY], env=env, stdout=out, check=True)
    return {"home": home, "secring": secring, "pubring": pubring}


@pytest.fixture(scope="module")
def built(keys: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("release") / "out"
    started = time.monotonic()
    done = subprocess.run(
        [
            "make", "-C", str(ROOT), "release", f"VERSION={VERSION}", f"OUT={out}",
            f"KEY={KEY}", f"KEYRING={keys['secring']}", f"GNUPGHOME={keys['home']}",
        ],
        capture_output=True, text=True, timeout=3500, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    print(f"make release: {time.monotonic() - started:.0f} s\n{done.stderr[-600:]}")
    return out


def verify_sums(out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sha256sum", "--check", "--strict", "SHA256SUMS"],
        cwd=out, capture_output=True, text=True, check=False,
    )  # fmt: skip


def gpg_verify(keys: dict[str, Path], signature: Path, data: Path) -> int:
    # A keyring of the public key only: what a user downloads.
    return subprocess.run(
        ["gpg", "--batch", "--no-default-keyring", "--keyring", str(keys["pubring"]),
         "--verify", str(signature), str(data)],
        env=gpg_env(keys["home"]), capture_output=True, check=False,
    ).returncode  # fmt: skip


def test_the_listing_checksums_and_signatures_verify(built: Path, keys: dict[str, Path]) -> None:
    names = {p.relative_to(built).as_posix() for p in built.rglob("*") if p.is_file()}
    stems = ("fencedlease_client-", "fencedlease-", "fencedlease_local-")
    for stem in stems:
        assert f"python/{stem}{VERSION}.tar.gz" in names
        assert f"python/{stem}{VERSION}-py3-none-any.whl" in names
    for name in (
        f"fencedlease-{VERSION}.tgz",
        f"fencedlease-{VERSION}.tgz.prov",
        f"fencedlease-image-{VERSION}.oci.tar",
        f"fencedlease-image-{VERSION}.digest",
        f"fencedlease-image-{VERSION}.cdx.json",
        "krew/fencedlease.yaml",
        "RELEASE_NOTES.md",
        "SHA256SUMS",
        "SHA256SUMS.asc",
    ):
        assert name in names, name
    listed = {line.split("  ", 1)[1] for line in (built / "SHA256SUMS").read_text().splitlines()}
    assert listed == names - {"SHA256SUMS", "SHA256SUMS.asc"}
    checked = verify_sums(built)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert gpg_verify(keys, built / "SHA256SUMS.asc", built / "SHA256SUMS") == 0
    helm = binary_path("helm")
    tgz = built / f"fencedlease-{VERSION}.tgz"
    assert "Signed by: " + KEY in sh(helm, "verify", tgz, "--keyring", keys["pubring"])
    notes = (built / "RELEASE_NOTES.md").read_text()
    assert notes.startswith(f"# fencedlease {VERSION}\n")


def test_a_tampered_file_fails_verification(
    built: Path, keys: dict[str, Path], tmp_path: Path
) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(built, copy)
    helm = binary_path("helm")
    tgz = copy / f"fencedlease-{VERSION}.tgz"
    data = bytearray(tgz.read_bytes())
    data[len(data) // 2] ^= 0xFF
    tgz.write_bytes(bytes(data))
    checked = verify_sums(copy)
    assert checked.returncode != 0 and f"fencedlease-{VERSION}.tgz: FAILED" in checked.stdout
    refused = subprocess.run(
        [str(helm), "verify", str(tgz), "--keyring", str(keys["pubring"])],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert refused.returncode != 0, refused.stdout
    # A checksum list edited to match the tampered file no longer matches its signature.
    sums = copy / "SHA256SUMS"
    digest = hashlib.sha256(tgz.read_bytes()).hexdigest()
    lines = [
        f"{digest}  {line.split('  ', 1)[1]}" if line.endswith(f"  {tgz.name}") else line
        for line in sums.read_text().splitlines()
    ]
    sums.write_text("\n".join(lines) + "\n")
    assert verify_sums(copy).returncode == 0
    assert gpg_verify(keys, copy / "SHA256SUMS.asc", sums) != 0


def test_the_wheels_install_in_a_fresh_venv(built: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    sh(sys.executable, "-m", "venv", venv)
    python = venv / "bin" / "python"
    wheels = sorted((built / "python").glob("*.whl"))
    sh(python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", *wheels)
    # Their dependencies from the development venv (no index here): a path entry after them.
    site = sh(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))").strip()
    import sysconfig

    (Path(site) / "dev-deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path)}
    probe = "import fencedlease; print(fencedlease.__file__, fencedlease.__version__)"
    got = sh(python, "-c", probe, env=env, cwd=tmp_path)
    assert str(venv) in got and got.split()[-1] == VERSION, got
    listed = json.loads(
        subprocess.run(
            [str(python), "-m", "pip", "list", "--format=json", "--path", site],
            capture_output=True, text=True, env=env, check=True,
        ).stdout
    )  # fmt: skip
    versions = {p["name"]: p["version"] for p in listed}
    for name in ("fencedlease", "fencedlease-client", "fencedlease-local"):
        assert versions.get(name) == VERSION, versions
    assert "local" in sh(venv / "bin" / "fencedlease", "--help", env=env, cwd=tmp_path)
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as zf:
            assert any(n.endswith(".dist-info/licenses/LICENSE") for n in zf.namelist())


def test_the_chart_installs_from_the_tgz_with_the_image_by_digest(
    built: Path, cluster: LocalCluster
) -> None:
    """``helm install`` of the packaged chart on the local API server (no kubelet: objects, not
    Pods), the image named by the release's digest. The cluster's CRDs are applied already,
    so the chart's stay off (``crds.enabled=false``; its check passes against them)."""
    helm = binary_path("helm")
    reference = (built / f"fencedlease-image-{VERSION}.digest").read_text().strip()
    repository, digest = reference.split(":", 1)[0], reference.split("@", 1)[1]
    assert repository == "ghcr.io/fencedlease/fencedlease"
    namespace = f"rel-{uuid.uuid4().hex[:8]}"
    release = f"fl-{uuid.uuid4().hex[:6]}"
    kube = ["--kubeconfig", str(cluster.kubeconfig)]
    sh(
        helm, *kube, "install", release, built / f"fencedlease-{VERSION}.tgz", "-n", namespace,
        "--create-namespace", "--set", "crds.enabled=false", "--set", f"watchNamespace={namespace}",
        "--set", f"image.digest={digest}",
    )  # fmt: skip
    try:
        listed = json.loads(sh(helm, *kube, "list", "-n", namespace, "-o", "json"))
        assert listed[0]["chart"] == f"fencedlease-{VERSION}"
        assert listed[0]["app_version"] == VERSION
        deployments = json.loads(
            cluster.kubectl("get", "deployments", "-n", namespace, "-o", "json").stdout
        )["items"]
        assert len(deployments) == 2
        for deployment in deployments:
            (container,) = deployment["spec"]["template"]["spec"]["containers"]
            assert container["image"] == f"{repository}@{digest}"
    finally:
        sh(helm, *kube, "uninstall", release, "-n", namespace, check=False)
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def oci_blob(tar: tarfile.TarFile, digest: str) -> bytes:
    member = tar.extractfile(f"blobs/sha256/{digest.split(':', 1)[1]}")
    assert member is not None
    return member.read()


def test_the_image_archive_digest_license_and_sbom(built: Path) -> None:
    archive = built / f"fencedlease-image-{VERSION}.oci.tar"
    reference = (built / f"fencedlease-image-{VERSION}.digest").read_text().strip()
    assert reference.startswith(f"ghcr.io/fencedlease/fencedlease:{VERSION}@sha256:")
    digest = reference.split("@", 1)[1]
    with tarfile.open(archive) as tar:
        index_file = tar.extractfile("index.json")
        assert index_file is not None
        (entry,) = json.loads(index_file.read())["manifests"]
        assert entry["digest"] == digest
        assert entry["annotations"]["org.opencontainers.image.ref.name"] == VERSION
        manifest_bytes = oci_blob(tar, digest)
        assert "sha256:" + hashlib.sha256(manifest_bytes).hexdigest() == digest
        manifest = json.loads(manifest_bytes)
        config = json.loads(oci_blob(tar, manifest["config"]["digest"]))
        labels = config["config"]["Labels"]
        assert labels["org.opencontainers.image.version"] == VERSION
        assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
        found: dict[str, bytes] = {}
        for layer in manifest["layers"]:
            data = oci_blob(tar, layer["digest"])
            if data[:2] == b"\x1f\x8b":
                import gzip

                data = gzip.decompress(data)
            import io

            with tarfile.open(fileobj=io.BytesIO(data)) as files:
                for member in files.getmembers():
                    name = member.name.lstrip("./")
                    if name.startswith("usr/share/doc/fencedlease/") and member.isfile():
                        handle = files.extractfile(member)
                        assert handle is not None
                        found[name.rsplit("/", 1)[1]] = handle.read()
    assert found == {n: (ROOT / n).read_bytes() for n in ("LICENSE", "NOTICE")}

    from cyclonedx.schema import OutputFormat, SchemaVersion
    from cyclonedx.validation import make_schemabased_validator

    text = (built / f"fencedlease-image-{VERSION}.cdx.json").read_text()
    validator = make_schemabased_validator(OutputFormat.JSON, SchemaVersion.V1_6)
    assert validator.validate_str(text) is None
    bom = json.loads(text)
    assert bom["bomFormat"] == "CycloneDX" and bom["specVersion"] == "1.6"
    components = {c["name"].lower().replace("_", "-"): c for c in bom["components"]}
    for name in ("fencedlease", "fencedlease-client"):
        assert components[name]["version"] == VERSION, name
        assert components[name]["purl"] == f"pkg:pypi/{name}@{VERSION}"
    for dependency in ("kopf", "aetcd", "httpx", "kubernetes-asyncio", "grpcio"):
        assert dependency in components, dependency
    assert "fencedlease-local" not in components  # the image has no local machinery


def test_the_krew_manifest_names_its_archive(built: Path) -> None:
    manifest = yaml.safe_load((built / "krew" / "fencedlease.yaml").read_text())
    assert manifest["spec"]["version"] == f"v{VERSION}"
    for platform in manifest["spec"]["platforms"]:
        name = platform["uri"].rsplit("/", 1)[1]
        archive = built / "krew" / name
        assert hashlib.sha256(archive.read_bytes()).hexdigest() == platform["sha256"]
        with tarfile.open(archive) as tar:
            assert "LICENSE" in tar.getnames()
            # lib/ was installed by the oldest supported Python's pip (3.9, scripts/release.py
            # oldest_python): anyio (httpx's) requires exceptiongroup only below Python 3.11.
            assert any(n.startswith("lib/exceptiongroup-") for n in tar.getnames())
