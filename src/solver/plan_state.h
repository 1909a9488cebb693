/*!
 * \file plan_state.h
 * \brief An incrementally maintained plan (set of chosen edges) and the limits it must meet.
 */
#ifndef VTC_TVM_SOLVER_PLAN_STATE_H_
#define VTC_TVM_SOLVER_PLAN_STATE_H_

#include <cstdint>
#include <limits>
#include <vector>

#include "problem.h"

namespace vtc_tvm {
namespace solver {

/*! \brief Caps a (sub)plan must meet: the budgets, and for the memory objective a gain floor.
 *  Components are solved under relaxed or shared caps, hence caps separate from the Problem. */
struct Limits {
  int64_t memory_cap = std::numeric_limits<int64_t>::max();
  int64_t kernel_cap = std::numeric_limits<int64_t>::max();
  double gain_floor = -std::numeric_limits<double>::infinity();

  /*! \brief The problem's own limits. */
  static Limits Of(const Problem& problem);
};

/*! \brief A plan with O(degree) add/remove and O(1) queries of its totals and rule breaks.
 *
 * Invariant: the chosen edges never form a cycle (callers check WouldCloseCycle before Add).
 * Totals are updated incrementally; Evaluate() recomputes them exactly for reporting.
 */
class PlanState {
 public:
  explicit PlanState(const Problem& problem);

  bool chosen(int e) const { return chosen_[e]; }
  double gain() const { return gain_; }
  int64_t memory() const { return memory_; }
  int64_t kernels() const { return kernels_; }
  int size() const { return size_; }

  /*! \brief gain[e] plus e's interactions with the chosen edges (e itself excluded). */
  double Contribution(int e) const;
  /*! \brief Whether e shares a conflict set with a chosen edge other than e. */
  bool Conflicts(int e) const;
  /*! \brief Whether adding e (not chosen) would close a directed cycle of chosen edges. */
  bool WouldCloseCycle(int e) const;
  /*! \brief Whether the plan meets conflicts, requires and \p limits (cycles are invariant). */
  bool Feasible(const Limits& limits) const;
  /*! \brief Whether the budget and gain-floor parts of \p limits hold. */
  bool WithinLimits(const Limits& limits) const;
  /*! \brief Number of (chosen e, unchosen f) requires pairs. */
  int unmet_requires() const { return unmet_requires_; }

  void Add(int e);
  void Remove(int e);
  /*! \brief The chosen edges, ascending. */
  std::vector<int> Chosen() const;

 private:
  const Problem& problem_;
  std::vector<char> chosen_;
  std::vector<int> set_count_;
  std::vector<std::vector<int>> chosen_out_;
  mutable std::vector<int> visit_stamp_;
  mutable int stamp_ = 0;
  double gain_ = 0;
  int64_t memory_ = 0, kernels_ = 0;
  int size_ = 0;
  int unmet_requires_ = 0;
  int broken_sets_ = 0;
};

}  // namespace solver
}  // namespace vtc_tvm

#endif  // VTC_TVM_SOLVER_PLAN_STATE_H_
