/*!
 * \file problem.h
 * \brief The plan problem of vtc-tvm's global planner: which virtual-tensor edges to take.
 *
 * Nodes are tensors of the opportunity graph; edge i (src -> dst) makes tensor src a view of
 * tensor dst, eliminating one movement op. A plan is a set of edges. It is feasible when
 *  1. no two chosen edges lie in one conflict set,
 *  2. every chosen e of a requires pair (e, f) has f chosen too,
 *  3. the chosen edges form no directed cycle (a tensor cannot be a view of itself),
 *  4. the summed memory and kernel changes stay within their budgets,
 *  5. for the "memory" objective only: the total gain is >= -kGainTolerance.
 * The total gain of a plan is the sum of its edges' gains plus the interactions of its pairs.
 *
 * This header is free of tvm-ffi: ffi_api.cc marshals to and from it.
 */
#ifndef VTC_TVM_SOLVER_PROBLEM_H_
#define VTC_TVM_SOLVER_PROBLEM_H_

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace vtc_tvm {
namespace solver {

/*! \brief Absolute slack (us) of the memory objective's "total gain >= 0" constraint, so that
 *  the rounding of float sums in different orders never flips a plan's feasibility. */
constexpr double kGainTolerance = 1e-9;

enum class Objective { kLatency, kMemory };

/*! \brief Raised for malformed input; ffi_api.cc turns it into a Python ValueError. */
class InvalidProblem : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/*! \brief The problem as passed in (flat arrays, as the Python dataclass holds them). */
struct RawProblem {
  int64_t num_nodes = 0;
  std::vector<int64_t> src, dst;
  std::vector<double> gain;
  std::vector<int64_t> kernels, memory;
  std::vector<std::vector<int64_t>> conflicts;
  std::vector<std::pair<int64_t, int64_t>> requires_pairs;
  std::vector<int64_t> interaction_a, interaction_b;
  std::vector<double> interaction_gain;
  std::optional<int64_t> memory_budget, kernel_budget;
  std::string objective = "latency";
};

/*! \brief A validated problem with the adjacency the search needs. Edge ids are ints. */
class Problem {
 public:
  /*! \brief Validate \p raw; throws InvalidProblem with a one-line message. */
  explicit Problem(const RawProblem& raw);

  int num_edges() const { return static_cast<int>(src.size()); }

  int num_nodes;
  std::vector<int> src, dst;
  std::vector<double> gain;
  std::vector<int64_t> kernels, memory;
  std::optional<int64_t> memory_budget, kernel_budget;
  Objective objective;

  /*! \brief Conflict sets, deduplicated, each of size >= 2. */
  std::vector<std::vector<int>> conflict_sets;
  /*! \brief conflict_sets_of[e]: ids of the conflict sets holding e. */
  std::vector<std::vector<int>> conflict_sets_of;
  /*! \brief requires_of[e]: the edges e requires; required_by[f]: the edges requiring f. */
  std::vector<std::vector<int>> requires_of, required_by;
  /*! \brief Interaction pairs (a < b) with duplicates summed; partners[e]: (other, gain). */
  struct Pair {
    int a, b;
    double gain;
  };
  std::vector<Pair> pairs;
  std::vector<std::vector<std::pair<int, double>>> partners;
  /*! \brief out_edges[n]: the edges whose src is n, ascending. */
  std::vector<std::vector<int>> out_edges;
};

/*! \brief Sums of a plan: total gain (with interactions), memory and kernel changes. */
struct PlanTotals {
  double gain = 0;
  int64_t memory = 0;
  int64_t kernels = 0;
};

/*! \brief Totals of \p chosen (any order; ids assumed valid and distinct). */
PlanTotals Evaluate(const Problem& problem, const std::vector<int>& chosen);

/*! \brief Whether \p chosen satisfies the five rules of the file comment. Throws InvalidProblem
 *  for an out-of-range or repeated edge id. */
bool IsFeasible(const Problem& problem, const std::vector<int64_t>& chosen);

}  // namespace solver
}  // namespace vtc_tvm

#endif  // VTC_TVM_SOLVER_PROBLEM_H_
