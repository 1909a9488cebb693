"""Which schedule rule schedules which kernel of a build: a DLight rule wrapped to report it.

``Recording(rule, taken)`` is ``rule`` as it is (same answers, same target check) that also
calls ``taken(rule, func, sch)`` for every kernel it schedules, with the kernel as the rule
saw it and the schedule it made. Give the wrapped rules to a pipeline's ``schedules=`` (e.g.
``[Recording(r, taken) for r in default_rules(target)]``): the CPU checks of our schedules
(``tests/schedule_semantics.py``) and the rule census (``benchmarks/rule_census.py``) do.
"""

from __future__ import annotations

from typing import Callable

from tvm.s_tir.dlight import ScheduleRule


class Recording(ScheduleRule):
    """``rule``, reporting each kernel it schedules to ``taken(rule, func, sch)``."""

    def __init__(self, rule: ScheduleRule, taken: Callable):
        self.rule, self.taken = rule, taken

    def apply(self, func, target, tunable):
        sch = self.rule.apply(func, target, tunable)
        if sch is not None:
            self.taken(self.rule, func, sch)
        return sch

    def is_target_available(self, target) -> bool:
        return self.rule.is_target_available(target)


__all__ = ["Recording"]
