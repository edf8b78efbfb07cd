// The matmul family (mm, addmm, bmm, and bias_grad: bias_grad.h): problem names, work, inputs,
// verification, and the problem lists.
#include "kernels/matmul/matmul.h"

#include <cmath>
#include <functional>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "hotops/check.h"
#include "hotops/op_family.h"
#include "kernels/matmul/bias_grad.h"

namespace hotops::matmul {
namespace {

// The op as the benchmark runs it: a PlanCase over the problem's inputs and outputs.
struct MatmulOp : OpOf<Shape, Args, Inputs, Outputs> {
  static Shape shape(const Problem& p) { return shape_of(p); }
  static Args bind(const Shape&, Io& io, Binder& b) {
    Args a;
    auto in = [&](const HostBuffer& h) { return h.count() ? b.in(h) : nullptr; };
    a.a = in(io.in.a);
    a.b = in(io.in.b_packed.count() ? io.in.b_packed : io.in.b);
    a.bias = in(io.in.bias);
    a.dout = in(io.in.dout);
    a.out = b.out(io.out.primary);
    if (io.out.dbias.count()) a.dbias = b.out(io.out.dbias);
    return a;
  }
};

// The arg that names a bmm on attention's strided views (NamedShape::view).
constexpr const char* kViewArg = "view";
// The args of an A in blocks (Shape::a_blocks) and of an f32 output (Shape::f32_out).
constexpr const char* kBlocksArg = "a_blocks";
constexpr const char* kOutArg = "out";
constexpr const char* kWeightsArg = "w";  // w:packed (Shape::b_packed)

const char* op_name(Op op) { return op == Op::mm ? "mm" : op == Op::addmm ? "addmm" : "bmm"; }

// The dtypes each backend runs: tf32 is a tensor-core mode that only the CUDA backend has.
std::vector<DType> dtypes_of(Backend b) {
  if (b == Backend::cpu) return {DType::f32, DType::bf16};
  return {DType::f32, DType::tf32, DType::bf16};
}

constexpr Direction kDirections[] = {Direction::fwd, Direction::bwd_data, Direction::bwd_weight};

// Expands one (op, args) into every backend x dtype x direction problem.
void expand(Op op, const std::vector<Arg>& args, std::vector<Problem>& out, bool cuda_only = false) {
  for (Backend be : kAllBackends) {
    if (cuda_only && be == Backend::cpu) continue;
    for (DType t : dtypes_of(be))
      for (Direction d : kDirections) out.push_back(Problem{op_name(op), be, t, d, args});
  }
}

std::vector<Arg> dims(std::int64_t M, std::int64_t N, std::int64_t K) {
  return {{"M", std::to_string(M)}, {"N", std::to_string(N)}, {"K", std::to_string(K)}};
}

// An A in blocks (or, blocks 1, a plain A), as a model step runs it: addmm fwd, mm bwd_data and bwd_weight, f32 and bf16; in
// bf16 the weight gradient in f32 (master weights) and the data gradient in bf16 or f32 (`out:f32`,
// for a consumer that takes f32 gradients). With `all` (tests), every op, direction and output.
void expand_blocks(std::vector<Arg> args, std::int64_t blocks, std::vector<Problem>& out, bool all) {
  if (blocks > 1) args.push_back({kBlocksArg, std::to_string(blocks)});
  std::vector<Arg> f32_out = args;
  f32_out.push_back({kOutArg, "f32"});
  for (Backend be : kAllBackends) {
    if (all) {
      for (Op op : {Op::mm, Op::addmm})
        for (DType t : {DType::f32, DType::bf16})
          for (Direction d : kDirections) out.push_back(Problem{op_name(op), be, t, d, args});
      for (Direction d : kDirections) out.push_back(Problem{"mm", be, DType::bf16, d, f32_out});
      continue;
    }
    for (DType t : {DType::f32, DType::bf16}) out.push_back(Problem{"addmm", be, t, Direction::fwd, args});
    out.push_back(Problem{"mm", be, DType::f32, Direction::bwd_data, args});
    out.push_back(Problem{"mm", be, DType::bf16, Direction::bwd_data, args});
    out.push_back(Problem{"mm", be, DType::bf16, Direction::bwd_data, f32_out});
    out.push_back(Problem{"mm", be, DType::f32, Direction::bwd_weight, args});
    out.push_back(Problem{"mm", be, DType::bf16, Direction::bwd_weight, f32_out});
  }
}

bool is_bias_grad(const Problem& p) { return p.op == "bias_grad"; }

std::unique_ptr<Case> make_case(const Problem& p) {
  if (p.backend == Backend::cuda && !is_bias_grad(p) && shape_of(p).b_packed)
    throw Error("matmul: a packed B is oneDNN's CPU layout", ErrorKind::unsupported);
  return is_bias_grad(p) ? bias_grad::make_case(p) : make_plan_case<MatmulOp>(p);
}

// bias_grad's CPU loop runs every problem; the GEMMs ask oneDNN.
std::string cpu_reason(const Problem& p) { return is_bias_grad(p) ? "" : cpu_unsupported_reason(p); }

class MatmulFamily final : public OpFamily {
 public:
  MatmulFamily() : OpFamily("matmul", cpu_reason, make_case, HOTOPS_CUDA_FACTORY(make_case)) {}

