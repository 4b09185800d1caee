"""Every version of one object, from ``kubectl get -w`` (nothing is missed between polls).

A thawed leader's stale write is overwritten again by the new leader's next round, so a poll
can miss it; the watch keeps every version the API server committed. Used by the controller
examples' freeze/thaw scenarios (e2e/test_20 and e2e/test_25), which look for the stale leader's
value *after* the first version showing the new leader's.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from e2e.node import NodeEnv

Project = Callable[[dict[str, Any]], dict[str, Any]]
"""An object → the fields a scenario compares (``rv`` is added)."""


class History:
    """``kubectl get -w`` of ``resource/name`` in ``namespace``, written to ``out``."""

    def __init__(
        self, env: NodeEnv, namespace: str, resource: str, name: str, out: Path, project: Project
    ) -> None:
        self.out, self.project = out, project
        self.handle = out.open("w")
        self.proc = subprocess.Popen(
            [
                str(env.kubectl_path),
                f"--kubeconfig={env.kubeconfig}",
                "get",
                "-n",
                namespace,
                resource,
                name,
                "-w",
                "-o",
                "json",
                "--output-watch-events",
            ],
            stdout=self.handle,
            stderr=subprocess.STDOUT,
        )

    def versions(self) -> list[dict[str, Any]]:
        text, pos, decoder = self.out.read_text(), 0, json.JSONDecoder()
        out: list[dict[str, Any]] = []
        while True:
            while pos < len(text) and text[pos].isspace():
                pos += 1
            if pos >= len(text):
                return out
            try:
                event, pos = decoder.raw_decode(text, pos)
            except json.JSONDecodeError:
                return out  # a partial object at the end
            obj = event.get("object") or {}
            rv = int(obj.get("metadata", {}).get("resourceVersion", 0))
            out.append({"rv": rv, **self.project(obj)})

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.handle.close()

    def __enter__(self) -> History:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


def after(versions: list[dict[str, Any]], field: str, new: str) -> list[dict[str, Any]]:
    """The versions from the first one whose ``field`` shows the new leader on."""
    for i, v in enumerate(versions):
        if v[field] == new:
            return versions[i:]
    return []


def overwritten(history: History, field: str, new: str, old: str) -> bool | None:
    """Whether a version after the new leader's first shows the old leader's ``field``."""
    return any(v[field] == old for v in after(history.versions(), field, new)) or None
