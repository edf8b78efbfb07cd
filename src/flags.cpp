// Parsing of --hotops_* flags: strict values, one clear message per mistake.
#include "hotops/flags.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <regex>

namespace hotops {
namespace {

constexpr std::int64_t kMaxBatch = 1 << 20;

std::int64_t parse_int(const std::string& flag, const std::string& v, std::int64_t lo, std::int64_t hi,
                       const char* expect) {
  if (v.empty() || v.find_first_not_of("0123456789") != std::string::npos)
    throw FlagError("hotops: bad value '" + v + "' for --" + flag + ": expected " + expect);
  errno = 0;
  const long long x = std::strtoll(v.c_str(), nullptr, 10);
  if (errno == ERANGE || x < lo || x > hi)
    throw FlagError("hotops: bad value '" + v + "' for --" + flag + ": expected " + expect);
  return x;
}

bool parse_bool(const std::string& flag, const std::string& v) {
  if (v == "1" || v == "true") return true;
  if (v == "0" || v == "false") return false;
  throw FlagError("hotops: bad value '" + v + "' for --" + flag + ": expected 0 or 1");
}

FlagError bad_value(const std::string& flag, const std::string& v, const std::string& expect) {
  return FlagError("hotops: bad value '" + v + "' for --" + flag + ": expected " + expect);
}

// Google Benchmark's reading of a boolean flag, refusing what it would silently take as true.
bool parse_benchmark_bool(const std::string& flag, const std::string& v) {
  static const char* const yes[] = {"", "1", "true", "t", "yes", "y", "on"};
  static const char* const no[] = {"0", "false", "f", "no", "n", "off"};
  std::string lower = v;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const char* y : yes)
    if (lower == y) return true;
  for (const char* n : no)
    if (lower == n) return false;
  throw bad_value(flag, v, "true or false");
}

void check_seconds(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || !std::isfinite(x) || x < 0) throw bad_value(flag, v, "seconds, a number >= 0");
}

// The file Google Benchmark will write: its folder must exist and be writable, and the file, if it
// exists, must be a writable regular file.
void check_output_path(const std::string& flag, const std::string& v) {
  if (v.empty()) throw bad_value(flag, v, "a file name");
  struct stat st {};
  if (::stat(v.c_str(), &st) == 0) {
    if (!S_ISREG(st.st_mode)) throw FlagError("hotops: --" + flag + "=" + v + " is not a regular file");
    if (::access(v.c_str(), W_OK) != 0) throw FlagError("hotops: --" + flag + "=" + v + " is not writable: " + std::strerror(errno));
    return;
  }
  const auto slash = v.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : v.substr(0, slash);
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    throw FlagError("hotops: --" + flag + "=" + v + ": no such folder '" + dir + "'");
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    throw FlagError("hotops: --" + flag + "=" + v + ": folder '" + dir + "' is not writable: " + std::strerror(errno));
}

}  // namespace

MinTime parse_min_time(const std::string& where, const std::string& v) {
  const FlagError bad("hotops: bad value '" + v + "' for " + where +
                      ": expected seconds (0.5 or 0.5s) or a count of iterations (100x)");
  MinTime t;
  if (!v.empty() && v.back() == 'x') {
    const std::string n = v.substr(0, v.size() - 1);
    if (n.empty() || n.find_first_not_of("0123456789") != std::string::npos) throw bad;
    errno = 0;
    t.iterations = std::strtoll(n.c_str(), nullptr, 10);
    if (errno == ERANGE || t.iterations < 1) throw bad;
    return t;
  }
  const std::string seconds = !v.empty() && v.back() == 's' ? v.substr(0, v.size() - 1) : v;
  char* end = nullptr;
  t.seconds = std::strtod(seconds.c_str(), &end);
  if (seconds.empty() || *end != '\0' || !std::isfinite(t.seconds) || t.seconds < 0) throw bad;
  return t;
}

