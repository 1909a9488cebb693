/*!
 * \file problem.cc
 * \brief Validation of the plan problem, plan totals and feasibility.
 */
#include "problem.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>

#include "plan_state.h"

namespace vtc_tvm {
namespace solver {
namespace {

// Memory (bytes) and kernel changes beyond this could overflow int64 sums; real plans are far below.
constexpr int64_t kMaxMagnitude = int64_t{1} << 48;

template <typename... Parts>
[[noreturn]] void Fail(const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  throw InvalidProblem(os.str());
}

int CheckEdge(int64_t e, int64_t num_edges, const char* where) {
  if (e < 0 || e >= num_edges) Fail(where, ": edge id ", e, " is out of range [0, ", num_edges, ")");
  return static_cast<int>(e);
}

void CheckMagnitude(int64_t value, const char* what, size_t i) {
  if (value > kMaxMagnitude || value < -kMaxMagnitude) {
    Fail(what, "[", i, "] = ", value, " exceeds +-2^48");
  }
}

}  // namespace

Problem::Problem(const RawProblem& raw) {
  if (raw.num_nodes < 0 || raw.num_nodes > std::numeric_limits<int>::max()) {
    Fail("num_nodes = ", raw.num_nodes, " must be in [0, 2^31)");
  }
  num_nodes = static_cast<int>(raw.num_nodes);
  const size_t n = raw.src.size();
  if (raw.dst.size() != n) Fail("edges: ", n, " sources but ", raw.dst.size(), " destinations");
  if (raw.gain.size() != n) Fail("gain has ", raw.gain.size(), " entries for ", n, " edges");
  if (raw.kernels.size() != n) Fail("kernels has ", raw.kernels.size(), " entries for ", n, " edges");
  if (raw.memory.size() != n) Fail("memory has ", raw.memory.size(), " entries for ", n, " edges");
  if (n > static_cast<size_t>(std::numeric_limits<int>::max())) Fail("too many edges: ", n);
  const int64_t num_edges_64 = static_cast<int64_t>(n);

  out_edges.assign(num_nodes, {});
  for (size_t i = 0; i < n; ++i) {
    for (int64_t node : {raw.src[i], raw.dst[i]}) {
      if (node < 0 || node >= num_nodes) {
        Fail("edges[", i, "] = (", raw.src[i], ", ", raw.dst[i], "): node id ", node,
             " is out of range [0, ", num_nodes, ")");
      }
    }
    if (raw.src[i] == raw.dst[i]) Fail("edges[", i, "] = (", raw.src[i], ", ", raw.dst[i], ") is a self-loop");
    if (!std::isfinite(raw.gain[i])) Fail("gain[", i, "] = ", raw.gain[i], " is not finite");
    CheckMagnitude(raw.kernels[i], "kernels", i);
    CheckMagnitude(raw.memory[i], "memory", i);
    src.push_back(static_cast<int>(raw.src[i]));
    dst.push_back(static_cast<int>(raw.dst[i]));
    out_edges[src.back()].push_back(static_cast<int>(i));
  }
  gain = raw.gain;
  kernels = raw.kernels;
  memory = raw.memory;

  for (const auto& [name, budget] : {std::pair<const char*, const std::optional<int64_t>&>{
                                         "memory_budget", raw.memory_budget},
                                     {"kernel_budget", raw.kernel_budget}}) {
    if (budget && *budget < 0) Fail(name, " = ", *budget, " is negative (the empty plan must be feasible)");
  }
  memory_budget = raw.memory_budget;
  kernel_budget = raw.kernel_budget;

  if (raw.objective == "latency") {
    objective = Objective::kLatency;
  } else if (raw.objective == "memory") {
    objective = Objective::kMemory;
  } else {
    Fail("objective = '", raw.objective, "' must be 'latency' or 'memory'");
  }

  conflict_sets_of.assign(n, {});
  for (size_t s = 0; s < raw.conflicts.size(); ++s) {
    std::vector<int> members;
    for (int64_t e : raw.conflicts[s]) members.push_back(CheckEdge(e, num_edges_64, "conflicts"));
    std::sort(members.begin(), members.end());
    members.erase(std::unique(members.begin(), members.end()), members.end());
    if (members.size() < 2) continue;  // at most one of one edge: no constraint
    for (int e : members) conflict_sets_of[e].push_back(static_cast<int>(conflict_sets.size()));
    conflict_sets.push_back(std::move(members));
  }

  requires_of.assign(n, {});
  required_by.assign(n, {});
  for (const auto& [e64, f64] : raw.requires_pairs) {
    int e = CheckEdge(e64, num_edges_64, "requires");
    int f = CheckEdge(f64, num_edges_64, "requires");
    if (e == f) continue;  // choosing e requires e: always true
    if (std::find(requires_of[e].begin(), requires_of[e].end(), f) != requires_of[e].end()) continue;
    requires_of[e].push_back(f);
    required_by[f].push_back(e);
  }

  if (raw.interaction_b.size() != raw.interaction_a.size() ||
      raw.interaction_gain.size() != raw.interaction_a.size()) {
    Fail("interactions: mismatched lengths");
  }
  std::map<std::pair<int, int>, double> summed;  // ordered: deterministic pair order
  for (size_t i = 0; i < raw.interaction_a.size(); ++i) {
    int a = CheckEdge(raw.interaction_a[i], num_edges_64, "interactions");
    int b = CheckEdge(raw.interaction_b[i], num_edges_64, "interactions");
    if (a == b) Fail("interactions[", i, "] pairs edge ", a, " with itself");
    if (!std::isfinite(raw.interaction_gain[i])) {
      Fail("interactions[", i, "] gain = ", raw.interaction_gain[i], " is not finite");
    }
    summed[{std::min(a, b), std::max(a, b)}] += raw.interaction_gain[i];
  }
  partners.assign(n, {});
  for (const auto& [key, g] : summed) {
    pairs.push_back({key.first, key.second, g});
    partners[key.first].push_back({key.second, g});
    partners[key.second].push_back({key.first, g});
  }
}

PlanTotals Evaluate(const Problem& problem, const std::vector<int>& chosen) {
  std::vector<int> sorted = chosen;
  std::sort(sorted.begin(), sorted.end());
  std::vector<char> in(problem.num_edges(), 0);
  PlanTotals totals;
  for (int e : sorted) {
    in[e] = 1;
    totals.gain += problem.gain[e];
    totals.memory += problem.memory[e];
    totals.kernels += problem.kernels[e];
  }
  for (const auto& pair : problem.pairs) {
    if (in[pair.a] && in[pair.b]) totals.gain += pair.gain;
  }
  return totals;
}

bool IsFeasible(const Problem& problem, const std::vector<int64_t>& chosen) {
  std::vector<int> ids;
  std::vector<char> seen(problem.num_edges(), 0);
  for (int64_t e64 : chosen) {
    int e = CheckEdge(e64, problem.num_edges(), "chosen");
    if (seen[e]) Fail("chosen: edge ", e, " is listed twice");
    seen[e] = 1;
    ids.push_back(e);
  }
  std::sort(ids.begin(), ids.end());
  PlanState state(problem);
  for (int e : ids) {
    if (state.WouldCloseCycle(e)) return false;
    state.Add(e);
  }
  if (state.unmet_requires() > 0) return false;
  // Rules 4 and 5 on exact totals, so that solve() and is_feasible() agree on rounding.
  PlanTotals totals = Evaluate(problem, ids);
  Limits limits = Limits::Of(problem);
  if (!state.Feasible(Limits())) return false;  // conflicts
  return totals.memory <= limits.memory_cap && totals.kernels <= limits.kernel_cap &&
         totals.gain >= limits.gain_floor;
}

}  // namespace solver
}  // namespace vtc_tvm
