/*!
 * \file plan_state.cc
 * \brief PlanState: incremental totals and rule checks of a plan.
 */
#include "plan_state.h"

#include <algorithm>

namespace vtc_tvm {
namespace solver {

Limits Limits::Of(const Problem& problem) {
  Limits limits;
  if (problem.memory_budget) limits.memory_cap = *problem.memory_budget;
  if (problem.kernel_budget) limits.kernel_cap = *problem.kernel_budget;
  if (problem.objective == Objective::kMemory) limits.gain_floor = -kGainTolerance;
  return limits;
}

PlanState::PlanState(const Problem& problem)
    : problem_(problem),
      chosen_(problem.num_edges(), 0),
      set_count_(problem.conflict_sets.size(), 0),
      chosen_out_(problem.num_nodes),
      visit_stamp_(problem.num_nodes, 0) {}

double PlanState::Contribution(int e) const {
  double total = problem_.gain[e];
  for (const auto& [other, g] : problem_.partners[e]) {
    if (chosen_[other]) total += g;
  }
  return total;
}

bool PlanState::Conflicts(int e) const {
  for (int s : problem_.conflict_sets_of[e]) {
    if (set_count_[s] - (chosen_[e] ? 1 : 0) > 0) return true;
  }
  return false;
}

bool PlanState::WouldCloseCycle(int e) const {
  // Adding src -> dst closes a cycle iff src is reachable from dst along chosen edges.
  const int target = problem_.src[e];
  ++stamp_;
  std::vector<int> stack = {problem_.dst[e]};
  visit_stamp_[problem_.dst[e]] = stamp_;
  while (!stack.empty()) {
    int node = stack.back();
    stack.pop_back();
    if (node == target) return true;
    for (int out : chosen_out_[node]) {
      int next = problem_.dst[out];
      if (visit_stamp_[next] != stamp_) {
        visit_stamp_[next] = stamp_;
        stack.push_back(next);
      }
    }
  }
  return false;
}

bool PlanState::WithinLimits(const Limits& limits) const {
  return memory_ <= limits.memory_cap && kernels_ <= limits.kernel_cap && gain_ >= limits.gain_floor;
}

bool PlanState::Feasible(const Limits& limits) const {
  return broken_sets_ == 0 && unmet_requires_ == 0 && WithinLimits(limits);
}

void PlanState::Add(int e) {
  gain_ += Contribution(e);
  memory_ += problem_.memory[e];
  kernels_ += problem_.kernels[e];
  for (int f : problem_.requires_of[e]) unmet_requires_ += chosen_[f] ? 0 : 1;
  for (int g : problem_.required_by[e]) unmet_requires_ -= chosen_[g] ? 1 : 0;
  for (int s : problem_.conflict_sets_of[e]) {
    if (++set_count_[s] == 2) ++broken_sets_;
  }
  chosen_[e] = 1;
  chosen_out_[problem_.src[e]].push_back(e);
  ++size_;
}

void PlanState::Remove(int e) {
  chosen_[e] = 0;
  gain_ -= Contribution(e);
  memory_ -= problem_.memory[e];
  kernels_ -= problem_.kernels[e];
  for (int f : problem_.requires_of[e]) unmet_requires_ -= chosen_[f] ? 0 : 1;
  for (int g : problem_.required_by[e]) unmet_requires_ += chosen_[g] ? 1 : 0;
  for (int s : problem_.conflict_sets_of[e]) {
    if (set_count_[s]-- == 2) --broken_sets_;
  }
  auto& outs = chosen_out_[problem_.src[e]];
  outs.erase(std::find(outs.begin(), outs.end(), e));
  --size_;
}

std::vector<int> PlanState::Chosen() const {
  std::vector<int> out;
  for (int e = 0; e < problem_.num_edges(); ++e) {
    if (chosen_[e]) out.push_back(e);
  }
  return out;
}

}  // namespace solver
}  // namespace vtc_tvm