  std::vector<Problem> benchmark_problems(const std::vector<std::int64_t>& batches) const override {
    std::vector<Problem> out = gemm_problems(batches);
    const std::vector<Problem> bias = bias_grad::benchmark_problems(batches);
    out.insert(out.end(), bias.begin(), bias.end());
    return out;
  }

  std::vector<Problem> test_problems() const override {
    std::vector<Problem> out = gemm_test_problems();
    const std::vector<Problem> bias = bias_grad::test_problems();
    out.insert(out.end(), bias.begin(), bias.end());
    return out;
  }

  Work work(const Problem& p) const override {
    if (is_bias_grad(p)) return bias_grad::work(p);
    const Shape s = shape_of(p);
    const double B = static_cast<double>(s.batch_count), M = static_cast<double>(s.M),
                 N = static_cast<double>(s.N), K = static_cast<double>(s.K);
    const double e = static_cast<double>(dtype_size(s.dtype));
    const bool bias = s.op == Op::addmm;
    Work w;
    w.flops = 2 * B * M * N * K;
    switch (s.dir) {
      case Direction::bwd_data: w.bytes = e * B * (M * N + K * N + M * K); break;
      case Direction::bwd_weight:
        w.bytes = e * B * (M * K + M * N + K * N) + (bias ? e * N : 0);
        if (bias) w.flops += B * M * N;  // the dbias reduction
        break;
      default:
        w.bytes = e * B * (M * K + K * N + M * N) + (bias ? e * N : 0);
        if (bias) w.flops += B * M * N;  // the bias add
    }
    w.items = p.batch() ? static_cast<double>(*p.batch()) : 1.0;
    return w;
  }

  std::string unsupported_reason(const Problem& p) const override {
    if (!is_bias_grad(p)) {
      const Shape s = shape_of(p);
      if (s.op == Op::addmm && s.alpha == 0) return "addmm with alpha = 0 is not benchmarked";
    }
    return OpFamily::unsupported_reason(p);
  }

