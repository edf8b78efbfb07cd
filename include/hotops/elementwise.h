// The problem shapes of the elementwise families (gelu, pointwise): a real model's activation
// tensor, or a flat run of N elements; only the element count matters to the ops.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "hotops/check.h"
#include "hotops/problem.h"

namespace hotops::elementwise {

// An activation tensor of a real model: [batch, sample...] with the default batch.
struct NamedShape {
  std::string name;
  std::vector<std::int64_t> sample;  // dims of one sample
  std::int64_t batch;
};

// shape:<name>/batch:B/dims:Bx<sample dims>.
inline std::vector<Arg> model_args(const std::string& name, std::int64_t batch, const std::vector<std::int64_t>& sample) {
  std::string dims = std::to_string(batch);
  for (std::int64_t d : sample) dims += "x" + std::to_string(d);
  return {{"shape", name}, {"batch", std::to_string(batch)}, {"dims", dims}};
}

// shape:flat/elements:N, and offset:<elements> where the tensors do not start their buffers.
inline std::vector<Arg> flat_args(std::int64_t elements, std::int64_t offset = 0) {
  std::vector<Arg> a{{"shape", "flat"}, {"elements", std::to_string(elements)}};
  if (offset != 0) a.push_back({"offset", std::to_string(offset)});
  return a;
}

// The benchmark problems: each named shape at its default batch or at each of `batches`, then the
// flat sweep; `expand(args, out)` appends the problems of one shape's args.
template <class FlatSizes, class Expand>
std::vector<Problem> benchmark_problems(const std::vector<NamedShape>& shapes, const FlatSizes& flat_elements,
                                        const std::vector<std::int64_t>& batches, Expand expand) {
  std::vector<Problem> out;
  for (const NamedShape& ns : shapes)
    for (std::int64_t b : batches.empty() ? std::vector<std::int64_t>{ns.batch} : batches)
      expand(model_args(ns.name, b, ns.sample), out);
  for (std::int64_t n : flat_elements) expand(flat_args(n), out);
  return out;
}

// The tensor's element count (the product of dims, or elements) and the offset of its first element.
struct Extent {
  std::int64_t elements = 1;
  std::int64_t offset = 0;
};
inline Extent extent_of(const Problem& p) {
  Extent e;
  if (p.has("dims")) {
    const std::string& dims = p.get("dims");
    for (std::size_t pos = 0; pos <= dims.size();) {
      const std::size_t end = std::min(dims.find('x', pos), dims.size());
      e.elements *= std::stoll(dims.substr(pos, end - pos));
      pos = end + 1;
    }
    if (p.batch()) HOTOPS_CHECK(std::stoll(dims) == *p.batch(), "dims must start with the batch: " + p.name());
  } else {
    e.elements = p.get_int("elements");
  }
  if (p.has("offset")) e.offset = p.get_int("offset");
  HOTOPS_CHECK(e.elements > 0 && e.offset >= 0, "bad " + p.op + " shape: " + p.name());
  return e;
}

}  // namespace hotops::elementwise
