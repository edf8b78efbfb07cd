// The CUDA runtime of hotops: device discovery, the shared stream and handles, device buffers,
// and the device-time sampler used by every CUDA benchmark.
#include <cudnn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <thread>

#include "hotops/cuda_util.h"
#include "hotops/cudnn_util.h"
#include "hotops/gpu.h"
#include "hotops/op.h"
#include "hotops/trace.h"

namespace hotops::gpu {
namespace {

std::string version_string(int v, int major_div, int minor_div, int minor_mod) {
  return std::to_string(v / major_div) + "." + std::to_string((v / minor_div) % minor_mod);
}

// Spins until `ns` nanoseconds of device time have passed, so that the work queued behind it is
// already in the stream when the GPU reaches it: nothing after it waits on the host. It also
// measures the SM clock while it spins (cycles over nanoseconds), which the sampler uses to
// recognise samples taken while the GPU was throttled.
__global__ void hold_kernel(unsigned long long ns, unsigned long long* probe) {
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  const long long c0 = clock64();
  for (;;) {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    if (now - start >= ns) break;
    __nanosleep(500);
  }
  probe[0] = static_cast<unsigned long long>(clock64() - c0);
  probe[1] = now - start;
}

// The device side of assert(), which NDEBUG compiles out of this Release build: a PTX system call.
extern "C" __device__ void __assertfail(const char* message, const char* file, unsigned line, const char* function,
                                        std::size_t char_size);

// Test-only faults (launch_test_fault). `bad` is an address no allocation maps; `offset` is 1 at
// run time, so the compiler cannot see that the access is misaligned.
__global__ void fault_kernel(int kind, float* bad, float* valid, int offset) {
  switch (kind) {
    case 0: *bad = 1.f; break;                                                    // illegal address
    case 1: *reinterpret_cast<float*>(reinterpret_cast<char*>(valid) + offset) = 1.f; break;  // misaligned
    case 2: __trap(); break;
    case 3: __assertfail("hotops test fault", __FILE__, __LINE__, "fault_kernel", 1); break;  // assert(false)
    default: break;
  }
}

std::atomic<std::size_t> g_held_bytes{0};  // by DeviceBuffers

}  // namespace

bool is_sticky(cudaError_t e) {
  switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchTimeout:
    case cudaErrorAssert:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchFailure:
#if CUDART_VERSION >= 13000
    case cudaErrorTensorMemoryLeak:
#endif
    case cudaErrorMpsClientTerminated:
    case cudaErrorECCUncorrectable:
      return true;
    default:
      return false;
  }
}

bool context_lost(std::string* error) {
  if (!available()) return false;
  // A sticky error is returned by every call, cudaGetLastError included; a non-sticky one is
  // returned once and cleared. Synchronising surfaces a fault of work still in flight.
  cudaError_t e = cudaGetLastError();
  if (!is_sticky(e)) e = cudaDeviceSynchronize();
  if (!is_sticky(e)) {
    cudaGetLastError();  // clear what the synchronisation may have reported
    return false;
  }
  if (error) *error = std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
  return true;
}

Memory memory() {
  Memory m;
  if (!available()) return m;
  if (cudaMemGetInfo(&m.free, &m.total) != cudaSuccess) cudaGetLastError();
  m.held = g_held_bytes.load();
  return m;
}

