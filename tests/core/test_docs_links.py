"""Every relative link in the README and docs/ leads somewhere.

Before: two links written from inside docs/ as `docs/x.md` pointed at docs/docs/x.md,
a 404 on any Markdown viewer. A link is resolved from the folder of the file that holds
it, as GitHub and every viewer resolve it; a `#fragment` must name a heading of the
target, slugged as GitHub slugs headings.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")


def prose_lines(path: Path):
    """(number, line) outside fenced code blocks, where `](` is not a link."""
    fenced = False
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            yield number, line


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"[`*_]|\[([^]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(m.group(1)) for _, line in prose_lines(path) if (m := HEADING.match(line))}


def relative_links():
    for document in DOCUMENTS:
        for number, line in prose_lines(document):
            for match in LINK.finditer(line):
                url = match.group(1)
                if not re.match(r"^[a-z][a-z0-9+.-]*:", url):  # http:, mailto: ...
                    yield pytest.param(document, number, url, id=f"{document.name}:{number}")


@pytest.mark.parametrize(("document", "number", "url"), list(relative_links()))
def test_a_relative_link_names_a_file_and_heading_that_exist(document, number, url):
    path, _, fragment = url.partition("#")
    target = (document.parent / path).resolve() if path else document
    where = f"{document.relative_to(ROOT)}:{number}: {url}"
    assert target.exists(), f"{where} -> {target} does not exist"
    if fragment and target.suffix == ".md":
        assert fragment in anchors(target), f"{where}: no heading with that anchor"


def test_the_documents_hold_relative_links_to_check():
    assert len(list(relative_links())) >= 20
