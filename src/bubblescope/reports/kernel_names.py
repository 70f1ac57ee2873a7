"""Kernel names a reader can scan: demangled, templates and argument lists cut, the full name kept for a tooltip.

CUPTI usually records demangled names, hundreds of characters of C++ templates
(``void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctorOnSelf_add<float>, ...>(int, ...)``);
some tools record the mangled symbol (``_ZN2at6native...``). :func:`short_kernel_name` demangles the latter with
the C++ runtime's own demangler (``abi::__cxa_demangle`` of libstdc++, the Itanium C++ ABI's, through ctypes;
the name is kept as it is where no such library loads), then keeps the qualified function name with its template
and argument lists shown as ``<…>`` and ``(…)``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import re

SHORT_WIDTH = 80  # characters of a shortened name at most
# Brackets that are part of a name, not a template or parameter list: operators, and the anonymous namespace.
_OPERATOR = re.compile(r"operator(?:\(\)|\[\]|<<=?|>>=?|<=>|<=?|>=?|->\*?)|\(anonymous namespace\)")


@functools.cache
def _cxa_demangle():
    path = ctypes.util.find_library("stdc++")
    if path is None:
        return None
    try:
        lib = ctypes.CDLL(path)
        fn = lib.__cxa_demangle
        free = ctypes.CDLL(None).free
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_void_p
    fn.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_int)]
    free.argtypes = [ctypes.c_void_p]
    return fn, free


def demangle(name: str) -> str:
    """The demangled form of an Itanium-mangled symbol (``_Z...``); any other name, or one the demangler refuses
    or cannot be loaded for, unchanged."""
    if not name.startswith("_Z"):
        return name
    cxa = _cxa_demangle()
    if cxa is None:
        return name
    fn, free = cxa
    status = ctypes.c_int(0)
    try:
        raw = name.encode("ascii")
    except UnicodeEncodeError:
        return name
    ptr = fn(raw, None, None, ctypes.byref(status))
    if not ptr or status.value != 0:
        return name
    try:
        return ctypes.string_at(ptr).decode("utf-8", "replace")
    finally:
        free(ptr)


def _cut(text: str) -> str:
    """``text`` with the contents of each outermost ``<…>`` and ``(…)`` replaced by "…" (empty pairs kept empty).
    Inside parentheses a ``<`` or ``>`` is a comparison (``b<(x>1)>``), not a bracket; a name whose brackets do not
    balance is returned as it is."""
    out, stack, start = [], [], 0
    for i, ch in enumerate(text):
        if ch in "<(" and not (ch == "<" and stack and stack[-1] == "("):
            if not stack:
                out.append(text[start:i + 1])
                start = i + 1
            stack.append(ch)
        elif stack and ((ch == ">" and stack[-1] == "<") or (ch == ")" and stack[-1] == "(")):
            stack.pop()
            if not stack:
                out.append("…" if i > start else "")
                start = i
        elif ch in ">)" and stack:
            if ch == ")":  # a ")" closing nothing open inside a template: unbalanced
                return text
    if stack:
        return text
    out.append(text[start:])
    return "".join(out)


def short_kernel_name(name: str, width: int = SHORT_WIDTH) -> str:
    """A kernel name shortened for a table: demangled (:func:`demangle`), the return type ``void`` dropped,
    template arguments and the parameter list cut to ``<…>`` and ``(…)`` (``operator<`` and the like are left
    as they are), whitespace collapsed, then at most ``width`` characters (a cut tail ends in "…")."""
    text = " ".join(demangle(str(name)).split())
    if text.startswith("void "):
        text = text[len("void "):]
    head = text.split("(", 1)[0]
    if "::" in head or "<" in head:  # C++: not "Memcpy DtoD (Device -> Device)", whose parentheses are words
        ops = _OPERATOR.findall(text)  # "operator()", "operator<<", "(anonymous namespace)": kept as they are
        text = _OPERATOR.sub("\0", text)
        text = _cut(text)
        for op in ops:
            text = text.replace("\0", op, 1)
    return text if len(text) <= width else text[: width - 1] + "…"
