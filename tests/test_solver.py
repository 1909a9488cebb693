"""The native plan solver (src/solver, vtc_tvm.solver) against a brute-force oracle.

The oracle enumerates every subset of the edges and checks the five rules of the
vtc_tvm.solver docstring itself, in Python: it is the specification, not a second solver.
"""

import itertools
import math
import random
import time

import pytest
import tvm_ffi

from vtc_tvm import solver
from vtc_tvm.solver import Problem, is_feasible, solve

GAIN_TOLERANCE = 1e-9  # rule 5's slack, as documented in vtc_tvm.solver


# ---------------------------------------------------------------- the oracle
def plan_gain(problem, chosen):
    chosen = set(chosen)
    total = sum(problem.gain[e] for e in sorted(chosen))
    return total + sum(g for a, b, g in problem.interactions if a in chosen and b in chosen)


def has_cycle(problem, chosen):
    succ = {}
    for e in chosen:
        src, dst = problem.edges[e]
        succ.setdefault(src, []).append(dst)
    state = {}  # node -> 1 on the stack, 2 done

    def visit(node):
        state[node] = 1
        for nxt in succ.get(node, ()):
            if state.get(nxt) == 1 or (nxt not in state and visit(nxt)):
                return True
        state[node] = 2
        return False

    return any(node not in state and visit(node) for node in list(succ))


def oracle_feasible(problem, chosen):
    chosen = set(chosen)
    if any(len(chosen & set(s)) > 1 for s in problem.conflicts):
        return False
    if any(e in chosen and f not in chosen for e, f in problem.requires):
        return False
    if has_cycle(problem, chosen):
        return False
    memory = sum(problem.memory[e] for e in chosen)
    kernels = sum(problem.kernels[e] for e in chosen)
    if problem.memory_budget is not None and memory > problem.memory_budget:
        return False
    if problem.kernel_budget is not None and kernels > problem.kernel_budget:
        return False
    if problem.objective == "memory" and plan_gain(problem, chosen) < -GAIN_TOLERANCE:
        return False
    return True


def objective_key(problem, chosen):
    """Larger is better."""
    gain = plan_gain(problem, chosen)
    if problem.objective == "memory":
        return (-sum(problem.memory[e] for e in chosen), gain)
    return (gain,)


def brute_force(problem):
    """The best objective key over all feasible subsets."""
    n = len(problem.edges)
    best = None
    for r in range(n + 1):
        for subset in itertools.combinations(range(n), r):
            if oracle_feasible(problem, subset):
                key = objective_key(problem, subset)
                if best is None or key_better(key, best):
                    best = key
    return best


def key_better(a, b):
    if len(a) == 2 and a[0] != b[0]:
        return a[0] > b[0]
    return a[-1] > b[-1] + 1e-7


def key_equal(a, b):
    return not key_better(a, b) and not key_better(b, a)


def check_solution(problem, sol):
    """Every returned plan: sorted, feasible (natively and by the oracle), totals right."""
    assert list(sol.chosen) == sorted(set(sol.chosen))
    assert oracle_feasible(problem, sol.chosen)
    assert is_feasible(problem, sol.chosen)
    assert sol.memory == sum(problem.memory[e] for e in sol.chosen)
    assert sol.kernels == sum(problem.kernels[e] for e in sol.chosen)
    assert math.isclose(sol.gain, plan_gain(problem, sol.chosen), abs_tol=1e-9)
    assert sum(n for _, n in sol.components) == len(problem.edges)


