/*!
 * \file search.cc
 * \brief Greedy, local search and branch and bound over a subset of the edges.
 */
#include "search.h"

#include <algorithm>
#include <numeric>
#include <optional>

namespace vtc_tvm {
namespace solver {
namespace {

// A node with more candidate out-edges tries only its best kMaxEnumerated ones (2^8 subsets).
constexpr size_t kMaxEnumerated = 8;

Delta DeltaBetween(const PlanState& before_after_state, int64_t memory_before, double gain_before) {
  return Delta{before_after_state.memory() - memory_before, before_after_state.gain() - gain_before};
}

/*! \brief Edges of a subset as a mask over all edges. */
std::vector<char> Mask(const Problem& problem, const std::vector<int>& edges) {
  std::vector<char> mask(problem.num_edges(), 0);
  for (int e : edges) mask[e] = 1;
  return mask;
}

/*! \brief \p seeds plus, transitively, the edges they require; nullopt if one lies outside
 *  \p in_subset. Ascending. */
std::optional<std::vector<int>> RequiresClosure(const Problem& problem, const std::vector<int>& seeds,
                                                const std::vector<char>& in_subset,
                                                const PlanState& state) {
  std::vector<int> closure, stack(seeds.begin(), seeds.end());
  std::vector<int> seen;
  while (!stack.empty()) {
    int e = stack.back();
    stack.pop_back();
    if (state.chosen(e) || std::find(seen.begin(), seen.end(), e) != seen.end()) continue;
    if (!in_subset[e]) return std::nullopt;
    seen.push_back(e);
    closure.push_back(e);
    for (int f : problem.requires_of[e]) stack.push_back(f);
  }
  std::sort(closure.begin(), closure.end());
  return closure;
}

/*! \brief Add \p closure to \p state if every edge fits (no conflict, no cycle) and the result
 *  is feasible under \p limits; returns whether it did. On false the state is unchanged. */
bool TryAdd(const std::vector<int>& closure, const Limits& limits, PlanState* state) {
  size_t added = 0;
  bool ok = true;
  for (int e : closure) {
    if (state->Conflicts(e) || state->WouldCloseCycle(e)) {
      ok = false;
      break;
    }
    state->Add(e);
    ++added;
  }
  ok = ok && state->Feasible(limits);
  if (!ok) {
    for (size_t i = added; i-- > 0;) state->Remove(closure[i]);
  }
  return ok;
}

void RemoveAll(const std::vector<int>& edges, PlanState* state) {
  for (size_t i = edges.size(); i-- > 0;) state->Remove(edges[i]);
}

/*! \brief The move "add the closure of \p seeds": its delta if feasible (state unchanged). */
std::optional<Delta> EvaluateAdd(const Problem& problem, const std::vector<int>& seeds,
                                 const std::vector<char>& in_subset, const Limits& limits,
                                 PlanState* state, std::vector<int>* closure_out) {
  auto closure = RequiresClosure(problem, seeds, in_subset, *state);
  if (!closure || closure->empty()) return std::nullopt;
  const int64_t memory_before = state->memory();
  const double gain_before = state->gain();
  if (!TryAdd(*closure, limits, state)) return std::nullopt;
  Delta d = DeltaBetween(*state, memory_before, gain_before);
  RemoveAll(*closure, state);
  if (closure_out) *closure_out = std::move(*closure);
  return d;
}

}  // namespace

bool ObjectiveOrder::Better(const Delta& a, const Delta& b) const {
  if (objective_ == Objective::kMemory && a.memory != b.memory) return a.memory < b.memory;
  return a.gain > b.gain + kGainTolerance;
}

std::vector<int> Greedy(const Problem& problem, const std::vector<int>& edges, const Limits& limits) {
  const ObjectiveOrder order(problem.objective);
  const std::vector<char> in_subset = Mask(problem, edges);
  std::vector<std::vector<int>> outs(problem.num_nodes);
  std::vector<int> open_nodes;
  for (int e : edges) outs[problem.src[e]].push_back(e);  // edges ascending: outs ascending
  for (int e : edges) {
    if (outs[problem.src[e]].front() == e) open_nodes.push_back(problem.src[e]);
  }
  std::sort(open_nodes.begin(), open_nodes.end());
  std::vector<char> anchored(problem.num_nodes, 1);
  for (int n : open_nodes) anchored[n] = 0;

  PlanState state(problem);
  while (true) {
    std::vector<int> open;
    for (int n : open_nodes) {
      if (!anchored[n]) open.push_back(n);
    }
    if (open.empty()) break;

    // The best improving move: a node and a set of its out-edges into anchored nodes.
    std::optional<Delta> best;
    std::vector<int> best_closure;
    int best_node = -1;
    for (int u : open) {
      std::vector<int> candidates;
      for (int e : outs[u]) {
        if (anchored[problem.dst[e]] && !state.chosen(e)) candidates.push_back(e);
      }
      if (candidates.size() > kMaxEnumerated) {
        // Keep the best single edges (stable: ties stay in id order).
        std::vector<std::pair<Delta, int>> singles;
        for (int e : candidates) {
          if (auto d = EvaluateAdd(problem, {e}, in_subset, limits, &state, nullptr)) singles.push_back({*d, e});
        }
        std::stable_sort(singles.begin(), singles.end(),
                         [&](const auto& x, const auto& y) { return order.Better(x.first, y.first); });
        candidates.clear();
        for (size_t i = 0; i < singles.size() && i < kMaxEnumerated; ++i) candidates.push_back(singles[i].second);
        std::sort(candidates.begin(), candidates.end());
      }
      const uint32_t num_subsets = 1u << candidates.size();
      for (uint32_t mask = 1; mask < num_subsets; ++mask) {
        std::vector<int> seeds;
        for (size_t i = 0; i < candidates.size(); ++i) {
          if (mask & (1u << i)) seeds.push_back(candidates[i]);
        }
        std::vector<int> closure;
        auto d = EvaluateAdd(problem, seeds, in_subset, limits, &state, &closure);
        if (d && order.Improves(*d) && (!best || order.Better(*d, *best))) {
          best = d;
          best_closure = std::move(closure);
          best_node = u;
        }
      }
    }
    if (best) {
      TryAdd(best_closure, limits, &state);
      anchored[best_node] = 1;
      for (int e : best_closure) anchored[problem.src[e]] = 1;
      continue;
    }
    // Fixed point: nodes that had every out-edge evaluated stay physical and become anchors.
    bool anchored_any = false;
    for (int u : open) {
      bool all_into_anchors = std::all_of(outs[u].begin(), outs[u].end(),
                                          [&](int e) { return anchored[problem.dst[e]]; });
      if (all_into_anchors) {
        anchored[u] = 1;
        anchored_any = true;
      }
    }
    if (!anchored_any) anchored[open.front()] = 1;
  }
  LocalSearch(problem, edges, limits, &state);
  return state.Chosen();
}

void LocalSearch(const Problem& problem, const std::vector<int>& edges, const Limits& limits,
                 PlanState* state) {
  const ObjectiveOrder order(problem.objective);
  const std::vector<char> in_subset = Mask(problem, edges);
  const size_t max_rounds = 4 * edges.size() + 16;
  for (size_t round = 0; round < max_rounds; ++round) {
    std::optional<Delta> best;
    std::vector<int> best_closure;
    for (int e : edges) {
      if (state->chosen(e)) continue;
      std::vector<int> closure;
      auto d = EvaluateAdd(problem, {e}, in_subset, limits, state, &closure);
      if (d && order.Improves(*d) && (!best || order.Better(*d, *best))) {
        best = d;
        best_closure = std::move(closure);
      }
    }
    if (best) {
      TryAdd(best_closure, limits, state);
      continue;
    }
    // Drop the first chosen edge (with its chosen requirers) whose removal loses nothing.
    bool removed = false;
    for (int e : edges) {
      if (!state->chosen(e)) continue;
      std::vector<int> group, stack = {e};
      while (!stack.empty()) {
        int f = stack.back();
        stack.pop_back();
        if (!state->chosen(f) || std::find(group.begin(), group.end(), f) != group.end()) continue;
        group.push_back(f);
        for (int g : problem.required_by[f]) stack.push_back(g);
      }
      const int64_t memory_before = state->memory();
      const double gain_before = state->gain();
      for (int f : group) state->Remove(f);
      Delta d = DeltaBetween(*state, memory_before, gain_before);
      if (state->WithinLimits(limits) && !order.Better(Delta(), d)) {
        removed = true;
        break;
      }
      for (size_t i = group.size(); i-- > 0;) state->Add(group[i]);
    }
    if (!removed) return;
  }
}

namespace {

/*! \brief Depth-first branch and bound; edge order fixed up front (most promising first). */
class BranchAndBoundSearch {
 public:
  BranchAndBoundSearch(const Problem& problem, const std::vector<int>& edges, const Limits& limits,
                       int64_t work_cap)
      : problem_(problem),
        limits_(limits),
        order_(problem.objective),
        edges_(edges),
        decided_(problem.num_edges(), 0),
        state_(problem) {
    if (problem.objective == Objective::kMemory) {
      std::stable_sort(edges_.begin(), edges_.end(), [&](int a, int b) {
        if (problem.memory[a] != problem.memory[b]) return problem.memory[a] < problem.memory[b];
        return problem.gain[a] > problem.gain[b];
      });
    } else {
      std::stable_sort(edges_.begin(), edges_.end(),
                       [&](int a, int b) { return problem.gain[a] > problem.gain[b]; });
    }
    std::vector<char> in_subset = Mask(problem, edges);
    for (const auto& pair : problem.pairs) {
      if (in_subset[pair.a] && in_subset[pair.b] && pair.gain > 0) positive_pairs_.push_back(pair);
    }
    const int64_t cost = static_cast<int64_t>(edges_.size() + positive_pairs_.size()) + 1;
    max_expansions_ = std::max<int64_t>(1000, work_cap / cost);
  }

