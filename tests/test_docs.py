"""The README and docs/ as a manual: a README short enough to read, and nothing they name that is not there.

- README.md has at most 300 lines (the rest lives in docs/);
- every inventory file README.md and docs/ name (``inventory/<name>.py``, ``inventory/group_data/<group>.py``)
  exists; tests/test_bad_inputs.py ``test_the_example_inventories_are_valid`` validates every inventory/*.py
  with its group_data, so every inventory a doc shows is also checked;
- every relative link (``[text](path#anchor)``) resolves to a file, and its anchor to a heading there;
- every repository path they name (``resolve/plan.py``, ``operations/scripts/``, ...) exists;
- docs/architecture.md names every top-level file and folder of the repository;
- no doc cites internal notes users do not have (FACTS, ../shared): docs/field-notes.md or the upstream
  source instead.

Placeholders are written with angle brackets (``inventory/<site>.py``) and are not paths.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
DOCS = [README, *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "docs" / "models").glob("*.md"))]

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
INVENTORY = re.compile(r"(?<![\w/.-])inventory/(?:[\w.-]+/)*[\w.-]+\.py\b")
TOP_FOLDERS = ("benchmarks", "docs", "inventory", "models", "operations", "patches", "resolve", "scripts",
               "templates", "testbed", "tests", ".ci")
# a repository path: one of the top-level folders, then a name ending in an extension or a folder's slash
REPO_PATH = re.compile(r"(?<![\w/.-])((?:%s)/(?:[\w.@+-]+/)*(?:[\w@+-]+(?:\.[\w-]+)*\.\w+|[\w.@+-]+/|))(?![\w/<*])"
                       % "|".join(re.escape(folder) for folder in TOP_FOLDERS))
# what a run writes beside the inventory: named by the docs, absent from the repository until then
WRITTEN_BY_A_RUN = (".lock.json",)


def rel(path: Path) -> str:
    return str(path.relative_to(REPO))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (match := re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)):
            base = slug(match.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def test_the_readme_is_at_most_300_lines():
    lines = README.read_text().splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines: move detail into docs/ (docs/architecture.md lists them)"


@pytest.mark.parametrize("doc", DOCS, ids=rel)
def test_every_inventory_named_exists(doc):
    missing = sorted({name for name in INVENTORY.findall(doc.read_text()) if not (REPO / name).is_file()})
    assert not missing, f"{rel(doc)} names inventories that are not in inventory/: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=rel)
def test_every_relative_link_resolves(doc):
    broken = []
    for target in LINK.findall(doc.read_text()):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        path = (doc.parent / path_part).resolve() if path_part else doc
        if not path.exists():
            broken.append(f"{target}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(f"{target}: no heading #{anchor} in {rel(path)}")
    assert not broken, f"{rel(doc)}: {broken}"


@pytest.mark.parametrize("doc", DOCS, ids=rel)
def test_every_repository_path_named_exists(doc):
    text = LINK.sub("", doc.read_text())  # link targets are relative to the doc, checked above
    missing = sorted({
        name for name in REPO_PATH.findall(text)
        if not name.endswith(WRITTEN_BY_A_RUN) and not (REPO / name).exists()
    })
    assert not missing, f"{rel(doc)} names paths that are not in the repository: {missing}"


def test_architecture_names_every_top_level_path():
    listed = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True)
    if listed.returncode != 0:
        pytest.skip(f"not a git checkout: {listed.stderr.strip()}")
    top = {name.split("/")[0] + ("/" if "/" in name else "") for name in listed.stdout.splitlines()}
    text = (REPO / "docs" / "architecture.md").read_text()
    missing = sorted(
        name for name in top
        if name != ".gitignore" and f"`{name}" not in text and f"`{name.rstrip('/')}`" not in text
    )
    assert not missing, f"docs/architecture.md, 'Packages and files', does not name: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=rel)
def test_no_citation_of_internal_notes(doc):
    text = doc.read_text()
    cited = re.findall(r"\bFACTS(?:\.md)?\b|\.\./shared\b|(?<![\w/.-])shared/[\w./-]+", text)
    assert not cited, f"{rel(doc)} cites notes users do not have: {cited}; cite docs/field-notes.md or the upstream source"
