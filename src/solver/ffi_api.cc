/*!
 * \file ffi_api.cc
 * \brief tvm-ffi global functions of the plan solver (loaded by python/vtc_tvm/solver.py):
 *
 *   vtc_tvm.solver.solve(<problem>, method, max_exact_edges)
 *       -> [chosen, gain, memory, kernels, exact, component_kinds, component_sizes]
 *   vtc_tvm.solver.is_feasible(<problem>, chosen) -> bool
 *
 * where <problem> is the flat argument list num_nodes, src, dst, gain, kernels, memory,
 * conflicts, requires_e, requires_f, interaction_a, interaction_b, interaction_gain,
 * memory_budget (None: no limit), kernel_budget (None: no limit), objective.
 * Malformed input raises ValueError with a one-line message.
 */
#include <tvm/ffi/container/array.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/optional.h>
#include <tvm/ffi/reflection/registry.h>
#include <tvm/ffi/string.h>

#include <string>
#include <vector>

#include "problem.h"
#include "solve.h"

namespace vtc_tvm {
namespace solver {
namespace {

namespace ffi = ::tvm::ffi;

template <typename T>
std::vector<T> ToVector(const ffi::Array<T>& array) {
  return std::vector<T>(array.begin(), array.end());
}

/*! \brief Raise \p message as a Python ValueError (through tvm-ffi's error kinds). */
[[noreturn]] void RaiseValueError(const std::string& message) {
  TVM_FFI_THROW(ValueError) << message;
  TVM_FFI_UNREACHABLE();
}

std::optional<int64_t> ToOptional(const ffi::Optional<int64_t>& value) {
  if (value.has_value()) return value.value();
  return std::nullopt;
}

/*! \brief Validate the flat problem; InvalidProblem becomes a ValueError. */
Problem MakeProblem(int64_t num_nodes, const ffi::Array<int64_t>& src, const ffi::Array<int64_t>& dst,
                    const ffi::Array<double>& gain, const ffi::Array<int64_t>& kernels,
                    const ffi::Array<int64_t>& memory, const ffi::Array<ffi::Array<int64_t>>& conflicts,
                    const ffi::Array<int64_t>& requires_e, const ffi::Array<int64_t>& requires_f,
                    const ffi::Array<int64_t>& interaction_a, const ffi::Array<int64_t>& interaction_b,
                    const ffi::Array<double>& interaction_gain, const ffi::Optional<int64_t>& memory_budget,
                    const ffi::Optional<int64_t>& kernel_budget, const ffi::String& objective) {
  RawProblem raw;
  raw.num_nodes = num_nodes;
  raw.src = ToVector(src);
  raw.dst = ToVector(dst);
  raw.gain = ToVector(gain);
  raw.kernels = ToVector(kernels);
  raw.memory = ToVector(memory);
  for (const auto& set : conflicts) raw.conflicts.push_back(ToVector(set));
  if (requires_e.size() != requires_f.size()) {
    RaiseValueError("requires: mismatched lengths");
  }
  for (size_t i = 0; i < requires_e.size(); ++i) raw.requires_pairs.push_back({requires_e[i], requires_f[i]});
  raw.interaction_a = ToVector(interaction_a);
  raw.interaction_b = ToVector(interaction_b);
  raw.interaction_gain = ToVector(interaction_gain);
  raw.memory_budget = ToOptional(memory_budget);
  raw.kernel_budget = ToOptional(kernel_budget);
  raw.objective = std::string(objective);
  try {
    return Problem(raw);
  } catch (const InvalidProblem& err) {
    RaiseValueError(err.what());
  }
}

#define VTC_TVM_PROBLEM_PARAMS                                                                      \
  int64_t num_nodes, ffi::Array<int64_t> src, ffi::Array<int64_t> dst, ffi::Array<double> gain,     \
      ffi::Array<int64_t> kernels, ffi::Array<int64_t> memory,                                      \
      ffi::Array<ffi::Array<int64_t>> conflicts, ffi::Array<int64_t> requires_e,                    \
      ffi::Array<int64_t> requires_f, ffi::Array<int64_t> interaction_a,                            \
      ffi::Array<int64_t> interaction_b, ffi::Array<double> interaction_gain,                       \
      ffi::Optional<int64_t> memory_budget, ffi::Optional<int64_t> kernel_budget, ffi::String objective
#define VTC_TVM_PROBLEM_ARGS                                                                         \
  num_nodes, src, dst, gain, kernels, memory, conflicts, requires_e, requires_f, interaction_a,      \
      interaction_b, interaction_gain, memory_budget, kernel_budget, objective

ffi::Array<ffi::Any> SolveFFI(VTC_TVM_PROBLEM_PARAMS, ffi::String method, int64_t max_exact_edges) {
  Problem problem = MakeProblem(VTC_TVM_PROBLEM_ARGS);
  Solution solution;
  try {
    solution = Solve(problem, std::string(method), max_exact_edges);
  } catch (const InvalidProblem& err) {
    RaiseValueError(err.what());
  }
  ffi::Array<int64_t> chosen;
  for (int e : solution.chosen) chosen.push_back(e);
  ffi::Array<ffi::String> kinds;
  ffi::Array<int64_t> sizes;
  for (const auto& [kind, size] : solution.components) {
    kinds.push_back(ffi::String(kind));
    sizes.push_back(size);
  }
  return ffi::Array<ffi::Any>{chosen, solution.totals.gain, solution.totals.memory,
                              solution.totals.kernels, solution.exact, kinds, sizes};
}

bool IsFeasibleFFI(VTC_TVM_PROBLEM_PARAMS, ffi::Array<int64_t> chosen) {
  Problem problem = MakeProblem(VTC_TVM_PROBLEM_ARGS);
  try {
    return IsFeasible(problem, ToVector(chosen));
  } catch (const InvalidProblem& err) {
    RaiseValueError(err.what());
  }
}

#undef VTC_TVM_PROBLEM_PARAMS
#undef VTC_TVM_PROBLEM_ARGS

}  // namespace

TVM_FFI_STATIC_INIT_BLOCK() {
  namespace refl = ::tvm::ffi::reflection;
  refl::GlobalDef()
      .def("vtc_tvm.solver.solve", SolveFFI)
      .def("vtc_tvm.solver.is_feasible", IsFeasibleFFI);
}

}  // namespace solver
}  // namespace vtc_tvm