void launch_test_fault(const std::string& kind) {
  static const char* const kinds[] = {"illegal_address", "misaligned_address", "trap", "assert"};
  static DeviceBuffer valid(64);
  if (kind == "out_of_memory") {
    DeviceBuffer huge(std::size_t(1) << 50);  // 1 PiB: fails with hotops' out-of-memory message
    return;
  }
  if (kind == "bad_launch") {
    fault_kernel<<<1, 4096, 0, stream()>>>(-1, nullptr, nullptr, 0);  // more threads than a block can have
    HOTOPS_CHECK_LAUNCH();
    return;
  }
  for (int k = 0; k < 4; ++k) {
    if (kind != kinds[k]) continue;
    // Far beyond any allocation: unmapped on every GPU hotops runs on.
    auto* bad = reinterpret_cast<float*>(reinterpret_cast<std::uintptr_t>(valid.get()) + (std::uintptr_t(1) << 46));
    fault_kernel<<<1, 1, 0, stream()>>>(k, bad, valid.as<float>(), 1);
    HOTOPS_CHECK_LAUNCH();
    return;
  }
  throw Error("no test fault named '" + kind + "'", ErrorKind::unsupported);
}

bool available(std::string* why) {
  static std::string reason = [] {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    // Without a driver the runtime reports "driver version is insufficient": the driver version it
    // reads is then 0, which tells that case apart from a driver that is really too old.
    int driver = 0;
    if (e != cudaSuccess && cudaDriverGetVersion(&driver) == cudaSuccess && driver == 0)
      return std::string("no NVIDIA driver found");
    if (e != cudaSuccess) return std::string("no CUDA device: ") + cudaGetErrorString(e);
    if (n == 0) return std::string("no CUDA device found");
    return std::string();
  }();
  if (why) *why = reason;
  return reason.empty();
}

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

void use_device(int local_rank, int local_world) {
  const int n = device_count();
  std::string why;
  if (!available(&why)) throw Error(why);
  int device = local_rank;
  if (n == 1 && local_rank > 0) device = 0;  // the launcher shows each process its own GPU
  if (device >= n)
    throw Error("local rank " + std::to_string(local_rank) + " needs CUDA device " + std::to_string(device) +
                " but this process sees " + std::to_string(n) + " (CUDA_VISIBLE_DEVICES" +
                (local_world > n ? ", or fewer ranks on this machine: " + std::to_string(local_world) + " started" : "") +
                ")");
  HOTOPS_CHECK_CUDA(cudaSetDevice(device));
}

std::string device_description() {
  int device = 0;
  HOTOPS_CHECK_CUDA(cudaGetDevice(&device));
  cudaDeviceProp p{};
  HOTOPS_CHECK_CUDA(cudaGetDeviceProperties(&p, device));
  char bus[32] = "";
  HOTOPS_CHECK_CUDA(cudaDeviceGetPCIBusId(bus, sizeof bus, device));
  return std::string(p.name) + " (bus " + bus + ")";
}

Info info() {
  Info i;
  cudaDeviceProp p{};
  int device = 0;
  HOTOPS_CHECK_CUDA(cudaGetDevice(&device));
  HOTOPS_CHECK_CUDA(cudaGetDeviceProperties(&p, device));
  i.name = p.name;
  i.sm_count = p.multiProcessorCount;
  i.memory_bytes = p.totalGlobalMem;
  i.l2_bytes = static_cast<std::size_t>(p.l2CacheSize);
  int clk = 0, mclk = 0;
  cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, device);
  cudaDeviceGetAttribute(&mclk, cudaDevAttrMemoryClockRate, device);
  i.sm_clock_mhz = clk / 1000;
  i.mem_clock_mhz = mclk / 1000;
  int drv = 0, rt = 0;
  cudaDriverGetVersion(&drv);
  cudaRuntimeGetVersion(&rt);
  i.driver_version = version_string(drv, 1000, 10, 100);
  i.runtime_version = version_string(rt, 1000, 10, 100);
  // cuBLAS and cuDNN number their releases major * 10000 + minor * 100 + patch.
  const auto release = [](int v) { return version_string(v, 10000, 100, 100) + "." + std::to_string(v % 100); };
  // 0 where cublasLt could not be loaded (src/cublas_loader.cpp): the context says so.
  const auto cublas = static_cast<int>(cublasLtGetVersion());
  i.cublas_version = cublas ? release(cublas) : std::string("none (") + cublasGetStatusString(CUBLAS_STATUS_NOT_INITIALIZED) + ")";
  i.cudnn_version = release(static_cast<int>(cudnnGetVersion()));
  return i;
}

