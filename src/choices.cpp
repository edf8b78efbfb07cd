// The choices file (hotops/choices.h): read whole at open, appended a line a new choice.
#include "hotops/choices.h"

#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <utility>

#include "hotops/check.h"

namespace hotops {
namespace {

struct Store {
  std::mutex mutex;
  std::string path;
  std::map<std::pair<std::string, std::string>, std::string> hex;  // (kind, key) -> bytes in hex
};
Store& store() {
  static Store s;
  return s;
}

bool is_hex(const std::string& s) {
  if (s.empty() || s.size() % 2) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

// "conv\tKEY\tHEX" split at its two tabs; false for any other shape.
bool split(const std::string& line, std::string& kind, std::string& key, std::string& hex) {
  const auto a = line.find('\t');
  const auto b = a == std::string::npos ? a : line.find('\t', a + 1);
  if (b == std::string::npos || line.find('\t', b + 1) != std::string::npos) return false;
  kind = line.substr(0, a), key = line.substr(a + 1, b - a - 1), hex = line.substr(b + 1);
  return !kind.empty() && !key.empty() && is_hex(hex);
}

}  // namespace

std::string open_choices(const std::string& path, const std::string& machine) {
  Store& s = store();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.path.clear(), s.hex.clear();
  if (path.empty()) return "";
  const std::string where = "hotops: --hotops_choices=" + path;
  bool has_machine = false;
  if (std::ifstream in{path}) {
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) {
      if (line.empty() || line[0] == '#') continue;
      if (!has_machine) {
        const std::string head = "machine\t";
        if (line.rfind(head, 0) != 0) return where + ": line " + std::to_string(n) + " is not the machine line";
        if (line.substr(head.size()) != machine)
          return where + ": its choices were timed on another machine (" + line.substr(head.size()) + "; this one: " +
                 machine + "); give another file";
        has_machine = true;
        continue;
      }
      std::string kind, key, hex;
      if (!split(line, kind, key, hex)) return where + ": line " + std::to_string(n) + " is not KIND<TAB>KEY<TAB>HEX";
      s.hex[{kind, key}] = hex;
    }
    if (in.bad()) return where + ": reading it failed";
  }
  std::FILE* f = std::fopen(path.c_str(), "a");
  if (!f) return where + ": cannot write it";
  const bool ok = has_machine || std::fprintf(f, "# hotops: the setup-time searches' choices (--hotops_choices)\nmachine\t%s\n",
                                              machine.c_str()) > 0;
  if (std::fclose(f) != 0 || !ok) return where + ": cannot write it";
  s.path = path;
  return "";
}

bool stored_choice(const std::string& kind, const std::string& key, void* out, std::size_t size) {
  Store& s = store();
  std::lock_guard<std::mutex> lock(s.mutex);
  const auto hit = s.hex.find({kind, key});
  if (hit == s.hex.end()) return false;
  const std::string& hex = hit->second;
  HOTOPS_CHECK(hex.size() == 2 * size, "--hotops_choices=" + s.path + ": a " + kind + " choice of " +
                                           std::to_string(hex.size() / 2) + " bytes where this build's has " +
                                           std::to_string(size) + " (a file of another hotops build)");
  auto* bytes = static_cast<unsigned char*>(out);
  for (std::size_t i = 0; i < size; ++i) bytes[i] = static_cast<unsigned char>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  return true;
}

void store_choice(const std::string& kind, const std::string& key, const void* data, std::size_t size) {
  Store& s = store();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.path.empty() || key.empty() || key.find_first_of("\t\n") != std::string::npos) return;
  std::string hex;
  const auto* bytes = static_cast<const unsigned char*>(data);
  static const char digits[] = "0123456789abcdef";
  for (std::size_t i = 0; i < size; ++i) hex += digits[bytes[i] >> 4], hex += digits[bytes[i] & 15];
  s.hex[{kind, key}] = hex;
  std::FILE* f = std::fopen(s.path.c_str(), "a");
  HOTOPS_CHECK(f, "--hotops_choices=" + s.path + ": cannot append to it");
  const bool ok = std::fprintf(f, "%s\t%s\t%s\n", kind.c_str(), key.c_str(), hex.c_str()) > 0;
  HOTOPS_CHECK(std::fclose(f) == 0 && ok, "--hotops_choices=" + s.path + ": writing to it failed");
}

}  // namespace hotops
