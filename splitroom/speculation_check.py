"""Whether speculation is predicted to pay (composition root): the same room predicted
plain, beside the speculative prediction, and the warning when speculation is the
slower of the two.

Speculative decoding pays only when the tokens a lap commits grow faster than the lap's
time (Leviathan, Kalman and Matias 2023, "Fast Inference from Transformers via
Speculative Decoding", ICML, section 3.3, theorem 3.8: the expected walltime
improvement ``(1 - alpha**(k+1)) / ((1 - alpha) (k c + 1))`` falls below 1 when the
drafting and verifying cost ``c`` is large beside the acceptance ``alpha``). A room
with a long round trip and little copying (chat at 80 ms) is such a case, so
``simulate`` and ``run --real --calibration`` compare the two predictions and say so
on stderr rather than leaving a user to find out after deploying.
"""

from __future__ import annotations

from dataclasses import replace

from planner.room import Scenario

__all__ = ["plain_metrics", "plain_scenario", "speculation_summary", "warning_line"]


def plain_scenario(scn: Scenario) -> Scenario:
    """``scn`` with speculation off (every other setting, laps in flight included, kept)."""
    return replace(scn, decoding=replace(scn.decoding, speculative=None))


def plain_metrics(scn: Scenario, deal) -> dict:
    """The metrics of ``scn`` predicted plain (:func:`plain_scenario`) with ``deal``,
    without a trace (what ``simulate`` runs in a forked child beside the speculative
    prediction: splitroom/forked.py). Raises what the simulation raises."""
    from splitroom.report import run_simulation
    return run_simulation(plain_scenario(scn), deal, show_progress=False, keep_trace=False).metrics


def speculation_summary(scn: Scenario, tokens_per_s: float, plain_tokens_per_s: float) -> dict:
    """The ``speculation`` object of the JSON: the drafter, its draft length (``"auto"``
    with ``max_draft_tokens`` for the adaptive rule), both predicted tokens per second,
    the change in percent of plain (negative: speculation is slower) and ``slower``
    (true when the speculative prediction is below the plain one). Raises ValueError
    when ``scn`` is not speculative."""
    spec = scn.decoding.speculative
    if spec is None:
        raise ValueError("the scenario does not speculate")
    change = 100.0 * (tokens_per_s - plain_tokens_per_s) / plain_tokens_per_s if plain_tokens_per_s > 0 else None
    return {"drafter": spec.drafter, "draft_tokens": "auto" if spec.adaptive else spec.draft_tokens,
            **({"max_draft_tokens": spec.draft_tokens} if spec.adaptive else {}),
            "tokens_per_s": tokens_per_s, "plain_tokens_per_s": plain_tokens_per_s, "change_pct": change,
            "slower": tokens_per_s < plain_tokens_per_s}


def warning_line(summary: dict | None) -> str | None:
    """One line for stderr when ``summary`` (:func:`speculation_summary`) says the
    speculative room is predicted slower than plain; None otherwise."""
    if not summary or not summary.get("slower"):
        return None
    k = summary["draft_tokens"]
    what = f"{summary['drafter']} drafter, " + (f"draft_tokens: auto up to {summary['max_draft_tokens']}"
                                                 if k == "auto" else f"draft_tokens: {k}")
    advice = ("turn speculation off" if k == "auto"
              else "turn speculation off, or set draft_tokens: auto (it drafts nothing where drafting does not pay)")
    return (f"warning: speculation ({what}) is predicted slower than plain decoding in this room: "
            f"{summary['tokens_per_s']:.2f} against {summary['plain_tokens_per_s']:.2f} tok/s "
            f"({summary['change_pct']:+.1f}%); {advice}")
