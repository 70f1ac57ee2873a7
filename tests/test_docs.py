"""The documentation matches the software: every command and option of the CLI is in docs/cli.md, every link of
the docs and the README points at a file of the repository, and no reference points outside it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CLI_MD = ROOT / "docs" / "cli.md"


def _commands():
    """(command path, its option names) of the typer app, from click's command tree (typer vendors click, so
    the tree is read by its interface, not by class)."""
    import typer

    from bubblescope import cli

    def walk(cmd, path):
        if hasattr(cmd, "commands"):
            for name, sub in cmd.commands.items():
                yield from walk(sub, path + (name,))
        else:
            opts = [o for p in cmd.params if p.param_type_name == "option" for o in p.opts if o != "--help"]
            yield " ".join(path), opts

    return list(walk(typer.main.get_command(cli.app), ()))


def _section(text: str, command: str) -> str | None:
    """The text of ``## `bubblescope COMMAND` `` up to the next ``## `` heading, or None."""
    m = re.search(rf"^## `bubblescope {re.escape(command)}`\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    return m.group(1) if m else None


def test_the_command_tree_is_read():
    commands = dict(_commands())
    # hand-picked from the CLI's own help: a command, a subcommand and options of each
    assert "--engines" in commands["diagnose model"] and "--step-marker" in commands["diagnose trace"]
    assert "--max-regression" in commands["gate"]


def test_every_command_and_option_is_documented():
    text = CLI_MD.read_text(encoding="utf-8")
    missing = []
    for command, opts in _commands():
        section = _section(text, command)
        if section is None:
            missing.append(f"## `bubblescope {command}` (no section)")
            continue
        missing += [f"bubblescope {command} {o}" for o in opts if f"`{o}" not in section]
    assert not missing, "docs/cli.md lacks:\n" + "\n".join(missing)


def _links(path: Path):
    text = path.read_text(encoding="utf-8")
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if not re.match(r"[a-z]+:", target) and not target.startswith("#"):
            yield target.split("#")[0]


@pytest.mark.parametrize("doc", sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md"))
                         + ["README.md", "benchmarks/NOTES.md", "benchmarks/results/README.md"])
def test_links_point_into_the_repository(doc):
    path = ROOT / doc
    if not path.exists():
        pytest.skip(f"{doc} is not in this checkout")
    broken = [t for t in _links(path) if not (path.parent / t).exists()]
    assert not broken, f"{doc}: links to missing files: {broken}"


def test_no_reference_to_a_design_file_outside_the_repository():
    hits = [f"{p.relative_to(ROOT)}:{i}" for tree in ("src", "tests", "docs", "benchmarks")
            for p in (ROOT / tree).rglob("*") if p.suffix in {".py", ".md", ".sh"}
            for i, line in enumerate(p.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
            if "DESIGN.md" in line and p.resolve() != Path(__file__).resolve()]
    assert not hits, "DESIGN.md is not part of the repository; cite docs/design.md: " + ", ".join(hits)
