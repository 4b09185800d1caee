"""The names the docs give equal the names in the code, read at test time.

What a reader copies from docs/ and README.md must exist: every alert name (``FencedLease…``)
in the chart's PrometheusRule, every ``fencedlease_*`` metric (and every row of the metrics
table in docs/operations.md) in the registry ``fencedlease.metrics`` fills, every dotted values
key (``networkPolicy.webhookSources``, ``--set etcd.bundled.enabled=false``; also in
values.yaml's own comments) in charts/fencedlease/values.yaml or its schema, every flag of a
``fencedlease`` / ``kubectl fencedlease`` command in the argparse definitions, and every
relative link with its ``#anchor``.  The install guide lists every alert, and the operations
guide has a section for each (its runbook).  Each extractor is checked first on a sentence that
must fail, so a check that cannot fail fails here.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCS = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
CHART = ROOT / "charts" / "fencedlease"
# The three distributions' sources: the operator, the client and the local-cluster tooling.
SOURCE_ROOTS = ("operator", "client", "local")

# ------------------------------------------------------------------------------ markdown


SHELL_BLOCKS = frozenset({"sh", "bash", "shell", "console"})


def prose_and_code(text: str) -> tuple[str, list[str]]:
    """The text outside fenced code blocks (code lines blanked, so line numbers stay) and the
    lines of the shell blocks (blocks without a language are output or diagrams)."""
    prose: list[str] = []
    code: list[str] = []
    fence: str | None = None
    shell = False
    for line in text.splitlines():
        opener = re.match(r"\s*(```|~~~)\s*(\w*)", line)
        if opener and (fence is None or opener.group(1) == fence):
            fence, shell = (
                (None, False) if fence else (opener.group(1), opener.group(2) in SHELL_BLOCKS)
            )
            prose.append("")
        elif fence:
            if shell:
                code.append(line)
            prose.append("")
        else:
            prose.append(line)
    return "\n".join(prose), code


def code_spans(prose: str) -> list[str]:
    """Inline code (single or double backticks) of markdown prose."""
    return [m.group(2) for m in re.finditer(r"(`{1,2})(.+?)\1", prose)]


@dataclass(frozen=True)
class Doc:
    path: Path
    prose: str
    code: list[str]

    @property
    def name(self) -> str:
        return str(self.path.relative_to(ROOT))


def read_doc(path: Path) -> Doc:
    prose, code = prose_and_code(path.read_text())
    return Doc(path, prose, code)


def all_docs() -> list[Doc]:
    return [read_doc(p) for p in DOCS]


# ------------------------------------------------------------------------------ alerts

ALERT_RE = re.compile(r"\bFencedLease[A-Z][A-Za-z0-9]*")


def chart_alerts() -> set[str]:
    """Alert names of the chart's PrometheusRule (the template text: no helm needed)."""
    names: set[str] = set()
    for template in (CHART / "templates").glob("*.yaml"):
        names.update(re.findall(r"^\s*-\s*alert:\s*([A-Za-z0-9_]+)", template.read_text(), re.M))
    return names


def fencedlease_classes() -> set[str]:
    """``FencedLease…`` classes of the code (a ``FencedLeaseStatus`` is a model, not an
    alert)."""
    names: set[str] = set()
    for path in (p for top in SOURCE_ROOTS for p in (ROOT / top).rglob("*.py")):
        names.update(re.findall(r"^\s*class (FencedLease\w+)", path.read_text(), re.M))
    return names


def unknown_alerts(text: str, alerts: set[str], classes: set[str]) -> set[str]:
    return {n for n in ALERT_RE.findall(text) if n not in alerts and n not in classes}


def test_the_alert_check_catches_a_wrong_name() -> None:
    alerts, classes = chart_alerts(), fencedlease_classes()
    assert {"FencedLeaseStaleFenceRejected", "FencedLeaseWebhookSlow"} <= alerts
    text = "Frequent `stale_fence` (the `FencedLeaseStaleFence` alert); FencedLeaseWebhookSlow."
    assert unknown_alerts(text, alerts, classes) == {"FencedLeaseStaleFence"}