 private:
  static std::vector<Problem> gemm_problems(const std::vector<std::int64_t>& batches) {
    std::vector<Problem> out;
    for (Op op : {Op::mm, Op::addmm, Op::bmm}) {
      for (const NamedShape& ns : named_shapes()) {
        bool wanted = false;
        for (Op o : ns.ops) wanted |= o == op;
        if (!wanted) continue;
        const bool has_batch = op == Op::bmm ? ns.heads > 0 : ns.rows_per_sample > 0;
        if (ns.a_blocks > 1 || ns.step_only) {  // its own directions, all ops at once
          if (op != Op::mm) continue;
          for (std::int64_t b : batches.empty() ? ns.batches : batches) {
            std::vector<Arg> args{{"shape", ns.name}, {"batch", std::to_string(b)}};
            for (const Arg& a : dims(b * ns.rows_per_sample, ns.N, ns.K)) args.push_back(a);
            expand_blocks(args, ns.a_blocks, out, false);
          }
          continue;
        }
        if (!has_batch) {
          std::vector<Arg> args{{"shape", ns.name}};
          for (const Arg& a : dims(ns.M, ns.N, ns.K)) args.push_back(a);
          expand(op, args, out, ns.cuda_only);
          continue;
        }
        for (std::int64_t b : batches.empty() ? ns.batches : batches) {
          std::vector<Arg> args{{"shape", ns.name}, {"batch", std::to_string(b)}};
          if (op == Op::bmm) {
            args.push_back({"heads", std::to_string(ns.heads)});
            for (const Arg& a : dims(ns.M, ns.N, ns.K)) args.push_back(a);
          } else {
            for (const Arg& a : dims(b * ns.rows_per_sample, ns.N, ns.K)) args.push_back(a);
          }
          expand(op, args, out);
          if (ns.packed && op == Op::addmm) {  // as an inference step runs it: the weights prepacked
            args.push_back({kWeightsArg, "packed"});
            for (DType t : dtypes_of(Backend::cpu)) out.push_back(Problem{"addmm", Backend::cpu, t, Direction::fwd, args});
          }
          if (op != Op::bmm || ns.view.empty()) continue;
          // The same GEMM on the heads of the model's buffers, as its attention runs it.
          args.push_back({kViewArg, ns.view});
          expand(op, args, out);
        }
      }
    }
    return out;
  }