std::string min_time_arg(const MinTime& t, int version) {
  const bool suffixed = version >= 108;  // Google Benchmark 1.8 reads "<float>s" and "<integer>x"
  if (t.iterations > 0) return suffixed ? "--benchmark_min_time=" + std::to_string(t.iterations) + "x" : "";
  // The shortest text that reads back as the same number, so that the flag looks as typed.
  char text[40];
  for (int digits = 6; digits <= 17; ++digits) {
    std::snprintf(text, sizeof text, "%.*g", digits, t.seconds);
    if (std::strtod(text, nullptr) == t.seconds) break;
  }
  return std::string("--benchmark_min_time=") + text + (suffixed ? "s" : "");
}

namespace {

// Checks one Google Benchmark flag's value as Google Benchmark would take it, noting in `b` what
// bench needs to know; throws FlagError naming `flag`.
void check_benchmark_flag(const std::string& flag, const std::string& v, BenchmarkFlags& b) {
  if (flag == "benchmark_format" || flag == "benchmark_out_format") {
    if (v != "console" && v != "json" && v != "csv") throw bad_value(flag, v, "console, json or csv");
    if (flag == "benchmark_out_format") b.out_format = v;
  } else if (flag == "benchmark_time_unit") {
    if (v != "ns" && v != "us" && v != "ms" && v != "s") throw bad_value(flag, v, "ns, us, ms or s");
    b.has_time_unit = true;
  } else if (flag == "benchmark_repetitions") {
    parse_int(flag, v, 1, 1000000, "a count from 1 to 1000000");
  } else if (flag == "benchmark_min_time") {
    b.min_time = parse_min_time("--" + flag, v);
    b.has_min_time = true;
  } else if (flag == "benchmark_min_warmup_time") {
    check_seconds(flag, v);  // a plain number of seconds in every release, 1.8's included
  } else if (flag == "benchmark_list_tests") {
    b.list_tests = parse_benchmark_bool(flag, v);
  } else if (flag == "benchmark_enable_random_interleaving" || flag == "benchmark_report_aggregates_only" ||
             flag == "benchmark_display_aggregates_only" || flag == "benchmark_counters_tabular") {
    parse_benchmark_bool(flag, v);
  } else if (flag == "benchmark_out") {
    check_output_path(flag, v);
    b.out = v;
  } else if (flag == "benchmark_filter") {
    // Google Benchmark's filter: a POSIX extended regex, after an optional '-' that negates it.
    try {
      const std::regex re(!v.empty() && v[0] == '-' ? v.substr(1) : v, std::regex::extended);
    } catch (const std::regex_error& e) {
      throw bad_value(flag, v, std::string("a regular expression (") + e.what() + ")");
    }
  }
}

}  // namespace

BenchmarkFlags check_benchmark_flags(int argc, char** argv) {
  BenchmarkFlags b;
  // Google Benchmark takes each flag's default from BENCHMARK_<FLAG> in the environment: a value
  // there is checked as the flag's would be (a flag on the command line overrides it, and is
  // checked below). BENCHMARK_MIN_TIME and BENCHMARK_TIME_UNIT bench reads itself.
  for (const char* flag : {"benchmark_format", "benchmark_out_format", "benchmark_repetitions", "benchmark_min_warmup_time",
                           "benchmark_list_tests", "benchmark_enable_random_interleaving",
                           "benchmark_report_aggregates_only", "benchmark_display_aggregates_only",
                           "benchmark_counters_tabular", "benchmark_out", "benchmark_filter", "benchmark_time_unit"}) {
    std::string var = "BENCHMARK_" + std::string(flag + 10);
    for (char& c : var) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    const char* v = std::getenv(var.c_str());
    if (!v) continue;
    try {
      BenchmarkFlags from_env;
      check_benchmark_flag(flag, v, from_env);
      b.list_tests |= from_env.list_tests;
      if (!from_env.out.empty()) b.out = from_env.out;
      if (std::string(flag) == "benchmark_out_format") b.out_format = from_env.out_format;
    } catch (const FlagError& e) {
      throw FlagError(std::string(e.what()) + " (from " + var + " in the environment)");
    }
  }
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help") b.help = true;
    if (a.rfind("--benchmark_", 0) != 0) continue;
    const auto eq = a.find('=');
    const std::string flag = a.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    if (eq == std::string::npos) {
      if (flag == "benchmark_list_tests") b.list_tests = true;
      continue;  // Google Benchmark refuses a valued flag without its value itself
    }
    check_benchmark_flag(flag, a.substr(eq + 1), b);
  }
  return b;
}