const Limits& limits() {  // one device a process, as stream()
  static const Limits l = [] {
    int device = 0;
    Limits t;
    HOTOPS_CHECK_CUDA(cudaGetDevice(&device));
    HOTOPS_CHECK_CUDA(cudaDeviceGetAttribute(&t.sms, cudaDevAttrMultiProcessorCount, device));
    HOTOPS_CHECK_CUDA(cudaDeviceGetAttribute(&t.threads_per_sm, cudaDevAttrMaxThreadsPerMultiProcessor, device));
    HOTOPS_CHECK_CUDA(cudaDeviceGetAttribute(&t.max_grid_x, cudaDevAttrMaxGridDimX, device));
    return t;
  }();
  return l;
}

cudaStream_t stream() {
  static cudaStream_t s = [] {
    cudaStream_t t;
    HOTOPS_CHECK_CUDA(cudaStreamCreateWithFlags(&t, cudaStreamNonBlocking));
    return t;
  }();
  return s;
}

cublasLtHandle_t cublaslt() {
  static cublasLtHandle_t h = [] {
    cublasLtHandle_t t;
    HOTOPS_CHECK_CUBLAS(cublasLtCreate(&t));
    return t;
  }();
  return h;
}

cudnnHandle_t cudnn() {
  static const cudnnHandle_t h = [] {
    cudnnHandle_t created = nullptr;
    HOTOPS_CHECK_CUDNN(cudnnCreate(&created));
    HOTOPS_CHECK_CUDNN(cudnnSetStream(created, stream()));
    return created;
  }();
  return h;
}

void* cublas_workspace() {
  static DeviceBuffer ws(kCublasWorkspaceBytes);
  return ws.get();
}

void synchronize() { HOTOPS_CHECK_CUDA(cudaStreamSynchronize(stream())); }

namespace {
std::atomic<bool> g_shuffle_layout{false};

// The shuffled layout's draws on this thread (seed_layout seeds them).
std::mt19937_64& layout_rng() {
  thread_local std::mt19937_64 rng(std::random_device{}());
  return rng;
}

// A buffer's offset into its allocation while the layout is shuffled: 0 to 7 large pages (2 MiB)
// and 0 to 31 steps of 64 KiB, uniformly (alignment stays 64 KiB).
std::size_t layout_shift() {
  if (!g_shuffle_layout.load()) return 0;
  std::mt19937_64& rng = layout_rng();
  const std::size_t pages = rng() % 8;
  const std::size_t steps = rng() % 32;
  return pages * (std::size_t(2) << 20) + steps * (std::size_t(64) << 10);
}
}  // namespace

void set_shuffle_layout(bool on) { g_shuffle_layout = on; }
void seed_layout(std::uint64_t seed) { layout_rng().seed(seed); }

DeviceBuffer::DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
  if (bytes == 0) return;
  std::size_t shift = layout_shift();
  void* base = nullptr;
  cudaError_t e = cudaMalloc(&base, bytes + shift);
  if (e == cudaErrorMemoryAllocation && shift > 0) {
    // The offset must never cost a case the memory it needs: place this buffer unshifted.
    cudaGetLastError();
    shift = 0;
    e = cudaMalloc(&base, bytes);
  }
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // an allocation failure is not sticky: clear it
    const Memory m = memory();
    // What hotops holds is the case being set up (the previous one is freed first) and the
    // process-wide buffers, so held + asked is what the case needs at least.
    char buf[300];
    std::snprintf(buf, sizeof buf,
                  "out of GPU memory: allocating %.2f GiB on top of the %.2f GiB hotops holds (the case needs at "
                  "least %.2f GiB) with %.2f GiB free of %.2f GiB",
                  bytes / 1073741824.0, m.held / 1073741824.0, (m.held + bytes) / 1073741824.0, m.free / 1073741824.0,
                  m.total / 1073741824.0);
    throw Error(buf, ErrorKind::out_of_memory);
  }
  HOTOPS_CHECK_CUDA(e);
  ptr_ = static_cast<char*>(base) + shift;
  shift_ = shift;
  g_held_bytes += bytes + shift;
}

