// libFuzzer target of hotops-compare's input path: any bytes go through the JSON reading, and
// what is read goes through the diff, the speed-up grouping and every output format, as a user's
// file would. Bad input may only ever end in InputError; anything else is a bug.
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>

#include "compare/src/analysis.h"
#include "compare/src/report.h"
#include "compare/src/run.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace hotops::compare;
  const std::string text(reinterpret_cast<const char*>(data), size);
  Run run;
  try {
    run = parse_run(text, "fuzz.json");
  } catch (const InputError&) {
    return 0;  // the one way bad input is allowed to end
  }
  std::ostringstream sink;
  const Diff d = diff(run, run, parse_prices("cpu=1,cuda=2"));
  for (Format f : {Format::console, Format::md, Format::csv, Format::json}) {
    Style s;
    s.format = f;
    print_diff(sink, d, run, run, s);
    print_speedup(sink, speedup(run, run, parse_prices("cpu=1,cuda=2")), s);
    print_gate(sink, gate(run, run, GateOptions{}), GateOptions{}, s);
  }
  export_run(sink, run, Tracker::github_action_benchmark);
  export_run(sink, run, Tracker::bencher);
  return 0;
}
