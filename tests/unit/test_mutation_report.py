"""scripts/mutation_report.py: mutmut's result lines counted per module, scored by hand."""

from __future__ import annotations

from scripts.mutation_report import keep, parse, score, table

RESULTS = """\
    planner.sampling.x_probabilities__mutmut_1: killed
    planner.sampling.x_probabilities__mutmut_2: survived
    planner.sampling.xǁSamplingǁ__post_init____mutmut_10: killed
    planner.sampling.xǁUniformsǁpairs__mutmut_3: suspicious
    planner.deal.x_deal__mutmut_7: timeout
    planner.deal.x_deal__mutmut_8: not checked
    planner.deal.xǁDealǁpinned__mutmut_1: killed
    some other line mutmut prints
"""


def test_counts_per_module_and_the_score_counts_timeouts_and_odd_exits_as_not_killed():
    counts = parse(RESULTS)
    assert set(counts) == {"planner.sampling", "planner.deal"}
    assert dict(counts["planner.sampling"]) == {"killed": 2, "survived": 1, "suspicious": 1}
    assert dict(counts["planner.deal"]) == {"timeout": 1, "not checked": 1, "killed": 1}
    assert score(counts["planner.sampling"]) == 2 / 4
    assert score(counts["planner.deal"]) == 1 / 2  # "not checked" is not judged
    assert "| planner.deal | 1 | 0 | 1 | 0 | 1 | 50.0% |" in table(counts)


def test_only_keeps_the_named_modules_and_their_submodules():
    counts = parse(RESULTS + "    planner.scheduler.host.x_a__mutmut_1: killed\n"
                             "    planner.deals.x_b__mutmut_1: killed\n")
    assert sorted(keep(counts, ["planner.deal", "planner.scheduler"])) == ["planner.deal", "planner.scheduler.host"]
