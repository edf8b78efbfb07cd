// The error path shared by every check macro.
#include "hotops/check.h"

#include <dnnl_types.h>

namespace hotops::detail {

void throw_call_error(const char* library, const char* call, const char* file, int line,
                      const std::string& message, ErrorKind kind) {
  std::string where = file;
  if (const auto slash = where.find_last_of('/'); slash != std::string::npos) where.erase(0, slash + 1);
  throw Error(std::string(library) + " error: " + message + " in `" + call + "` at " + where + ":" +
                  std::to_string(line),
              kind);
}

const char* dnnl_status_name(int status) {
  switch (status) {
    case dnnl_success: return "success";
    case dnnl_out_of_memory: return "out_of_memory";
    case dnnl_invalid_arguments: return "invalid_arguments";
    case dnnl_unimplemented: return "unimplemented";
    case dnnl_iterator_ends: return "iterator_ends";
    case dnnl_runtime_error: return "runtime_error";
    case dnnl_not_required: return "not_required";
    default: return "unknown_status";
  }
}

}  // namespace hotops::detail
