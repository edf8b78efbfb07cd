// The device tensors of one CUDA batchnorm problem and their verification, shared by hotops'
// kernels and the cuDNN version, which differ only in what run() launches.
#pragma once
#include "hotops/cuda_util.h"
#include "hotops/op.h"
#include "kernels/batchnorm/batchnorm.h"

namespace hotops::batchnorm {

struct DeviceTensors {
  gpu::DeviceBuffer x, dy, gamma, beta, running_mean, running_var, save_mean, save_invstd, out, dgamma, dbeta;

  // Allocates what the direction reads and writes, and uploads its inputs (uploads are ordered on
  // gpu::stream() and complete on return).
  DeviceTensors(const Shape& s, const Inputs& in, const Outputs& o)
      : x(in.x), gamma(in.gamma), beta(in.beta), out(o.out.bytes()) {
    const std::size_t cbytes = static_cast<std::size_t>(s.C) * sizeof(float);
    if (s.dir != Direction::bwd) {
      running_mean = gpu::DeviceBuffer(in.running_mean);
      running_var = gpu::DeviceBuffer(in.running_var);
    }
    if (s.dir == Direction::fwd) {
      save_mean = gpu::DeviceBuffer(cbytes);
      save_invstd = gpu::DeviceBuffer(cbytes);
    }
    if (s.dir == Direction::bwd) {
      dy = gpu::DeviceBuffer(in.dy);
      save_mean = gpu::DeviceBuffer(in.save_mean);
      save_invstd = gpu::DeviceBuffer(in.save_invstd);
      dgamma = gpu::DeviceBuffer(cbytes);
      dbeta = gpu::DeviceBuffer(cbytes);
    }
  }

  // Poisons every output, restores the running statistics (the timed runs moved them on), runs the
  // case once, downloads and compares with the reference.
  Check verify(const Shape& s, const Inputs& in, Outputs& o, Case& c) {
    out.poison();
    if (s.dir == Direction::fwd) {
      save_mean.poison();
      save_invstd.poison();
      running_mean.upload(in.running_mean);
      running_var.upload(in.running_var);
    }
    if (s.dir == Direction::bwd) {
      dgamma.poison();
      dbeta.poison();
    }
    c.run();
    out.download(o.out);
    if (s.dir == Direction::fwd) {
      save_mean.download(o.save_mean);
      save_invstd.download(o.save_invstd);
      running_mean.download(o.running_mean);
      running_var.download(o.running_var);
    }
    if (s.dir == Direction::bwd) {
      dgamma.download(o.dgamma);
      dbeta.download(o.dbeta);
    }
    return batchnorm::verify(s, in, o);
  }
};

}  // namespace hotops::batchnorm
