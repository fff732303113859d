"""docs/config.md, generated: every key of the run schema (peer_rl.config.schema.PeerRLConfig) with its
type, default and the comment written beside it, then every recipe with its header's first
sentence. The schema's source is the one place a key is described; this page only renders it.

    python -m peer_rl.config.doc            # rewrite docs/config.md
    python -m peer_rl.config.doc --check    # exit 1 when the page differs from the schema
"""
from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import io
import json
import re
import sys
import textwrap
import tokenize
import typing
from pathlib import Path

from peer_rl.config.schema import RECIPES_DIR, PeerRLConfig

# the page lives in the checkout (generated and checked there, not installed)
PAGE = Path(__file__).resolve().parents[2] / "docs" / "config.md"
RECIPE_DIRS = (("", "`peer-rl train`, `sft`, `train-rm`, `eval`, `data` recipes "
                    "(`recipe=NAME`)"),
               ("ladders", "evaluation ladders (`peer-rl eval ladder NAME`)"),
               ("chains", "pipelines (`peer-rl chain NAME`)"))


@functools.lru_cache(maxsize=None)
def _comments(cls: type) -> dict[str, str]:
    """{field name: its comment} for the fields `cls` itself defines: the comment lines just
    above the field, then the one beside it and any comment lines aligned under that one."""
    src = textwrap.dedent(inspect.getsource(cls))
    lines = src.splitlines()
    beside: dict[int, tuple[int, str]] = {}             # line -> (column, text)
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.COMMENT:
            beside[tok.start[0]] = (tok.start[1], tok.string.lstrip("#").strip())

    def alone(n: int) -> bool:                           # a line holding only a comment
        return n in beside and not lines[n - 1][:beside[n][0]].strip()

    out, used = {}, set()                                # used: continuation lines
    body = ast.parse(src).body[0].body
    for node in body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        first, last = node.lineno, node.end_lineno
        above, n = [], first - 1
        while n >= 1 and alone(n) and n not in used:
            above.insert(0, beside[n][1])
            n -= 1
        after = []
        if last in beside and not alone(last):
            col = beside[last][0]
            after.append(beside[last][1])
            n = last + 1
            while alone(n) and beside[n][0] == col:
                after.append(beside[n][1])
                used.add(n)
                n += 1
        out[node.target.id] = " ".join(above + after)
    return out


def _comment(cls: type, name: str) -> str:
    """The comment of the most derived class in `cls`'s MRO that defines `name` itself."""
    for klass in cls.__mro__:
        if name in getattr(klass, "__annotations__", {}) and dataclasses.is_dataclass(klass):
            return _comments(klass).get(name, "")
    return ""


def _value(v) -> str:
    if v == "???":
        return "`???` (required)"
    return "`" + json.dumps(v, ensure_ascii=False) + "`"


def _cell(text: str) -> str:
    """Markdown table cell: pipes escaped, and `<` outside code spans (`<think>`, `<dir>`)
    written as an entity so that it is not read as an HTML tag."""
    parts = text.replace("|", "\\|").split("`")
    return "`".join(p if i % 2 else p.replace("<", "&lt;") for i, p in enumerate(parts))


def _type(cls: type, f: dataclasses.Field) -> str:
    """The field's annotation as written, or a Literal's choices spelled out ("auto" or
    "float32" or ...): an alias such as DType names none of them."""
    hint = typing.get_type_hints(cls)[f.name]
    if typing.get_origin(hint) is typing.Literal:
        return " or ".join(json.dumps(v) for v in typing.get_args(hint))
    return str(f.type).replace(" | ", " or ")


def schema_rows(obj=None, prefix: str = "") -> list[tuple[str, list]]:
    """[(section, [(key, type, default, comment), ...])] in the schema's order, one section per
    dataclass (nested sections after their parent's plain keys). Defaults are read off an
    instance, so a section's own defaults (resources.redundancy's 0.5 CPUs) show."""
    obj = PeerRLConfig() if obj is None else obj
    cls, own, nested = type(obj), [], []
    for f in dataclasses.fields(cls):
        key, value = prefix + f.name, getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            nested += schema_rows(value, key + ".")
            continue
        own.append((key, _type(cls, f), value, _comment(cls, f.name)))
    return ([(prefix.rstrip(".") or "top level", own)] if own else []) + nested


def _first_sentence(path: Path) -> str:
    """The recipe's header comment up to its first full stop (or its first paragraph)."""
    head = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        text = line.lstrip("#").strip()
        if not text or text.startswith("peer-rl ") or line.startswith("#   "):
            break                                         # a command line ends the prose
        head.append(text)
    prose = " ".join(head)
    for m in re.finditer(r"\.(?=\s+[A-Z`(]|$)", prose):
        if not re.search(r"\b(al|Dr|vs|e\.g|i\.e)$", prose[:m.start()]):
            return prose[:m.start() + 1]
    return prose.rstrip(":") + "."


def recipe_rows() -> list[tuple[str, list[tuple[str, str]]]]:
    out = []
    for sub, what in RECIPE_DIRS:
        d = RECIPES_DIR / sub if sub else RECIPES_DIR
        out.append((what, [(p.stem, _first_sentence(p)) for p in sorted(d.glob("*.yaml"))]))
    return out


def render() -> str:
    parts = [
        "# Configuration reference",
        "",
        "<!-- generated by `python -m peer_rl.config.doc` from peer_rl/config/schema.py and recipes/; "
        "edit those, then rerun it -->",
        "",
        "`peer-rl train` reads the schema below (`peer_rl/config/schema.py`), then the recipe named by "
        "`recipe=NAME` (default `tiny`), then `key=value` overrides from the command line. An "
        "unknown key or a value of the wrong type fails at start-up naming the key. The defaults "
        "here are the schema's; a recipe usually sets many of them (read it in `recipes/`). A "
        "run saves its resolved configuration as `config.yaml` in its output directory.",
        "",
    ]
    for section, rows in schema_rows():
        parts += [f"## `{section}`" if section != "top level" else "## Top-level keys", "",
                  "| key | type | default | meaning |", "| --- | --- | --- | --- |"]
        parts += [f"| `{k}` | `{t}` | {_cell(_value(v))} | {_cell(c)} |" for k, t, v, c in rows]
        parts.append("")
    parts += ["## Recipes", "",
              "Each recipe's first line, from the comment at its head; a recipe may name a "
              "`base` recipe whose values it overrides.", ""]
    for what, rows in recipe_rows():
        parts += [f"### {what[0].upper()}{what[1:]}", "", "| recipe | what it is |",
                  "| --- | --- |"]
        parts += [f"| `{name}` | {_cell(line)} |" for name, line in rows]
        parts.append("")
    return "\n".join(parts).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    text = render()
    if "--check" in argv:
        if PAGE.read_text(encoding="utf-8") != text:
            print(f"{PAGE}: differs from the schema and recipes; run "
                  "`python -m peer_rl.config.doc` to regenerate it", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text, encoding="utf-8")
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
