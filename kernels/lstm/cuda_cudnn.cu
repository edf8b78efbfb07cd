// lstm on CUDA: cuDNN 9's RNN API (cudnnRNNForward, cudnnRNNBackwardData_v8,
// cudnnRNNBackwardWeights_v8) with the algorithm of gpu::lstm_algo (the label says which), two biases
// a gate as PyTorch (CUDNN_RNN_DOUBLE_BIAS: b_ih and b_hh), sequence-major unpacked [T,B,*] data,
// every sequence of full length T. Each dtype's math type, what fwd and bwd time (bwd's training
// forward is the plan's forward(), outside the timed backward, as PyTorch's backward excludes it) and
// verification: docs/ops.md, "lstm".
#include <cudnn.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "hotops/cudnn_util.h"
#include "kernels/lstm/lstm.h"

namespace hotops::lstm {
namespace {

using gpu::cudnn;
using gpu::TensorDesc;

using gpu::DataDesc;
using gpu::DropoutDesc;
using gpu::RnnDesc;

int dim(std::int64_t v) {
  HOTOPS_CHECK(v <= 0x7fffffff, "lstm: a dimension does not fit cuDNN's int");
  return static_cast<int>(v);
}

cudnnMathType_t math_of(const Shape& s) {
  switch (s.dtype) {
    case DType::f32: return CUDNN_FMA_MATH;
    case DType::tf32: return CUDNN_DEFAULT_MATH;
    default: return CUDNN_TENSOR_OP_MATH;
  }
}

const char* math_name(cudnnMathType_t m) {
  switch (m) {
    case CUDNN_FMA_MATH: return "FMA math (no tensor ops)";
    case CUDNN_TENSOR_OP_MATH: return "tensor ops";
    case CUDNN_DEFAULT_MATH: return "default math (TF32 tensor ops allowed)";
    default: return "other math";
  }
}

std::string mib(std::size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

// Where one gate's matrix and bias live in the weight space, in elements.
struct Slot {
  std::size_t w = 0, b = 0;
};

// The descriptors of one problem, the weight space's size and layout, and the temp space sizes,
// with the algorithm of gpu::lstm_algo, or the standard one where cuDNN refuses that.
class Descriptors {
 public:
  explicit Descriptors(const Shape& s) : s_(s) {
    if (s_.dtype == DType::bf16) {
      // cuDNN documents no bf16 RNN: its refusal is the unsupported reason.
      try {
        describe_with_fallback();
      } catch (const Error& e) {
        throw Error(std::string("cuDNN's RNN API rejects bf16 LSTM (CUDNN_DATA_BFLOAT16, tensor ops, f32 compute): ") +
                        e.what(),
                    ErrorKind::unsupported);
      }
    } else {
      describe_with_fallback();
    }
  }

  bool training() const { return s_.dir != Direction::fwd; }

  // Between PyTorch's W_ih, W_hh, b_ih, b_hh and cuDNN's weight space, either way.
  void scatter(HostBuffer& space, HostBuffer& w_ih, HostBuffer& w_hh, HostBuffer& b_ih, HostBuffer& b_hh,
               bool to_space) const {
    const std::int64_t H = s_.H;
    for (std::int64_t d = 0; d < s_.D(); ++d)
      for (std::int64_t lin = 0; lin < 8; ++lin) {
        const Slot& sl = slots_[static_cast<std::size_t>(d * 8 + lin)];
        const std::int64_t gate = lin % 4, K = lin < 4 ? s_.I : s_.H;
        HostBuffer& w = lin < 4 ? w_ih : w_hh;
        HostBuffer& bias = lin < 4 ? b_ih : b_hh;
        for (std::int64_t r = 0; r < H; ++r) {
          const std::size_t row = static_cast<std::size_t>(d * 4 * H + gate * H + r);
          for (std::int64_t k = 0; k < K; ++k) {
            const std::size_t a = sl.w + static_cast<std::size_t>(r * K + k), u = row * static_cast<std::size_t>(K) + static_cast<std::size_t>(k);
            if (to_space) space.set(a, w.get(u));
            else w.set(u, space.get(a));
          }
          if (to_space) space.set(sl.b + static_cast<std::size_t>(r), bias.get(row));
          else bias.set(row, space.get(sl.b + static_cast<std::size_t>(r)));
        }
      }
  }

  RnnDesc rnn_;
  DropoutDesc dropout_;
  DataDesc x_desc_, y_desc_;
  TensorDesc h_desc_;
  std::vector<Slot> slots_;  // [direction * 8 + linear layer]
  std::size_t w_bytes_ = 0, ws_bytes_ = 0, reserve_bytes_ = 0;
  cudnnRNNAlgo_t algo_ = CUDNN_RNN_ALGO_STANDARD;

 private:
  void describe_with_fallback() {
    algo_ = gpu::lstm_algo(dim(s_.H), training());
    if (algo_ == CUDNN_RNN_ALGO_STANDARD) return describe();
    try {
      describe();
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::unsupported) throw;
      algo_ = CUDNN_RNN_ALGO_STANDARD;
      describe();
    }
  }

  // Descriptors, the weight space's layout, and the temp space sizes.
  void describe() {
    cudnnHandle_t h = cudnn();
    const cudnnDataType_t dt = s_.dtype == DType::bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
    const int T = dim(s_.T), B = dim(s_.B), I = dim(s_.I), H = dim(s_.H), D = dim(s_.D());
    HOTOPS_CHECK_CUDNN(cudnnSetDropoutDescriptor(dropout_.h, h, 0.0f, nullptr, 0, 0));  // no dropout: no states
    HOTOPS_CHECK_CUDNN(cudnnSetRNNDescriptor_v8(rnn_.h, algo_, CUDNN_LSTM, CUDNN_RNN_DOUBLE_BIAS,
                                                s_.bidirectional ? CUDNN_BIDIRECTIONAL : CUDNN_UNIDIRECTIONAL,
                                                CUDNN_LINEAR_INPUT, dt, CUDNN_DATA_FLOAT, math_of(s_), I, H, H,
                                                1, dropout_.h, CUDNN_RNN_PADDED_IO_DISABLED));
    const std::vector<int> lengths(static_cast<std::size_t>(B), T);
    HOTOPS_CHECK_CUDNN(cudnnSetRNNDataDescriptor(x_desc_.h, dt, CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED, T, B, I,
                                                 lengths.data(), nullptr));
    HOTOPS_CHECK_CUDNN(cudnnSetRNNDataDescriptor(y_desc_.h, dt, CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED, T, B, D * H,
                                                 lengths.data(), nullptr));
    const int hdims[3] = {D, B, H}, hstrides[3] = {B * H, H, 1};
    HOTOPS_CHECK_CUDNN(cudnnSetTensorNdDescriptor(h_desc_.h, dt, 3, hdims, hstrides));
    HOTOPS_CHECK_CUDNN(cudnnGetRNNWeightSpaceSize(h, rnn_.h, &w_bytes_));
    HOTOPS_CHECK_CUDNN(cudnnGetRNNTempSpaceSizes(h, rnn_.h, training() ? CUDNN_FWD_MODE_TRAINING : CUDNN_FWD_MODE_INFERENCE,
                                                 x_desc_.h, &ws_bytes_, &reserve_bytes_));
    if (!training()) reserve_bytes_ = 0;
    locate_weights();
  }

  // Asks cuDNN where each gate's matrix and bias live (pseudo-layer = direction; linear layers
  // 0-3 are W_ih and b_ih of gates i, f, g, o, 4-7 W_hh and b_hh), and checks their shapes. cuDNN
  // answers with addresses in a weight space: one is allocated for the question.
  void locate_weights() {
    const std::size_t e = dtype_size(storage_of(s_.dtype));
    const gpu::DeviceBuffer space(w_bytes_);
    slots_.clear();
    TensorDesc m, b;
    for (int d = 0; d < static_cast<int>(s_.D()); ++d)
      for (int lin = 0; lin < 8; ++lin) {
        void* maddr = nullptr;
        void* baddr = nullptr;
        HOTOPS_CHECK_CUDNN(cudnnGetRNNWeightParams(cudnn(), rnn_.h, d, w_bytes_, space.get(), lin, m.h, &maddr, b.h, &baddr));
        cudnnDataType_t t;
        int nb = 0, dims[3] = {}, strides[3] = {};
        HOTOPS_CHECK_CUDNN(cudnnGetTensorNdDescriptor(m.h, 3, &t, &nb, dims, strides));
        const std::int64_t K = lin < 4 ? s_.I : s_.H;
        HOTOPS_CHECK(nb == 3 && dims[0] == 1 && dims[1] == s_.H && dims[2] == K && strides[1] == K && strides[2] == 1,
                     "lstm: cuDNN's gate matrix is not a row-major [H, K] block");
        HOTOPS_CHECK_CUDNN(cudnnGetTensorNdDescriptor(b.h, 3, &t, &nb, dims, strides));
        HOTOPS_CHECK(nb == 3 && dims[0] == 1 && dims[1] == s_.H && dims[2] == 1, "lstm: cuDNN's gate bias is not [H]");
        const auto base = static_cast<const char*>(space.get());
        slots_.push_back(Slot{static_cast<std::size_t>(static_cast<const char*>(maddr) - base) / e,
                              static_cast<std::size_t>(static_cast<const char*>(baddr) - base) / e});
      }
  }

  Shape s_;
};

// cuDNN's weight space is the weight space, and its dweight space the gradient space.
class CudaLayout final : public Layout {
 public:
  explicit CudaLayout(const Shape& s) : s_(s), d_(s) {}

