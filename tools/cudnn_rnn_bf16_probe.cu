// tools/cudnn_rnn_bf16_probe.cu: which cuDNN RNN algorithms take a bf16 bidirectional LSTM (bf16 data,
// f32 or bf16 math precision, tensor-op or default math), and the time of each, at bilstm_imdb's
// shape (T 200, E = H = 128, batches 32/64/256) and two tiny ones, against f32 with the persistent
// small-hidden algorithm. Build and run on a GPU host:
//   nvcc -O2 -arch=sm_90 tools/cudnn_rnn_bf16_probe.cu -lcudnn -o /tmp/rnn_probe && /tmp/rnn_probe
#include <cudnn.h>
#include <cuda_runtime.h>
#include <chrono>
#include <cstdio>
#include <vector>
#define CK(x) do { cudnnStatus_t s_ = (x); if (s_ != CUDNN_STATUS_SUCCESS) { std::printf("  FAIL %s: %s\n", #x, cudnnGetErrorString(s_)); return -1.f; } } while (0)
static cudnnHandle_t h;
static const char* an(cudnnRNNAlgo_t a) { const char* n[] = {"STANDARD", "PERSIST_STATIC", "PERSIST_DYNAMIC", "SMALL_H"}; return n[a]; }
float probe(int T, int B, int I, int H, cudnnRNNAlgo_t algo, cudnnDataType_t dt, cudnnDataType_t prec, cudnnMathType_t math, bool train, bool states = false) {
  std::printf("T%d B%d I%d H%d algo %s dt %s prec %s math %d %s%s\n", T, B, I, H, an(algo), dt == CUDNN_DATA_FLOAT ? "f32" : "bf16",
              prec == CUDNN_DATA_FLOAT ? "f32" : "bf16", (int)math, train ? "train" : "infer", states ? " (hx, cx, cy, dhy, dcy given)" : "");
  cudnnRNNDescriptor_t r; cudnnDropoutDescriptor_t d; cudnnRNNDataDescriptor_t xd, yd; cudnnTensorDescriptor_t hd;
  cudnnCreateRNNDescriptor(&r); cudnnCreateDropoutDescriptor(&d); cudnnCreateRNNDataDescriptor(&xd); cudnnCreateRNNDataDescriptor(&yd); cudnnCreateTensorDescriptor(&hd);
  CK(cudnnSetDropoutDescriptor(d, h, 0.f, nullptr, 0, 0));
  CK(cudnnSetRNNDescriptor_v8(r, algo, CUDNN_LSTM, CUDNN_RNN_DOUBLE_BIAS, CUDNN_BIDIRECTIONAL, CUDNN_LINEAR_INPUT, dt, prec, math, I, H, H, 1, d, CUDNN_RNN_PADDED_IO_DISABLED));
  std::vector<int> len(B, T);
  CK(cudnnSetRNNDataDescriptor(xd, dt, CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED, T, B, I, len.data(), nullptr));
  CK(cudnnSetRNNDataDescriptor(yd, dt, CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED, T, B, 2 * H, len.data(), nullptr));
  int dims[3] = {2, B, H}, str[3] = {B * H, H, 1};
  CK(cudnnSetTensorNdDescriptor(hd, dt, 3, dims, str));
  size_t wb, ws, rs;
  CK(cudnnGetRNNWeightSpaceSize(h, r, &wb));
  CK(cudnnGetRNNTempSpaceSizes(h, r, train ? CUDNN_FWD_MODE_TRAINING : CUDNN_FWD_MODE_INFERENCE, xd, &ws, &rs));
  size_t es = dt == CUDNN_DATA_FLOAT ? 4 : 2;
  void *w, *dw, *x, *y, *hT, *dhT, *dx, *dy, *wsp, *rsp, *z, *cy, *dz; int* seq;
  cudaMalloc(&z, 2 * B * H * es); cudaMemset(z, 0, 2 * B * H * es); cudaMalloc(&cy, 2 * B * H * es); cudaMalloc(&dz, 4 * B * H * es);
  void* hx = states ? z : nullptr; void* cyp = states ? cy : nullptr; void* dcy = states ? z : nullptr;
  void* dhx = states ? dz : nullptr; void* dcx = states ? static_cast<char*>(dz) + 2 * B * H * es : nullptr;
  cudaMalloc(&w, wb); cudaMalloc(&dw, wb); cudaMemset(w, 0, wb);
  cudaMalloc(&x, T * B * I * es); cudaMemset(x, 0, T * B * I * es); cudaMalloc(&dx, T * B * I * es);
  cudaMalloc(&y, T * B * 2 * H * es); cudaMalloc(&dy, T * B * 2 * H * es); cudaMemset(dy, 0, T * B * 2 * H * es);
  cudaMalloc(&hT, 2 * B * H * es); cudaMalloc(&dhT, 2 * B * H * es); cudaMemset(dhT, 0, 2 * B * H * es);
  cudaMalloc(&wsp, ws + 16); cudaMalloc(&rsp, rs + 16); cudaMalloc(&seq, B * 4);
  cudaMemcpy(seq, len.data(), B * 4, cudaMemcpyHostToDevice);
  auto step = [&]() -> int {
    cudnnStatus_t s = cudnnRNNForward(h, r, train ? CUDNN_FWD_MODE_TRAINING : CUDNN_FWD_MODE_INFERENCE, seq, xd, x, yd, y, hd, hx, hT, hd, hx, cyp, wb, w, ws, wsp, train ? rs : 0, train ? rsp : nullptr);
    if (s) { std::printf("  FAIL fwd %s\n", cudnnGetErrorString(s)); return 1; }
    if (!train) return 0;
    cudaMemsetAsync(dw, 0, wb);
    s = cudnnRNNBackwardData_v8(h, r, seq, yd, y, dy, xd, dx, hd, hx, dhT, dhx, hd, hx, dcy, dcx, wb, w, ws, wsp, rs, rsp);
    if (s) { std::printf("  FAIL bwd data %s\n", cudnnGetErrorString(s)); return 1; }
    s = cudnnRNNBackwardWeights_v8(h, r, CUDNN_WGRAD_MODE_ADD, seq, xd, x, hd, hx, yd, y, wb, dw, ws, wsp, rs, rsp);
    if (s) { std::printf("  FAIL bwd weights %s\n", cudnnGetErrorString(s)); return 1; }
    return 0;
  };
  if (step()) return -1.f;
  cudaError_t e = cudaDeviceSynchronize();
  if (e) { std::printf("  CUDA error %s\n", cudaGetErrorString(e)); return -1.f; }
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  cudaEventRecord(a);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 20; ++i) step();
  const double host = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  cudaEventRecord(b); cudaEventSynchronize(b);
  float ms; cudaEventElapsedTime(&ms, a, b);
  std::printf("  OK %.3f ms/step, host enqueue %.3f ms/step (ws %zu, reserve %zu)\n", ms / 20, host / 20, ws, rs);
  cudaFree(z); cudaFree(cy); cudaFree(dz); cudaFree(w); cudaFree(dw); cudaFree(x); cudaFree(dx); cudaFree(y); cudaFree(dy); cudaFree(hT); cudaFree(dhT); cudaFree(wsp); cudaFree(rsp); cudaFree(seq);
  return ms / 20;
}
int main() {
  cudnnCreate(&h);
  std::printf("cudnn %zu\n", cudnnGetVersion());
  const cudnnRNNAlgo_t algos[] = {CUDNN_RNN_ALGO_PERSIST_STATIC_SMALL_H, CUDNN_RNN_ALGO_STANDARD, CUDNN_RNN_ALGO_PERSIST_STATIC, CUDNN_RNN_ALGO_PERSIST_DYNAMIC};
  for (bool train : {false, true}) {
    probe(200, 64, 128, 128, CUDNN_RNN_ALGO_PERSIST_STATIC_SMALL_H, CUDNN_DATA_FLOAT, CUDNN_DATA_FLOAT, CUDNN_FMA_MATH, train);
    for (auto a : algos)
      for (auto m : {CUDNN_FMA_MATH, CUDNN_TENSOR_OP_MATH, CUDNN_DEFAULT_MATH})
        for (bool states : {false, true}) probe(200, 64, 128, 128, a, CUDNN_DATA_BFLOAT16, CUDNN_DATA_FLOAT, m, train, states);
    for (auto prec : {CUDNN_DATA_BFLOAT16})  // cuDNN 9 refuses bf16 math precision
      probe(200, 64, 128, 128, CUDNN_RNN_ALGO_STANDARD, CUDNN_DATA_BFLOAT16, prec, CUDNN_DEFAULT_MATH, train);
    for (auto a : algos) probe(5, 3, 5, 7, a, CUDNN_DATA_BFLOAT16, CUDNN_DATA_FLOAT, CUDNN_FMA_MATH, train);
  }
}