def test_every_alert_named_in_the_docs_exists_in_the_chart() -> None:
    alerts, classes = chart_alerts(), fencedlease_classes()
    wrong = {
        doc.name: sorted(unknown_alerts(doc.path.read_text(), alerts, classes))
        for doc in all_docs()
    }
    wrong = {k: v for k, v in wrong.items() if v}
    assert not wrong, f"alerts the chart's PrometheusRule does not define: {wrong}"


def test_every_alert_is_listed_in_the_install_guide_and_has_a_runbook_section() -> None:
    alerts = chart_alerts()
    install = (ROOT / "docs" / "install.md").read_text()
    monitoring = install.split("\n## Monitoring\n", 1)[1].split("\n## ", 1)[0]
    operations = (ROOT / "docs" / "operations.md").read_text()
    sections = set(re.findall(r"^### (FencedLease\w+)\s*$", operations, re.M))
    assert alerts, "no alert found in the chart's templates"
    missing = sorted(alerts - set(ALERT_RE.findall(monitoring)))
    assert not missing, f"docs/install.md, Monitoring, does not list: {missing}"
    assert not sorted(alerts - sections), f"no section in docs/operations.md: {alerts - sections}"


# ------------------------------------------------------------------------------ metrics

METRIC_RE = re.compile(r"(?<![\w$])fencedlease_[a-z0-9_]*[a-z0-9]")


def exported_metrics() -> set[str]:
    """Every name a reader may write for a fencedlease metric: a gauge's name, a counter's
    ``_total``, a histogram's name and its ``_bucket``/``_sum``/``_count`` series."""
    metrics = pytest.importorskip("fencedlease.metrics")
    from prometheus_client import REGISTRY

    names: set[str] = set()
    for family in REGISTRY.collect():
        if not family.name.startswith(f"{metrics.NAMESPACE}_"):
            continue
        if family.type == "counter":
            names.add(f"{family.name}_total")
        elif family.type == "histogram":
            names.update([family.name, *(f"{family.name}_{s}" for s in ("bucket", "sum", "count"))])
        else:
            names.add(family.name)
    assert len(names) > 20
    return names


GO_METRIC_RE = re.compile(r'Name:\s*"(fencedlease_[a-z0-9_]*[a-z0-9])"')


def go_metrics() -> set[str]:
    """The metric names the Go module (go/, docs/go.md) registers, read from its sources."""
    return {
        name
        for path in sorted((ROOT / "go").rglob("*.go"))
        if not path.name.endswith("_test.go")
        for name in GO_METRIC_RE.findall(path.read_text())
    }


def metrics_table_names(operations: str) -> set[str]:
    """The names of docs/operations.md's metrics table (its first column, without the
    ``fencedlease_`` prefix the page states once)."""
    section = operations.split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]
    names: set[str] = set()
    for row in re.findall(r"^\| *(`[^|]+)\|", section, re.M):
        names.update(f"fencedlease_{n}" for n in re.findall(r"`([a-z0-9_]+)`", row))
    return names


def test_the_metric_checks_catch_a_wrong_name() -> None:
    exported = exported_metrics()
    text = (
        "`fencedlease_grants_total`, `fencedlease_grant_total`, `fencedlease_` and `$fencedlease_x`"
    )
    assert set(METRIC_RE.findall(text)) - exported == {"fencedlease_grant_total"}
    table = "intro\n## Metrics\n\n| metric | labels |\n|---|---|\n"
    table += "| `grants_total`, `renewal_total` | — |\n"
    assert metrics_table_names(table) - exported == {"fencedlease_renewal_total"}


def test_every_metric_named_in_the_docs_is_exported() -> None:
    go = go_metrics()
    assert "fencedlease_leader_status" in go
    exported = exported_metrics() | go
    wrong = {
        doc.name: sorted(set(METRIC_RE.findall(doc.path.read_text())) - exported)
        for doc in all_docs()
    }
    wrong = {k: v for k, v in wrong.items() if v}
    assert not wrong, f"metrics fencedlease.metrics does not export: {wrong}"
    table = metrics_table_names((ROOT / "docs" / "operations.md").read_text())
    assert len(table) > 20 and not table - exported, (
        f"docs/operations.md's metrics table names unexported metrics: {table - exported}"
    )


