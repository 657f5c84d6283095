"""Every relative link in the README and the docs reaches a file, and every #anchor a heading.

Anchors are GitHub's heading slugs: lower case, punctuation other than `-` and `_` dropped,
spaces as `-`, a repeated heading numbered `-1`, `-2`, ... Links inside code blocks are code.
"""

import re
import unicodedata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", REPO / "tests" / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
EXTERNAL = ("http://", "https://", "mailto:")


def prose(text: str) -> str:
    """The text outside fenced code blocks (``` ... ```)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def slug(heading: str) -> str:
    text = heading.strip().lower().replace("`", "")
    kept = "".join(
        char
        for char in text
        if char in " -_" or unicodedata.category(char)[0] in "LMN"  # letters, marks, numbers
    )
    return kept.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found, seen = set(), {}
    for line in prose(page.read_text()).splitlines():
        if match := re.match(r"#{1,6} (.+)", line):
            base = slug(match.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(page: Path) -> list[str]:
    return [
        target
        for target in LINK.findall(prose(page.read_text()))
        if not target.startswith(EXTERNAL)
    ]


def test_slugs_are_githubs():
    assert slug("Configuration (`model_repository/<model>/1/`)") == (
        "configuration-model_repositorymodel1"
    )
    assert slug("Speed vs faster-whisper (part `speed`, P7)") == (
        "speed-vs-faster-whisper-part-speed-p7"
    )


def test_every_doc_is_linked_from_the_readme():
    linked = {(REPO / target.split("#")[0]).resolve() for target in links(REPO / "README.md")}
    unlinked = [page.name for page in PAGES[1:] if page.resolve() not in linked]
    assert not unlinked, f"README.md links none of: {unlinked}"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(REPO)))
def test_relative_links_resolve(page):
    assert links(page) or page.name != "README.md", f"{page} has no links"
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        destination = (page.parent / path).resolve() if path else page
        if not destination.exists():
            broken.append(f"{target}: no {destination.relative_to(REPO)}")
        elif anchor and destination.suffix == ".md" and anchor not in anchors(destination):
            broken.append(f"{target}: no heading #{anchor} in {destination.name}")
    assert not broken, f"{page.relative_to(REPO)}: " + "; ".join(broken)
