"""Every relative link of the README, docs/*.md, docs/decisions/*.md and cluster/README.md resolves
inside the repository (file, and heading anchor when one is given); the README links nowhere outside
it."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "cluster" / "README.md", *sorted((ROOT / "docs").glob("*.md")),
        *sorted((ROOT / "docs" / "decisions").glob("*.md"))]
LINK = re.compile(r"(?<!\!)\[[^\]]*\]\(([^)\s]+)\)|\!\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
EXTERNAL = ("http://", "https://", "mailto:")


def links(text: str) -> list[str]:
    """Link targets outside fenced code blocks and inline code."""
    text = FENCE.sub("", text)
    text = re.sub(r"`[^`\n]*`", "", text)
    return [a or b for a, b in LINK.findall(text)]


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", lambda m: "_" if m.group() == "_" else "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", path.read_text(encoding="utf-8")).splitlines():
        m = re.match(r"^#{1,6}\s+(.*)$", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken(doc: Path, root: Path = ROOT) -> list[str]:
    bad = []
    for target in links(doc.read_text(encoding="utf-8")):
        if target.startswith(EXTERNAL):
            continue
        path_part, _, anchor = target.partition("#")
        dest = (doc.parent / path_part).resolve() if path_part else doc
        if root not in dest.parents and dest != root:
            bad.append(f"{target}: outside the repository")
        elif not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target}: no heading #{anchor} in {dest.relative_to(root)}")
    return bad


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve_inside_the_repository(doc):
    assert broken(doc) == []


def test_readme_links_nowhere_outside_the_repository():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert [t for t in links(readme) if t.startswith(EXTERNAL)] == []
    assert "../shared" not in readme


def test_readme_is_short():
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) < 220


def test_the_checker_finds_broken_links(tmp_path):
    repo = tmp_path / "repo"
    (repo / "docs").mkdir(parents=True)
    (repo / "docs" / "a.md").write_text("# Three packages, one `direction`\n```\n# not a heading\n```\n")
    (tmp_path / "outside.md").write_text("x")
    doc = repo / "docs" / "b.md"
    doc.write_text("[a](a.md#no-such-heading) [b](missing.md) [c](../../outside.md) `[d](ignored.md)` "
                   "[e](a.md#three-packages-one-direction) [f](a.md#not-a-heading) [g](https://example.org)")
    assert broken(doc, repo) == ["a.md#no-such-heading: no heading #no-such-heading in docs/a.md",
                                 "missing.md: no such file", "../../outside.md: outside the repository",
                                 "a.md#not-a-heading: no heading #not-a-heading in docs/a.md"]