  std::size_t weight_bytes() const override { return d_.w_bytes_; }
  std::size_t gradient_bytes() const override { return d_.w_bytes_; }
  DType gradient_dtype() const override { return storage_of(s_.dtype); }

  HostBuffer pack(const HostBuffer& w_ih, const HostBuffer& w_hh, const HostBuffer& b_ih,
                  const HostBuffer& b_hh) const override {
    const DType t = storage_of(s_.dtype);
    HostBuffer space(t, d_.w_bytes_ / dtype_size(t));
    std::memset(space.data(), 0, space.bytes());
    HostBuffer wi = w_ih, wh = w_hh, bi = b_ih, bh = b_hh;
    d_.scatter(space, wi, wh, bi, bh, /*to_space=*/true);
    return space;
  }

  void unpack(const HostBuffer& gradients, Outputs& out) const override {
    const DType t = storage_of(s_.dtype);
    const auto H = static_cast<std::size_t>(s_.H), I = static_cast<std::size_t>(s_.I),
               D = static_cast<std::size_t>(s_.D());
    HostBuffer dw(t, d_.w_bytes_ / dtype_size(t));
    std::memcpy(dw.data(), gradients.data(), dw.bytes());
    out.dw_ih = HostBuffer(t, D * 4 * H * I);
    out.dw_hh = HostBuffer(t, D * 4 * H * H);
    out.db = HostBuffer(t, D * 4 * H);
    out.db2 = HostBuffer(t, D * 4 * H);
    d_.scatter(dw, out.dw_ih, out.dw_hh, out.db, out.db2, /*to_space=*/false);
  }

