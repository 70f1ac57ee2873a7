"""Trace analysis: a Kineto / Chrome trace (``.json`` or ``.json.gz``) read once into columns, then pure
functions of them. The modules follow the data through five stages, and imports go one way: a module imports
only modules of its own stage or of the stages before it, except that the read stage, which hands every event
to the events stage, imports that one (``tests/test_import_graph.py`` holds the order):

- **read**: :mod:`.file` (the file read and inflated in a thread), :mod:`.window` (the text window and where
  its whole events end), :mod:`.walk` (the JSON top level walked, ``traceEvents`` handed on),
  :mod:`.workers` (windows decoded in worker processes for a large file);
- **events**: :mod:`.schema` (the tables and their columns), :mod:`.values` (numbers as traces write them),
  :mod:`.events` (each event typed into its table's column chunks), :mod:`.batch` (a window's events decoded
  by msgspec in one call), :mod:`.pairs` (``B``/``E`` pairs made complete events), :mod:`.opevents` (the CPU
  operator events, kept apart from the tables);
- **columns**: :mod:`.columns` (whole numpy columns per table), :mod:`.repeats` (events written twice,
  counted once), :mod:`.categories` (kernel categories), :mod:`.apis` (launch and sync calls by name),
  :mod:`.arrays` (:class:`~.arrays.TraceArrays`, the numpy form), :mod:`.frames` (:class:`~.frames.Trace`,
  the pandas form), :mod:`.load` (:func:`~.load.read_trace_arrays`, :func:`~.load.load_trace`), with
  :mod:`.intervals` (the numpy cores of the interval metrics) and :mod:`.heap` (glibc heap settings);
- **steps**: :mod:`.arraysummary` (device and step figures on the columns), :mod:`.metrics` and :mod:`.steps`
  (the same as pandas frames), :mod:`.graphs` (CUDA-graph replays), :mod:`.periodic`, :mod:`.cpuops` and
  :mod:`.stepfind` (steps found in a trace that marks none);
- **summaries**: :mod:`.timeline` (one engine's decode timeline), :mod:`.checks` (warnings on overlapping
  streams and clock skew), :mod:`.summary` (``diagnose trace``'s per-file summary), :mod:`.ranks` and
  :mod:`.ranksummary` (one trace per rank of a distributed job).

Units: every ``ts``/``dur`` is in microseconds, as the Trace Event Format writes them. The package hands on
its two entry points, :func:`load_trace` and :class:`Trace`.
"""

from .frames import Trace
from .load import load_trace

__all__ = ["Trace", "load_trace"]
