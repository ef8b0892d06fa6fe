"""``trajlake bench judgement``'s own parts: the minimum profile size's justification, the documented agent it
runs, and the report that puts the honest-flag rate per origin beside the recall per cheat kind."""

from benchmarks.judgement import HONEST_TARGET, JudgementReport, documented_agent, false_flag_chance
from quality.config import MIN_GROUP, QualityConfig


def test_the_minimum_profile_keeps_honest_false_flags_under_the_target_and_fewer_would_not() -> None:
    chances = {n: false_flag_chance(n, trials=3000) for n in (10, 20, MIN_GROUP)}
    assert chances[10] > chances[20] > chances[MIN_GROUP]  # the estimate's noise is what flags
    assert chances[MIN_GROUP] < HONEST_TARGET < chances[20]
    assert QualityConfig().min_profile_sessions == MIN_GROUP


def test_the_documented_agent_is_the_users_example() -> None:
    agent = documented_agent()
    assert agent.startswith("# my_agent.py") and "def agent(session" in agent
    compile(agent, "my_agent.py", "exec")


def test_the_report_prints_honest_flags_per_origin_beside_recall() -> None:
    report = JudgementReport(
        seed=1,
        recall={"edit_tests": (1, 1), "network": (0, 1)},
        honest_by_origin={"sandbox": (1, 10), "synthetic": (9, 100), "import:swe-agent": (0, 4)},
        honest_by_population={"built-in": (1, 6), "own agent": (0, 4)},
        stability={50: 0.031},
    )
    text = report.summary()
    first = next(line for line in text.splitlines() if "edit_tests" in line)
    assert "1/1" in first and "import:swe-agent" in first  # side by side
    assert "BELOW 1.0" in text and "sandbox" in text and "ABOVE" in text  # 1/10 > 5 %
    assert "(load, not a target)" in text and "n=50: 0.031" in text
    figures = report.as_dict()
    assert figures["honest_by_origin"]["sandbox"] == {"flagged": 1, "sessions": 10, "rate": 0.1}
    assert figures["recall"]["network"]["rate"] == 0.0
