"""The code stays readable in pieces (issue #32's done-when, docs/design.md): no module of the
three distributions (``operator/``, ``client/``, ``local/``) over 600 lines and no function over
80, unless the module's docstring says why ("over 600 lines", "over 80 lines")."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OPERATOR = ROOT / "operator" / "fencedlease"
CLIENT = ROOT / "client" / "src" / "fencedlease"
LOCAL = ROOT / "local" / "src" / "fencedlease"
MODULE_LINES = 600
FUNCTION_LINES = 80


def oversized(root: Path = OPERATOR) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        tree = ast.parse(text)
        doc = ast.get_docstring(tree) or ""
        name = path.relative_to(root.parent)
        lines = text.count("\n")
        if lines > MODULE_LINES and f"over {MODULE_LINES} lines" not in doc:
            found.append(f"{name}: {lines} lines")
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > FUNCTION_LINES and f"over {FUNCTION_LINES} lines" not in doc:
                    found.append(f"{name}:{node.lineno} {node.name}: {length} lines")
    return found


def test_no_module_or_function_of_the_operator_is_oversized() -> None:
    assert not oversized(), "over the limits, without a reason in the module docstring"


def test_no_module_or_function_of_the_client_or_local_is_oversized() -> None:
    found = oversized(CLIENT) + oversized(LOCAL)
    assert not found, "over the limits, without a reason in the module docstring"
    assert list(CLIENT.rglob("*.py")) and list(LOCAL.rglob("*.py"))  # both were scanned


def test_the_check_sees_an_oversized_function_unless_its_module_says_why(tmp_path: Path) -> None:
    root = tmp_path / "pkg"
    root.mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(FUNCTION_LINES))
    (root / "long.py").write_text(f'"""A module."""\n\n\ndef long() -> None:\n{body}\n')
    assert oversized(root) == ["pkg/long.py:4 long: 81 lines"]
    (root / "long.py").write_text(
        f'"""Why over 80 lines: a table."""\n\n\ndef long() -> None:\n{body}\n'
    )
    assert oversized(root) == []
