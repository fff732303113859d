"""The site's front page lists every page of the site, and mkdocs' nav holds every page."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = {p.name for p in (ROOT / "docs").glob("*.md")} - {"index.md"}


def test_the_front_page_links_every_page():
    linked = set(re.findall(r"\]\(([\w-]+\.md)\)", (ROOT / "docs" / "index.md").read_text()))
    assert PAGES - linked == set(), "docs/index.md does not link these pages"
    assert linked - PAGES - {"index.md"} == set(), "docs/index.md links pages that do not exist"


def test_the_front_page_gives_the_install_and_first_run_commands():
    text = (ROOT / "docs" / "index.md").read_text()
    assert "bash scripts/setup.sh" in text and ".venv/bin/peer-rl train" in text


def test_the_nav_holds_every_page():
    nav = set(re.findall(r"^\s+- [^:]+: ([\w-]+\.md)$", (ROOT / "mkdocs.yml").read_text(), re.M))
    assert nav == PAGES | {"index.md"}