def random_problem(rng, max_edges=12):
    num_nodes = rng.randint(2, 8)
    num_edges = rng.randint(0, max_edges)
    edges = []
    while len(edges) < num_edges:
        src, dst = rng.randrange(num_nodes), rng.randrange(num_nodes)
        if src != dst:
            edges.append((src, dst))
    ids = range(num_edges)
    conflicts, requires, interactions = [], [], []
    if num_edges >= 2:
        conflicts = [rng.sample(ids, rng.randint(2, min(4, num_edges))) for _ in range(rng.randint(0, 3))]
        requires = [tuple(rng.sample(ids, 2)) for _ in range(rng.randint(0, 2))]
        interactions = [
            (*rng.sample(ids, 2), round(rng.uniform(-3, 3), 2)) for _ in range(rng.randint(0, 3))
        ]
    return Problem(
        num_nodes=num_nodes,
        edges=edges,
        gain=[round(rng.uniform(-2, 5), 2) for _ in ids],
        kernels=[rng.choice([-1, -1, 0, 1]) for _ in ids],
        memory=[rng.randint(-100, 60) for _ in ids],
        conflicts=conflicts,
        requires=requires,
        interactions=interactions,
        memory_budget=rng.choice([None, 0, 0, 50]),
        kernel_budget=rng.choice([None, 0, 1]),
        objective=rng.choice(["latency", "memory"]),
    )


# ---------------------------------------------------------------- tests
def test_functions_come_from_the_native_library():
    for name in ("vtc_tvm.solver.solve", "vtc_tvm.solver.is_feasible"):
        func = tvm_ffi.get_global_func(name, allow_missing=True)
        assert func is not None, name
    assert solver._solve_native.same_as(tvm_ffi.get_global_func("vtc_tvm.solver.solve"))


@pytest.mark.parametrize("seed", range(6))
def test_exact_matches_brute_force_and_greedy_is_feasible(seed):
    rng = random.Random(seed)
    for _ in range(40):
        problem = random_problem(rng)
        best = brute_force(problem)
        exact = solve(problem, method="exact")
        check_solution(problem, exact)
        assert exact.exact
        assert all(kind == "exact" for kind, _ in exact.components)
        assert key_equal(objective_key(problem, exact.chosen), best), (problem, exact, best)
        auto = solve(problem)
        check_solution(problem, auto)
        assert key_equal(objective_key(problem, auto.chosen), best)
        greedy = solve(problem, method="greedy")
        check_solution(problem, greedy)
        assert not key_better(objective_key(problem, greedy.chosen), best)
        assert all(kind == "greedy" for kind, _ in greedy.components)


def test_latency_plans_hold_only_contributing_edges():
    rng = random.Random(11)
    for _ in range(100):
        problem = random_problem(rng)
        if problem.objective != "latency":
            continue
        sol = solve(problem)
        for e in sol.chosen:
            # Dropping e (with whatever requires it) never helps: e contributes.
            rest = [f for f in sol.chosen if f != e]
            if oracle_feasible(problem, rest):
                assert plan_gain(problem, rest) < sol.gain + 1e-12


def test_oracle_sees_the_rules_the_native_check_sees():
    rng = random.Random(5)
    for _ in range(60):
        problem = random_problem(rng, max_edges=8)
        for r in range(len(problem.edges) + 1):
            for subset in itertools.combinations(range(len(problem.edges)), r):
                assert is_feasible(problem, subset) == oracle_feasible(problem, subset), (problem, subset)


def test_deterministic():
    rng = random.Random(3)
    for _ in range(20):
        problem = random_problem(rng)
        copy = Problem(**{k: getattr(problem, k) for k in problem.__dataclass_fields__})
        assert solve(problem) == solve(copy) == solve(problem)
        assert solve(problem, method="greedy") == solve(copy, method="greedy")


