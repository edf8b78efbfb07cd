// Check macros: every library call that can fail goes through one of these, which throw
// hotops::Error with the call text, file:line and the library's own error string.
#pragma once
#include <stdexcept>
#include <string>

namespace hotops {

// What went wrong, so callers can tell a resource shortage or an unsupported case from a bug.
enum class ErrorKind { failure, unsupported, out_of_memory };

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what, ErrorKind kind = ErrorKind::failure)
      : std::runtime_error(what), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

namespace detail {
[[noreturn]] void throw_call_error(const char* library, const char* call, const char* file, int line,
                                   const std::string& message, ErrorKind kind = ErrorKind::failure);
}  // namespace detail
}  // namespace hotops

// HOTOPS_CHECK(cond, message): a broken precondition of hotops' own.
#define HOTOPS_CHECK(cond, message)                                                              \
  do {                                                                                           \
    if (!(cond)) ::hotops::detail::throw_call_error("hotops", #cond, __FILE__, __LINE__, (message)); \
  } while (0)

// The CUDA macros need the CUDA headers, so they are usable only in files that include them.
#define HOTOPS_CHECK_CUDA(call)                                                                  \
  do {                                                                                           \
    const cudaError_t hotops_err_ = (call);                                                      \
    if (hotops_err_ != cudaSuccess)                                                              \
      ::hotops::detail::throw_call_error(                                                        \
          "CUDA", #call, __FILE__, __LINE__,                                                     \
          std::string(cudaGetErrorName(hotops_err_)) + ": " + cudaGetErrorString(hotops_err_),  \
          hotops_err_ == cudaErrorMemoryAllocation ? ::hotops::ErrorKind::out_of_memory          \
                                                   : ::hotops::ErrorKind::failure);              \
  } while (0)

// After a kernel launch: the launch error, if any.
#define HOTOPS_CHECK_LAUNCH() HOTOPS_CHECK_CUDA(cudaGetLastError())

#define HOTOPS_CHECK_CUBLAS(call)                                                                \
  do {                                                                                           \
    const cublasStatus_t hotops_st_ = (call);                                                    \
    if (hotops_st_ != CUBLAS_STATUS_SUCCESS)                                                     \
      ::hotops::detail::throw_call_error(                                                        \
          "cuBLAS", #call, __FILE__, __LINE__,                                                   \
          std::string(cublasGetStatusName(hotops_st_)) + ": " + cublasGetStatusString(hotops_st_), \
          hotops_st_ == CUBLAS_STATUS_NOT_SUPPORTED ? ::hotops::ErrorKind::unsupported           \
          : hotops_st_ == CUBLAS_STATUS_ALLOC_FAILED ? ::hotops::ErrorKind::out_of_memory        \
                                                     : ::hotops::ErrorKind::failure);            \
  } while (0)

#define HOTOPS_CHECK_CUDNN(call)                                                                 \
  do {                                                                                           \
    const cudnnStatus_t hotops_st_ = (call);                                                     \
    if (hotops_st_ != CUDNN_STATUS_SUCCESS)                                                      \
      ::hotops::detail::throw_call_error(                                                        \
          "cuDNN", #call, __FILE__, __LINE__, cudnnGetErrorString(hotops_st_),                   \
          hotops_st_ == CUDNN_STATUS_NOT_SUPPORTED ? ::hotops::ErrorKind::unsupported            \
          : hotops_st_ == CUDNN_STATUS_ALLOC_FAILED ? ::hotops::ErrorKind::out_of_memory         \
                                                    : ::hotops::ErrorKind::failure);             \
  } while (0)

// oneDNN reports errors by throwing dnnl::error; this turns one into a hotops::Error.
// `unimplemented` means oneDNN has no implementation for this case on this CPU.
#define HOTOPS_CHECK_DNNL(...)                                                                   \
  [&]() -> decltype(auto) {                                                                      \
    try {                                                                                        \
      return __VA_ARGS__;                                                                        \
    } catch (const dnnl::error& hotops_e_) {                                                     \
      ::hotops::detail::throw_call_error(                                                        \
          "oneDNN", #__VA_ARGS__, __FILE__, __LINE__,                                            \
          std::string(::hotops::detail::dnnl_status_name(hotops_e_.status)) + ": " +             \
              hotops_e_.what(),                                                                  \
          hotops_e_.status == dnnl_unimplemented ? ::hotops::ErrorKind::unsupported              \
          : hotops_e_.status == dnnl_out_of_memory ? ::hotops::ErrorKind::out_of_memory          \
                                                   : ::hotops::ErrorKind::failure);              \
    }                                                                                            \
  }()

namespace hotops::detail {
const char* dnnl_status_name(int status);
}