  Positions positions() const override {
    const std::size_t H = static_cast<std::size_t>(s_.H), G = 4 * H;
    Positions p;
    p.w_ih.resize(static_cast<std::size_t>(s_.D()) * G * static_cast<std::size_t>(s_.I));
    p.w_hh.resize(static_cast<std::size_t>(s_.D()) * G * H);
    p.b_ih.resize(static_cast<std::size_t>(s_.D()) * G);
    p.b_hh.resize(p.b_ih.size());
    for (std::size_t d = 0; d < static_cast<std::size_t>(s_.D()); ++d)
      for (std::size_t lin = 0; lin < 8; ++lin) {
        const Slot& sl = d_.slots_[d * 8 + lin];
        const std::size_t gate = lin % 4, K = lin < 4 ? static_cast<std::size_t>(s_.I) : H;
        std::vector<std::size_t>& w = lin < 4 ? p.w_ih : p.w_hh;
        std::vector<std::size_t>& b = lin < 4 ? p.b_ih : p.b_hh;
        for (std::size_t r = 0; r < H; ++r) {
          const std::size_t row = d * G + gate * H + r;
          for (std::size_t k = 0; k < K; ++k) w[row * K + k] = sl.w + r * K + k;
          b[row] = sl.b + r;
        }
      }
    return p;
  }

