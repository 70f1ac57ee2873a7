"""What ``bubblescope profile`` says of a run, in one-line notes: the window, the profiler's cost, the steps found.

Pure functions of the ``profile`` section (:func:`bubblescope.profile_program.profile_section`) and the runner's
state; the CLI prints them on stderr and the HTML report lists them.
"""

from __future__ import annotations

from ..wording import count

# Steps after the window that differ from the baseline before it by more than this share are stated, with the
# profiler's cost against either side: the program's own step time may change over the run (a growing cache,
# recompilation), or the profiler's cost may outlast the window (Kineto keeps CUPTI attached after a CUDA profile
# unless TEARDOWN_CUPTI=1, pytorch/pytorch#144455, which the runner sets where it is safe; some cost remains), and
# the trace alone cannot tell which.
BASELINE_SPREAD = 0.10
COUNTED = "nn.Module calls, torch.compile'd function calls or CUDA-graph replays made outside any other"


def outcome_lines(section: dict, label: str) -> list[str]:
    """One-line notes on how the run went (for stderr and the report's notes): the window against what was
    asked, the profiler's cost, the step counts of the hooks and of the trace. Pure."""
    lines = []
    asked = (count(section["steps_requested"], "step") if section["steps_requested"] is not None
             else f"{section['seconds_requested']:g} s")
    window = count(section["tokens_generated"], "step")
    if section["status"] == "cut":
        lines.append(f"{label}: ended inside the window ({window} of {asked} recorded, from step "
                     f"{section['first_step']}); the report covers them")
    else:
        lines.append(f"window: {window} from step {section['first_step']} (after --skip {section['skip']} and "
                     f"the profiler's warm-up step), of {section['steps_counted']} counted in the run")
    if section["profiler_overhead_pct"] is not None:
        where = {"before": " before the window", "after": " after the window"}.get(section.get("reference_from"), "")
        lines.append(f"profiler cost: {section['profiler_overhead_pct']:+.1f} % per step (median "
                     f"{section['step_ms_p50_profiled']:.3f} ms profiled vs {section['step_ms_p50_unprofiled']:.3f} "
                     f"ms over {count(section['reference_steps'], 'step')}{where} without it)")
    else:
        lines.append(f"profiler cost: unknown ({section['overhead_reason']})")
    spread = baseline_spread(section)
    if spread is not None:
        after = (section["step_ms_p50_profiled"] / section["step_ms_p50_after"] - 1.0) * 100.0
        lines.append(f"the steps without the profiler changed over the run: {section['step_ms_p50_unprofiled']:.3f} ms "
                     f"(median) before the window, {section['step_ms_p50_after']:.3f} ms after it ({spread:+.1%}): the "
                     "program's own step time moves (a growing cache, recompilation) or the profiler's cost outlasts "
                     f"the window (a CUDA profiler stays attached once stopped); against the steps after it the "
                     f"profiler costs {after:+.1f} %")
    if section.get("effective_GBps_unprofiled") is not None:
        util = section.get("util_peak_unprofiled")
        lines.append(f"without the profiler: {section['effective_GBps_unprofiled']:,.1f} GB/s"
                     + (f", {util:.1%} of peak" if util is not None else "")
                     + " (the trace's bytes per step over the unprofiled median step time)")
    found = section["steps_found"]
    if found is None:
        lines.append(f"steps found in the trace: none ({section['step_source'] or 'no analysis'}); the hooks "
                     f"counted {window}")
    else:
        lines.append(f"steps found in the trace: {found}; the hooks counted {window}")
    if section.get("error"):
        lines.append(f"profiler: {section['error']}")
    return lines


def baseline_spread(section: dict, threshold: float = BASELINE_SPREAD) -> float | None:
    """How far the median unprofiled step after the window lies from the baseline before it (a fraction: +0.25
    is 25 % slower after), when both exist and it is more than ``threshold`` either way; else None. Pure."""
    after, before = section.get("step_ms_p50_after"), section.get("step_ms_p50_unprofiled")
    if section.get("reference_from") != "before" or not after or not before or not section.get("step_ms_p50_profiled"):
        return None
    spread = after / before - 1.0
    return spread if abs(spread) > threshold else None


def not_reached_message(section: dict, state: dict, label: str) -> str:
    """The one-line error of a run whose window never started (or whose runner never reported). Pure."""
    if state.get("status") == "setup-failed":
        return f"COMMAND {label}: {state.get('message')}"
    if state.get("status") == "no-state":
        return f"COMMAND {label}: ended (exit status {section['exit_code']}) before profile could record anything"
    n = section["steps_counted"]
    if state.get("status") in ("window", "reference") and not state.get("trace"):
        return (f"COMMAND {label}: ended inside the window without exiting normally (os._exit or a signal, exit "
                f"status {section['exit_code']}): the profiler's trace was never written")
    if section.get("error"):
        return f"COMMAND {label}: the profiler failed ({section['error']}); nothing recorded"
    if n == 0:
        return (f"COMMAND {label}: made no step profile can count ({COUNTED}); nothing recorded, no output "
                "written")
    return (f"COMMAND {label}: ended after {count(n, 'step')}, before the window (it starts after --skip "
            f"{section['skip']}); nothing recorded: lower --skip")
