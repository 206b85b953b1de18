"""The chart README's values table, made from values.yaml's "# --" comments.

    python values_doc.py            # print the table
    python values_doc.py --write    # rewrite it in README.md between the markers
    python values_doc.py --check    # exit 1 when README.md is out of date

A "# --" comment (continued by the "#" lines below it) documents the key on the
next line; on a map it documents the whole map. Keys of a map without such a
comment are documented one by one, and every value must be documented somewhere.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import yaml

CHART = Path(__file__).resolve().parent.parent
START = "<!-- values-table:start -->"
END = "<!-- values-table:end -->"
_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_.-]+):(?:\s|$)")


def documented(values_file: Path = CHART / "values.yaml") -> list[tuple[str, str]]:
    """(dotted path, description) for each "# --" comment, in file order."""
    data = yaml.safe_load(values_file.read_text())
    stack: list[tuple[int, str]] = []
    pending: list[str] | None = None
    rows = []
    for line in values_file.read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("# --"):
            pending = [stripped[4:].strip()]
            continue
        if stripped.startswith("#"):
            if pending is not None:
                pending.append(stripped[1:].strip())
            continue
        match = _KEY.match(line)
        if not match:
            if stripped:
                pending = None
            continue
        indent = len(match["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([k for _, k in stack] + [match["key"]])
        stack.append((indent, match["key"]))
        if not _exists(data, path):  # a key inside a list item
            pending = None
            continue
        if pending is not None:
            rows.append((path, " ".join(p for p in pending if p)))
        pending = None
    return rows


def _exists(data: object, path: str) -> bool:
    node = data
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def _get(data: object, path: str) -> object:
    node = data
    for part in path.split("."):
        node = node[part]  # type: ignore[index]
    return node


def leaves(data: object, prefix: str = "") -> list[str]:
    """Paths of every value that is not a non-empty map."""
    if isinstance(data, dict) and data:
        out = []
        for key, value in data.items():
            out.extend(leaves(value, f"{prefix}.{key}" if prefix else key))
        return out
    return [prefix]


def undocumented(values_file: Path = CHART / "values.yaml") -> list[str]:
    data = yaml.safe_load(values_file.read_text())
    covered = [path for path, _ in documented(values_file)]
    return [leaf for leaf in leaves(data)
            if not any(leaf == c or leaf.startswith(c + ".") for c in covered)]


def table(values_file: Path = CHART / "values.yaml") -> str:
    data = yaml.safe_load(values_file.read_text())
    lines = ["| Key | Type | Default | Description |", "| --- | --- | --- | --- |"]
    for path, text in documented(values_file):
        value = _get(data, path)
        kind = {dict: "object", list: "list", bool: "bool", int: "int", float: "number",
                str: "string", type(None): "null"}.get(type(value), type(value).__name__)
        default = json.dumps(value, separators=(",", ":"))
        if len(default) > 60:
            default = "see values.yaml"
        default = default.replace("|", "\\|")
        text = text.replace("|", "\\|")
        lines.append(f"| `{path}` | {kind} | `{default}` | {text} |")
    return "\n".join(lines) + "\n"


def _readme_with(table_text: str) -> tuple[str, str]:
    readme = (CHART / "README.md").read_text()
    if START not in readme or END not in readme:
        raise SystemExit(f"README.md lacks the {START} / {END} markers")
    head, rest = readme.split(START, 1)
    _, tail = rest.split(END, 1)
    return readme, f"{head}{START}\n{table_text}{END}{tail}"


def main(argv: list[str]) -> int:
    text = table()
    if "--write" in argv:
        _, new = _readme_with(text)
        (CHART / "README.md").write_text(new)
        return 0
    if "--check" in argv:
        current, new = _readme_with(text)
        if current != new:
            print("helm/outboxd/README.md: the values table is out of date; "
                  "run: python helm/outboxd/ci/values_doc.py --write")
            return 1
        return 0
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