DeviceBuffer::DeviceBuffer(const HostBuffer& host) : DeviceBuffer(host.bytes()) { upload(host); }

DeviceBuffer::~DeviceBuffer() {
  if (!ptr_) return;
  cudaFree(static_cast<char*>(ptr_) - shift_);  // fails only on a lost context, where there is nothing left to free
  g_held_bytes -= bytes_ + shift_;
}

void copy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind) {
  HOTOPS_CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, kind, stream()));
  HOTOPS_CHECK_CUDA(cudaStreamSynchronize(stream()));
}

float read_float(const void* device) {
  float v = 0;
  copy(&v, device, sizeof v, cudaMemcpyDeviceToHost);
  return v;
}

void DeviceBuffer::upload(const HostBuffer& host) {
  HOTOPS_CHECK(host.bytes() <= bytes_, "upload larger than the device buffer");
  copy(ptr_, host.data(), host.bytes(), cudaMemcpyHostToDevice);
}

void DeviceBuffer::download(HostBuffer& host) const {
  HOTOPS_CHECK(host.bytes() <= bytes_, "download larger than the device buffer");
  copy(host.data(), ptr_, host.bytes(), cudaMemcpyDeviceToHost);
}

void DeviceBuffer::poison() {
  HOTOPS_CHECK_CUDA(cudaMemsetAsync(ptr_, 0xff, bytes_, stream()));
  HOTOPS_CHECK_CUDA(cudaStreamSynchronize(stream()));
}

std::string placement_key(std::initializer_list<const void*> operands) {
  std::string key;
  for (const void* p : operands) key += std::to_string(reinterpret_cast<std::uintptr_t>(p) % 256) + ",";
  int device = 0;
  HOTOPS_CHECK_CUDA(cudaGetDevice(&device));
  return key + "device " + std::to_string(device);
}

void hold(double seconds, unsigned long long* probe) {
  static DeviceBuffer unread(2 * sizeof(unsigned long long));
  hold_kernel<<<1, 1, 0, stream()>>>(static_cast<unsigned long long>(seconds * 1e9),
                                     probe ? probe : unread.as<unsigned long long>());
  HOTOPS_CHECK_LAUNCH();
}

// ---- the sampler ------------------------------------------------------------------------------

struct Timer::Impl {
  Case& c;
  bool cold = false;
  double min_clock_mhz = 0;  // samples measured below this clock are discarded
  cudaEvent_t start{}, stop{};
  cudaGraphExec_t graph{};
  DeviceBuffer flush;  // twice the L2, rewritten before each cold sample
  DeviceBuffer probe{2 * sizeof(unsigned long long)};
  double hold_seconds = 20e-6;
  double clock_sum = 0;
  long samples = 0, discarded = 0;
  explicit Impl(Case& cs) : c(cs) {}

  std::function<double(double)> agree_max;  // several ranks: the largest value over them
  // Holds the stream, then lines the ranks up (Case::align) so that the interval that follows
  // starts when every rank's GPU is there.
  void hold() {
    gpu::hold(hold_seconds, probe.as<unsigned long long>());
    c.align();
  }
  double agreed(double x) const { return agree_max ? agree_max(x) : x; }
  double probed_clock_mhz() const {
    unsigned long long v[2];
    HOTOPS_CHECK_CUDA(cudaMemcpy(v, probe.get(), sizeof v, cudaMemcpyDeviceToHost));
    return v[1] ? 1e3 * static_cast<double>(v[0]) / static_cast<double>(v[1]) : 0;
  }
};