def test_split_feeding_reshapes():
    """Paper example: X -split-> S0, S1 -reshape-> R0, R1 (nodes 0..4).

    Load side: each split output is a view of X (Type I), each reshape output a view of its
    part. Store side: X's producer writes straight into S0 and S1 (both or neither), which
    excludes the split outputs being views of X. Chains: R0 -> S0 -> X.
    """
    X, S0, S1, R0, R1 = range(5)
    edges = [(S0, X), (S1, X), (R0, S0), (R1, S1), (X, S0), (X, S1)]
    problem = Problem(
        num_nodes=5,
        edges=edges,
        gain=[3.0, 3.0, 2.0, 2.0, 1.0, 1.0],
        kernels=[-1, 0, -1, -1, -1, 0],
        memory=[-64, -64, -32, -32, -64, -64],
        conflicts=[[0, 4], [1, 5]],
        requires=[(4, 5), (5, 4)],
        interactions=[(0, 2, 0.5), (1, 3, 0.5)],
    )
    sol = solve(problem)
    check_solution(problem, sol)
    assert sol.chosen == (0, 1, 2, 3) and sol.exact
    assert math.isclose(sol.gain, 11.0)
    assert key_equal(objective_key(problem, sol.chosen), brute_force(problem))
    assert is_feasible(problem, [4, 5, 2, 3])  # the store-side plan
    assert not is_feasible(problem, [0, 4, 5])  # conflict (and a cycle X -> S0 -> X)
    assert not is_feasible(problem, [4])  # store side needs both parts


def test_scatternd_into_kv_cache_has_several_valid_plans():
    """Paper example: QKV -split-> K -reshape-> Kr -ScatterND(Kc)-> Kout (nodes 0..4).

    0: K over QKV, 1: Kr over K, 2: Kout in place over the cache Kc, 3: Kr stored straight
    into the cache (needs 2), 4: K over Kr (the GEMM writes K into the cache; needs 3).
    K and Kr each live in one place: conflicts {0, 4}, {1, 3}.
    """
    QKV, K, Kr, Kc, Kout = range(5)
    problem = Problem(
        num_nodes=5,
        edges=[(K, QKV), (Kr, K), (Kout, Kc), (Kr, Kout), (K, Kr)],
        gain=[2.0, 1.5, 4.0, 3.0, 1.0],
        kernels=[-1, -1, -1, 0, -1],
        memory=[-32, -32, -4096, 0, -32],
        conflicts=[[0, 4], [1, 3]],
        requires=[(3, 2), (4, 3)],
    )
    plans = {(0, 1, 2): 7.5, (2, 3, 4): 8.0, (0, 2, 3): 9.0}
    for plan, gain in plans.items():
        assert is_feasible(problem, plan) and oracle_feasible(problem, plan)
        assert math.isclose(plan_gain(problem, plan), gain)
    assert not is_feasible(problem, [1, 4])  # K and Kr views of each other: a cycle
    assert not is_feasible(problem, [2, 3, 4, 0])  # K in two places
    assert not is_feasible(problem, [3])  # stored into a cache that is not in place
    sol = solve(problem)
    check_solution(problem, sol)
    assert sol.chosen == (0, 2, 3) and sol.exact
    assert key_equal(objective_key(problem, sol.chosen), brute_force(problem))
    by_memory = Problem(**{**problem.__dict__, "objective": "memory"})
    memory_plan = solve(by_memory)
    check_solution(by_memory, memory_plan)
    assert memory_plan.chosen == (0, 1, 2)  # the least memory of the three; then the most gain
    assert key_equal(objective_key(by_memory, memory_plan.chosen), brute_force(by_memory))


def test_budgets_coupling_components():
    """Two independent edges that each fit the memory budget but not together."""
    problem = Problem(
        num_nodes=4,
        edges=[(0, 1), (2, 3)],
        gain=[5.0, 4.0],
        kernels=[-1, -1],
        memory=[8, 8],
        memory_budget=10,
    )
    sol = solve(problem)
    check_solution(problem, sol)
    assert sol.chosen == (0,) and sol.exact  # whole-problem branch and bound
    capped = solve(problem, max_exact_edges=1)
    check_solution(problem, capped)
    assert capped.chosen == (0,) and not capped.exact  # the coupling was repaired, not proven
    assert capped.components == (("exact", 1), ("exact", 1))


