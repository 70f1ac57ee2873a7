"""Tuned parameters per context range: read by ``generate`` / ``diagnose`` from the file ``tune --save`` writes
(:func:`~.reports.tune_result.tuned_document`).

A tuned file (``bubblescope.tuned/1``) holds, for one engine and one knob, the best value found at each
measured context, each valid over a range of lengths: a range ends at the geometric mean of its context
and the next measured one (contexts are usually powers of two apart: 128 then 4096 splits at 724), the
last range is open. :func:`pick` returns the entry for a given length ("prepare different tile
configurations for different length ranges").
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from .errors import BubblescopeError
from .reports.tune_result import SCHEMA


@dataclass(frozen=True)
class Tuning:
    """A loaded tuned file: ``engine``, ``knob``, ``ranges`` (as in :func:`~.reports.tune_result.tuned_document`)
    and ``model`` (``{"name", "config_sha256", ...}``; empty for files written before the hash was recorded)."""

    path: str
    engine: str
    knob: str
    ranges: tuple
    model: dict = field(default_factory=dict)

    def check_model(self, config) -> str | None:
        """Refuse a file tuned for another model: tile sizes tuned for one model's shapes say nothing about
        another's. ``config`` is the :class:`~bubblescope.models.ModelConfig` about to run.

        Returns:
            None when the file's ``model.config_sha256`` matches ``config.config_sha256()``; a warning (one
            line) when the file records no hash (written by an older bubblescope), so it cannot be checked.

        Raises:
            BubblescopeError: the hashes differ (the message names both models).
        """
        tuned_hash, tuned_name = self.model.get("config_sha256"), self.model.get("name")
        if tuned_hash is None:
            named = f"; it names {tuned_name}" if tuned_name else ""
            return (f"--tuning {self.path}: the file does not record which model it was tuned for (written "
                    f"before bubblescope stored the config hash{named}): applied to {config.name} unchecked")
        if tuned_hash != config.config_sha256():
            raise BubblescopeError(
                f"--tuning {self.path}: tuned for {tuned_name or 'another model'} (config {tuned_hash[:12]}), not "
                f"for {config.name} "
                f"(config {config.config_sha256()[:12]}); run `bubblescope tune` on this model with --save")
        return None

    def pick(self, length: int) -> dict:
        """The range entry for a sequence of ``length`` positions: the first whose ``max_context`` is None
        or >= ``length``."""
        for r in self.ranges:
            if r["max_context"] is None or length <= r["max_context"]:
                return r
        return self.ranges[-1]

    def params(self, engine: str, length: int, device_type: str):
        """``MegakernelParams`` for ``engine`` at ``length`` (the device's defaults plus the picked entry),
        or None when this file tunes another engine.

        Raises:
            BubblescopeError: the picked values do not validate.
        """
        if engine != self.engine and not (engine == "auto" and self.engine == "megakernel"):
            return None
        from .megakernel_engine import CPU_PARAMS, MegakernelParams
        base = MegakernelParams() if device_type == "cuda" else CPU_PARAMS
        p = base.replace(**self.pick(length)["params"])
        try:
            p.validate()
        except BubblescopeError as e:
            raise BubblescopeError(f"--tuning {self.path}: {e}") from None
        return p


def load_tuning(path: str | Path) -> Tuning:
    """Read and check a tuned file.

    Raises:
        BubblescopeError: missing or unreadable file, not JSON, not a ``bubblescope.tuned/1`` document, an
            unknown engine or knob, ranges that :func:`_check_ranges` refuses.
    """
    from .tuning import knobs
    p = Path(path)
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BubblescopeError(f"--tuning {p}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BubblescopeError(f"--tuning {p}: not a readable JSON file ({type(e).__name__})") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        got = f"schema {doc.get('schema')!r}" if isinstance(doc, dict) else f"a JSON {_json_kind(doc)}, not an object"
        raise BubblescopeError(f"--tuning {p}: not a bubblescope tuned file ({got}; expected schema {SCHEMA!r}: "
                               "write one with `bubblescope tune ... --save`)")
    engine, knob, ranges = doc.get("engine"), doc.get("knob"), doc.get("ranges")
    for field_name, value in (("engine", engine), ("knob", knob)):
        if not isinstance(value, str):
            raise BubblescopeError(f"--tuning {p}: {field_name} must be a string, got {json.dumps(value)[:80]}")
    try:
        types = {k["name"]: k["type"] for k in knobs(engine)}
        names = set(types)
    except BubblescopeError:
        raise BubblescopeError(f"--tuning {p}: engine {engine!r} has no tuning knobs") from None
    if knob not in names:
        raise BubblescopeError(f"--tuning {p}: unknown knob {knob!r} for {engine}")
    _check_ranges(p, engine, ranges, types)
    model = doc.get("model", {})
    if not isinstance(model, dict) or not isinstance(model.get("config_sha256", ""), str) \
            or not isinstance(model.get("name", ""), str):
        raise BubblescopeError(f"--tuning {p}: model must be an object with a string name and config_sha256, got "
                               f"{json.dumps(model)[:80]}")
    return Tuning(str(p), engine, knob, tuple(ranges), model)


def _check_ranges(p: Path, engine: str, ranges, types: dict[str, str]) -> None:
    """Refuse, naming the field (``ranges[1].max_context``, ``ranges[0].params.block_k``), ranges that are not a
    non-empty list of ``{max_context, params}`` objects whose ``max_context`` are positive integers in increasing
    order, the last one null (open-ended), and whose params are knobs of ``engine`` with values of their type
    that ``MegakernelParams.validate`` accepts (on the defaults of a GPU and of the CPU alike).

    Raises:
        BubblescopeError: one line ``--tuning PATH: FIELD: what is wrong``.
    """
    from .megakernel_engine import CPU_PARAMS, MegakernelParams

    if not isinstance(ranges, list) or not ranges:
        raise BubblescopeError(f"--tuning {p}: ranges: must be a non-empty list of {{max_context, params}}, got "
                               f"{json.dumps(ranges)[:80]}")
    last = None
    for i, r in enumerate(ranges):
        where = f"--tuning {p}: ranges[{i}]"
        if not isinstance(r, dict) or not isinstance(r.get("params"), dict):
            raise BubblescopeError(f"{where}: must be an object {{max_context, params}} whose params is an object, "
                                   f"got {json.dumps(r)[:80]}")
        bound = r.get("max_context")
        if i == len(ranges) - 1:
            if bound is not None:
                raise BubblescopeError(f"{where}.max_context: the last range must be open-ended (null), got "
                                       f"{json.dumps(bound)}")
        elif not isinstance(bound, int) or isinstance(bound, bool) or bound < 1:
            raise BubblescopeError(f"{where}.max_context: must be a positive integer (only the last range is "
                                   f"open-ended, null), got {json.dumps(bound)}")
        elif last is not None and bound <= last:
            raise BubblescopeError(f"{where}.max_context: ranges must be in increasing order, got {bound} after "
                                   f"{last}")
        last = bound
        for name, value in r["params"].items():
            if name not in types:
                raise BubblescopeError(f"{where}.params: unknown knob {name!r} for {engine} (see `bubblescope tune "
                                       "--list`)")
            if not _json_type_ok(types[name], value):
                raise BubblescopeError(f"{where}.params.{name}: must be {types[name]}, got {json.dumps(value)}")
        for base in (MegakernelParams(), CPU_PARAMS):
            try:
                base.replace(**r["params"]).validate()
            except BubblescopeError as e:
                raise BubblescopeError(f"{where}.params: {e}") from None


def _json_kind(value) -> str:
    """The JSON name of a parsed value's type: null, boolean, number, string, array, object."""
    for kind, types in (("null", type(None)), ("boolean", bool), ("number", (int, float)), ("string", str),
                        ("array", list)):
        if isinstance(value, types):
            return kind
    return "object"


def _json_type_ok(annotation: str, value) -> bool:
    """Whether a JSON value has the knob's annotated type (``"int | None"``, ``"bool"``, ``"str"``).

    JSON true is no integer here, and "no" no bool: MegakernelParams.validate() would take true as
    block_k 1 (a power of two) and any non-empty string as fast_launch on."""
    if value is None:
        return "None" in annotation
    if annotation.startswith("bool"):
        return isinstance(value, bool)
    if annotation.startswith("int"):
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation.startswith("str"):
        return isinstance(value, str)
    return True


def describe_pick(record: dict, engine: str) -> str:
    """One line saying what ``--tuning`` did for ``engine`` (a record of :func:`engine_params`), e.g.
    ``--tuning tuned.json: megakernel takes kv_splits=1 (entry up to length 16; this run's length 5)``."""
    if record.get("params") is None:
        return f"--tuning {record['path']}: not applied to {engine} ({record.get('reason')})"
    values = ", ".join(f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in record["params"].items())
    entry = (f"entry up to length {record['max_context']}" if record.get("max_context") is not None
             else "last, open-ended entry")
    return f"--tuning {record['path']}: {engine} takes {values} ({entry}; this run's length {record['length']})"


def engine_params(tuning: Tuning | None, engine: str, length: int, device_type: str):
    """What ``--tuning`` gives ``engine`` for a sequence of ``length`` positions: ``(params or None, record)``;
    ``record`` is None without a tuning file, else ``{"path", "knob", "params", "max_context", "length"}``
    (``params`` None and a ``reason`` when the file tunes another engine)."""
    if tuning is None:
        return None, None
    p = tuning.params(engine, length, device_type)
    if p is None:
        return None, {"path": tuning.path, "knob": tuning.knob, "params": None, "length": length,
                      "reason": f"the file tunes {tuning.engine}, not {engine}"}
    r = tuning.pick(length)
    return p, {"path": tuning.path, "knob": tuning.knob, "params": r["params"], "max_context": r["max_context"],
               "length": length}
