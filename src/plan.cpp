// The memory of the op cases' plans: host buffers on the CPU, their device copies on CUDA.
#include "hotops/plan.h"

#include <cstring>

namespace hotops {

const void* Binder::in(const HostBuffer& h) {
  if (backend_ == Backend::cpu) return h.data();
  auto s = std::make_unique<Slot>();
  s->device = gpu::DeviceBuffer(h);
  slots_.push_back(std::move(s));
  return slots_.back()->device.get();
}

void* Binder::out(HostBuffer& h) {
  if (backend_ == Backend::cpu) {
    auto s = std::make_unique<Slot>();
    s->result = &h;
    slots_.push_back(std::move(s));
    return h.data();
  }
  auto s = std::make_unique<Slot>();
  s->result = &h;
  s->device = gpu::DeviceBuffer(h.bytes());
  slots_.push_back(std::move(s));
  return slots_.back()->device.get();
}

void* Binder::inout(const HostBuffer& initial, HostBuffer& result) {
  HOTOPS_CHECK(initial.bytes() == result.bytes(), "an in-out tensor's initial values and result differ in size");
  auto s = std::make_unique<Slot>();
  s->result = &result;
  s->initial = &initial;
  if (backend_ == Backend::cpu) {
    std::memcpy(result.data(), initial.data(), initial.bytes());
    slots_.push_back(std::move(s));
    return result.data();
  }
  s->device = gpu::DeviceBuffer(initial);
  slots_.push_back(std::move(s));
  return slots_.back()->device.get();
}

void* Binder::scratch(std::size_t bytes) {
  auto s = std::make_unique<Slot>();
  if (backend_ == Backend::cpu)
    s->host = HostBuffer(DType::f32, (bytes + 3) / 4);
  else
    s->device = gpu::DeviceBuffer(bytes);
  slots_.push_back(std::move(s));
  return backend_ == Backend::cpu ? slots_.back()->host.data() : slots_.back()->device.get();
}

void* Binder::host_out(HostBuffer& h) {
  auto s = std::make_unique<Slot>();
  s->result = &h;
  s->on_host = true;
  slots_.push_back(std::move(s));
  return h.data();
}

void Binder::before_check() {
  for (auto& s : slots_) {
    if (!s->result) continue;
    if (backend_ == Backend::cpu || s->on_host) {
      if (s->initial)
        std::memcpy(s->result->data(), s->initial->data(), s->initial->bytes());
      else
        s->result->poison();
    } else {
      if (s->initial)
        s->device.upload(*s->initial);
      else
        s->device.poison();
    }
  }
}

void Binder::after_check() {
  if (backend_ == Backend::cpu) return;
  gpu::synchronize();
  for (auto& s : slots_)
    if (s->result && !s->on_host) s->device.download(*s->result);
}

}  // namespace hotops