namespace {
// A graph of `runs` back-to-back runs of the case, instantiated and uploaded.
cudaGraphExec_t capture_runs(Case& c, int runs) {
  cudaStream_t s = stream();
  cudaGraph_t g;
  HOTOPS_CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  try {
    for (int i = 0; i < runs; ++i) c.run();
  } catch (...) {
    cudaStreamEndCapture(s, &g);
    throw;
  }
  HOTOPS_CHECK_CUDA(cudaStreamEndCapture(s, &g));
  cudaGraphExec_t exec;
  HOTOPS_CHECK_CUDA(cudaGraphInstantiate(&exec, g, 0));
  HOTOPS_CHECK_CUDA(cudaGraphDestroy(g));
  HOTOPS_CHECK_CUDA(cudaGraphUpload(exec, s));
  return exec;
}
constexpr double kMaxEnqueueHoldSeconds = 20e-3;  // a run that blocks the host is not held past this
}  // namespace

Timer::Timer(Case& c, const TimerOptions& o) : impl_(new Impl(c)) {
  Impl& t = *impl_;
  t.cold = o.cold_l2;
  t.agree_max = o.agree_max;
  // Ranks that time together also enqueue the aligning collective inside the hold.
  const double hold_base = o.agree_max ? 50e-6 : 20e-6;
  t.min_clock_mhz = o.throttle_threshold * info().sm_clock_mhz;
  cudaStream_t s = stream();
  HOTOPS_CHECK_CUDA(cudaEventCreate(&t.start));
  HOTOPS_CHECK_CUDA(cudaEventCreate(&t.stop));

  // Warm-up: module loading, lazy library init, first-touch of the workspace.
  for (int i = 0; i < 2; ++i) c.run();
  synchronize();

  // What the host takes to enqueue one run. A run launched eagerly is held at least this long;
  // otherwise the GPU would wait for the host between launches and the wait would count as device
  // time (cuDNN's legacy convolution calls choose their engine on the host at every call: hundreds
  // of microseconds for a convnet step, longer than the step's device time).
  const auto h0 = std::chrono::steady_clock::now();
  c.run();
  const double enqueue = std::chrono::duration<double>(std::chrono::steady_clock::now() - h0).count();
  synchronize();
  const double eager_hold = hold_base + std::min(1.5 * enqueue, kMaxEnqueueHoldSeconds);

  // A capturable case is always timed as a graph, so a sample holds no launch gap whatever the
  // run's length; a graph of one run also sizes the samples, so that sizing sees device time only.
  if (c.capturable()) t.graph = capture_runs(c, 1);
  t.hold_seconds = t.graph ? hold_base : eager_hold;
  if (o.cold_l2) {
    t.flush = DeviceBuffer(2 * info().l2_bytes);
    return;  // one run per sample
  }
  t.hold();
  HOTOPS_CHECK_CUDA(cudaEventRecord(t.start, s));
  if (t.graph) HOTOPS_CHECK_CUDA(cudaGraphLaunch(t.graph, s));
  else c.run();
  HOTOPS_CHECK_CUDA(cudaEventRecord(t.stop, s));
  HOTOPS_CHECK_CUDA(cudaEventSynchronize(t.stop));
  float ms = 0;
  HOTOPS_CHECK_CUDA(cudaEventElapsedTime(&ms, t.start, t.stop));
  const double one = t.agreed(std::max(1e-7, ms * 1e-3));  // every rank sizes its samples alike
  launches_ = o.runs_per_sample > 0
                  ? o.runs_per_sample
                  : static_cast<int>(std::clamp(std::ceil(o.target_sample_seconds / one), 1.0, double(kMaxRunsPerSample)));

  if (t.graph && launches_ > 1) {
    HOTOPS_CHECK_CUDA(cudaGraphExecDestroy(t.graph));
    t.graph = capture_runs(c, launches_);
  } else if (!t.graph) {
    // Launched one by one: the hold must outlast the host's enqueueing of every run.
    t.hold_seconds = hold_base + std::min(launches_ * std::max(10e-6, 1.5 * enqueue), kMaxEnqueueHoldSeconds);
  }
}