# ------------------------------------------------------------------------------ values keys

DOTTED_RE = re.compile(r"(?<![\w./$-])([A-Za-z_][\w-]*(?:\.[A-Za-z_][\w-]*)+)(?![\w/(-])")
FILE_SUFFIXES = frozenset(
    {
        "py",
        "md",
        "yaml",
        "yml",
        "json",
        "tpl",
        "txt",
        "sh",
        "toml",
        "io",
        "log",
        "crt",
        "key",
        "pem",
    }
)


@cache
def values_and_schema() -> tuple[dict[str, Any], dict[str, Any]]:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())
    return values, schema


def in_values(path: list[str], node: Any) -> bool:
    """``path`` names a key of values.yaml (below a free-form map, an empty ``{}`` or a null,
    anything goes)."""
    for key in path:
        if not isinstance(node, dict):
            return False
        if not node:
            return True  # a free-form map (annotations, labels, resources)
        if key not in node:
            return False
        node = node[key]
        if node is None:
            return True
    return True


def in_schema(path: list[str], node: dict[str, Any]) -> bool:
    """``path`` names a key the schema defines (or lets through: additionalProperties)."""
    for key in path:
        props = node.get("properties")
        if props is None:
            return node.get("type") == "object" and node.get("additionalProperties") is not False
        if key not in props:
            return node.get("additionalProperties") not in (None, False)
        node = props[key]
    return True


def dotted_keys(text: str, top: set[str]) -> set[str]:
    """Dotted names in ``text`` whose first part is a top-level values key (``.Values.``
    dropped; a file name such as ``etcd.yaml`` is not a key)."""
    text = text.replace(".Values.", " ")
    return {
        name
        for name in DOTTED_RE.findall(text)
        if name.split(".")[0] in top and name.split(".")[-1] not in FILE_SUFFIXES
    }


def set_flag_keys(lines: list[str]) -> set[str]:
    """The keys of ``--set``/``--set-string`` arguments."""
    keys: set[str] = set()
    for line in lines:
        for arg in re.findall(r"--set(?:-string|-json)?[= ]+['\"]?([^\s'\"]+)", line):
            keys.update(part.split("=", 1)[0] for part in arg.split(",") if "=" in part)
    return keys


def values_mentions(doc: Doc, top: set[str]) -> set[str]:
    spans = code_spans(doc.prose)
    found = set().union(*(dotted_keys(s, top) for s in spans)) if spans else set()
    return found | set_flag_keys(doc.code + spans)


def unknown_values_keys(names: set[str]) -> set[str]:
    values, schema = values_and_schema()
    return {
        n
        for n in names
        if not in_values(n.split("."), values) and not in_schema(n.split("."), schema)
    }


def values_comments() -> str:
    return "\n".join(
        line.split("#", 1)[1]
        for line in (CHART / "values.yaml").read_text().splitlines()
        if "#" in line
    )


def test_the_values_check_catches_a_wrong_key() -> None:
    values, _ = values_and_schema()
    top = set(values)
    doc = Doc(
        ROOT / "x.md",
        "from `webhook.allowedSources`, `networkPolicy.webhookSources`, `templates/etcd.yaml`,"
        " `monitoring.dashboard.annotations.grafana_folder`, `status.holder`",
        ["helm upgrade r charts/fencedlease --set etcd.bundled.enabled=false,webhook.nope=1"],
    )
    found = values_mentions(doc, top)
    assert "networkPolicy.webhookSources" in found and "status.holder" not in found
    assert unknown_values_keys(found) == {"webhook.allowedSources", "webhook.nope"}
    assert dotted_keys("(webhook port from webhook.allowedSources, metrics)", top) == {
        "webhook.allowedSources"
    }


def test_every_values_key_named_in_the_docs_exists_in_the_chart() -> None:
    values, _ = values_and_schema()
    top = set(values)
    wrong = {doc.name: sorted(unknown_values_keys(values_mentions(doc, top))) for doc in all_docs()}
    wrong["charts/fencedlease/values.yaml (comments)"] = sorted(
        unknown_values_keys(dotted_keys(values_comments(), top))
    )
    wrong = {k: v for k, v in wrong.items() if v}
    assert not wrong, f"values keys charts/fencedlease/values.yaml does not have: {wrong}"
    assert sum(len(values_mentions(doc, top)) for doc in all_docs()) > 50  # the check looks


