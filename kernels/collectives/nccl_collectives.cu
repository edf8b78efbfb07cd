// The collectives' CUDA plan: one NCCL call on the communicator of the shape's GPUs, enqueued on
// hotops' stream; a one-element all-reduce lines the ranks up before each timed sample.
#include <cuda_runtime.h>

#include "hotops/cuda_util.h"
#include "hotops/nccl_util.h"
#include "kernels/collectives/collectives.h"

namespace hotops::collectives {
namespace {

class NcclPlan final : public Plan {
 public:
  explicit NcclPlan(const Shape& s) : s_(s), comm_(comm::get(s.gpus)), type_(comm::nccl_type(s.dtype)), barrier_(sizeof(float)) {
    HOTOPS_CHECK(comm_, "rank " + std::to_string(s.rank) + " is not among the " + std::to_string(s.gpus) +
                            " ranks of this collective");
    int n = 0;
    HOTOPS_CHECK_NCCL(ncclCommCount(comm_, &n));
    HOTOPS_CHECK(n == s.gpus, "the communicator of " + std::to_string(s.gpus) + " GPUs has " + std::to_string(n) + " ranks");
    HOTOPS_CHECK_CUDA(cudaMemsetAsync(barrier_.get(), 0, sizeof(float), gpu::stream()));
  }

  void run(const Args& a) override {
    cudaStream_t st = gpu::stream();
    switch (s_.op) {
      case Kind::allreduce:
        HOTOPS_CHECK_NCCL(ncclAllReduce(a.send, a.recv, s_.recv_count(), type_, ncclSum, comm_, st));
        break;
      case Kind::reduce_scatter:
        HOTOPS_CHECK_NCCL(ncclReduceScatter(a.send, a.recv, s_.recv_count(), type_, ncclSum, comm_, st));
        break;
      case Kind::allgather:
        HOTOPS_CHECK_NCCL(ncclAllGather(a.send, a.recv, s_.send_count(), type_, comm_, st));
        break;
      case Kind::broadcast:
        HOTOPS_CHECK_NCCL(ncclBroadcast(a.send, a.recv, s_.recv_count(), type_, 0, comm_, st));
        break;
    }
  }

  // A barrier on the GPUs: no rank's next collective starts before every rank has reached it.
  void align() override {
    HOTOPS_CHECK_NCCL(ncclAllReduce(barrier_.get(), barrier_.get(), 1, ncclFloat32, ncclSum, comm_, gpu::stream()));
  }

  // Launched one by one, as nccl-tests (without -G) and PyTorch launch them: the sampler's hold
  // covers the host's enqueueing of a sample's runs.
  bool capturable() const override { return false; }

  std::string label() const override {
    static const char* const calls[] = {"ncclAllReduce (sum)", "ncclReduceScatter (sum)", "ncclAllGather",
                                        "ncclBroadcast (root 0)"};
    return "NCCL " + comm::nccl_version() + " " + calls[static_cast<int>(s_.op)] + ", " + std::to_string(s_.gpus) +
           (s_.gpus == 1 ? " rank" : " ranks") + (s_.inplace ? ", in place" : "");
  }

 private:
  Shape s_;
  ncclComm_t comm_;
  ncclDataType_t type_;
  gpu::DeviceBuffer barrier_;
};

}  // namespace

std::unique_ptr<Plan> make_nccl_plan(const Shape& s) { return std::make_unique<NcclPlan>(s); }

}  // namespace hotops::collectives
