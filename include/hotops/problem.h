// Problem descriptors and their benchmark names: op/backend/dtype/direction/arg:value/...
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "hotops/dtype.h"

namespace hotops {

enum class Backend { cpu, cuda };
enum class Direction { fwd, bwd_data, bwd_weight, bwd, infer, train, step };

const char* backend_name(Backend b);

// Every family lists its problems on every backend, in every build: a build or a machine without
// CUDA then says, through Family::unsupported_reason, why its CUDA problems do not run.
constexpr Backend kAllBackends[] = {Backend::cpu, Backend::cuda};
const char* direction_name(Direction d);

struct Arg {
  std::string key;
  std::string value;
};

// One problem, fully described. Its name is the join key across backends and machines: two
// problems that differ only in backend have names that differ only in the backend segment.
struct Problem {
  std::string op;
  Backend backend = Backend::cpu;
  DType dtype = DType::f32;
  Direction dir = Direction::fwd;
  std::vector<Arg> args;  // in name order

  std::string name() const;
  bool has(const std::string& key) const;
  const std::string& get(const std::string& key) const;  // throws hotops::Error when absent
  std::int64_t get_int(const std::string& key) const;
  std::optional<std::int64_t> batch() const;  // the `batch` arg, where the problem has one
  // Seed of the problem's inputs: the global seed (--hotops_seed) mixed with the name less its
  // backend segment, so that every backend computes on the same numbers.
  std::uint64_t seed() const;
};

// What one execution must do: the standard FLOP count, the fewest bytes it must move (each input
// read once, each output written once), and the samples of the batch it processes. Collectives:
// `bytes` is nccl-tests' size (algbw = bytes / time) and `bus_bytes` that size times the
// collective's bus factor (busbw = bus_bytes / time); 0 elsewhere.
struct Work {
  double flops = 0;
  double bytes = 0;
  double items = 1;
  double bus_bytes = 0;
};

}  // namespace hotops