const char* flags_help() {
  return "hotops flags (Google Benchmark's --benchmark_* flags work as documented):\n"
         "  --hotops_batch=LIST    comma-separated batch sizes replacing every benchmark's batch axis\n"
         "  --hotops_verify=0|1    verify each output against the reference before timing (default 1)\n"
         "  --hotops_cold_l2[=0|1] flush the GPU L2 before each timed sample (default 0: warm)\n"
         "  --hotops_throttle_threshold=F  discard GPU samples taken below F x the max SM clock,\n"
         "                         letting the GPU recover first (default 0.9; 0 keeps every sample)\n"
         "  --hotops_roofline=0|1  measure copy bandwidth and GEMM peak first; report fractions (default 1)\n"
         "  --hotops_runs_per_sample=N  GPU executions per timed sample: 0 (default) enough for 0.5 ms,\n"
         "                         back to back in a CUDA graph; 1 times each execution on its own\n"
         "  --hotops_shuffle_layout=0|1  place each GPU buffer at a random offset, drawn again at\n"
         "                         every setup of a case from its seed and the setup's number (default 1)\n"
         "  --hotops_choices=FILE  keep the CUDA plans' algorithm choices (cuDNN, cublasLt) in FILE: a search\n"
         "                         writes its choice there, later processes read it instead of searching, so\n"
         "                         runs that share FILE run the same algorithms (one GPU; docs/timing.md)\n"
         "  --hotops_cpu_ftz=0|1   CPU threads flush subnormal floats to zero (x86 FTZ and DAZ; default 1,\n"
         "                         as TensorFlow's threads; 0: IEEE subnormals, PyTorch's default; docs/timing.md)\n"
         "  --hotops_gpus=G        run on G GPUs of this machine, one process per GPU (it starts the other\n"
         "                         G-1), for the multi-GPU entries (gpus:G); docs/scaling.md\n"
         "  --hotops_max_noise=P   stopping rule: sample each entry until its samples' noise (relative\n"
         "                         standard deviation) is below P percent, or has settled, or the timeout\n"
         "                         (default, and 0: off; --benchmark_min_time governs); docs/timing.md\n"
         "  --hotops_min_samples=N with --hotops_max_noise: at least N samples an entry (default 10)\n"
         "  --hotops_timeout=S     with --hotops_max_noise: at most S seconds of samples an entry (default 15)\n"
         "  --hotops_threads=N     CPU threads for oneDNN and hotops' loops (default: all cores)\n"
         "  --hotops_seed=N        seed of every random input (default 20261122)\n"
         "  --hotops_help          this text\n";
}