 private:
  Shape s_;
  Descriptors d_;
};

class CudaLstm final : public Plan {
 public:
  explicit CudaLstm(const Shape& s) : s_(s), d_(s) {
    std::vector<std::int32_t> lengths(static_cast<std::size_t>(s_.B), static_cast<std::int32_t>(s_.T));
    seq_ = gpu::DeviceBuffer(lengths.size() * sizeof(std::int32_t));
    HOTOPS_CHECK_CUDA(cudaMemcpyAsync(seq_.get(), lengths.data(), seq_.bytes(), cudaMemcpyHostToDevice, gpu::stream()));
    ws_ = gpu::DeviceBuffer(d_.ws_bytes_);
    if (training()) reserve_ = gpu::DeviceBuffer(d_.reserve_bytes_);
    HOTOPS_CHECK_CUDA(cudaStreamSynchronize(gpu::stream()));
    capturable_ = probe_capture();
    label_ = std::string("cuDNN RNN ") + gpu::rnn_algo_name(d_.algo_) + " LSTM " +
             (training() ? "BackwardData_v8 + BackwardWeights_v8 (ADD into a zeroed dweight space; the TRAINING "
                           "forward that fills the reserve space runs at setup, not timed)"
                         : "Forward INFERENCE") +
             ", double bias, " + math_name(math_of(s_)) + ", ws " + mib(d_.ws_bytes_) +
             (training() ? ", reserve " + mib(d_.reserve_bytes_) : std::string()) +
             (capturable_ ? "" : ", not graph-capturable: launched one by one");
  }

  // fwd: the inference forward. bwd: the training forward, y, hT, cT and the reserve space that the
  // backward calls read.
  void forward(const Args& a) override {
    HOTOPS_CHECK_CUDNN(cudnnRNNForward(cudnn(), d_.rnn_.h, training() ? CUDNN_FWD_MODE_TRAINING : CUDNN_FWD_MODE_INFERENCE,
                                       seq_.as<std::int32_t>(), d_.x_desc_.h, a.x, d_.y_desc_.h, a.y, d_.h_desc_.h,
                                       a.h0, a.hT, d_.h_desc_.h, a.c0, a.cT, d_.w_bytes_, a.weights, d_.ws_bytes_,
                                       ws_.get(), d_.reserve_bytes_, training() ? reserve_.get() : nullptr));
    if (training()) seen_ = {a.x, a.h0, a.c0, a.weights, a.y, a.hT, a.cT};
  }

  void run(const Args& a) override {
    if (!training()) return forward(a);
    if (seen_ != Seen{a.x, a.h0, a.c0, a.weights, a.y, a.hT, a.cT}) forward(a);
    backward(a);
  }

  std::string label() const override { return label_; }
  bool capturable() const override { return capturable_; }

 private:
  // The inputs and outputs of the last training forward: what the reserve space holds the state of.
  using Seen = std::array<const void*, 7>;

