"""``make release VERSION=x.y.z``: every artifact of a release, built offline into one directory.

The tree is copied (tracked and untracked-but-not-ignored files) to a staging directory, the
version is written into every place that carries one (:data:`VERSION_PLACES`: the three
distributions, their pins on each other, the operator's ``__version__``, the chart's version and
appVersion, the image's ``VERSION`` label), every file gets the commit's time
(``SOURCE_DATE_EPOCH``), and from that copy come:

- ``python/``: the wheels and sdists of fencedlease-client, fencedlease and fencedlease-local
  (``python -m build``; ``twine check --strict``);
- ``fencedlease-X.tgz``: the chart (``helm lint --strict``), with ``fencedlease-X.tgz.prov`` when
  a signing key is given (``helm package --sign``; checked with ``helm verify``);
- ``fencedlease-image-X.oci.tar``: the operator image as an OCI archive (built from the
  Dockerfile by ``fencedlease.local.images``, no registry) and ``fencedlease-image-X.digest``;
- ``fencedlease-image-X.cdx.json``: a CycloneDX SBOM of the image's Python environment
  (``cyclonedx-py environment`` over the distributions found in the image's layers), validated
  against the CycloneDX schema;
- ``krew/``: the kubectl plugin's archive and manifest with its sha256 (client/krew/build.py),
  its ``lib/`` installed by the oldest supported Python's pip (:func:`oldest_python`, the
  Makefile's ``PYTHON_OLDEST``), as ``make krew`` does;
- ``RELEASE_NOTES.md``: the version's section of CHANGELOG.md (a release without one is refused);
- ``SHA256SUMS`` over all of it (``sha256sum -c SHA256SUMS``), and ``SHA256SUMS.asc`` when signed.

docs/release.md has the flow with a real key. Usage::

    python scripts/release.py --version X.Y.Z --out DIR [--key NAME --keyring SECRING]
        [--python-oldest /path/to/python3.9]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SEMVER = re.compile(r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?\Z")
IMAGE_REPOSITORY = "ghcr.io/fencedlease/fencedlease"
PIN = r"[0-9A-Za-z.+-]+"
OLDEST_PYTHON = "3.9"  # the oldest Python the client supports (docs/client.md)

# Every place a version is written: (file, pattern, replacement with {v}). Each pattern must
# match at least once (a test stamps a copy and looks for any version left behind).
VERSION_PLACES: list[tuple[str, str, str]] = [
    ("pyproject.toml", r'(?m)^version = "[^"]*"', 'version = "{v}"'),
    ("pyproject.toml", rf"(fencedlease-client(?:\[[a-z0-9,]+\])?)=={PIN}", r"\g<1>=={v}"),
    ("client/pyproject.toml", r'(?m)^version = "[^"]*"', 'version = "{v}"'),
    ("local/pyproject.toml", r'(?m)^version = "[^"]*"', 'version = "{v}"'),
    ("local/pyproject.toml", rf'"fencedlease=={PIN}"', '"fencedlease=={v}"'),
    ("operator/fencedlease/__init__.py", r'(?m)^__version__ = "[^"]*"', '__version__ = "{v}"'),
    ("charts/fencedlease/Chart.yaml", r"(?m)^version: .*$", "version: {v}"),
    ("charts/fencedlease/Chart.yaml", r"(?m)^appVersion: .*$", 'appVersion: "{v}"'),
    ("Dockerfile", r"(?m)^ARG VERSION=.*$", "ARG VERSION={v}"),
]


class ReleaseError(Exception):
    """A release that cannot be made, with what to do."""


def say(msg: str) -> None:
    print(f"[release] {msg}", file=sys.stderr, flush=True)


def run(*cmd: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise ReleaseError(f"{' '.join(map(str, cmd))} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout


def _version_key(path: Path) -> tuple[int, ...]:
    patch = path.parents[1].name.rsplit(".", 1)[-1]
    return (int(patch),) if patch.isdigit() else (-1,)


def oldest_python(given: str | None = None) -> str:
    """The oldest supported Python (:data:`OLDEST_PYTHON`), found as the Makefile's
    ``PYTHON_OLDEST`` is: ``given`` (``--python-oldest``, which ``make release`` passes), else
    the newest ``$PYENV_ROOT/versions/3.9.*`` (``~/.pyenv``), else ``python3.9`` on PATH; it must
    run and be that version, or the release stops saying how to get one."""
    want = OLDEST_PYTHON
    candidates: list[str] = [given] if given else []
    if not given:
        pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")
        found = sorted(pyenv.glob(f"versions/{want}.*/bin/python{want}"), key=_version_key)
        candidates += [str(p) for p in found[-1:]]
        on_path = shutil.which(f"python{want}")
        candidates += [on_path] if on_path else []
    for python in candidates:
        try:
            got = subprocess.run(
                [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
        except OSError:
            continue
        if got.returncode == 0 and got.stdout.strip() == want:
            return python
    looked = given or f"{want}.* under $PYENV_ROOT/versions (~/.pyenv) and python{want} on PATH"
    raise ReleaseError(
        f"no Python {want} (the krew archive's lib/ is installed by the oldest supported Python's "
        f"pip; looked for {looked}): get it with 'pyenv install {want}' or your OS package "
        f"python{want}, or name one: make release PYTHON_OLDEST=/path/to/python{want}"
    )


# ------------------------------------------------------------------------- the staged tree


def stamp(tree: Path, version: str) -> None:
    """Write ``version`` into every :data:`VERSION_PLACES` of ``tree``."""
    for name, pattern, replacement in VERSION_PLACES:
        path = tree / name
        text, count = re.subn(pattern, replacement.replace("{v}", version), path.read_text())
        if count == 0:
            raise ReleaseError(f"{name}: no version matching {pattern!r} (VERSION_PLACES)")
        path.write_text(text)


def stage(repo: Path, dest: Path, epoch: int) -> None:
    """Copy the files git knows or would add (symlinks as symlinks), all dated ``epoch``."""
    listed = run(
        "git", "-C", repo, "ls-files", "-z", "--cached", "--others", "--exclude-standard"
    ).split("\0")
    for name in sorted(n for n in listed if n):
        source = repo / name
        if not source.is_symlink() and not source.exists():
            continue  # deleted in the work tree
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            target.symlink_to(os.readlink(source))
        else:
            shutil.copy2(source, target)
    for path in [dest, *dest.rglob("*")]:
        os.utime(path, (epoch, epoch), follow_symlinks=False)


def source_date_epoch(repo: Path) -> int:
    if os.environ.get("SOURCE_DATE_EPOCH"):
        return int(os.environ["SOURCE_DATE_EPOCH"])
    return int(run("git", "-C", repo, "log", "-1", "--format=%ct").strip())


def changelog_section(text: str, version: str) -> str:
    """The body of CHANGELOG.md's ``## [version]`` (or ``## version``) section."""
    match = re.search(rf"^## \[?{re.escape(version)}\]?[^\n]*\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    if match is None or not match.group(1).strip():
        raise ReleaseError(
            f"CHANGELOG.md has no section for {version}: add '## [{version}] - DATE' with its notes"
        )
    return f"# fencedlease {version}\n\n{match.group(1).strip()}\n"


# ---------------------------------------------------------------------------- the artifacts


def python_dists(tree: Path, out: Path, env: dict[str, str]) -> None:
    out.mkdir(parents=True)
    for source in (tree / "client", tree, tree / "local"):
        run(sys.executable, "-m", "build", "--outdir", out, source, env=env)
    run(sys.executable, "-m", "twine", "check", "--strict", *sorted(out.iterdir()))


def chart(
    tree: Path, out: Path, helm: str, key: str | None, keyring: Path | None, env: dict[str, str]
) -> Path:
    source = tree / "charts" / "fencedlease"
    run(helm, "lint", "--strict", source, env=env)
    sign = ["--sign", "--key", key, "--keyring", str(keyring)] if key and keyring else []
    run(helm, "package", source, "--destination", out, *sign, env=env)
    (tgz,) = out.glob("fencedlease-*.tgz")
    if sign:
        assert keyring is not None
        run(helm, "verify", tgz, "--keyring", keyring, env=env)
    return tgz


def image_digest(archive: Path) -> str:
    with tarfile.open(archive) as tar:
        member = tar.extractfile("index.json")
        assert member is not None
        index = json.loads(member.read())
    (manifest,) = index["manifests"]
    return str(manifest["digest"])


def retag_archive(source: Path, target: Path, reference: str) -> None:
    """Copy an OCI archive, naming its one image ``reference`` (index.json only: the manifest,
    and so the digest, stays)."""
    with tarfile.open(source) as src, tarfile.open(target, "w", format=tarfile.PAX_FORMAT) as dst:
        for member in src.getmembers():
            data = src.extractfile(member) if member.isfile() else None
            if member.name.lstrip("./") == "index.json" and data is not None:
                index = json.loads(data.read())
                for manifest in index["manifests"]:
                    manifest["annotations"] = {
                        "io.containerd.image.name": reference,
                        "org.opencontainers.image.ref.name": reference.rsplit(":", 1)[1],
                    }
                body = json.dumps(index, sort_keys=True).encode()
                member.size = len(body)
                data = io.BytesIO(body)
            dst.addfile(member, data)


def image_layers(archive: Path) -> list[bytes]:
    """The (uncompressed) layer tars of the archive's one image, bottom first."""
    with tarfile.open(archive) as tar:

        def blob(digest: str) -> bytes:
            member = tar.extractfile(f"blobs/sha256/{digest.split(':', 1)[1]}")
            assert member is not None
            return member.read()

        manifest = json.loads(blob(image_digest(archive)))
        layers = []
        for layer in manifest["layers"]:
            data = blob(layer["digest"])
            if data[:2] == b"\x1f\x8b":
                import gzip

                data = gzip.decompress(data)
            layers.append(data)
    return layers


def sbom(archive: Path, target: Path, env: dict[str, str]) -> None:
    """CycloneDX (JSON, 1.6) of the distributions installed in the image's venv
    (/opt/fencedlease), by cyclonedx-py over a venv holding their .dist-info directories."""
    from cyclonedx.schema import OutputFormat, SchemaVersion
    from cyclonedx.validation import make_schemabased_validator

    site = re.compile(r"^opt/fencedlease/lib/python3\.\d+/site-packages/([^/]+\.dist-info/.*)$")
    with tempfile.TemporaryDirectory(prefix="fencedlease-sbom-") as tmp:
        venv = Path(tmp) / "venv"
        run(sys.executable, "-m", "venv", "--without-pip", venv)
        (dest,) = venv.glob("lib/python3.*/site-packages")
        found = 0
        for layer in image_layers(archive):
            with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
                for member in tar.getmembers():
                    match = site.match(member.name.lstrip("./"))
                    if match and member.isfile():
                        path = dest / match.group(1)
                        path.parent.mkdir(parents=True, exist_ok=True)
                        handle = tar.extractfile(member)
                        assert handle is not None
                        path.write_bytes(handle.read())
                        found += 1
        if not found:
            raise ReleaseError(f"{archive}: no Python distribution under /opt/fencedlease")
        run(
            sys.executable, "-m", "cyclonedx_py", "environment", "--output-format", "JSON",
            "--spec-version", "1.6", "--output-reproducible", "--output-file", target,
            venv / "bin" / "python", env=env,
        )  # fmt: skip
    validator = make_schemabased_validator(OutputFormat.JSON, SchemaVersion.V1_6)
    error = validator.validate_str(target.read_text())
    if error is not None:
        raise ReleaseError(f"{target} is not valid CycloneDX 1.6: {error}")


def sha256sums(out: Path) -> Path:
    lines = []
    for path in sorted(p for p in out.rglob("*") if p.is_file()):
        name = path.relative_to(out).as_posix()
        if name.startswith("SHA256SUMS"):
            continue
        lines.append(f"{hashlib.sha256(path.read_bytes()).hexdigest()}  {name}\n")
    target = out / "SHA256SUMS"
    target.write_text("".join(lines))
    return target


# --------------------------------------------------------------------------------- the flow


def release(
    version: str,
    out: Path,
    key: str | None = None,
    keyring: Path | None = None,
    gnupghome: Path | None = None,
    image: bool = True,
    log: Callable[[str], None] = say,
    python_oldest: str | None = None,
) -> dict[str, float]:
    """Build every artifact of ``version`` into ``out``; returns each step's seconds."""
    if not SEMVER.match(version):
        raise ReleaseError(f"VERSION {version!r} is not x.y.z (semver)")
    if out.exists() and any(out.iterdir()):
        raise ReleaseError(f"{out} is not empty")
    if bool(key) != bool(keyring):
        raise ReleaseError("signing needs both a key name and its (legacy) secret keyring")
    krew_python = oldest_python(python_oldest)
    from fencedlease.local.binaries import binary_path

    helm = str(binary_path("helm"))
    notes = changelog_section((ROOT / "CHANGELOG.md").read_text(), version)
    epoch = source_date_epoch(ROOT)
    env = {**os.environ, "SOURCE_DATE_EPOCH": str(epoch)}
    if gnupghome is not None:
        env["GNUPGHOME"] = str(gnupghome)
    seconds: dict[str, float] = {}
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="fencedlease-release-") as tmp:
        tree = Path(tmp) / "src"
        t0 = time.monotonic()
        stage(ROOT, tree, epoch)
        stamp(tree, version)
        seconds["stage"] = time.monotonic() - t0

        def step(name: str, fn: Callable[[], object]) -> None:
            log(name)
            start = time.monotonic()
            fn()
            seconds[name] = round(time.monotonic() - start, 1)

        step("python", lambda: python_dists(tree, out / "python", env))
        step("chart", lambda: chart(tree, out, helm, key, keyring, env))
        client_wheel = next((out / "python").glob("fencedlease_client-*.whl"))
        step(
            "krew",
            lambda: run(
                sys.executable, tree / "client" / "krew" / "build.py", "--out", out / "krew",
                "--wheel", client_wheel, "--python", krew_python, env=env,
            ),
        )  # fmt: skip
        if image:
            archive = out / f"fencedlease-image-{version}.oci.tar"

            def build_image() -> None:
                from fencedlease.local import images

                _name, cached = images.operator_archive(tree, log)
                retag_archive(cached, archive, f"{IMAGE_REPOSITORY}:{version}")
                digest = image_digest(archive)
                (out / f"fencedlease-image-{version}.digest").write_text(
                    f"{IMAGE_REPOSITORY}:{version}@{digest}\n"
                )

            step("image", build_image)
            step("sbom", lambda: sbom(archive, out / f"fencedlease-image-{version}.cdx.json", env))
    (out / "RELEASE_NOTES.md").write_text(notes)
    sums = sha256sums(out)
    if key:
        run(
            "gpg", "--batch", "--yes", "--local-user", key, "--armor", "--detach-sign",
            "--output", f"{sums}.asc", sums, env=env,
        )  # fmt: skip
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", required=True, help="x.y.z (CHANGELOG.md needs its section)")
    parser.add_argument("--out", type=Path, required=True, help="an empty or missing directory")
    parser.add_argument("--key", help="gpg key name (uid) that signs the chart and SHA256SUMS")
    parser.add_argument("--keyring", type=Path, help="legacy secret keyring (helm --sign)")
    parser.add_argument("--gnupghome", type=Path, help="GNUPGHOME holding --key (gpg's default)")
    parser.add_argument("--no-image", action="store_true", help="skip the image and its SBOM")
    parser.add_argument(
        "--python-oldest",
        help=f"Python {OLDEST_PYTHON} whose pip installs the krew archive's lib/ "
        "(default: as the Makefile's PYTHON_OLDEST)",
    )
    args = parser.parse_args(argv)
    try:
        seconds = release(
            args.version, args.out, args.key, args.keyring, args.gnupghome, not args.no_image,
            python_oldest=args.python_oldest,
        )  # fmt: skip
    except ReleaseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    say("done: " + ", ".join(f"{k} {v:.0f} s" for k, v in seconds.items()))
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
