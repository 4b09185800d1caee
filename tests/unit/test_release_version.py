"""``make release``'s one version source (scripts/release.py): the version given is written into
every place that carries one, none is missed, and a release without its CHANGELOG section or
with a malformed version is refused with what to do."""

from __future__ import annotations

import importlib.util
import re
import shutil
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("release", ROOT / "scripts" / "release.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["release"] = module
    spec.loader.exec_module(module)
    return module


release = load()
FILES = sorted({name for name, _, _ in release.VERSION_PLACES})


def versions_in(text: str) -> set[str]:
    return set(re.findall(r"\b\d+\.\d+\.\d+\b", text))


def test_stamping_writes_the_version_everywhere_and_leaves_no_other(tmp_path: Path) -> None:
    for name in FILES:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    release.stamp(tmp_path, "9.8.7")
    current = {
        v for name in FILES for v in versions_in((ROOT / name).read_text())
    }  # what the tree carries now (e.g. 0.1.0 and the chart's own version)
    for name in FILES:
        text = (tmp_path / name).read_text()
        assert "9.8.7" in text, name
        left = {v for v in versions_in(text) & current if v in versions_in(own(name))}
        assert not left, f"{name} still carries {left}: add it to VERSION_PLACES"
    pyproject = (tmp_path / "pyproject.toml").read_text()
    pins = re.findall(r"fencedlease-client(?:\[\w+\])?==([\w.]+)", pyproject)
    assert len(pins) == 6 and set(pins) == {"9.8.7"}
    assert 'appVersion: "9.8.7"' in (tmp_path / "charts/fencedlease/Chart.yaml").read_text()
    assert "ARG VERSION=9.8.7" in (tmp_path / "Dockerfile").read_text()


def own(name: str) -> str:
    """The lines of ``name`` that carry this project's versions (not its dependencies')."""
    text = (ROOT / name).read_text()
    keep = [
        line
        for line in text.splitlines()
        if re.match(r"^(version|appVersion|__version__|ARG VERSION)\b", line)
        or "fencedlease-client" in line
        or '"fencedlease==' in line
    ]
    return "\n".join(keep)


def test_a_place_that_moved_is_an_error(tmp_path: Path) -> None:
    for name in FILES:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("nothing here\n")
    with pytest.raises(release.ReleaseError, match="VERSION_PLACES"):
        release.stamp(tmp_path, "1.2.3")


def test_release_notes_come_from_the_changelog() -> None:
    text = (
        "# Changelog\n\n## [Unreleased]\n\n- x\n\n"
        "## [1.2.0] - 2026-01-01\n\n- a\n- b\n\n## [1.1.0]\n- c\n"
    )
    assert release.changelog_section(text, "1.2.0") == "# fencedlease 1.2.0\n\n- a\n- b\n"
    assert release.changelog_section(text, "1.1.0") == "# fencedlease 1.1.0\n\n- c\n"
    with pytest.raises(release.ReleaseError, match=r"## \[1.3.0\]"):
        release.changelog_section(text, "1.3.0")
    # The repository's changelog has a section for the version the tree carries.
    import tomllib

    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert release.changelog_section((ROOT / "CHANGELOG.md").read_text(), version)


@pytest.mark.parametrize("version", ["1.2", "v1.2.3", "01.2.3", "1.2.3 ", ""])
def test_a_malformed_version_is_refused(version: str, tmp_path: Path) -> None:
    with pytest.raises(release.ReleaseError, match="semver"):
        release.release(version, tmp_path / "out")


def fake_python(path: Path, version: str) -> Path:
    """An executable that answers the version probe as Python ``version`` would."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\necho {version}\n")
    path.chmod(0o755)
    return path


def test_the_krew_step_takes_the_newest_3_9_under_pyenv_as_the_makefile_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for patch in ("2", "18", "9"):
        fake_python(tmp_path / "versions" / f"3.9.{patch}" / "bin" / "python3.9", "3.9")
    fake_python(tmp_path / "versions" / "3.13.0" / "bin" / "python3.13", "3.13")
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert release.oldest_python() == str(tmp_path / "versions/3.9.18/bin/python3.9")
    on_path = fake_python(tmp_path / "path" / "python3.9", "3.9")
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path / "none"))
    monkeypatch.setenv("PATH", str(on_path.parent))
    assert release.oldest_python() == str(on_path)


def test_a_release_without_python_3_9_stops_saying_how_to_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path / "none"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(release.ReleaseError, match=r"no Python 3\.9.*pyenv install 3\.9"):
        release.oldest_python()
    wrong = fake_python(tmp_path / "python3.11", "3.11")
    with pytest.raises(release.ReleaseError, match=r"PYTHON_OLDEST="):
        release.oldest_python(str(wrong))
    # Refused before anything is built: the output directory stays empty.
    out = tmp_path / "out"
    with pytest.raises(release.ReleaseError, match=r"no Python 3\.9"):
        release.release("0.1.0", out, image=False, python_oldest=str(wrong))
    assert not out.exists() or not any(out.iterdir())
