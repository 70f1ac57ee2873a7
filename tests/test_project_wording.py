"""The tree speaks of what the software is, not of how it was made.

Source, tests, docs, the README and the benchmarks describe the project itself; the history of the work (who tried
what, in which sitting, under which ticket) lives in ``git log``. The check is the pattern below, run over every
text file of those folders; a word that has another meaning in its context is let through only by an entry of
:data:`ALLOWED`, each with its reason, so the list stays small and says why.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# The search the project's wording is held to: sittings (the word "session" and a number), numbered rounds and
# sweeps ("round" or the letter r followed by a number), the people of the work ("helper", "tester") and tickets
# ("issue" and a number). The examples in the test below are assembled from parts so that this file does not match.
WORK_LOG = re.compile(r"session|round ?[0-9]|\br[0-9]{1,2}\b|helper|tester|issue ?#?[0-9]", re.IGNORECASE)

# Words with another meaning in context: (pattern removed from a line before the search, why it is not work log).
ALLOWED = (
    (r"NoArgsIsHelpError", "the name of click's exception class"),
    (r"start_new_session", "subprocess.Popen's argument"),
)
_ALLOWED = re.compile("|".join(f"(?:{p})" for p, _ in ALLOWED))

# Where the project describes itself. benchmarks/results holds raw records (JSON, logs, CSV), read as data; its
# index README.md is prose and is searched.
TREES = ("src", "tests", "docs", "benchmarks")
FILES = ("README.md", "pyproject.toml", "Makefile")
TEXT_SUFFIXES = {".py", ".md", ".sh", ".toml", ".j2", ".txt", ".cfg", ".ini", ".yml", ".yaml"}
SKIP_DIRS = {"__pycache__", "data", ".pytest_cache"}
RECORDS = ROOT / "benchmarks" / "results"


def _text_files() -> list[Path]:
    files = [ROOT / f for f in FILES if (ROOT / f).is_file()]
    for tree in TREES:
        for p in sorted((ROOT / tree).rglob("*")):
            if p.is_file() and p.suffix in TEXT_SUFFIXES and not SKIP_DIRS & set(p.relative_to(ROOT).parts):
                if RECORDS in p.parents and p != RECORDS / "README.md":
                    continue  # a raw record: data, not prose
                files.append(p)
    # this file states the pattern it searches for
    return [p for p in files if p.resolve() != Path(__file__).resolve()]


def work_log_lines(text: str) -> list[tuple[int, str]]:
    """(1-based line number, line) of each line of ``text`` that the work-log pattern finds once the allowed
    words are removed."""
    return [(i, line.strip()) for i, line in enumerate(text.splitlines(), 1)
            if WORK_LOG.search(_ALLOWED.sub("", line))]


def test_the_pattern_finds_work_log_and_lets_the_allowed_words_through():
    r, n = "r", "41"
    text = "\n".join([
        "measured in sess" + "ion 13",              # 1: found
        f"sweep {r}{n} on the 1B",                  # 2: found
        "rou" + "nd 6 of the sweep",                # 3: found
        "fixed for iss" + "ue #12",                 # 4: found
        "a bad-input test" + "er's finding",        # 5: found
        "sweep_rou" + "nd6_128.json",               # 6: found (a record named by its round)
        "tma.async_copy(desc, [row0, c])",          # 7: a variable, let through
        f"gluon_check_{r}{n}_llama.json",           # 8: a result file's name, no word boundary before the r
        "rounded to 3 digits",                      # 9: no number after the word
        "subprocess.Popen(cmd, start_new_sess" + "ion=True)",  # 10: an argument's name, allowed
    ])
    assert [i for i, _ in work_log_lines(text)] == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize("tree", TREES + FILES)
def test_no_work_log_in_the_tree(tree):
    base = ROOT / tree
    if not base.exists():
        pytest.skip(f"{tree} is not in this checkout")
    hits = [f"{p.relative_to(ROOT)}:{i}: {line[:120]}"
            for p in _text_files() if p == base or base in p.parents
            for i, line in work_log_lines(p.read_text(encoding="utf-8", errors="replace"))]
    assert not hits, "work-log wording (history belongs in git log):\n" + "\n".join(hits)
