// lstm on CUDA: cuDNN 9's RNN API (cudnnRNNForward, cudnnRNNBackwardData_v8,
// cudnnRNNBackwardWeights_v8) with the algorithm of gpu::lstm_algo (the label says which), two biases
// a gate as PyTorch (CUDNN_RNN_DOUBLE_BIAS: b_ih and b_hh), sequence-major unpacked [T,B,*] data,
// every sequence of full length T. Each dtype's math type, what fwd and bwd time (bwd's training
// forward runs at setup, as PyTorch's backward excludes it) and verification: docs/ops.md, "lstm".
#include <cudnn.h>

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

cudnnMathType_t math_of(DType t) {
  switch (t) {
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

class CudaLstm final : public Case {
 public:
  explicit CudaLstm(const Problem& p) : s_(shape_of(p)), in_(make_inputs(s_, p.seed())) {
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
    upload();
    if (training()) forward_training();
    HOTOPS_CHECK_CUDA(cudaStreamSynchronize(gpu::stream()));
    capturable_ = probe_capture();
    label_ = std::string("cuDNN RNN ") + gpu::rnn_algo_name(algo_) + " LSTM " +
             (training() ? "BackwardData_v8 + BackwardWeights_v8 (ADD into a zeroed dweight space; the TRAINING "
                           "forward that fills the reserve space runs at setup, not timed)"
                         : "Forward INFERENCE") +
             ", double bias, " + math_name(math_of(s_.dtype)) + ", ws " + mib(ws_bytes_) +
             (training() ? ", reserve " + mib(reserve_bytes_) : std::string()) +
             (capturable_ ? "" : ", not graph-capturable: launched one by one");
  }

  void run() override {
    cudnnHandle_t h = cudnn();
    if (!training()) {
      HOTOPS_CHECK_CUDNN(cudnnRNNForward(h, rnn_.h, CUDNN_FWD_MODE_INFERENCE, seq_.as<std::int32_t>(), x_desc_.h,
                                         x_.get(), y_desc_.h, y_.get(), h_desc_.h, hx_.get(), hy_.get(), h_desc_.h,
                                         cx_.get(), cy_.get(), w_bytes_, w_.get(), ws_bytes_, ws_.get(), 0, nullptr));
      return;
    }
    HOTOPS_CHECK_CUDA(cudaMemsetAsync(dw_.get(), 0, w_bytes_, gpu::stream()));
    HOTOPS_CHECK_CUDNN(cudnnRNNBackwardData_v8(h, rnn_.h, seq_.as<std::int32_t>(), y_desc_.h, y_.get(), dy_.get(),
                                               x_desc_.h, dx_.get(), h_desc_.h, hx_.get(), dhy_.get(), dhx_.get(),
                                               h_desc_.h, cx_.get(), dcy_.get(), dcx_.get(), w_bytes_, w_.get(),
                                               ws_bytes_, ws_.get(), reserve_bytes_, reserve_.get()));
    HOTOPS_CHECK_CUDNN(cudnnRNNBackwardWeights_v8(h, rnn_.h, CUDNN_WGRAD_MODE_ADD, seq_.as<std::int32_t>(), x_desc_.h,
                                                  x_.get(), h_desc_.h, hx_.get(), y_desc_.h, y_.get(), w_bytes_,
                                                  dw_.get(), ws_bytes_, ws_.get(), reserve_bytes_, reserve_.get()));
  }

  Check verify() override {
    const DType t = storage_of(s_.dtype);
    const auto T = static_cast<std::size_t>(s_.T), B = static_cast<std::size_t>(s_.B),
               I = static_cast<std::size_t>(s_.I), H = static_cast<std::size_t>(s_.H),
               D = static_cast<std::size_t>(s_.D());
    Outputs out;
    if (!training()) {
      y_.poison();
      hy_.poison();
      cy_.poison();
      run();
      out.y = HostBuffer(t, T * B * D * H);
      out.hT = HostBuffer(t, D * B * H);
      out.cT = HostBuffer(t, D * B * H);
      y_.download(out.y);
      hy_.download(out.hT);
      cy_.download(out.cT);
      return lstm::verify(s_, in_, out, cache_);
    }
    forward_training();
    dx_.poison();
    dhx_.poison();
    dcx_.poison();
    dw_.poison();
    run();
    out.dx = HostBuffer(t, T * B * I);
    out.dh0 = HostBuffer(t, D * B * H);
    out.dc0 = HostBuffer(t, D * B * H);
    dx_.download(out.dx);
    dhx_.download(out.dh0);
    dcx_.download(out.dc0);
    HostBuffer dw(t, w_bytes_ / dtype_size(t));
    dw_.download(dw);
    out.dw_ih = HostBuffer(t, in_.w_ih.count());
    out.dw_hh = HostBuffer(t, in_.w_hh.count());
    out.db = HostBuffer(t, in_.b_ih.count());
    out.db2 = HostBuffer(t, in_.b_hh.count());
    scatter(dw, out.dw_ih, out.dw_hh, out.db, out.db2, /*to_space=*/false);
    return lstm::verify(s_, in_, out, cache_);
  }

  std::string label() const override { return label_; }
  bool capturable() const override { return capturable_; }

 private:
  bool training() const { return s_.dir != Direction::fwd; }

  // describe() with the algorithm of gpu::lstm_algo, or the standard one where cuDNN refuses that.
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
                                                CUDNN_LINEAR_INPUT, dt, CUDNN_DATA_FLOAT, math_of(s_.dtype), I, H, H,
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
    w_ = gpu::DeviceBuffer(w_bytes_);
    locate_weights();
  }

  // Asks cuDNN where each gate's matrix and bias live (pseudo-layer = direction; linear layers
  // 0-3 are W_ih and b_ih of gates i, f, g, o, 4-7 W_hh and b_hh), and checks their shapes.
  void locate_weights() {
    const std::size_t e = dtype_size(storage_of(s_.dtype));
    TensorDesc m, b;
    for (int d = 0; d < static_cast<int>(s_.D()); ++d)
      for (int lin = 0; lin < 8; ++lin) {
        void* maddr = nullptr;
        void* baddr = nullptr;
        HOTOPS_CHECK_CUDNN(cudnnGetRNNWeightParams(cudnn(), rnn_.h, d, w_bytes_, w_.get(), lin, m.h, &maddr, b.h, &baddr));
        cudnnDataType_t t;
        int nb = 0, dims[3] = {}, strides[3] = {};
        HOTOPS_CHECK_CUDNN(cudnnGetTensorNdDescriptor(m.h, 3, &t, &nb, dims, strides));
        const std::int64_t K = lin < 4 ? s_.I : s_.H;
        HOTOPS_CHECK(nb == 3 && dims[0] == 1 && dims[1] == s_.H && dims[2] == K && strides[1] == K && strides[2] == 1,
                     "lstm: cuDNN's gate matrix is not a row-major [H, K] block");
        HOTOPS_CHECK_CUDNN(cudnnGetTensorNdDescriptor(b.h, 3, &t, &nb, dims, strides));
        HOTOPS_CHECK(nb == 3 && dims[0] == 1 && dims[1] == s_.H && dims[2] == 1, "lstm: cuDNN's gate bias is not [H]");
        const auto base = static_cast<const char*>(w_.get());
        slots_.push_back(Slot{static_cast<std::size_t>(static_cast<const char*>(maddr) - base) / e,
                              static_cast<std::size_t>(static_cast<const char*>(baddr) - base) / e});
      }
  }

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

  void upload() {
    const DType t = storage_of(s_.dtype);
    HostBuffer space(t, w_bytes_ / dtype_size(t));
    std::memset(space.data(), 0, space.bytes());
    scatter(space, in_.w_ih, in_.w_hh, in_.b_ih, in_.b_hh, /*to_space=*/true);
    w_.upload(space);
    std::vector<std::int32_t> lengths(static_cast<std::size_t>(s_.B), static_cast<std::int32_t>(s_.T));
    seq_ = gpu::DeviceBuffer(lengths.size() * sizeof(std::int32_t));
    HOTOPS_CHECK_CUDA(cudaMemcpyAsync(seq_.get(), lengths.data(), seq_.bytes(), cudaMemcpyHostToDevice, gpu::stream()));
    HOTOPS_CHECK_CUDA(cudaStreamSynchronize(gpu::stream()));
    x_ = gpu::DeviceBuffer(in_.x);
    hx_ = gpu::DeviceBuffer(in_.h0);
    cx_ = gpu::DeviceBuffer(in_.c0);
    const std::size_t e = dtype_size(t);
    y_ = gpu::DeviceBuffer(static_cast<std::size_t>(s_.T * s_.B * s_.D() * s_.H) * e);
    hy_ = gpu::DeviceBuffer(in_.h0.bytes());
    cy_ = gpu::DeviceBuffer(in_.c0.bytes());
    ws_ = gpu::DeviceBuffer(ws_bytes_);
    if (!training()) return;
    reserve_ = gpu::DeviceBuffer(reserve_bytes_);
    dy_ = gpu::DeviceBuffer(in_.dy);
    dhy_ = gpu::DeviceBuffer(in_.dhT);
    dcy_ = gpu::DeviceBuffer(in_.dcT);
    dx_ = gpu::DeviceBuffer(in_.x.bytes());
    dhx_ = gpu::DeviceBuffer(in_.h0.bytes());
    dcx_ = gpu::DeviceBuffer(in_.c0.bytes());
    dw_ = gpu::DeviceBuffer(w_bytes_);
  }

  // The training forward: y, hT, cT and the reserve space that the backward calls read.
  void forward_training() {
    HOTOPS_CHECK_CUDNN(cudnnRNNForward(cudnn(), rnn_.h, CUDNN_FWD_MODE_TRAINING, seq_.as<std::int32_t>(), x_desc_.h,
                                       x_.get(), y_desc_.h, y_.get(), h_desc_.h, hx_.get(), hy_.get(), h_desc_.h,
                                       cx_.get(), cy_.get(), w_bytes_, w_.get(), ws_bytes_, ws_.get(), reserve_bytes_,
                                       reserve_.get()));
  }

  // Whether run() can be captured into a CUDA graph (the harness then times graphs of runs, free
  // of host launch cost); tried once at setup, since cuDNN does not document it for RNNs.
  bool probe_capture() {
    gpu::StepGraph trial;
    std::string why;
    return trial.capture([this] { run(); }, &why);
  }

  Shape s_;
  Inputs in_;
  ReferenceCache cache_;
  RnnDesc rnn_;
  DropoutDesc dropout_;
  DataDesc x_desc_, y_desc_;
  TensorDesc h_desc_;
  std::vector<Slot> slots_;  // [direction * 8 + linear layer]
  std::size_t w_bytes_ = 0, ws_bytes_ = 0, reserve_bytes_ = 0;
  gpu::DeviceBuffer w_, seq_, x_, hx_, cx_, y_, hy_, cy_, ws_, reserve_;
  gpu::DeviceBuffer dy_, dhy_, dcy_, dx_, dhx_, dcx_, dw_;
  bool capturable_ = true;
  std::string label_;
  cudnnRNNAlgo_t algo_ = CUDNN_RNN_ALGO_STANDARD;
};

}  // namespace

std::unique_ptr<Case> make_cuda(const Problem& p) { return std::make_unique<CudaLstm>(p); }

}  // namespace hotops::lstm
