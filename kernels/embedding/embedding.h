// The embedding family: nn.Embedding's lookup. fwd gathers rows of a [vocab, dim] table W by int64
// indices: out[i, :] = W[idx[i], :]. bwd is the dense weight gradient: dW = zeros([vocab, dim]),
// then dW[idx[i], :] += dout[i, :] for every i, accumulated and written in f32 for both dtypes
// (a bf16 table gets an f32 gradient, as with a mixed-precision master copy). The bwd is
// deterministic: indices are grouped by row at setup (a CSR of positions per vocab row, outside
// timing) and every row's sum runs in ascending position order, on both backends.
// An RNN's embedding (Shape::time_major, `layout:tnc`): the indices are a batch of sequences [batch,
// T], as a data loader hands them, and out (bwd: dout) is time-major [T, batch, dim], as the RNN
// reads its input; the bwd groups the indices by row inside the run, as a training step must for a
// new batch each step (CUDA: a stable device radix sort of the indices, each row summed in index
// order; CPU: each thread owns a set of rows and walks dout's rows in order, each row summed in that
// order). A mixed-precision model's lookup
// (Shape::f32_table, `table:f32`): fwd reads an f32 table and stores bf16 rows.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hotops/buffer.h"
#include "hotops/op.h"
#include "hotops/plan.h"

namespace hotops::embedding {

struct Shape {
  Direction dir = Direction::fwd;
  DType dtype = DType::f32;  // the table's and dout's; dW is always f32
  std::int64_t batch = 1, T = 1;  // batch x T indices
  std::int64_t vocab = 1, dim = 1;
  bool time_major = false;  // indices [batch, T], out and dout [T, batch, dim]; bwd groups in the run
  bool f32_table = false;   // fwd, bf16: the table is f32, its rows rounded to bf16 (nearest even)
  std::int64_t n() const { return batch * T; }
  // The row of out (dout) that index i gathers into (scatters from).
  std::int64_t row_of(std::int64_t i) const { return time_major ? (i % T) * batch + i / T : i; }
  // The index that gathers into (scatters from) row r: the inverse of row_of.
  std::int64_t index_of(std::int64_t r) const { return time_major ? (r % batch) * T + r / batch : r; }
  DType table_dtype() const { return f32_table ? DType::f32 : dtype; }
};

Shape shape_of(const Problem& p);

// The positions of the indices grouped by row: row r's are pos[offset[r] .. offset[r + 1]), in
// ascending order (a stable counting sort).
struct Csr {
  std::vector<std::int32_t> offset;  // vocab + 1
  std::vector<std::int32_t> pos;     // n
  std::vector<std::int32_t> counts;  // group_by_row's scratch: each thread's count of each row
};
// Fills g, reusing its storage (a train step groups each batch's tokens into the same Csr). On
// cpu::threads() threads, each counting and placing a contiguous share of the indices; the result
// is the serial counting sort's whatever the thread count.
void group_by_row(const std::vector<std::int64_t>& idx, std::int64_t vocab, Csr& g);
Csr group_by_row(const std::vector<std::int64_t>& idx, std::int64_t vocab);

// Inputs, seeded from the problem name so every backend sees the same numbers: idx uniform in
// [0, vocab); fwd: the table W uniform in [-1, 1) (in table_dtype()); bwd: dout uniform in [-1, 1).
struct Inputs {
  std::vector<std::int64_t> idx;
  HostBuffer W;     // fwd
  HostBuffer dout;  // bwd
};
Inputs make_inputs(const Shape& s, std::uint64_t seed);
HostBuffer make_output(const Shape& s);  // out [n, dim] in the dtype (fwd), dW [vocab, dim] f32 (bwd)

// The reference: fwd one element (a copy, exact; an f32 table's value rounded to bf16); bwd the dW
// rows listed in `rows` in double, one pass over the indices (independent of the CSR), into
// ref[k * dim + j] for rows[k].
double reference_fwd(const Shape& s, const Inputs& in, std::size_t out_index);
std::vector<double> reference_bwd(const Shape& s, const Inputs& in, const std::vector<std::size_t>& rows);

// fwd: exact match; bwd: tolerance(f32) (exact inputs, an f32 sum of the few rows per index).
Check verify(const Shape& s, const Inputs& in, const HostBuffer& out);

// The tensors of one embedding, in the backend's memory (host on the CPU, device on CUDA). bwd reads
// the indices as their grouping by row (group_by_row's offset and pos), which the caller builds once
// per batch of indices, outside the op; time_major's bwd reads the indices themselves.
struct Args {
  const std::int64_t* idx = nullptr;     // fwd, and time_major bwd: [n], each in [0, vocab)
  const void* W = nullptr;               // fwd: [vocab, dim], table_dtype()
  void* out = nullptr;                   // fwd: [n, dim], the dtype (time_major: [T, batch, dim])
  const std::int32_t* offset = nullptr;  // bwd: [vocab + 1], Csr::offset (not time_major)
  const std::int32_t* pos = nullptr;     // bwd: [n], Csr::pos (not time_major)
  const void* dout = nullptr;            // bwd: [n, dim], the dtype (time_major: [T, batch, dim])
  void* dW = nullptr;                    // bwd: [vocab, dim] f32, every element written
};
HOTOPS_PLAN_FACTORIES(Shape, Args);  // CPU: hand-written OpenMP loops; CUDA: hotops' kernels (and CUB's sort)

const Family& family();

}  // namespace hotops::embedding
