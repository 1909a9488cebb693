/*!
 * \file solve.h
 * \brief The plan solver: split into components, greedy, branch and bound, budget coupling.
 */
#ifndef VTC_TVM_SOLVER_SOLVE_H_
#define VTC_TVM_SOLVER_SOLVE_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "problem.h"

namespace vtc_tvm {
namespace solver {

struct Solution {
  std::vector<int> chosen;  //!< ascending edge ids
  PlanTotals totals;
  bool exact = false;
  /*! \brief Per component (ordered by lowest edge id): "exact" or "greedy", number of edges. */
  std::vector<std::pair<std::string, int>> components;
};

/*!
 * \brief Independent components: edges linked by a conflict set, a requires pair, an
 * interaction, or by lying inside one strongly connected component of the node graph (only
 * those can close a cycle). Each component ascending; components by lowest edge id.
 */
std::vector<std::vector<int>> Components(const Problem& problem);

/*!
 * \brief Solve \p problem. \p method: "auto" (exact on components of <= \p max_exact_edges
 * edges, greedy on the others), "greedy", or "exact" (every component, up to a work cap).
 *
 * Budgets (and the memory objective's gain >= 0) couple the components. Each component is
 * first solved under a relaxation of them: its cap is the budget minus the least the other
 * components could contribute. If the union of these optima meets the real budgets it is
 * optimal (exact when every component was proven). Otherwise the solver compares
 *  (a) each component solved under a zero share of every budget (so the union is feasible),
 *      then a local search on the union under the real budgets, and
 *  (b) the global greedy on all edges under the real budgets,
 * and, if all edges number <= max_exact_edges, runs branch and bound on the whole problem
 * seeded with the better one (exact when it finishes); else the result has exact = false.
 * Throws InvalidProblem for a bad method or max_exact_edges.
 */
Solution Solve(const Problem& problem, const std::string& method, int64_t max_exact_edges);

}  // namespace solver
}  // namespace vtc_tvm

#endif  // VTC_TVM_SOLVER_SOLVE_H_
