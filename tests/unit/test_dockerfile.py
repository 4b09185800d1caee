"""The Dockerfile's rules, checked without a Docker engine (and with hadolint when installed)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"

pytestmark = pytest.mark.timeout(60)

COMPILERS = ("build-essential", "gcc", "g++", "clang", "make", "cargo", "rustc", "-dev")


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def args(self, keyword: str) -> list[str]:
        return [a for k, a in self.instructions if k == keyword]


def parse(text: str) -> tuple[dict[str, str], list[Stage]]:
    """Split a Dockerfile into (global ARG defaults, stages) with continuation lines joined."""
    logical = re.sub(r"\\\n", " ", text)
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for raw in logical.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            parts = rest.split()
            name = parts[2] if len(parts) > 2 and parts[1].upper() == "AS" else None
            stages.append(Stage(parts[0], name))
        elif not stages:
            if keyword == "ARG" and "=" in rest:
                key, _, value = rest.partition("=")
                global_args[key.strip()] = value.strip()
        else:
            stages[-1].instructions.append((keyword, rest.strip()))
    return global_args, stages


@pytest.fixture(scope="module")
def parsed() -> tuple[dict[str, str], list[Stage]]:
    return parse(DOCKERFILE.read_text())


def resolve(base: str, global_args: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: global_args[m[1] or m[2]], base)


def test_multi_stage_with_pinned_base(parsed: tuple[dict[str, str], list[Stage]]) -> None:
    global_args, stages = parsed
    assert len(stages) >= 2, "builder and runtime stages"
    for stage in stages:
        base = resolve(stage.base, global_args)
        if base in {s.name for s in stages}:
            continue
        _image, _, tag = base.partition(":")
        assert tag and tag != "latest", f"{base}: pin the base image"
        assert re.match(r"^3\.11\.\d+-slim-bookworm$", tag) or "@sha256:" in base, base


def test_final_stage_runs_fencedlease_as_non_root(
    parsed: tuple[dict[str, str], list[Stage]],
) -> None:
    _, stages = parsed
    final = stages[-1]
    users = final.args("USER")
    assert users, "final stage sets USER"
    uid = users[-1].split(":")[0]
    assert uid == "65532", "numeric non-root user (runAsNonRoot needs a numeric UID)"
    assert json.loads(final.args("ENTRYPOINT")[-1]) == ["fencedlease"]
    assert json.loads(final.args("CMD")[-1]) == ["run"]
    values = yaml.safe_load((ROOT / "charts/fencedlease/values.yaml").read_text())
    assert str(values["podSecurityContext"]["runAsUser"]) == uid


def test_final_stage_has_only_the_runtime(parsed: tuple[dict[str, str], list[Stage]]) -> None:
    _, stages = parsed
    final = stages[-1]
    runs = " ".join(final.args("RUN"))
    assert "apt-get install" not in runs, "no system packages (compilers) in the final stage"
    for word in COMPILERS:
        assert word not in runs, f"{word} in the final stage"
    copies = final.args("COPY")
    assert all("--from=" in c for c in copies), f"final stage copies only build outputs: {copies}"
    assert "--no-index" in runs and "/wheels" in runs, "installs the builder's wheels, offline"
    builder_runs = " ".join(" ".join(s.args("RUN")) for s in stages[:-1])
    assert "pip wheel" in builder_runs or "python -m build" in builder_runs


def test_read_only_root_friendly(parsed: tuple[dict[str, str], list[Stage]]) -> None:
    _, stages = parsed
    env = " ".join(stages[-1].args("ENV"))
    assert "PYTHONDONTWRITEBYTECODE=1" in env
    assert "HOME=/tmp" in env, "anything writing to $HOME lands in the writable /tmp"


def test_oci_labels(parsed: tuple[dict[str, str], list[Stage]]) -> None:
    _, stages = parsed
    labels = " ".join(stages[-1].args("LABEL"))
    for key in ("title", "description", "version", "revision", "licenses", "source"):
        assert f"org.opencontainers.image.{key}=" in labels, key


def test_dockerignore_keeps_the_context_small() -> None:
    text = (ROOT / ".dockerignore").read_text().splitlines()
    lines = [line.strip() for line in text if line.strip() and not line.startswith("#")]
    assert lines[0] == "*", "deny by default"
    assert {"!pyproject.toml", "!operator/"} <= set(lines)


def test_hadolint() -> None:
    hadolint = shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed (not packaged in Debian bookworm)")
    result = subprocess.run(
        [hadolint, str(DOCKERFILE)], capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_parser_sees_a_broken_dockerfile() -> None:
    """The checks above can fail: a root, single-stage image is caught."""
    _, stages = parse("FROM python:latest\nRUN apt-get install -y gcc\nCMD run\n")
    assert len(stages) == 1
    assert not stages[0].args("USER")
    assert "gcc" in " ".join(stages[0].args("RUN"))


def test_the_image_carries_the_license_and_notice(
    parsed: tuple[dict[str, str], list[Stage]],
) -> None:
    """LICENSE and NOTICE reach the build context (.dockerignore, the local build's inputs)
    and the final stage's /usr/share/doc/fencedlease/ (tests/integration/test_release_build.py
    finds them in the built image's layers)."""
    from fencedlease.local.images import REPO_INPUTS

    _, stages = parsed
    lines = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()}
    assert {"!LICENSE", "!NOTICE"} <= lines
    assert {"LICENSE", "NOTICE"} <= set(REPO_INPUTS)
    builder = " ".join(" ".join(s.args("COPY")) for s in stages[:-1])
    assert "LICENSE NOTICE /licenses/" in builder
    assert "--from=builder /licenses/ /usr/share/doc/fencedlease/" in stages[-1].args("COPY")
    assert "Apache License" in (ROOT / "LICENSE").read_text()