  static std::vector<Problem> gemm_test_problems() {
    // Degenerate, odd and tile-crossing sizes; bmm with several batches; addmm with alpha, beta != 1.
    const std::int64_t sizes[][3] = {{1, 1, 1}, {7, 13, 5}, {33, 65, 17}, {64, 128, 96}, {130, 47, 260}};
    std::vector<Problem> out;
    for (const auto& s : sizes) {
      for (Op op : {Op::mm, Op::addmm}) expand(op, [&] {
          std::vector<Arg> a{{"shape", "test"}};
          for (const Arg& d : dims(s[0], s[1], s[2])) a.push_back(d);
          return a;
        }(), out);
      std::vector<Arg> a{{"shape", "test"}, {"batch", "2"}, {"heads", "3"}};
      for (const Arg& d : dims(s[0], s[1], s[2])) a.push_back(d);
      expand(Op::bmm, a, out);
    }
    // Attention's GEMMs on strided heads: 2 samples of 7 tokens, 3 heads of 5.
    for (const auto& [view, n, k] : {std::tuple{"qkv.scores", 7, 5}, std::tuple{"qkv.context", 5, 7}}) {
      std::vector<Arg> a{{"shape", "test"}, {"batch", "2"}, {"heads", "3"}};
      for (const Arg& d : dims(7, n, k)) a.push_back(d);
      a.push_back({kViewArg, view});
      expand(Op::bmm, a, out);
    }
    std::vector<Arg> ab{{"shape", "test"}};
    for (const Arg& d : dims(17, 9, 31)) ab.push_back(d);
    ab.push_back({"alpha", "0.5"});
    ab.push_back({"beta", "2"});
    expand(Op::addmm, ab, out);
    // Operands stored transposed: a Linear layer's weight [N, K] (addmm trans_b), A as [K, M], both.
    const std::pair<Op, std::vector<Arg>> transposed[] = {
        {Op::addmm, {{"trans_b", "1"}}}, {Op::mm, {{"trans_a", "1"}}}, {Op::bmm, {{"trans_a", "1"}, {"trans_b", "1"}}}};
    for (const auto& [op, flags] : transposed) {
      std::vector<Arg> a{{"shape", "test"}};
      if (op == Op::bmm) a.insert(a.end(), {{"batch", "2"}, {"heads", "3"}});
      for (const Arg& d : dims(33, 65, 17)) a.push_back(d);
      a.insert(a.end(), flags.begin(), flags.end());
      expand(op, a, out);
    }
    // The weights prepacked (CPU, fwd): above the loops' size, as stored and stored transposed.
    for (const bool trans_b : {false, true}) {
      std::vector<Arg> a{{"shape", "test"}};
      for (const Arg& d : dims(33, 65, 130)) a.push_back(d);
      if (trans_b) a.push_back({"trans_b", "1"});
      a.push_back({kWeightsArg, "packed"});
      for (Op op : {Op::mm, Op::addmm})
        for (DType t : dtypes_of(Backend::cpu)) out.push_back(Problem{op_name(op), Backend::cpu, t, Direction::fwd, a});
    }
    // A in blocks: the tiny BiLSTM's head (3 samples, 2 x 7 features, 2 classes), three blocks and
    // more rows than a warp, and the widest N.
    for (const auto& [m, n, k, blocks] : {std::tuple{3, 2, 14, 2}, std::tuple{37, 3, 12, 3}, std::tuple{5, 16, 64, 2}}) {
      std::vector<Arg> a{{"shape", "test"}};
      for (const Arg& d : dims(m, n, k)) a.push_back(d);
      expand_blocks(a, blocks, out, true);
    }
    return out;
  }
};

// The attention GEMM of a bmm on attention's strided views (its arg `view`).
AttentionGemm attention_of(const std::string& view) {
  if (view == "qkv.scores") return AttentionGemm::scores;
  if (view == "qkv.context") return AttentionGemm::context;
  throw Error("matmul: unknown view '" + view + "' (qkv.scores or qkv.context)");
}

// The attention GEMM that a bmm problem with a view names: seq and head_dim from its M, N, K.
Shape attention_shape_of(const Problem& p) {
  const AttentionGemm g = attention_of(p.get(kViewArg));
  const std::int64_t M = p.get_int("M"), N = p.get_int("N"), K = p.get_int("K");
  const bool scores = g == AttentionGemm::scores;
  HOTOPS_CHECK(p.op == "bmm" && (scores ? M == N : M == K),
               "matmul: an attention view is a bmm of [seq, seq] scores (qkv.scores: M = N) or context (qkv.context: M = K)");
  return attention_gemm(g, p.dir, p.dtype, p.has("batch") ? p.get_int("batch") : 1, M, p.get_int("heads"), scores ? K : N);
}

}  // namespace

Shape attention_gemm(AttentionGemm g, Direction d, DType t, std::int64_t samples, std::int64_t seq, std::int64_t heads,
                     std::int64_t head_dim) {
  const std::int64_t hidden = heads * head_dim;
  const View qkv{seq * 3 * hidden, head_dim, 3 * hidden};  // Q, K or V of a head: [seq, head_dim]
  const View probs{heads * seq * seq, seq * seq, seq};      // [seq, seq]
  const View context{seq * hidden, head_dim, hidden};       // [seq, head_dim]
  Shape s;
  s.op = Op::bmm;
  s.dir = d;
  s.dtype = t;
  s.batch_count = samples * heads;
  s.M = seq;
  s.views.heads = heads;
  if (g == AttentionGemm::scores) {  // Q [seq, head_dim] . (K [seq, head_dim])^T
    s.N = seq, s.K = head_dim;
    s.trans_b = true;
    s.alpha = 1 / std::sqrt(static_cast<double>(head_dim));
    s.views.a = qkv, s.views.b = qkv, s.views.out = probs;
  } else {  // P [seq, seq] . V [seq, head_dim]
    s.N = head_dim, s.K = seq;
    s.views.a = probs, s.views.b = qkv, s.views.out = context;
  }
  return s;
}

Args attention_args(AttentionGemm g, Direction d, DType t, std::int64_t hidden, const AttentionTensors& x) {
  const auto head = [&](void* qkv, std::int64_t which) {  // Q (0), K (1) or V (2) of a [tokens, 3 hidden] buffer
    return qkv ? static_cast<char*>(qkv) + which * hidden * static_cast<std::int64_t>(dtype_size(t)) : nullptr;
  };
  const bool scores = g == AttentionGemm::scores;
  Args a;
  switch (d) {
    case Direction::fwd:  // P = Q . K^T, or C = P . V
      a.a = scores ? head(x.qkv, 0) : x.prob;
      a.b = head(x.qkv, scores ? 1 : 2);
      a.out = scores ? x.prob : x.ctx;
      break;
    case Direction::bwd_data:  // dQ = dS . K, or dP = dC . V^T
      a.dout = scores ? x.dprob : x.dctx;
      a.b = head(x.qkv, scores ? 1 : 2);
      a.out = scores ? head(x.dqkv, 0) : x.dprob;
      break;
    default:  // dK = dS^T . Q, or dV = P^T . dC
      a.a = scores ? head(x.qkv, 0) : x.prob;
      a.dout = scores ? x.dprob : x.dctx;
      a.out = head(x.dqkv, scores ? 1 : 2);
  }
  return a;
}

Shape shape_of(const Problem& p) {
  if (p.has(kViewArg)) return attention_shape_of(p);
  Shape s;
  s.op = p.op == "mm" ? Op::mm : p.op == "addmm" ? Op::addmm : Op::bmm;
  s.dir = p.dir;
  s.dtype = p.dtype;
  s.M = p.get_int("M");
  s.N = p.get_int("N");
  s.K = p.get_int("K");
  if (s.op == Op::bmm) s.batch_count = (p.has("batch") ? p.get_int("batch") : 1) * p.get_int("heads");
  if (p.has("alpha")) s.alpha = std::stod(p.get("alpha"));
  if (p.has("beta")) s.beta = std::stod(p.get("beta"));
  s.trans_a = p.has("trans_a") && p.get("trans_a") == "1";
  s.trans_b = p.has("trans_b") && p.get("trans_b") == "1";
  if (p.has(kBlocksArg)) s.a_blocks = p.get_int(kBlocksArg);
  if (p.has(kOutArg)) {
    HOTOPS_CHECK(p.get(kOutArg) == "f32", "matmul: out is f32 or absent: " + p.name());
    s.f32_out = true;
  }
  if (p.has(kWeightsArg)) {
    HOTOPS_CHECK(p.get(kWeightsArg) == "packed", "matmul: w is packed or absent: " + p.name());
    s.b_packed = true;
  }
  return s;
}

DType out_dtype(const Shape& s) { return s.f32_out ? DType::f32 : s.dtype; }

const HostBuffer& operand(const Inputs& in, Operand o) {
  return o == Operand::a ? in.a : o == Operand::b ? in.b : in.dout;
}
const void* operand(const Args& a, Operand o) { return o == Operand::a ? a.a : o == Operand::b ? a.b : a.dout; }

Product product(const Shape& s) {
  HOTOPS_CHECK(s.batch_count > 0 && s.M > 0 && s.N > 0 && s.K > 0, "matmul: every dimension must be positive");
  HOTOPS_CHECK(s.op != Op::addmm || s.batch_count == 1, "matmul: addmm has one batch (a Linear layer's rows are M)");
  HOTOPS_CHECK(!s.relu || (s.op == Op::addmm && s.dir == Direction::fwd), "matmul: a ReLU follows addmm fwd's bias only");
  HOTOPS_CHECK(!s.f32_out || s.op == Op::mm, "matmul: an f32 output is for mm only");
  HOTOPS_CHECK(!s.strided() || (s.op == Op::bmm && !s.residual && s.batch_count % s.views.heads == 0),
               "matmul: strided views are for a plain bmm of samples x heads");
  HOTOPS_CHECK(s.a_blocks >= 1, "matmul: a_blocks must be positive");
  if (s.blocked()) {
    HOTOPS_CHECK(s.op != Op::bmm && !s.trans_a && !s.trans_b && !s.residual && !s.relu && s.K % s.a_blocks == 0,
                 "matmul: an A in blocks is for a plain mm or addmm, its K a multiple of a_blocks");
    HOTOPS_CHECK(s.N <= kBlocksMaxN, "matmul: an A in blocks takes N up to " + std::to_string(kBlocksMaxN));
    if (s.dtype == DType::tf32) throw Error("matmul: an A in blocks runs hotops' kernels: f32 or bf16", ErrorKind::unsupported);
  }
  HOTOPS_CHECK(!s.b_packed || (s.dir == Direction::fwd && s.op != Op::bmm && !s.blocked() && !s.residual),
               "matmul: a packed B is for mm and addmm fwd over packed operands");
  Product p;
  switch (s.dir) {
    case Direction::fwd:  // out = op(A) . op(B)
      p = {Operand::a, Operand::b, s.trans_a, s.trans_b, s.M, s.N, s.K};
      break;
    case Direction::bwd_data:  // dA = dOut . op(B)^T, or stored transposed dA^T = op(B) . dOut^T
      if (!s.trans_a) p = {Operand::dout, Operand::b, false, !s.trans_b, s.M, s.K, s.N};
      else p = {Operand::b, Operand::dout, s.trans_b, true, s.K, s.M, s.N};
      break;
    case Direction::bwd_weight:  // dB = op(A)^T . dOut, or stored transposed dB^T = dOut^T . op(A)
      if (!s.trans_b) p = {Operand::a, Operand::dout, !s.trans_a, false, s.K, s.N, s.M};
      else p = {Operand::dout, Operand::a, true, s.trans_a, s.N, s.K, s.M};
      break;
    default: throw Error("matmul has fwd, bwd_data and bwd_weight", ErrorKind::unsupported);
  }
  return p;
}

Inputs make_inputs(const Shape& s, std::uint64_t seed) {
  Inputs in;
  const bool fwd = s.dir == Direction::fwd;
  if (fwd || s.dir == Direction::bwd_weight) in.a = HostBuffer(s.dtype, operand_count(s, Operand::a));
  if (fwd || s.dir == Direction::bwd_data) in.b = HostBuffer(s.dtype, operand_count(s, Operand::b));
  if (fwd && s.op == Op::addmm) in.bias = HostBuffer(s.dtype, static_cast<std::size_t>(s.N));
  if (!fwd) in.dout = HostBuffer(s.dtype, operand_count(s, Operand::dout));
  in.a.fill_uniform(seed, 1);
  in.b.fill_uniform(seed, 2);
  in.bias.fill_uniform(seed, 3);
  in.dout.fill_uniform(seed, 4);
  if (s.b_packed) {
    in.b_packed = HostBuffer(DType::f32, (cpu_packed_b_bytes(s) + 3) / 4);
    cpu_pack_b(s, in.b.data(), s.dtype, in.b_packed.data());
  }
  return in;
}

Outputs make_outputs(const Shape& s) {
  Outputs o;
  const Operand stored_as = s.dir == Direction::bwd_data ? Operand::a : s.dir == Direction::bwd_weight ? Operand::b : Operand::dout;
  o.primary = HostBuffer(out_dtype(s), s.strided() ? operand_count(s, stored_as) : primary_count(s));
  if (s.op == Op::addmm && s.dir == Direction::bwd_weight) o.dbias = HostBuffer(s.dtype, static_cast<std::size_t>(s.N));
  return o;
}

Check verify(const Shape& s, const Inputs& in, const Outputs& out) {
  // Each sampled element costs one dot product of length K (or M, N): 4096 of them is a few ms.
  const std::size_t limit = 4096;
  const double tol = tolerance(s.dtype);
  Check c;
  if (!s.strided()) {
    c = compare(out.primary, sample_indices(out.primary.count(), limit, 7),
                [&](std::size_t i) { return reference_primary(s, in, i); }, tol);
  } else {  // the sampled elements where the view holds them
    std::unordered_map<std::size_t, std::size_t> element_of;
    std::vector<std::size_t> at;
    for (const std::size_t i : sample_indices(primary_count(s), limit, 7)) {
      at.push_back(primary_at(s, i));
      element_of[at.back()] = i;
    }
    c = compare(out.primary, at, [&](std::size_t j) { return reference_primary(s, in, element_of.at(j)); }, tol);
  }
  if (out.dbias.count() > 0) {
    Check d = compare(out.dbias, sample_indices(out.dbias.count(), limit, 11),
                      [&](std::size_t n) { return reference_dbias(s, in, n); }, tol);
    Check all;
    all.merge(c, s.dir == Direction::bwd_weight ? "dB" : "out");
    all.merge(d, "dbias");
    return all;
  }
  return c;
}

HOTOPS_DEFINE_FAMILY(MatmulFamily);

}  // namespace hotops::matmul