Options parse_flags(int& argc, char** argv) {
  Options o;
  bool ruled_noise = false, ruled_samples = false, ruled_timeout = false;
  int out = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--hotops_", 0) != 0) {
      argv[out++] = argv[i];
      continue;
    }
    const auto eq = a.find('=');
    const std::string flag = a.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    const bool has_value = eq != std::string::npos;
    const std::string v = has_value ? a.substr(eq + 1) : "";
    auto need_value = [&] {
      if (!has_value) throw FlagError("hotops: --" + flag + " needs a value (--" + flag + "=...)");
    };
    if (flag == "hotops_batch") {
      need_value();
      o.batches.clear();
      std::size_t pos = 0;
      while (true) {
        const auto comma = v.find(',', pos);
        o.batches.push_back(parse_int(flag, v.substr(pos, comma - pos), 1, kMaxBatch,
                                      "a comma-separated list of batch sizes from 1 to 1048576, e.g. 1,8,32"));
        if (comma == std::string::npos) break;
        pos = comma + 1;
      }
    } else if (flag == "hotops_verify") {
      need_value();
      o.verify = parse_bool(flag, v);
    } else if (flag == "hotops_roofline") {
      need_value();
      o.roofline = parse_bool(flag, v);
    } else if (flag == "hotops_cold_l2") {
      o.cold_l2 = has_value ? parse_bool(flag, v) : true;
    } else if (flag == "hotops_throttle_threshold") {
      need_value();
      char* end = nullptr;
      const double f = std::strtod(v.c_str(), &end);
      if (v.empty() || *end != '\0' || !(f >= 0 && f <= 1))
        throw FlagError("hotops: bad value '" + v + "' for --" + flag + ": expected a fraction from 0 to 1 (0: keep throttled samples)");
      o.throttle_threshold = f;
    } else if (flag == "hotops_max_noise" || flag == "hotops_timeout") {
      need_value();
      char* end = nullptr;
      const double f = std::strtod(v.c_str(), &end);
      const bool noise = flag == "hotops_max_noise";
      const double most = noise ? 100 : 86400;
      // A target of 0 turns the rule off, as leaving the flag out does.
      if (v.empty() || *end != '\0' || !((f > 0 || (noise && f == 0)) && f <= most))
        throw FlagError("hotops: bad value '" + v + "' for --" + flag + ": expected " +
                        (noise ? "a percentage from 0 (off) to 100, e.g. 0.5" : "seconds above 0, at most 86400"));
      (noise ? o.max_noise : o.timeout) = f;
      (noise ? ruled_noise : ruled_timeout) = f > 0;
    } else if (flag == "hotops_min_samples") {
      need_value();
      o.min_samples = static_cast<int>(parse_int(flag, v, 2, 1000000, "a count from 2 to 1000000"));
      ruled_samples = true;
    } else if (flag == "hotops_choices") {
      need_value();
      if (v.empty()) throw bad_value(flag, v, "a file name");
      o.choices = v;
    } else if (flag == "hotops_shuffle_layout") {
      need_value();
      o.shuffle_layout = parse_bool(flag, v);
    } else if (flag == "hotops_cpu_ftz") {
      need_value();
      o.cpu_ftz = parse_bool(flag, v);
    } else if (flag == "hotops_runs_per_sample") {
      need_value();
      o.runs_per_sample = static_cast<int>(parse_int(flag, v, 0, 10000, "a count from 0 (automatic) to 10000"));
    } else if (flag == "hotops_gpus") {
      need_value();
      o.gpus = static_cast<int>(parse_int(flag, v, 1, 1024, "a GPU count from 1 to 1024"));
    } else if (flag == "hotops_threads") {
      need_value();
      o.threads = static_cast<int>(parse_int(flag, v, 1, 4096, "a thread count from 1 to 4096"));
    } else if (flag == "hotops_seed") {
      need_value();
      o.seed = static_cast<std::uint64_t>(parse_int(flag, v, 0, INT64_MAX, "a non-negative integer"));
    } else if (flag == "hotops_help") {
      if (has_value) throw FlagError("hotops: --hotops_help takes no value");
      o.help = true;
    } else {
      throw FlagError("hotops: unknown flag --" + flag + " (--hotops_help lists hotops' flags)");
    }
  }
  if ((ruled_samples || ruled_timeout) && !ruled_noise)
    throw FlagError(std::string("hotops: --") + (ruled_samples ? "hotops_min_samples" : "hotops_timeout") +
                    " belongs to the stopping rule, which --hotops_max_noise=P (P above 0) turns on");
  argc = out;
  argv[argc] = nullptr;
  return o;
}

}  // namespace hotops
