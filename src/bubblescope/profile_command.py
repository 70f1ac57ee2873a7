"""The program ``bubblescope profile`` runs: ``python SCRIPT args``, ``python -m MODULE args`` or ``SCRIPT.py args``.

:func:`parse_program` checks the command before anything runs and returns how to start it under
:mod:`bubblescope.profile_runner`: the interpreter (the ``python`` named, found on ``PATH`` as the shell finds
it; for a bare ``SCRIPT.py``, the interpreter running bubblescope), the interpreter's own flags (``-u``, ``-X
dev``, ...) and the program with its arguments, unchanged.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from .errors import BubblescopeError

# python, python3, python3.11, pypy3 ...: an interpreter named by the command (a path to one is allowed).
_INTERPRETER = re.compile(r"(python|pypy)(\d+(\.\d+)*)?(\.exe)?")
# Interpreter flags that take no value, and those that take one (-X dev, -W error): passed on as given.
_FLAGS = frozenset("-b -bb -B -d -E -i -I -O -OO -P -q -R -s -S -u -v -vv".split())
_VALUE_FLAGS = frozenset(("-X", "-W"))
_FORMS = "`python SCRIPT.py [args]`, `python -m MODULE [args]` or `SCRIPT.py [args]`"


@dataclass(frozen=True)
class Program:
    """A Python program to run unchanged.

    Attributes:
        interpreter: absolute path of the Python that runs it.
        flags: the interpreter's own flags, as given (``["-u"]``).
        target: ``[SCRIPT, *args]`` or ``["-m", MODULE, *args]``, as given.
    """

    interpreter: str
    flags: tuple[str, ...]
    target: tuple[str, ...]

    @property
    def label(self) -> str:
        """What the program is, for messages: ``script.py`` or ``-m package.module``."""
        return " ".join(self.target[:2]) if self.target[0] == "-m" else self.target[0]


def _shebang_is_python(path: Path) -> bool:
    try:
        with open(path, "rb") as fh:
            first = fh.readline(256)
    except OSError:
        return False
    return first.startswith(b"#!") and b"python" in first


def _interpreter(word: str) -> str:
    """The absolute path of the interpreter ``word`` (a name looked up on PATH, or a path)."""
    found = shutil.which(word) if os.sep not in word else (word if os.access(word, os.X_OK) and
                                                            os.path.isfile(word) else None)
    if found is None:
        where = "not found on PATH" if os.sep not in word else "no such executable file"
        raise BubblescopeError(f"COMMAND {word}: {where}")
    return os.path.abspath(found)


def _script(word: str) -> str:
    path = Path(word)
    if path.is_dir():
        raise BubblescopeError(f"COMMAND {word}: is a directory; name a Python script or use `python -m MODULE`")
    if not path.is_file():
        raise BubblescopeError(f"COMMAND {word}: no such file")
    if not os.access(path, os.R_OK):
        raise BubblescopeError(f"COMMAND {word}: cannot read it (permission denied)")
    return word


def parse_program(words: list[str]) -> Program:
    """The :class:`Program` of a command line ``words`` (what follows ``--``).

    Raises:
        BubblescopeError: no command; a command that is not Python (neither a ``python`` interpreter nor a
            ``.py`` file or a script whose ``#!`` line names python); an interpreter not found on PATH; a
            script that does not exist or cannot be read; ``-m`` without a module; ``-c`` (a program given as
            text: put it in a file); an interpreter flag this command does not know.
    """
    if not words:
        raise BubblescopeError(f"COMMAND: missing; give the program after `--`: {_FORMS}")
    first = words[0]
    if not first.strip():
        raise BubblescopeError(f"COMMAND: empty program name; use {_FORMS}")
    if not _INTERPRETER.fullmatch(os.path.basename(first)):
        path = Path(first)
        if path.is_file() and (first.endswith(".py") or _shebang_is_python(path)):
            return Program(sys.executable, (), (_script(first), *words[1:]))
        if first.endswith(".py"):
            _script(first)  # raises: missing, a directory
        if path.exists() or os.sep in first or shutil.which(first):
            raise BubblescopeError(f"COMMAND {first}: not a Python program; profile runs {_FORMS}")
        raise BubblescopeError(f"COMMAND {first}: not found (and not a Python program); profile runs {_FORMS}")
    interpreter = _interpreter(first)
    flags: list[str] = []
    rest = list(words[1:])
    while rest and rest[0].startswith("-") and rest[0] != "-m":
        flag = rest.pop(0)
        if flag in _FLAGS:
            flags.append(flag)
        elif flag in _VALUE_FLAGS and rest:
            flags += [flag, rest.pop(0)]
        elif flag[:2] in _VALUE_FLAGS and len(flag) > 2:  # -Xdev
            flags.append(flag)
        elif flag.startswith("-c"):
            raise BubblescopeError(f"COMMAND {first} -c: a program given as text cannot be profiled; put it in a "
                                   "file and run `python FILE.py`")
        elif flag == "-":
            raise BubblescopeError(f"COMMAND {first} -: a program read from stdin cannot be profiled; put it in a "
                                   "file and run `python FILE.py`")
        else:
            raise BubblescopeError(f"COMMAND {first} {flag}: an interpreter option profile does not pass on; "
                                   f"use {_FORMS}")
    if not rest:
        raise BubblescopeError(f"COMMAND {first}: no script or -m MODULE given; use {_FORMS}")
    if rest[0] == "-m":
        if len(rest) < 2 or not rest[1].strip() or rest[1].startswith("-"):
            raise BubblescopeError(f"COMMAND {first} -m: no module name given; use `python -m MODULE [args]`")
        return Program(interpreter, tuple(flags), tuple(rest))
    return Program(interpreter, tuple(flags), (_script(rest[0]), *rest[1:]))
