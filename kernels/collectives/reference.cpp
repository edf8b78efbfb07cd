// The collectives' exact inputs and results, computed on the host from the inputs' definition.
#include "kernels/collectives/collectives.h"

namespace hotops::collectives {
namespace {

std::uint64_t mix(std::uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

double input_value(DType t, std::uint64_t seed, int rank, std::size_t i) {
  const std::uint64_t h = mix(mix(seed ^ (static_cast<std::uint64_t>(rank) << 48)) + i);
  return 1.0 + static_cast<double>(h % (t == DType::bf16 ? 31 : 4095));
}

double expected(const Shape& s, std::uint64_t seed, std::size_t i) {
  switch (s.op) {
    case Kind::allreduce: {
      double sum = 0;
      for (int q = 0; q < s.gpus; ++q) sum += input_value(s.dtype, seed, q, i);
      return sum;
    }
    case Kind::reduce_scatter: {
      const std::size_t at = static_cast<std::size_t>(s.rank) * s.recv_count() + i;
      double sum = 0;
      for (int q = 0; q < s.gpus; ++q) sum += input_value(s.dtype, seed, q, at);
      return sum;
    }
    case Kind::allgather: {
      const std::size_t n = s.send_count();
      return input_value(s.dtype, seed, static_cast<int>(i / n), i % n);
    }
    case Kind::broadcast:
      return input_value(s.dtype, seed, 0, i);
  }
  return 0;
}

}  // namespace hotops::collectives
