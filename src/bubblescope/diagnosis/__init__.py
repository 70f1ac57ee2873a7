"""The main job: measure a model on every engine, side by side, into one results document.

``diagnose(...)`` = for each engine: build; warm up; R timed generations (host wall time per token with
the token on the host); one profiled run (torch.profiler/CUPTI trace -> timeline metrics); effective
bandwidth vs the NVML peak and the measured copy bandwidth; teacher-forced correctness against the
reference engine; an optional context sweep. Then findings, ``results.json`` and ``report.html`` in ``out``.
Nothing here renders; ``reports`` does.

Stages, each a module: :mod:`.plan` decides the run once (every default and every check that needs no model:
a frozen :class:`~.plan.RunPlan`); :mod:`.document` starts the results document (device, model, workload);
:mod:`.measure` and :mod:`.profiled` measure one engine; :mod:`.run` loads the model, runs the engines in turn
and publishes the outputs.
"""

from .document import command_line, model_notes
from .measure import latency_stats, logit_agreement
from .plan import Bench, RunPlan, Workload, check_positions, check_workload, default_model, nothing_ran, plan_run
from .run import diagnose

__all__ = ["Bench", "RunPlan", "Workload", "check_positions", "check_workload", "command_line", "default_model",
           "diagnose", "latency_stats", "logit_agreement", "model_notes", "nothing_ran", "plan_run"]
