// The memory of the op cases' plans: host buffers on the CPU, their device copies on CUDA; and the
// test-only mutations planted between a case and its plan.
#include "hotops/plan.h"

#include <algorithm>
#include <cstring>

namespace hotops {
namespace {

constexpr std::size_t kShiftBytes = 16;  // shift_output's shift

std::string& mutation() {
  static std::string m;
  return m;
}

}  // namespace

const std::vector<std::string>& test_mutation_names() {
  static const std::vector<std::string> names = {"shift_output", "zero_input", "swap_inputs"};
  return names;
}

void set_test_mutation(const std::string& name) {
  const auto& n = test_mutation_names();
  if (!name.empty() && std::find(n.begin(), n.end(), name) == n.end())
    throw Error("unknown test mutation '" + name + "'");
  mutation() = name;
}

const std::string& test_mutation() { return mutation(); }

const void* Binder::in(const HostBuffer& h) {
  auto s = std::make_unique<Slot>();
  s->input = true;
  s->bytes = h.bytes();
  if (backend_ == Backend::cpu) {
    s->bound = h.data();
  } else {
    s->device = gpu::DeviceBuffer(h);
    s->bound = s->device.get();
  }
  slots_.push_back(std::move(s));
  return slots_.back()->bound;
}

const void* Binder::indices(const HostBuffer& h) {
  const void* p = in(h);
  slots_.back()->input = false;
  return p;
}

void* Binder::out(HostBuffer& h) {
  auto s = std::make_unique<Slot>();
  s->result = &h;
  s->bytes = h.bytes();
  if (backend_ == Backend::cpu) {
    s->bound = h.data();
  } else {
    s->device = gpu::DeviceBuffer(h.bytes());
    s->bound = s->device.get();
  }
  slots_.push_back(std::move(s));
  return const_cast<void*>(slots_.back()->bound);
}

void* Binder::inout(const HostBuffer& initial, HostBuffer& result) {
  HOTOPS_CHECK(initial.bytes() == result.bytes(), "an in-out tensor's initial values and result differ in size");
  auto s = std::make_unique<Slot>();
  s->result = &result;
  s->initial = &initial;
  if (backend_ == Backend::cpu) {
    std::memcpy(result.data(), initial.data(), initial.bytes());
    s->bound = result.data();
  } else {
    s->device = gpu::DeviceBuffer(initial);
    s->bound = s->device.get();
  }
  slots_.push_back(std::move(s));
  return const_cast<void*>(slots_.back()->bound);
}

void* Binder::scratch(std::size_t bytes) {
  auto s = std::make_unique<Slot>();
  if (backend_ == Backend::cpu) {
    s->host = HostBuffer(DType::f32, (bytes + 3) / 4);
    s->bound = s->host.data();
  } else {
    s->device = gpu::DeviceBuffer(bytes);
    s->bound = s->device.get();
  }
  slots_.push_back(std::move(s));
  return const_cast<void*>(slots_.back()->bound);
}

void* Binder::host_out(HostBuffer& h) {
  auto s = std::make_unique<Slot>();
  s->result = &h;
  s->on_host = true;
  s->bound = h.data();
  slots_.push_back(std::move(s));
  return h.data();
}

void Binder::before_check() {
  for (auto& s : slots_) {
    if (!s->result) continue;
    const bool host = backend_ == Backend::cpu || s->on_host;
    if (s->initial) {
      if (host)
        std::memcpy(s->result->data(), s->initial->data(), s->initial->bytes());
      else
        s->device.upload(*s->initial);
    } else if (s->host.count() != 0) {
      s->host.poison();  // a shifted output (test mutation)
    } else if (host) {
      s->result->poison();
    } else {
      s->device.poison();
    }
  }
}

void Binder::after_check() {
  if (backend_ != Backend::cpu) gpu::synchronize();
  for (auto& s : slots_) {
    if (!s->result) continue;
    if (s->host.count() != 0)
      std::memcpy(s->result->data(), s->host.data(), s->result->bytes());  // a shifted output (test mutation)
    else if (backend_ != Backend::cpu && !s->on_host)
      s->device.download(*s->result);
  }
}

void Binder::mutate(const void** pointers, std::size_t n) {
  const std::string& m = test_mutation();
  if (m.empty()) return;
  // Every field of the Args that holds `a` (a pointer handed out above) holds `b` instead, and with
  // `swap`, every field that holds `b` holds `a`.
  auto redirect = [&](const void* a, const void* b, bool swap = false) {
    for (std::size_t i = 0; i < n; ++i) {
      const void* p;
      std::memcpy(&p, pointers + i, sizeof p);
      if (p == a)
        std::memcpy(pointers + i, &b, sizeof b);
      else if (swap && p == b)
        std::memcpy(pointers + i, &a, sizeof a);
    }
  };
  std::vector<Slot*> inputs;
  for (auto& s : slots_)
    if (s->input && s->bytes > 0) inputs.push_back(s.get());
  if (m == "zero_input" && !inputs.empty()) {
    Slot& s = *inputs.back();
    HostBuffer zeros(DType::f32, (s.bytes + 3) / 4);
    std::memset(zeros.data(), 0, zeros.bytes());
    const void* was = s.bound;
    if (backend_ == Backend::cpu) {
      s.host = std::move(zeros);
      s.bound = s.host.data();
    } else {
      s.device = gpu::DeviceBuffer(zeros);
      s.bound = s.device.get();
    }
    redirect(was, s.bound);
  } else if (m == "swap_inputs") {
    for (std::size_t i = 0; i < inputs.size(); ++i)
      for (std::size_t j = i + 1; j < inputs.size(); ++j)
        if (inputs[i]->bytes == inputs[j]->bytes && inputs[i]->bound != inputs[j]->bound) {
          redirect(inputs[i]->bound, inputs[j]->bound, true);
          return;
        }
  } else if (m == "shift_output") {
    for (auto& s : slots_) {
      if (!s->result || s->initial || s->result->count() == 0) continue;
      // 16 bytes more than the output, handed to the op 16 bytes in (one vector: the alignment that
      // vectorised kernels need is kept): what it writes at element i is read back 16 bytes later.
      const std::size_t e = dtype_size(s->result->dtype());
      const void* was = s->bound;
      if (backend_ == Backend::cpu || s->on_host) {
        s->host = HostBuffer(s->result->dtype(), s->result->count() + kShiftBytes / e);
        s->bound = static_cast<const std::byte*>(s->host.data()) + kShiftBytes;
      } else {
        s->device = gpu::DeviceBuffer(s->result->bytes() + kShiftBytes);
        s->bound = static_cast<const std::byte*>(s->device.get()) + kShiftBytes;
      }
      redirect(was, s->bound);
    }
  }
}

}  // namespace hotops