bool StepGraph::capture(const std::function<void()>& body, std::string* why) {
  reset();
  cudaStream_t s = stream();
  cudaError_t e = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
  if (e != cudaSuccess) {
    *why = cudaGetErrorString(e);
    (void)cudaGetLastError();
    return false;
  }
  bool ok = true;
  try {
    body();
  } catch (const Error& err) {
    ok = false;
    *why = err.what();
  } catch (...) {  // anything else (std::bad_alloc) is not a capture problem: end the capture, pass it on
    cudaGraph_t broken = nullptr;
    cudaStreamEndCapture(s, &broken);
    if (broken) cudaGraphDestroy(broken);
    (void)cudaGetLastError();
    throw;
  }
  cudaGraph_t g = nullptr;
  e = cudaStreamEndCapture(s, &g);
  if (e != cudaSuccess && ok) ok = false, *why = cudaGetErrorString(e);
  if (ok && g) {
    e = cudaGraphInstantiate(&exec_, g, 0);
    if (e != cudaSuccess) ok = false, *why = cudaGetErrorString(e), exec_ = nullptr;
  }
  if (ok && exec_) graph_ = g;
  else if (g) cudaGraphDestroy(g);
  (void)cudaGetLastError();
  return ok && exec_;
}

void StepGraph::launch() const { HOTOPS_CHECK_CUDA(cudaGraphLaunch(exec_, stream())); }

void StepGraph::reset() {
  if (exec_) cudaGraphExecDestroy(exec_), exec_ = nullptr;
  if (graph_) cudaGraphDestroy(graph_), graph_ = nullptr;
}

Timer::~Timer() {
  if (impl_->graph) cudaGraphExecDestroy(impl_->graph);
  cudaEventDestroy(impl_->start);
  cudaEventDestroy(impl_->stop);
  delete impl_;
}

double Timer::sample() {
  Impl& t = *impl_;
  cudaStream_t s = stream();
  for (int attempt = 0;; ++attempt) {
    if (t.cold) HOTOPS_CHECK_CUDA(cudaMemsetAsync(t.flush.get(), attempt & 0xff, t.flush.bytes(), s));
    t.hold();
    HOTOPS_CHECK_CUDA(cudaEventRecord(t.start, s));
    if (t.graph) {
      HOTOPS_CHECK_CUDA(cudaGraphLaunch(t.graph, s));
    } else {
      for (int i = 0; i < launches_; ++i) t.c.run();
    }
    HOTOPS_CHECK_CUDA(cudaEventRecord(t.stop, s));
    HOTOPS_CHECK_CUDA(cudaEventSynchronize(t.stop));
    float ms = 0;
    HOTOPS_CHECK_CUDA(cudaEventElapsedTime(&ms, t.start, t.stop));
    const double mhz = t.probed_clock_mhz();
    // A throttled GPU (power or temperature) runs slower than its clocks promise: like nvbench,
    // discard the sample and let the GPU recover, a bounded number of times. Ranks that time
    // together discard together, when any of them was throttled.
    const bool throttled = t.agreed(mhz < t.min_clock_mhz ? 1 : 0) > 0;
    if (throttled && attempt < kMaxThrottleRetries) {
      ++t.discarded;
      std::this_thread::sleep_for(std::chrono::milliseconds(kThrottleRecoveryMs));
      continue;
    }
    t.clock_sum += mhz;
    ++t.samples;
    return t.agreed(ms * 1e-3) / launches_;  // several ranks: the slowest one's time
  }
}

double Timer::mean_clock_mhz() const { return impl_->samples ? impl_->clock_sum / impl_->samples : 0; }
long Timer::discarded_samples() const { return impl_->discarded; }


