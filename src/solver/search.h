/*!
 * \file search.h
 * \brief The searches over a subset of the edges (a component, or all): the paper's global
 *  greedy, a local add/remove search, and branch and bound.
 *
 * All three only return plans that are feasible under the Limits they are given, and are
 * deterministic: ties go to the lowest node id, then to the lowest edge ids.
 */
#ifndef VTC_TVM_SOLVER_SEARCH_H_
#define VTC_TVM_SOLVER_SEARCH_H_

#include <cstdint>
#include <vector>

#include "plan_state.h"
#include "problem.h"

namespace vtc_tvm {
namespace solver {

/*! \brief How much a change (or a plan, against the empty plan) moves the totals. */
struct Delta {
  int64_t memory = 0;
  double gain = 0;
};

/*! \brief The objective as an order on Deltas. "latency": larger gain. "memory": less memory,
 *  then larger gain. Gains closer than kGainTolerance count as equal. */
class ObjectiveOrder {
 public:
  explicit ObjectiveOrder(Objective objective) : objective_(objective) {}
  bool Better(const Delta& a, const Delta& b) const;
  /*! \brief Strictly better than no change. */
  bool Improves(const Delta& d) const { return Better(d, Delta()); }

 private:
  Objective objective_;
};

/*!
 * \brief The paper's global greedy over \p edges, then LocalSearch.
 *
 * 1. Anchors: nodes with no out-edge in \p edges. 2. Repeatedly, over the non-anchored nodes,
 *    find the best set of their out-edges into anchored nodes (every non-empty subset of up to
 *    8 candidates, each with the edges it requires), apply the best improving one and anchor
 *    its node, so edges into it are evaluated (with their interactions) from then on.
 * 3. With no improving move left, the fixed point: nodes whose out-edges all lead to anchors
 *    stay physical and become anchors (edges into them open up); if none, the lowest open node
 *    does (this breaks cycles and chains into still-open nodes). Ends when no node is open.
 * Limits: a node with more than 8 candidate edges only tries its 8 best single edges' subsets;
 * the node-level choice is myopic (it is a heuristic; branch and bound makes it exact).
 */
std::vector<int> Greedy(const Problem& problem, const std::vector<int>& edges, const Limits& limits);

/*!
 * \brief Improve \p state in place within \p edges: add the best improving edge (with the
 * edges it requires) while one exists, and drop any chosen edge (with the chosen edges that
 * require it) whose removal does not worsen the objective, so that only edges that contribute
 * stay. Keeps the state feasible under \p limits; bounded by 4 * |edges| + 16 rounds.
 */
void LocalSearch(const Problem& problem, const std::vector<int>& edges, const Limits& limits,
                 PlanState* state);

struct BranchAndBoundResult {
  std::vector<int> chosen;
  bool finished = false;  //!< true: proven optimal under the limits; false: the work cap hit
};

/*!
 * \brief Exact search over \p edges under \p limits, seeded with \p incumbent (feasible), so
 * the result is never worse than it. Bound: current gain + the remaining edges' positive gains
 * + positive interactions among chosen-or-still-possible edges; memory and kernel lower bounds
 * prune budget-infeasible branches. Stops after about \p work_cap units (an expansion costs
 * |edges| + interaction pairs units) and returns the best plan found.
 */
BranchAndBoundResult BranchAndBound(const Problem& problem, const std::vector<int>& edges,
                                    const Limits& limits, const std::vector<int>& incumbent,
                                    int64_t work_cap);

}  // namespace solver
}  // namespace vtc_tvm

#endif  // VTC_TVM_SOLVER_SEARCH_H_
