// The GPU runtime of a build without CUDA: no device, and a clear reason why.
#include "hotops/check.h"
#include "hotops/gpu.h"
#include "hotops/trace.h"

namespace hotops::gpu {

bool available(std::string* why) {
  if (why) *why = "this build of hotops has no CUDA backend (configured with HOTOPS_WITH_CUDA=OFF or no CUDA found)";
  return false;
}

Info info() { throw Error("no CUDA backend in this build", ErrorKind::unsupported); }
int device_count() { return 0; }
void use_device(int, int) { throw Error("this build of hotops has no CUDA backend", ErrorKind::unsupported); }
std::string device_description() { return "none"; }

struct Timer::Impl {};
Timer::Timer(Case&, const TimerOptions&) : impl_(nullptr) {
  throw Error("no CUDA backend in this build", ErrorKind::unsupported);
}
double Timer::mean_clock_mhz() const { return 0; }
long Timer::discarded_samples() const { return 0; }
Timer::~Timer() = default;
double Timer::sample() { return 0; }
DeviceBuffer::DeviceBuffer(std::size_t) { throw Error("no CUDA backend in this build", ErrorKind::unsupported); }
DeviceBuffer::DeviceBuffer(const HostBuffer&) : DeviceBuffer(std::size_t(0)) {}
DeviceBuffer::~DeviceBuffer() = default;
void DeviceBuffer::upload(const HostBuffer&) {}
void DeviceBuffer::download(HostBuffer&) const {}
void DeviceBuffer::poison() {}
void set_shuffle_layout(bool) {}
void seed_layout(std::uint64_t) {}
void synchronize() {}
bool context_lost(std::string*) { return false; }
Memory memory() { return {}; }
trace::Breakdown measure_breakdown(Case&, double, int) {
  throw Error("no CUDA backend in this build", ErrorKind::unsupported);
}
void launch_test_fault(const std::string&) { throw Error("no CUDA backend in this build", ErrorKind::unsupported); }

}  // namespace hotops::gpu