def test_method_and_component_reports():
    # One component of 5 edges (a conflict chain) and one of 1 edge.
    problem = Problem(
        num_nodes=7,
        edges=[(0, 6), (1, 6), (2, 6), (3, 6), (4, 6), (5, 6)],
        gain=[1.0, 2.0, 3.0, 2.5, 1.0, 0.5],
        kernels=[-1] * 6,
        memory=[-1] * 6,
        conflicts=[[0, 1], [1, 2], [2, 3], [3, 4]],
    )
    auto = solve(problem, max_exact_edges=2)
    assert auto.components == (("greedy", 5), ("exact", 1)) and not auto.exact
    exact = solve(problem, method="exact", max_exact_edges=2)
    assert exact.components == (("exact", 5), ("exact", 1)) and exact.exact
    assert exact.chosen == (0, 2, 4, 5)
    check_solution(problem, auto)
    assert auto.gain <= exact.gain


def test_empty_problem_and_no_positive_edge():
    assert solve(Problem(0, [], [], [], [])) == solver.Solution((), 0.0, 0, 0, True, ())
    sol = solve(Problem(2, [(0, 1)], [-1.0], [-1], [-1]))
    assert sol.chosen == () and sol.exact


@pytest.mark.parametrize(
    "change, message",
    [
        ({"edges": [(0, 9)]}, r"edges\[0\] = \(0, 9\): node id 9 is out of range \[0, 3\)"),
        ({"edges": [(1, 1)]}, r"self-loop"),
        ({"gain": [1.0, 2.0]}, r"gain has 2 entries for 1 edges"),
        ({"memory": []}, r"memory has 0 entries"),
        ({"gain": [float("nan")]}, r"gain\[0\] = nan is not finite"),
        ({"conflicts": [[0, 3]]}, r"conflicts: edge id 3 is out of range \[0, 1\)"),
        ({"requires": [(0, -1)]}, r"requires: edge id -1 is out of range"),
        ({"interactions": [(0, 0, 1.0)]}, r"pairs edge 0 with itself"),
        ({"memory_budget": -1}, r"memory_budget = -1 is negative"),
        ({"objective": "speed"}, r"objective = 'speed' must be 'latency' or 'memory'"),
    ],
)
def test_bad_input_raises_one_line_value_error(change, message):
    base = dict(num_nodes=3, edges=[(0, 1)], gain=[1.0], kernels=[-1], memory=[-1])
    problem = Problem(**{**base, **change})
    with pytest.raises(ValueError, match=message) as info:
        solve(problem)
    assert "\n" not in str(info.value).strip()
    with pytest.raises(ValueError, match=message):
        is_feasible(problem, [])


def test_bad_method_and_chosen():
    problem = Problem(3, [(0, 1)], [1.0], [-1], [-1])
    with pytest.raises(ValueError, match="method = 'best' must be"):
        solve(problem, method="best")
    with pytest.raises(ValueError, match="chosen: edge id 4 is out of range"):
        is_feasible(problem, [4])
    with pytest.raises(ValueError, match="edge 0 is listed twice"):
        is_feasible(problem, [0, 0])


def test_large_problem_is_fast_and_feasible():
    rng = random.Random(0)
    num_nodes, num_edges = 1200, 2000
    edges = []
    while len(edges) < num_edges:
        src, dst = rng.randrange(num_nodes), rng.randrange(num_nodes)
        if src != dst:
            edges.append((src, dst))
    by_src = {}
    for e, (src, _) in enumerate(edges):
        by_src.setdefault(src, []).append(e)
    problem = Problem(
        num_nodes=num_nodes,
        edges=edges,
        gain=[rng.uniform(-1, 5) for _ in edges],
        kernels=[rng.choice([-1, 0, 1]) for _ in edges],
        memory=[rng.randint(-1000, 500) for _ in edges],
        conflicts=[outs for outs in by_src.values() if len(outs) > 1],  # one place per tensor
        requires=[tuple(rng.sample(range(num_edges), 2)) for _ in range(100)],
        interactions=[(*rng.sample(range(num_edges), 2), rng.uniform(-2, 2)) for _ in range(300)],
        memory_budget=0,
        kernel_budget=0,
    )
    start = time.perf_counter()
    sol = solve(problem)
    elapsed = time.perf_counter() - start
    check_solution(problem, sol)
    assert sol.gain > 0
    assert elapsed < 10, elapsed
