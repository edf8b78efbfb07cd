// Problem names and argument access.
#include "hotops/problem.h"

#include "hotops/buffer.h"
#include "hotops/check.h"

namespace hotops {

const char* backend_name(Backend b) { return b == Backend::cpu ? "cpu" : "cuda"; }

const char* direction_name(Direction d) {
  switch (d) {
    case Direction::fwd: return "fwd";
    case Direction::bwd_data: return "bwd_data";
    case Direction::bwd_weight: return "bwd_weight";
    case Direction::bwd: return "bwd";
    case Direction::infer: return "infer";
    case Direction::train: return "train";
    case Direction::step: return "step";
  }
  return "?";
}

std::string Problem::name() const {
  std::string n = op + "/" + backend_name(backend) + "/" + dtype_name(dtype) + "/" + direction_name(dir);
  for (const Arg& a : args) n += "/" + a.key + ":" + a.value;
  return n;
}

bool Problem::has(const std::string& key) const {
  for (const Arg& a : args)
    if (a.key == key) return true;
  return false;
}

const std::string& Problem::get(const std::string& key) const {
  for (const Arg& a : args)
    if (a.key == key) return a.value;
  throw Error("problem " + name() + " has no arg '" + key + "'");
}

std::int64_t Problem::get_int(const std::string& key) const { return std::stoll(get(key)); }

std::optional<std::int64_t> Problem::batch() const {
  if (!has("batch")) return std::nullopt;
  return get_int("batch");
}

std::uint64_t Problem::seed() const {
  std::string key = op + "/" + dtype_name(dtype) + "/" + direction_name(dir);
  for (const Arg& a : args) key += "/" + a.key + ":" + a.value;
  std::uint64_t h = 1469598103934665603ull ^ global_seed();  // FNV-1a
  for (unsigned char c : key) h = (h ^ c) * 1099511628211ull;
  return h;
}

}  // namespace hotops