namespace {

// The CUDA recorder: an event on hotops' stream at each mark, from a pool that grows to the
// step's mark count once and is reused by every later step.
class EventRecorder final : public trace::Recorder {
 public:
  ~EventRecorder() override {
    for (cudaEvent_t e : pool_) cudaEventDestroy(e);
  }
  // Two events back to back: the step's first mark comes one event record after the second, and
  // the gap between the two measures that cost of the recorder's own, which is not the step's.
  void begin() { used_ = 0, marks.clear(), record(), record(); }
  // Recording into a stream capture: each event becomes a node of the graph, recorded again at every
  // launch of it (a plain record there would only order the capture).
  bool in_graph = false;
  void mark(const char* op) override {
    marks.emplace_back(op);
    record();
  }
  void end() { record(); }
  // Seconds from the first begin event to each event (the marks', then the end's), after a sync;
  // *lead: the gap between the two begin events, one event's cost.
  std::vector<double> offsets(double* lead) const {
    HOTOPS_CHECK_CUDA(cudaEventSynchronize(pool_[used_ - 1]));
    float lead_ms = 0;
    HOTOPS_CHECK_CUDA(cudaEventElapsedTime(&lead_ms, pool_[0], pool_[1]));
    *lead = lead_ms * 1e-3;
    std::vector<double> out;
    for (std::size_t k = 2; k < used_; ++k) {
      float ms = 0;
      HOTOPS_CHECK_CUDA(cudaEventElapsedTime(&ms, pool_[0], pool_[k]));
      out.push_back(ms * 1e-3);
    }
    return out;
  }
  std::vector<std::string> marks;

 private:
  void record() {
    if (used_ == pool_.size()) {
      cudaEvent_t e;
      HOTOPS_CHECK_CUDA(cudaEventCreate(&e));
      pool_.push_back(e);
    }
    HOTOPS_CHECK_CUDA(cudaEventRecordWithFlags(pool_[used_++], stream(), in_graph ? cudaEventRecordExternal : cudaEventRecordDefault));
  }
  std::vector<cudaEvent_t> pool_;
  std::size_t used_ = 0;
};

}  // namespace

trace::Breakdown measure_breakdown(Case& c, double min_seconds, int min_steps) {
  trace::Breakdown b;
  EventRecorder r;
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  auto instrumented_run = [&] {
    trace::Scope on(&r);
    r.begin();
    c.run();
    r.end();
  };
  // A device-timed case that the timed pass runs as a CUDA graph is instrumented as one too: the
  // step and its events captured once and launched behind a short hold, so that the spans hold no
  // launch gap, as the timed samples do not. One launched eagerly is held for 1.5 times the longest
  // time the host has taken to enqueue a step so far (the first step measures it and is not
  // counted): a shorter hold would let the GPU wait for the host, and the wait would count in the
  // ops' spans.
  StepGraph graph;
  const bool held = !c.host_timed();
  if (held && c.capturable()) {
    r.in_graph = true;
    std::string why;
    HOTOPS_CHECK(graph.capture(instrumented_run, &why), "capturing the instrumented step: " + why);
  }
  double enqueue = 0;
  for (int k = -1; k < min_steps || elapsed() < min_seconds; ++k) {
    if (held) hold(20e-6 + std::min(1.5 * enqueue, kMaxEnqueueHoldSeconds));
    const auto h0 = std::chrono::steady_clock::now();
    if (graph) graph.launch();
    else instrumented_run();
    enqueue = std::max(enqueue, std::chrono::duration<double>(std::chrono::steady_clock::now() - h0).count());
    double lead = 0;
    const std::vector<double> at = r.offsets(&lead);
    if (k < 0) continue;
    // The step begins at the second begin event, `lead` after the first.
    trace::add_step(r.marks, std::vector<double>(at.begin(), at.end() - 1), lead, at.back(), b, lead);
  }
  return b;
}

}  // namespace hotops::gpu
