/*!
 * \file solve.cc
 * \brief Components, per-component solving and the handling of budgets that couple them.
 */
#include "solve.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include "plan_state.h"
#include "search.h"

namespace vtc_tvm {
namespace solver {
namespace {

// Branch-and-bound work cap per search (about a second of work on one core).
constexpr int64_t kWorkCap = int64_t{300} * 1000 * 1000;

class UnionFind {
 public:
  explicit UnionFind(int n) : parent_(n) { std::iota(parent_.begin(), parent_.end(), 0); }
  int Find(int x) {
    while (parent_[x] != x) x = parent_[x] = parent_[parent_[x]];
    return x;
  }
  void Union(int a, int b) {
    a = Find(a);
    b = Find(b);
    if (a != b) parent_[std::max(a, b)] = std::min(a, b);
  }

 private:
  std::vector<int> parent_;
};

/*! \brief Strongly connected component id of every node (Kosaraju, iterative). */
std::vector<int> StronglyConnected(const Problem& problem) {
  const int n = problem.num_nodes;
  std::vector<std::vector<int>> reverse(n);
  for (int e = 0; e < problem.num_edges(); ++e) reverse[problem.dst[e]].push_back(problem.src[e]);
  std::vector<int> finish_order;
  std::vector<char> seen(n, 0);
  for (int root = 0; root < n; ++root) {
    if (seen[root]) continue;
    std::vector<std::pair<int, size_t>> stack = {{root, 0}};
    seen[root] = 1;
    while (!stack.empty()) {
      auto& [node, next] = stack.back();
      if (next < problem.out_edges[node].size()) {
        int to = problem.dst[problem.out_edges[node][next++]];
        if (!seen[to]) {
          seen[to] = 1;
          stack.push_back({to, 0});
        }
      } else {
        finish_order.push_back(node);
        stack.pop_back();
      }
    }
  }
  std::vector<int> scc(n, -1);
  int count = 0;
  for (auto it = finish_order.rbegin(); it != finish_order.rend(); ++it) {
    if (scc[*it] >= 0) continue;
    std::vector<int> stack = {*it};
    scc[*it] = count;
    while (!stack.empty()) {
      int node = stack.back();
      stack.pop_back();
      for (int from : reverse[node]) {
        if (scc[from] < 0) {
          scc[from] = count;
          stack.push_back(from);
        }
      }
    }
    ++count;
  }
  return scc;
}

int64_t SaturatingSub(int64_t cap, int64_t lower_bound_sum) {
  // cap - lower_bound_sum with lower_bound_sum <= 0: may exceed int64.
  if (lower_bound_sum < 0 && cap > std::numeric_limits<int64_t>::max() + lower_bound_sum) {
    return std::numeric_limits<int64_t>::max();
  }
  return cap - lower_bound_sum;
}

/*! \brief Per component: the least memory / kernels and the most gain it could contribute. */
struct ComponentExtremes {
  int64_t least_memory = 0, least_kernels = 0;
  double most_gain = 0;
};

ComponentExtremes Extremes(const Problem& problem, const std::vector<int>& edges,
                           const std::vector<char>& in_component) {
  ComponentExtremes x;
  for (int e : edges) {
    x.least_memory += std::min<int64_t>(0, problem.memory[e]);
    x.least_kernels += std::min<int64_t>(0, problem.kernels[e]);
    x.most_gain += std::max(0.0, problem.gain[e]);
  }
  for (const auto& pair : problem.pairs) {
    if (in_component[pair.a] && pair.gain > 0) x.most_gain += pair.gain;
  }
  return x;
}

/*! \brief A component's plan and whether it is proven optimal under its limits. */
struct ComponentPlan {
  std::vector<int> chosen;
  bool exact = false;
};

ComponentPlan SolveComponent(const Problem& problem, const std::vector<int>& edges, const Limits& limits,
                             const std::string& method, int64_t max_exact_edges) {
  ComponentPlan plan{Greedy(problem, edges, limits), false};
  bool run_exact = method == "exact" ||
                   (method == "auto" && static_cast<int64_t>(edges.size()) <= max_exact_edges);
  if (!run_exact) return plan;
  BranchAndBoundResult result = BranchAndBound(problem, edges, limits, plan.chosen, kWorkCap);
  // Drop edges that contribute nothing (ties of the optimum), keeping the objective.
  PlanState state(problem);
  for (int e : result.chosen) state.Add(e);
  LocalSearch(problem, edges, limits, &state);
  return {state.Chosen(), result.finished};
}

bool FeasibleUnder(const Problem& problem, const std::vector<int>& chosen) {
  return IsFeasible(problem, std::vector<int64_t>(chosen.begin(), chosen.end()));
}

Delta ValueOf(const Problem& problem, const std::vector<int>& chosen) {
  PlanTotals totals = Evaluate(problem, chosen);
  return Delta{totals.memory, totals.gain};
}

std::vector<int> Union(const std::vector<ComponentPlan>& plans) {
  std::vector<int> all;
  for (const auto& plan : plans) all.insert(all.end(), plan.chosen.begin(), plan.chosen.end());
  std::sort(all.begin(), all.end());
  return all;
}

}  // namespace

std::vector<std::vector<int>> Components(const Problem& problem) {
  const int m = problem.num_edges();
  UnionFind uf(m);
  for (const auto& set : problem.conflict_sets) {
    for (size_t i = 1; i < set.size(); ++i) uf.Union(set[0], set[i]);
  }
  for (int e = 0; e < m; ++e) {
    for (int f : problem.requires_of[e]) uf.Union(e, f);
  }
  for (const auto& pair : problem.pairs) uf.Union(pair.a, pair.b);
  std::vector<int> scc = StronglyConnected(problem);
  std::vector<int> first_edge_of_scc(problem.num_nodes, -1);
  for (int e = 0; e < m; ++e) {
    int s = scc[problem.src[e]];
    if (s != scc[problem.dst[e]]) continue;  // not on any cycle
    if (first_edge_of_scc[s] < 0) first_edge_of_scc[s] = e;
    uf.Union(first_edge_of_scc[s], e);
  }
  std::vector<std::vector<int>> by_root(m);
  for (int e = 0; e < m; ++e) by_root[uf.Find(e)].push_back(e);  // roots are lowest ids
  std::vector<std::vector<int>> components;
  for (auto& edges : by_root) {
    if (!edges.empty()) components.push_back(std::move(edges));
  }
  return components;
}

Solution Solve(const Problem& problem, const std::string& method, int64_t max_exact_edges) {
  if (method != "auto" && method != "greedy" && method != "exact") {
    throw InvalidProblem("method = '" + method + "' must be 'auto', 'greedy' or 'exact'");
  }
  if (max_exact_edges < 0) {
    throw InvalidProblem("max_exact_edges = " + std::to_string(max_exact_edges) + " is negative");
  }
  const Limits global = Limits::Of(problem);
  const ObjectiveOrder order(problem.objective);
  const std::vector<std::vector<int>> components = Components(problem);
  std::vector<ComponentExtremes> extremes;
  ComponentExtremes total;
  for (const auto& edges : components) {
    std::vector<char> in_component(problem.num_edges(), 0);
    for (int e : edges) in_component[e] = 1;
    extremes.push_back(Extremes(problem, edges, in_component));
    total.least_memory += extremes.back().least_memory;
    total.least_kernels += extremes.back().least_kernels;
    total.most_gain += extremes.back().most_gain;
  }

  // 1. Each component under the relaxed budgets (a true relaxation of the coupled problem).
  std::vector<ComponentPlan> relaxed;
  for (size_t c = 0; c < components.size(); ++c) {
    Limits limits = global;
    if (problem.memory_budget) {
      limits.memory_cap = SaturatingSub(global.memory_cap, total.least_memory - extremes[c].least_memory);
    }
    if (problem.kernel_budget) {
      limits.kernel_cap = SaturatingSub(global.kernel_cap, total.least_kernels - extremes[c].least_kernels);
    }
    if (problem.objective == Objective::kMemory) {
      limits.gain_floor = global.gain_floor - (total.most_gain - extremes[c].most_gain);
    }
    relaxed.push_back(SolveComponent(problem, components[c], limits, method, max_exact_edges));
  }

  Solution solution;
  std::vector<int> chosen = Union(relaxed);
  if (FeasibleUnder(problem, chosen)) {
    solution.exact = true;
    for (size_t c = 0; c < components.size(); ++c) {
      solution.components.push_back({relaxed[c].exact ? "exact" : "greedy", static_cast<int>(components[c].size())});
      solution.exact = solution.exact && relaxed[c].exact;
    }
  } else {
    // 2. The budgets couple the components. (a) zero shares, then a global local search.
    std::vector<ComponentPlan> shared;
    for (const auto& edges : components) {
      Limits limits = global;
      if (problem.memory_budget) limits.memory_cap = 0;
      if (problem.kernel_budget) limits.kernel_cap = 0;
      if (problem.objective == Objective::kMemory) limits.gain_floor = 0;
      shared.push_back(SolveComponent(problem, edges, limits, method, max_exact_edges));
    }
    std::vector<int> all(problem.num_edges());
    std::iota(all.begin(), all.end(), 0);
    PlanState state(problem);
    for (int e : Union(shared)) state.Add(e);
    LocalSearch(problem, all, global, &state);
    std::vector<int> from_shares = state.Chosen();
    // (b) the global greedy.
    std::vector<int> from_greedy = Greedy(problem, all, global);
    bool shares_win = FeasibleUnder(problem, from_shares) &&
                      (!FeasibleUnder(problem, from_greedy) ||
                       !order.Better(ValueOf(problem, from_greedy), ValueOf(problem, from_shares)));
    chosen = shares_win ? from_shares : from_greedy;
    solution.exact = false;
    for (size_t c = 0; c < components.size(); ++c) {
      bool exact = shares_win && shared[c].exact;
      solution.components.push_back({exact ? "exact" : "greedy", static_cast<int>(components[c].size())});
    }
    if (method != "greedy" && problem.num_edges() <= max_exact_edges && FeasibleUnder(problem, chosen)) {
      BranchAndBoundResult result = BranchAndBound(problem, all, global, chosen, kWorkCap);
      PlanState cleaned(problem);
      for (int e : result.chosen) cleaned.Add(e);
      LocalSearch(problem, all, global, &cleaned);
      chosen = cleaned.Chosen();
      solution.exact = result.finished;
      for (auto& component : solution.components) component.first = result.finished ? "exact" : "greedy";
    }
  }
  // The searches keep every rule; this re-check on exact sums only guards the float rounding of
  // the memory objective's gain floor. The empty plan is always feasible.
  if (!FeasibleUnder(problem, chosen)) {
    chosen.clear();
    solution.exact = false;
  }
  solution.chosen = chosen;
  solution.totals = Evaluate(problem, chosen);
  return solution;
}

}  // namespace solver
}  // namespace vtc_tvm
