// The fused attention kernels on CUDA (tensor cores, mma.sync bf16 with f32 accumulation): softmax(Q
// K^T / sqrt(head_dim)) V over the heads of a packed qkv buffer, and its backward, without writing
// the scores or the probabilities anywhere. A block takes one (sample, head), a warp 16 of its rows
// against every key. The forward keeps each query row's scores in registers and saves the row's
// log-sum-exp; the backward, one launch, recomputes the probabilities from it (dQ a warp's query
// rows, then dK and dV its key rows).
//
// Layouts, as a transformer layer holds them (the attention family's): qkv [batch, seq, 3, heads,
// head_dim] (Q | K | V of each token), ctx and dctx [batch, seq, heads, head_dim], dqkv as qkv.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "hotops/dtype.h"

namespace hotops::attention::fused {

// "" where the kernels take the case (bf16, head_dim 64, 1 <= seq <= kMaxSeq), else why not.
constexpr std::int64_t kMaxSeq = 256;
std::string unsupported_reason(DType t, std::int64_t seq, std::int64_t head_dim);

// What the forward saves for the backward, in bytes: a float a query row of every head (its
// log-sum-exp).
std::size_t saved_bytes(std::int64_t batch, std::int64_t seq, std::int64_t heads);

// Queued on gpu::stream(); bf16 tensors, head_dim 64 (unsupported_reason() == "").
void forward(std::int64_t batch, std::int64_t seq, std::int64_t heads, const void* qkv, void* ctx, float* saved);
void backward(std::int64_t batch, std::int64_t seq, std::int64_t heads, const void* qkv, const void* ctx, const void* dctx,
              const float* saved, void* dqkv);

}  // namespace hotops::attention::fused
