"""How a request's limit rules fall into cluster slots, and one verdict put back together
from each slot's (`gateway.limits.slots`): the refusal one script would have given, the
plan, and each rate rule's own minute."""

from __future__ import annotations

from gateway.limits.rules import BudgetRule, RateRule
from gateway.limits.slots import SlotGroup, first_downgrade, merged, slot_groups
from gateway.limits.store import Admitted, BudgetRefusal, RateRefusal

KEY_RATE = RateRule("key", "k", 10, None)
TEAM_RATE = RateRule("team", "t", 10, None)
KEY = BudgetRule("key", "k", "day", 100, None, None)
TEAM = BudgetRule("team", "t", "day", 100, 50, "cheap")
ROUTE = BudgetRule("route", "r", "month", 100, None, None)


def test_rules_group_by_scope_and_name_in_first_seen_order() -> None:
    groups = slot_groups([KEY_RATE, TEAM_RATE], [KEY, TEAM, ROUTE])
    assert groups == [
        SlotGroup("key", "k", (0,), (0,)),
        SlotGroup("team", "t", (1,), (1,)),
        SlotGroup("route", "r", (), (2,)),
    ]


def test_each_rate_rule_keeps_the_minute_its_slot_counted_it_in() -> None:
    groups = slot_groups([KEY_RATE, TEAM_RATE], [KEY, TEAM, ROUTE])
    verdicts = [
        Admitted(0, 100, ((9, None),), (False,)),
        Admitted(0, 101, ((8, None),), (True,)),  # its script ran after the minute turned
        Admitted(0, 101, (), (False,)),
    ]
    verdict = merged(groups, verdicts, 2, 3, None)
    assert verdict == Admitted(0, 100, ((9, None), (8, None)), (False, True, False), (100, 101))


def test_the_first_refusal_is_the_one_a_single_script_gives() -> None:
    groups = slot_groups([KEY_RATE, TEAM_RATE], [KEY, TEAM, ROUTE])
    verdicts = [
        BudgetRefusal(0, 90, 20, 0),
        RateRefusal(0, "requests", 5, 6, 100),  # the team's rate: rates are checked first
        Admitted(0, 1, (), (False,)),
    ]
    assert merged(groups, verdicts, 2, 3, None) == RateRefusal(1, "requests", 5, 6, 100)
    verdicts[1] = Admitted(0, 1, ((1, None),), (False,))
    # A refusal under a forced plan names that plan, not the slot's local 0.
    assert merged(groups, verdicts, 2, 3, 1) == BudgetRefusal(0, 90, 20, 1)


def test_a_spent_budget_is_named_before_a_busy_one_whatever_its_slot() -> None:
    """One slot refuses a budget only in-flight holds fill (busy), another a budget that
    is spent: the spent one is the answer, or its clients would retry every 2 s a
    budget that cannot let them through before it resets."""
    groups = slot_groups([], [KEY, TEAM])
    busy = BudgetRefusal(0, 90, 20, 0, spent_nanos=10, limit_nanos=100)
    spent = BudgetRefusal(0, 95, 20, 0, spent_nanos=95, limit_nanos=100)
    assert busy.busy and not spent.busy and len(groups) == 2  # the key's slot, the team's
    chosen = merged(groups, [busy, spent], 0, 2, None)
    assert isinstance(chosen, BudgetRefusal) and not chosen.busy and chosen.rule == 1


def test_the_plan_is_the_first_soft_limit_passed_that_has_a_downgrade() -> None:
    budgets = [KEY, TEAM, ROUTE]
    assert first_downgrade(budgets, [0, 1, 0], [None, 40, None]) == 0  # under its soft 50
    assert first_downgrade(budgets, [0, 1, 0], [None, 50, None]) == 1
    assert first_downgrade(budgets, [0, 0, 0], [99, 99, 99]) == 0  # none has a downgrade
