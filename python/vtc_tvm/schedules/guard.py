"""A schedule rule that raises on a kernel, or schedules it in a way TVM cannot compile, is "not
mine" there: the next rule schedules it.

DLight's rules answer None for a kernel they do not take, but some raise on kernels just outside
what they were written for, and in TVM's pipeline the exception ends the build. TVM 0.27:
``GEMV`` asserts (``assert r_loops``) on a 1x1 depthwise convolution with a stride (a one-term
reduction; ``tests/schedule_fuzz.py`` case 1313, which stock TVM cannot build);
``MatmulTensorization`` raises on an fp16 convolution with a symbolic batch (now
:class:`.FittedTensorCoreGEMM`'s first). Others schedule a kernel TVM then cannot compile:
``Matmul`` on a matmul over a slice clamped on a symbolic axis leaves a shared buffer of symbolic
size; a rule that leaves one of a block's outputs in global memory inside the kernel ends the
build too (:mod:`vtc_tvm.scratch` checks both, lowering only the schedules concerned).
``Guarded(rule)`` answers None instead, so the rule list goes on to the next rule (at worst
``Fallback``, which schedules any kernel); the error is logged at debug level with the rule's
name and handed to ``on_error(rule, func, err)`` where one is given: :func:`report_defect` for
our rules in a user's build (an error of ours costs the kernel our schedule, not the build, but
it is a defect), a recorder in the CPU checks of our schedules (``tests/schedule_semantics.py``
counts it as a problem). Each rule builds its own schedule from the kernel, so one that raised
leaves nothing behind. :func:`vtc_tvm.schedules.default_rules` guards every rule, ours too: they
catch what they raise themselves, the scratch check is what the guard adds for them.
"""

from __future__ import annotations

import logging
from typing import Callable

from tvm.s_tir.dlight import ScheduleRule

from ..errors import last_line
from ..scratch import checked_schedule

logger = logging.getLogger("vtc_tvm")


class Guarded(ScheduleRule):
    """``rule``, with an exception it raises on a kernel taken as None ("not mine")."""

    def __init__(self, rule: ScheduleRule, on_error: Callable | None = None):
        self.rule, self.on_error = rule, on_error

    def apply(self, func, target, tunable):
        try:
            return checked_schedule(self.rule, func, target, tunable)
        except Exception as err:  # noqa: BLE001 - whatever DLight raises, the next rule decides
            logger.debug("%s raised on a kernel, the next rule schedules it: %s: %s", type(self.rule).__name__,
                         type(err).__name__, last_line(err))
            if self.on_error is not None:
                self.on_error(self.rule, func, err)
            return None

    def is_target_available(self, target) -> bool:
        return self.rule.is_target_available(target)


_REPORTED: set = set()


def report_defect(rule: ScheduleRule, func, err: Exception) -> None:
    """``on_error`` of our rules in :func:`vtc_tvm.schedules.default_rules`: a warning, once a
    process for each rule and error. DLight's rules raise by design on kernels just outside their
    reach (debug log only); one of ours raising is a defect of vtc_tvm, which the user should see
    even though the build goes on (the kernel loses our schedule, not its correctness)."""
    key = (type(rule).__name__, type(err).__name__, last_line(err))
    if key not in _REPORTED:
        _REPORTED.add(key)
        logger.warning("vtc_tvm's %s schedule rule failed on a kernel (%s: %s); the next rule scheduled it. "
                       "Please report this with the model.", *key)


def unguarded(rule: ScheduleRule) -> ScheduleRule:
    """The rule a :class:`Guarded` guards (``rule`` itself otherwise)."""
    return rule.rule if isinstance(rule, Guarded) else rule


__all__ = ["Guarded", "report_defect", "unguarded"]
