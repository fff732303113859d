"""The documentation: the README is a front door whose links resolve, the docs site builds with
no warning (broken links and anchors included), and every file or test the docs name exists."""
import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted((ROOT / "docs").glob("*.md"))


def test_the_docs_site_builds_strictly(tmp_path):
    from mkdocs.commands.build import build
    from mkdocs.config import load_config

    cfg = load_config(str(ROOT / "mkdocs.yml"), site_dir=str(tmp_path / "site"), strict=True)
    build(cfg)     # raises on any warning in strict mode: a broken link, a page left out of nav
    assert (tmp_path / "site" / "reliability" / "index.html").exists()


def test_the_readme_fits_a_few_screens_and_its_links_resolve():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    assert links, "the README links to its docs"
    missing = [link for link in links if not link.startswith("http") and
               not (ROOT / link).exists()]
    assert missing == []
    assert {f"docs/{p.name}" for p in DOCS} - {"docs/index.md"} <= set(links)


def _functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}


def _slug(heading: str) -> str:
    """A heading's anchor as the docs site makes it (Markdown's toc: lower case, punctuation
    dropped, spaces as hyphens)."""
    return re.sub(r"[\s]+", "-", re.sub(r"[^\w\s-]", "", heading.strip().lower()))


def test_contributing_links_and_their_anchors_resolve():
    text = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)#]+)(?:#([^)]*))?\)", text)
    assert links
    for link, anchor in links:
        assert (ROOT / link).exists(), link
        if anchor:
            headings = re.findall(r"^#+ (.+)$", (ROOT / link).read_text(encoding="utf-8"), re.M)
            assert anchor in {_slug(h) for h in headings}, f"{link}#{anchor}"


@pytest.mark.parametrize("page", [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *DOCS],
                         ids=lambda p: p.name)
def test_every_file_and_test_a_page_names_exists(page):
    text = page.read_text(encoding="utf-8")
    paths = set(re.findall(r"`((?:peer_rl|workers|recipes|tests|cluster|scripts|benchmarks)"
                           r"/[\w./-]+\.(?:py|yaml|sh))", text))
    assert [p for p in sorted(paths) if not (ROOT / p).exists()] == []
    # `tests/x.py::name` and the `::other` that may follow it in the same cell or sentence
    for path, names in re.findall(r"(tests/[\w/]+\.py)((?:::\w+(?:`?,? ?`?)?)+)", text):
        defined = _functions(ROOT / path)
        for name in re.findall(r"::(\w+)", names):
            assert name in defined, f"{page.name}: {path}::{name} is not defined"


def test_every_config_key_the_glossary_names_exists():
    from omegaconf import OmegaConf

    from peer_rl.config.schema import load_config

    cfg, absent = load_config(), object()
    text = (ROOT / "docs" / "glossary.md").read_text(encoding="utf-8")
    keys = set(re.findall(r"`((?:actor|rollout|algorithm|trainer|model|reward_model|resources)"
                          r"\.[\w.<>]+)", text))
    assert {"rollout.n", "actor.kl_loss_type", "algorithm.rur"} <= keys
    concrete = {k.replace("<pool>", "rollout").split("=")[0] for k in keys}
    assert [k for k in sorted(concrete) if OmegaConf.select(cfg, k, default=absent) is absent] \
        == []
