"""The Go module reads a downward-API grant directory exactly as the Python client does
(docs/go.md): the same corpus of directories through ``read_grant_dir`` and through the Go
package ``grant`` (``go/internal/grantread``), compared field by field. Builds a small Go
command (the grant package and fsnotify only: seconds with a warm cache). And the names the Go
module writes again (label, annotation, fence codes, file names) are the Python client's."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from fencedlease.client import fenced
from fencedlease.client.contract import DEFAULT_DIR, FENCE_CODES, GRANT_FILES
from fencedlease.client.errors import GrantError
from fencedlease.client.sources import read_grant_dir

ROOT = Path(__file__).resolve().parents[2]
UNTIL = "2026-12-07T04:05:06Z"

TOKENS = ["752", "752\n", " 752\r\n", "\t752", "752\v", "752\x0c", "٧٥٢", "7_52", "+752", "-752",
          "0752", "0", "7.5", "7e2", "752 1", "", " \n", "\uff19", "\u00b2", "9223372036854775807",
          "9223372036854775808", "1" * 40]  # fmt: skip
LEASE_IDS = ["5f3a9c0d12ab", " a7\n", "a7\v", "-a", ".a", "A.b_c-d", "a/b", "é7", "", "x" * 64,
             "x" * 65]  # fmt: skip
TIMES = [UNTIL, "2026-12-07T04:05:06+00:00", " 2026-12-07T04:05:06Z\n", "2026-12-07 04:05:06",
         "2026-12-07x04:05:06", "2026-12-07T04", "2026-12-07T04:05", "2026-12-07",
         "2026-12-07T04:05:06.1234567Z", "2026-12-07T04:05:06,5Z", "2026-12-07T03:05:06-0100",
         "2026-12-07T04:05:06+00", "2026-12-07T05:05:36+01:00:30", "2026-12-07T04:05:06\x1c",
         "20261207T040506", "2026-12-07T24:00:00", "2026-02-30T00:00:00Z", "soon", "",
         "2026-12-07T04:05:06 UTC", "1765080000", "0000-01-01T00:00:00", "20261207",
         "20261207T0405", "2026-12-07T040506", "20261207T04:05:06", "2026-12-07T04:0506",
         "2026-W49-1", "2026W491", "2026-W49", "2026-W53-1", "2026-W54-1", "2020-W53-7",
         "2026-341", "2026-12-07T040506.5+01", "2026-12-07T04:05:06.5+01:00:30.123456",
         "2026-12-07T04:05:06-00:00", "2026-12-07T04:05:06+24:00", "2026-12-07T",
         "2026-12-07\u00e904:05:06", "2026-12-07T04:05:06+01:00Z"]  # fmt: skip
STATES = ["held", "held\n", "lost", "", " \x1c", "released", "HELD"]


def cases() -> list[dict[str, bytes | None]]:
    base: dict[str, bytes | None] = {
        "token": b"752",
        "lease-id": b"5f3a9c0d12ab",
        "valid-until": UNTIL.encode(),
        "state": b"held",
    }
    found = [dict(base, token=t.encode()) for t in TOKENS]
    found += [dict(base, **{"lease-id": x.encode()}) for x in LEASE_IDS]
    found += [dict(base, **{"valid-until": x.encode()}) for x in TIMES]
    found += [dict(base, state=x.encode()) for x in STATES]
    found += [dict(base, token=b"\xff\xfe7"), dict(base, state=b"h\xe9ld")]
    found += [dict(base, **{name: None}) for name in base]  # each file missing
    found += [{name: None for name in base}, {name: b"" for name in base}]
    return found


def python_reading(directory: Path) -> dict[str, object]:
    try:
        grant = read_grant_dir(directory)
    except GrantError:
        return {"error": True}
    if grant is None:
        return {"absent": True}
    return {
        "token": grant.token,
        "leaseId": grant.lease_id,
        "validUntil": grant.valid_until.astimezone(dt.UTC),
        "state": grant.state,
    }


def go_reading(line: dict[str, object]) -> dict[str, object]:
    if line.get("error"):
        return {"error": True}
    if line.get("absent"):
        return {"absent": True}
    until = dt.datetime.fromisoformat(str(line["validUntil"]).replace("Z", "+00:00"))
    return {
        "token": line["token"],
        "leaseId": line["leaseId"],
        "validUntil": until,
        "state": line["state"],
    }


def test_go_reads_every_grant_directory_as_the_python_client(tmp_path: Path) -> None:
    go = shutil.which("go")
    if go is None:
        pytest.fail("the 'go' toolchain is not on PATH (Go >= 1.26; docs/go.md)")
    binary = tmp_path / "grantread"
    env = dict(os.environ, GOFLAGS="-mod=readonly -buildvcs=false")
    subprocess.run(
        [go, "build", "-o", str(binary), "./internal/grantread"],
        cwd=ROOT / "go",
        env=env,
        check=True,
        timeout=600,
    )
    dirs = []
    for i, files in enumerate(cases()):
        directory = tmp_path / f"case-{i}"
        directory.mkdir()
        for name, data in files.items():
            if data is not None:
                (directory / name).write_bytes(data)
        dirs.append(directory)
    out = subprocess.run(
        [str(binary), *map(str, dirs)], capture_output=True, text=True, check=True, timeout=60
    )
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(lines) == len(dirs)
    differ = {
        str(cases()[i]): (python_reading(d), go_reading(line), line.get("error"))
        for i, (d, line) in enumerate(zip(dirs, lines, strict=True))
        if python_reading(d) != go_reading(line)
    }
    shown = (f"{k}: python {p}, go {g} ({e})" for k, (p, g, e) in differ.items())
    assert not differ, "\n".join(shown)
    kinds = {next(iter(go_reading(line))) for line in lines}
    assert kinds == {"error", "absent", "token"}  # the corpus reaches every outcome


def go_constants(path: Path) -> dict[str, str]:
    return dict(re.findall(r'^\s*(?:const\s+)?(\w+)\s*=\s*"([^"]*)"', path.read_text(), re.M))


def test_the_go_modules_names_are_the_python_clients() -> None:
    names = go_constants(ROOT / "go" / "fenced" / "client.go")
    assert (names["LeaseLabel"], names["TokenAnnotation"]) == (
        fenced.LEASE_LABEL,
        fenced.TOKEN_ANNOTATION,
    )
    codes = go_constants(ROOT / "go" / "fenced" / "denial.go")
    assert {v for k, v in codes.items() if k.startswith("Code")} == FENCE_CODES
    files = go_constants(ROOT / "go" / "grant" / "grant.go")
    assert {v for k, v in files.items() if k.startswith("File")} == set(GRANT_FILES.values())
    assert files["DefaultDir"] == DEFAULT_DIR