  bool training() const { return s_.dir != Direction::fwd; }

  void backward(const Args& a) {
    cudnnHandle_t h = cudnn();
    HOTOPS_CHECK_CUDA(cudaMemsetAsync(a.dweights, 0, d_.w_bytes_, gpu::stream()));
    HOTOPS_CHECK_CUDNN(cudnnRNNBackwardData_v8(h, d_.rnn_.h, seq_.as<std::int32_t>(), d_.y_desc_.h, a.y, a.dy,
                                               d_.x_desc_.h, a.dx, d_.h_desc_.h, a.h0, a.dhT, a.dh0, d_.h_desc_.h,
                                               a.c0, a.dcT, a.dc0, d_.w_bytes_, a.weights, d_.ws_bytes_, ws_.get(),
                                               d_.reserve_bytes_, reserve_.get()));
    HOTOPS_CHECK_CUDNN(cudnnRNNBackwardWeights_v8(h, d_.rnn_.h, CUDNN_WGRAD_MODE_ADD, seq_.as<std::int32_t>(),
                                                  d_.x_desc_.h, a.x, d_.h_desc_.h, a.h0, d_.y_desc_.h, a.y,
                                                  d_.w_bytes_, a.dweights, d_.ws_bytes_, ws_.get(), d_.reserve_bytes_,
                                                  reserve_.get()));
  }

  // Whether the timed work (the inference forward, or the backward) can be captured into a CUDA
  // graph (the harness then times graphs of runs, free of host launch cost); tried once at setup,
  // since cuDNN does not document it for RNNs, on tensors made for the trial (capture runs nothing).
  bool probe_capture() {
    const std::size_t e = dtype_size(storage_of(s_.dtype));
    const auto state = static_cast<std::size_t>(s_.D() * s_.B * s_.H) * e;
    gpu::DeviceBuffer x(static_cast<std::size_t>(s_.T * s_.B * s_.I) * e),
        y(static_cast<std::size_t>(s_.T * s_.B * s_.D() * s_.H) * e), h0(state), c0(state), hT(state), cT(state),
        w(d_.w_bytes_);
    gpu::DeviceBuffer dy, dhT, dcT, dx, dh0, dc0, dw;
    Args a{x.get(), h0.get(), c0.get(), w.get(), y.get(), hT.get(), cT.get()};
    if (training()) {
      dy = gpu::DeviceBuffer(y.bytes()), dhT = gpu::DeviceBuffer(state), dcT = gpu::DeviceBuffer(state);
      dx = gpu::DeviceBuffer(x.bytes()), dh0 = gpu::DeviceBuffer(state), dc0 = gpu::DeviceBuffer(state);
      dw = gpu::DeviceBuffer(d_.w_bytes_);
      a.dy = dy.get(), a.dhT = dhT.get(), a.dcT = dcT.get();
      a.dx = dx.get(), a.dh0 = dh0.get(), a.dc0 = dc0.get(), a.dweights = dw.get();
    }
    if (training()) {  // as a training step has it: the backward after a forward (seen_ forgets it)
      forward(a);
      HOTOPS_CHECK_CUDA(cudaStreamSynchronize(gpu::stream()));
      seen_ = Seen{};
    }
    gpu::StepGraph trial;
    std::string why;
    return trial.capture([&] { training() ? backward(a) : forward(a); }, &why);
  }

  Shape s_;
  Descriptors d_;
  gpu::DeviceBuffer seq_, ws_, reserve_;
  bool capturable_ = true;
  std::string label_;
  Seen seen_{};
};

}  // namespace

std::unique_ptr<Plan> make_cudnn_plan(const Shape& s) { return std::make_unique<CudaLstm>(s); }
std::unique_ptr<Layout> make_cudnn_layout(const Shape& s) { return std::make_unique<CudaLayout>(s); }

}  // namespace hotops::lstm