# ------------------------------------------------------------------------------ CLI flags

COMMAND_RE = re.compile(
    r"(?:^|[;&|(]\s*|\$\(\s*|\b(?:sudo|exec|then|do)\s+)"  # in command position
    r"(?:[A-Z_][A-Z0-9_]*=\S*\s+)*"  # env assignments
    r"(?:\S*/)?(kubectl[ -]fencedlease|fencedlease)(?=\s|$)([^;&|#)`]*)"
)


def parsers() -> dict[str, argparse.ArgumentParser]:
    from fencedlease.client import cli, kubectl

    # The whole command as installed: the client's commands and those the operator (run)
    # and the local tooling (local) add through their entry points.
    full = cli.build_parser(cli.installed_commands())[0]
    return {"fencedlease": full, "kubectl fencedlease": kubectl.build_parser()}


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse has no public accessor
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings}


def command_errors(program: str, args: str, tree: dict[str, argparse.ArgumentParser]) -> list[str]:
    """What is wrong with ``program args`` as the docs write it (``[--flag V]`` optional parts
    and ``<placeholders>`` allowed): unknown flags and unknown subcommands."""
    parser = tree[program.replace("kubectl-", "kubectl ")]
    errors: list[str] = []
    words = re.sub(r"[\[\]{}]", " ", args).split()
    takes_value = False
    for word in words:
        if takes_value:  # the value of the flag before it (`--context prod`)
            takes_value = False
            continue
        subs = _subcommands(parser)
        if word.startswith("-"):
            flag = word.split("=", 1)[0]
            if re.fullmatch(r"--?[A-Za-z][\w-]*", flag) and flag not in _options(parser):
                errors.append(f"{program} {args.strip()}: no flag {flag}")
            action = parser._option_string_actions.get(flag)
            takes_value = "=" not in word and action is not None and action.nargs != 0
        elif subs and re.fullmatch(r"[a-z][a-z-]*", word):
            if word not in subs:
                errors.append(f"{program} {args.strip()}: no subcommand {word!r}")
                break
            parser = subs[word]
    return errors


def commands(doc: Doc) -> list[tuple[str, str]]:
    """``(program, arguments)`` of every fencedlease command a doc writes: in code blocks and
    in inline code that starts with the command."""
    joined = re.sub(r"\\\n", " ", "\n".join(doc.code)).splitlines()  # continued lines
    lines = [re.sub(r"^\s*[$#]\s+", "", line) for line in joined] + code_spans(doc.prose)
    return [(m.group(1), m.group(2)) for line in lines for m in COMMAND_RE.finditer(line)]


def test_the_flag_check_catches_a_wrong_flag() -> None:
    tree = parsers()
    doc = Doc(
        ROOT / "x.md",
        "run `fencedlease token --dir D --lease L` or `kubectl fencedlease describe --context c`",
        [
            "$ .venv/bin/fencedlease local up --node --state-dir /tmp/x --nodes 2",
            "helm install fencedlease charts/fencedlease --create-namespace  # not the CLI",
            "x=$(fencedlease token --require-held --min-remaining 30) && fencedlease publih a",
            "FENCEDLEASE_ROLE=webhook fencedlease run --no-leader-election \\",
            "    --pod-select x",
        ],
    )
    found = commands(doc)
    assert len(found) == 6
    errors = [e for program, args in found for e in command_errors(program, args, tree)]
    assert [e.rsplit(": ", 1)[1] for e in errors] == [
        "no flag --nodes",
        "no subcommand 'publih'",
        "no flag --pod-select",
    ]


def test_every_cli_flag_named_in_the_docs_exists() -> None:
    tree = parsers()
    found = [(doc, program, args) for doc in all_docs() for program, args in commands(doc)]
    errors = [
        f"{doc.name}: {e}"
        for doc, program, args in found
        for e in command_errors(program, args, tree)
    ]
    assert not errors, "\n".join(errors)
    assert len(found) > 10  # the check looks