  BranchAndBoundResult Run(const std::vector<int>& incumbent) {
    best_ = incumbent;
    PlanTotals totals = Evaluate(problem_, incumbent);
    best_value_ = Delta{totals.memory, totals.gain};
    Visit(0);
    std::sort(best_.begin(), best_.end());
    return {best_, !aborted_};
  }

 private:
  bool Possible(int e) const { return !decided_[e] && !state_.Conflicts(e); }

  void Visit(size_t depth) {
    if (aborted_) return;
    if (++expansions_ > max_expansions_) {
      aborted_ = true;
      return;
    }
    // Bounds over the still-possible edges.
    double gain_bound = state_.gain();
    int64_t memory_bound = state_.memory(), kernel_bound = state_.kernels();
    for (size_t i = depth; i < edges_.size(); ++i) {
      int e = edges_[i];
      if (!Possible(e)) continue;
      gain_bound += std::max(0.0, problem_.gain[e]);
      memory_bound += std::min<int64_t>(0, problem_.memory[e]);
      kernel_bound += std::min<int64_t>(0, problem_.kernels[e]);
    }
    for (const auto& pair : positive_pairs_) {
      bool a = state_.chosen(pair.a), b = state_.chosen(pair.b);
      if (a && b) continue;  // already in state_.gain()
      if ((a || Possible(pair.a)) && (b || Possible(pair.b))) gain_bound += pair.gain;
    }
    if (memory_bound > limits_.memory_cap || kernel_bound > limits_.kernel_cap ||
        gain_bound < limits_.gain_floor) {
      return;
    }
    if (!order_.Better(Delta{memory_bound, gain_bound}, best_value_)) return;
    if (depth == edges_.size()) {
      Delta value{state_.memory(), state_.gain()};
      if (state_.Feasible(limits_) && order_.Better(value, best_value_)) {
        best_value_ = value;
        best_ = state_.Chosen();
      }
      return;
    }
    const int e = edges_[depth];
    decided_[e] = 1;
    bool requirements_open = std::all_of(problem_.requires_of[e].begin(), problem_.requires_of[e].end(),
                                         [&](int f) { return !decided_[f] || state_.chosen(f); });
    if (requirements_open && !state_.Conflicts(e) && !state_.WouldCloseCycle(e)) {
      state_.Add(e);
      Visit(depth + 1);
      state_.Remove(e);
    }
    bool required = std::any_of(problem_.required_by[e].begin(), problem_.required_by[e].end(),
                                [&](int g) { return state_.chosen(g); });
    if (!required) Visit(depth + 1);
    decided_[e] = 0;
  }

  const Problem& problem_;
  const Limits limits_;
  const ObjectiveOrder order_;
  std::vector<int> edges_;
  std::vector<Problem::Pair> positive_pairs_;
  std::vector<char> decided_;
  PlanState state_;
  std::vector<int> best_;
  Delta best_value_;
  int64_t expansions_ = 0, max_expansions_ = 0;
  bool aborted_ = false;
};

}  // namespace

BranchAndBoundResult BranchAndBound(const Problem& problem, const std::vector<int>& edges,
                                    const Limits& limits, const std::vector<int>& incumbent,
                                    int64_t work_cap) {
  BranchAndBoundSearch search(problem, edges, limits, work_cap);
  return search.Run(incumbent);
}

}  // namespace solver
}  // namespace vtc_tvm
