"""The examples' manifests name the image this repository builds, so they apply as written.

``fencedlease.local.images`` tags the operator image it builds with the chart's default name
(``release_name``: ``ghcr.io/fencedlease/fencedlease:<appVersion>``), which is also what a
release pushes; every container of ``examples/`` and ``docs/examples/`` must run that image
(the fenced-controller example once named ``fencedlease/fencedlease:dev``, built nowhere).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from fencedlease.local import go_example
from fencedlease.local.images import release_name

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = sorted(p for top in ("examples", "docs/examples") for p in (ROOT / top).rglob("*.yaml"))


def images(doc: Any) -> Iterator[str]:
    """Every ``image`` of a container or init container, at any depth (Pods, Deployments,
    Jobs, CronJobs)."""
    if isinstance(doc, dict):
        for key, value in doc.items():
            if key in ("containers", "initContainers") and isinstance(value, list):
                yield from (str(c.get("image")) for c in value if isinstance(c, dict))
            else:
                yield from images(value)
    elif isinstance(doc, list):
        for item in doc:
            yield from images(item)


def test_the_check_sees_nested_containers() -> None:
    doc = {"spec": {"template": {"spec": {"containers": [{"image": "a"}], "x": [{"b": 1}]}}}}
    assert list(images(doc)) == ["a"]


def test_every_example_container_runs_the_image_the_repo_builds() -> None:
    built = release_name(ROOT)
    found = {
        str(path.relative_to(ROOT)): sorted(set(images(list(yaml.safe_load_all(path.read_text())))))
        for path in MANIFESTS
    }
    named = {path: imgs for path, imgs in found.items() if imgs}
    assert "examples/fenced-controller/manifests.yaml" in named, found
    # The Go example runs its own image (fencedlease.local.go_example builds and names it).
    own = {"examples/go-controller/manifests.yaml": go_example.release_name(ROOT)}
    wrong = {path: imgs for path, imgs in named.items() if imgs != [own.get(path, built)]}
    assert not wrong, f"images this repository does not build (it builds {built}): {wrong}"