# ------------------------------------------------------------------------------ file paths

PATH_RE = re.compile(
    r"(?<![\w./-])((?:[\w.-]+/)*[\w.-]+\.(?:py|yaml|json|tpl|sh|toml|md))(?:::(\w+))?"
)


def repo_files() -> list[str]:
    return sorted(
        str(p.relative_to(ROOT))
        for top in (
            *SOURCE_ROOTS,
            "tests",
            "bench",
            "e2e",
            "examples",
            "charts",
            "crds",
            "docs",
            "scripts",
            ".ci",
        )
        for p in (ROOT / top).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    ) + [p.name for p in ROOT.iterdir() if p.is_file()]


def unknown_paths(spans: list[str], files: list[str]) -> set[str]:
    """Paths in inline code that no file of the repository ends with (``store/etcd.py``,
    ``tests/unit/test_x.py``), and ``file.py::test_name`` whose file defines no such function.
    A bare name without a directory is checked only with ``::``."""
    wrong: set[str] = set()
    for span in spans:
        for m in PATH_RE.finditer(span):
            path, func = m.group(1), m.group(2)
            if "/" not in path and not func:
                continue
            found = [f for f in files if f == path or f.endswith("/" + path)]
            if not found:
                wrong.add(path)
            elif func and not any(
                re.search(rf"^\s*(?:async )?def {func}\b", (ROOT / f).read_text(), re.M)
                for f in found
            ):
                wrong.add(f"{path}::{func}")
    return wrong


def test_the_path_check_catches_a_wrong_path() -> None:
    files = repo_files()
    spans = [
        "store/etcd.py",
        "webhook/reads.py: CoalescedReads",
        "store/etcd_client.py",
        "tests/unit/test_docs_names.py::test_the_path_check_catches_a_wrong_path",
        "test_docs_names.py::test_no_such_test",
        "lease.py",
    ]
    assert unknown_paths(spans, files) == {
        "store/etcd_client.py",
        "test_docs_names.py::test_no_such_test",
    }


def test_every_file_and_test_named_in_the_docs_exists() -> None:
    files = repo_files()
    wrong = {doc.name: sorted(unknown_paths(code_spans(doc.prose), files)) for doc in all_docs()}
    wrong = {k: v for k, v in wrong.items() if v}
    assert not wrong, f"files or tests that do not exist: {wrong}"


# ------------------------------------------------------------------------------ links


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(doc: Doc) -> set[str]:
    seen: dict[str, int] = {}
    found: set[str] = set(re.findall(r"<a (?:id|name)=\"([^\"]+)\"", doc.prose))
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", doc.prose, re.M):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def links(doc: Doc) -> Iterator[tuple[Path, str]]:
    """Relative link targets of the prose: (file, anchor or "")."""
    for target in re.findall(r"\]\(([^)\s]+)\)", doc.prose):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        yield (doc.path.parent / path).resolve() if path else doc.path, anchor


def test_slugs_are_githubs() -> None:
    assert slug("Scale: 2,500 leases on one operator, and a 30-minute soak") == (
        "scale-2500-leases-on-one-operator-and-a-30-minute-soak"
    )
    assert (
        slug("Why acquire+release misses etcd's v3lock") == "why-acquirerelease-misses-etcds-v3lock"
    )
    assert slug("Alerts (PrometheusRule, `monitoring.enabled`)") == (
        "alerts-prometheusrule-monitoringenabled"
    )


def test_every_relative_link_and_anchor_resolves() -> None:
    docs = {doc.path: doc for doc in all_docs()}
    broken: list[str] = []
    for doc in docs.values():
        for path, anchor in links(doc):
            if not path.exists():
                broken.append(f"{doc.name}: {path.relative_to(ROOT)} does not exist")
            elif anchor and path.suffix == ".md":
                target = docs.get(path) or read_doc(path)
                if anchor not in anchors(target):
                    broken.append(f"{doc.name}: no #{anchor} in {path.relative_to(ROOT)}")
    assert not broken, "\n".join(broken)
