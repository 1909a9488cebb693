"""Validation of ``VirtualTensorize``'s options: a typo fails loudly instead of silently
disabling part of the pass.

Limits: 1. op names are checked against the rules registered *when the pass is created*
(register your own rules first). 2. ``inplace`` names are checked when the pass runs, against
the parameters of the module's Relax functions (any function, not only ``main``).
"""

from __future__ import annotations

import difflib
from typing import Iterable, Optional, Sequence

from tvm import relax


def _suggest(name: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def check_ops(ops: Optional[Sequence[str]]) -> Optional[set]:
    """``ops`` as a set of registered Relax op names (None: all), or ValueError naming the
    first unknown one. ``"permute_dims"`` is accepted for ``"relax.permute_dims"``."""
    from .rules import registered_ops

    if ops is None:
        return None
    if isinstance(ops, str):
        raise TypeError(f"ops must be a list of Relax op names, not the string {ops!r}")
    known = set(registered_ops())
    allowed = set()
    for op in ops:
        full = op if op in known or op.startswith("relax.") else f"relax.{op}"
        if full not in known:
            raise ValueError(f"ops: {op!r} has no VirtualTensorize rule{_suggest(full, known)}; "
                             f"known: {', '.join(sorted(known))}")
        allowed.add(full)
    return allowed


def check_report(report) -> None:
    """``report`` must be None or support ``.append`` (a list)."""
    if report is not None and not callable(getattr(report, "append", None)):
        raise TypeError(f"report must be a list (anything with .append), not {type(report).__name__}")


def check_inplace_names(inplace: Sequence[str]) -> tuple:
    """``inplace`` as a tuple of names; a bare string (whose letters would be taken as names)
    is a TypeError."""
    if isinstance(inplace, str):
        raise TypeError(f"inplace must be a list of parameter names, not the string {inplace!r}")
    return tuple(inplace)


def check_inplace(inplace: Sequence[str], mod) -> None:
    """ValueError unless every ``inplace`` name is a parameter of a Relax function of ``mod``."""
    if not inplace:
        return
    params = {p.name for _, f in mod.functions_items() if isinstance(f, relax.Function) for p in f.params}
    for name in inplace:
        if name not in params:
            raise ValueError(f"inplace: {name!r} is not a parameter of the module's functions"
                             f"{_suggest(name, params)}; parameters: {', '.join(sorted(params))}")
