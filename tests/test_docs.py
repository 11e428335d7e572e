"""The README and docs/: every relative link leads to a file (and heading) that exists, and the README
starts with the two commands a new user runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchor_of(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^a-z0-9 _-]", "", heading.strip().lower()).replace(" ", "-")


def headings(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return {anchor_of(h) for h in re.findall(r"^#+ (.*)$", text, flags=re.M)}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_lead_somewhere(page):
    broken = []
    for link in LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", link):
            continue  # https:, mailto:
        path, _, anchor = link.partition("#")
        target = (page.parent / path) if path else page
        missing_heading = (
            anchor and target.suffix == ".md" and target.exists() and anchor not in headings(target)
        )
        if not target.exists() or missing_heading:
            broken.append(link)
    assert not broken, f"{page.name}: links to nothing: {broken}"


def test_the_readme_starts_with_the_two_commands():
    first_block = ROOT.joinpath("README.md").read_text(encoding="utf-8").split("```")[1]
    commands = [line.split("#")[0].strip() for line in first_block.splitlines()[1:] if line.strip()]
    assert commands == ["bash packaging/run-app.sh", "bash packaging/test.sh"]
