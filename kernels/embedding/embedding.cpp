// The embedding family: problem names and shapes, work, inputs, the row grouping and verification.
//
// Names: embedding/<backend>/<dtype>/<fwd|bwd>/shape:<model.layer>/batch:B/T:T/vocab:V/dim:D, with
// B x T int64 indices into a [V, D] table; test problems have shape:test and `N:` for the batch.
// An RNN's embedding appends layout:tnc (out and dout time-major, the bwd's grouping in the run) and,
// for a bf16 fwd from an f32 table, table:f32 (embedding.h).
#include "kernels/embedding/embedding.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "hotops/check.h"
#include "hotops/cpu.h"
#include "hotops/op_family.h"

namespace hotops::embedding {
namespace {

struct NamedShape {
  const char* name;
  std::int64_t T, vocab, dim, batch;
};

constexpr NamedShape kNamedShapes[] = {
    // Keras' IMDb bidirectional LSTM: 20000-word vocabulary, 128-wide embeddings, reviews cut to
    // 200 tokens, batch 64 (12800 indices).
    {"imdb_bilstm.embed", 200, 20000, 128, 64},
    // BERT-base word embeddings: WordPiece vocabulary 30522 x hidden 768, sequence 128, batch 32.
    {"bert.word_embed", 128, 30522, 768, 32},
    // Keras' imdb_fasttext.py: 20000-word vocabulary, 50-wide embeddings, reviews cut to 400 tokens,
    // batch 32 (12800 indices): model.fasttext_imdb's embedding.
    {"fasttext_imdb.embed", 400, 20000, 50, 32},
};

constexpr DType kDTypes[] = {DType::f32, DType::bf16};

void expand(const std::vector<Arg>& args, std::vector<Problem>& out) { expand_fwd_bwd("embedding", args, out); }

// The time-major lookups an RNN model step runs (model.bilstm_imdb): f32, and bf16 activations
// from the f32 table (mixed precision; its bwd is bf16 dout into the f32 dW); with `all`, the bf16
// fwd from a bf16 table too.
void expand_time_major(std::vector<Arg> args, std::vector<Problem>& out, bool all) {
  args.push_back({"layout", "tnc"});
  std::vector<Arg> f32_table = args;
  f32_table.push_back({"table", "f32"});
  for (Backend be : kAllBackends) {
    out.push_back(Problem{"embedding", be, DType::f32, Direction::fwd, args});
    out.push_back(Problem{"embedding", be, DType::bf16, Direction::fwd, f32_table});
    if (all) out.push_back(Problem{"embedding", be, DType::bf16, Direction::fwd, args});
    for (DType t : kDTypes) out.push_back(Problem{"embedding", be, t, Direction::bwd, args});
  }
}

// An integer vector as a HostBuffer of its bytes, which a Binder uploads like any tensor.
template <class I>
HostBuffer bytes_of(const std::vector<I>& v) {
  HostBuffer b(DType::f32, (v.size() * sizeof(I) + 3) / 4);
  std::memcpy(b.data(), v.data(), v.size() * sizeof(I));
  return b;
}

// The op as the benchmark runs it: a PlanCase over the problem's inputs and output. bwd's grouping
// of the indices by row is built here, with the inputs, outside the timed runs (time_major: by the
// plan, inside them).
struct Op : OpOf<Shape, Args, Inputs, HostBuffer> {
  struct Io : OpOf::Io {
    HostBuffer idx;          // fwd and time_major: in.idx's bytes
    HostBuffer offset, pos;  // bwd: group_by_row(in.idx)'s
  };
  static Shape shape(const Problem& p) { return shape_of(p); }
  static Io io(const Shape& s, std::uint64_t seed) {
    Io io{OpOf::io(s, seed), {}, {}, {}};
    if (s.dir == Direction::fwd || s.time_major) {
      io.idx = bytes_of(io.in.idx);
    } else {
      const Csr csr = group_by_row(io.in.idx, s.vocab);
      io.offset = bytes_of(csr.offset);
      io.pos = bytes_of(csr.pos);
    }
    return io;
  }
  static Args bind(const Shape& s, Io& io, Binder& b) {
    Args a;
    if (s.dir == Direction::fwd) {
      a.idx = static_cast<const std::int64_t*>(b.indices(io.idx));
      a.W = b.in(io.in.W);
      a.out = b.out(io.out);
    } else {
      if (s.time_major) {
        a.idx = static_cast<const std::int64_t*>(b.indices(io.idx));
      } else {
        a.offset = static_cast<const std::int32_t*>(b.indices(io.offset));
        a.pos = static_cast<const std::int32_t*>(b.indices(io.pos));
      }
      a.dout = b.in(io.in.dout);
      a.dW = b.out(io.out);
    }
    return a;
  }
};

class EmbeddingFamily final : public PlanFamily<Op> {
 public:
  EmbeddingFamily() : PlanFamily("embedding", nullptr) {}

  std::vector<Problem> benchmark_problems(const std::vector<std::int64_t>& batches) const override {
    return per_shape_and_batch(kNamedShapes, batches, [](const NamedShape& ns, std::int64_t b, std::vector<Problem>& out) {
      const std::vector<Arg> args{{"shape", ns.name},
                                  {"batch", std::to_string(b)},
                                  {"T", std::to_string(ns.T)},
                                  {"vocab", std::to_string(ns.vocab)},
                                  {"dim", std::to_string(ns.dim)}};
      expand(args, out);
      // The IMDb BiLSTM's lookup as its model step runs it (model.bilstm_imdb).
      if (std::string(ns.name) == "imdb_bilstm.embed") expand_time_major(args, out, false);
    });
  }

  std::vector<Problem> test_problems() const override {
    // A vocabulary far smaller than the indices (many repeats per row) and one far larger (most
    // rows of dW are zeros); dims that are odd (2- and 4-byte pieces on CUDA, 16-byte output
    // vectors spanning rows, an output ending inside its last vector), a multiple of 4 but not 8
    // (bf16 rows not a multiple of 16 bytes), fastText's 50 (8- and 4-byte pieces, two columns a
    // dW thread), and 16-byte vector widths in both dtypes.
    constexpr std::int64_t kShapes[][4] = {{3, 20, 7, 5}, {2, 9, 1000, 12}, {2, 25, 40, 50}, {4, 33, 50, 64}, {1, 17, 3, 1}};
    std::vector<Problem> out;
    for (const auto& t : kShapes) {
      const std::vector<Arg> args{{"shape", "test"},
                                  {"N", std::to_string(t[0])},
                                  {"T", std::to_string(t[1])},
                                  {"vocab", std::to_string(t[2])},
                                  {"dim", std::to_string(t[3])}};
      expand(args, out);
      expand_time_major(args, out, true);
    }
    return out;
  }

  // fwd: no FLOPs; bytes = the gathered rows read + the int64 indices + the output written (not
  // the whole table: only the rows looked up need be touched). bwd: dim adds per index; bytes =
  // dout + the indices read and all of dW (f32) written once (the rows no index hits are zeros);
  // time_major's grouping in the run adds none.
  Work work(const Problem& p) const override {
    const Shape s = shape_of(p);
    const double n = static_cast<double>(s.n()), dim = static_cast<double>(s.dim);
    const double e = static_cast<double>(dtype_size(s.dtype));
    Work w;
    if (s.dir == Direction::fwd) {
      w.bytes = n * dim * (static_cast<double>(dtype_size(s.table_dtype())) + e) + 8 * n;
    } else {
      w.flops = n * dim;
      w.bytes = n * dim * e + 8 * n + static_cast<double>(s.vocab) * dim * 4;
    }
    w.items = p.batch() ? static_cast<double>(*p.batch()) : 1.0;
    return w;
  }
};

}  // namespace

Shape shape_of(const Problem& p) {
  Shape s = fwd_bwd_shape<Shape>(p, "embedding");
  s.batch = p.batch() ? *p.batch() : p.get_int("N");
  s.T = p.get_int("T"), s.vocab = p.get_int("vocab"), s.dim = p.get_int("dim");
  HOTOPS_CHECK(s.batch > 0 && s.T > 0 && s.vocab > 0 && s.dim > 0, "bad embedding shape: " + p.name());
  if (p.has("layout")) {
    HOTOPS_CHECK(p.get("layout") == "tnc", "embedding: layout is tnc (time-major) or absent: " + p.name());
    s.time_major = true;
  }
  if (p.has("table")) {
    HOTOPS_CHECK(p.get("table") == "f32" && s.dtype == DType::bf16 && s.dir == Direction::fwd,
                 "embedding: table:f32 names a bf16 fwd from an f32 table: " + p.name());
    s.f32_table = true;
  }
  HOTOPS_CHECK(s.n() < (std::int64_t(1) << 31) && s.vocab < (std::int64_t(1) << 24),
               "embedding supports < 2^31 indices and a vocabulary < 2^24: " + p.name());
  return s;
}

// Thread t of a team of T takes indices [t n / T, (t + 1) n / T) and rows [t V / T, (t + 1) V / T):
//   1. counts[t][r] = its share's indices of row r (its row of counts zeroed first);
//   2. for each of its rows, counts[t'][r] becomes where thread t''s indices of r start within the
//      row (threads in order), offset[r] the row's total, and its rows' sum the block's;
//   3. (one thread) the blocks' starts; 4. offset[r] for its rows, added to counts[t'][r]: where
//      thread t''s indices of r go; 5. it places its share's indices.
// Within a row the positions are thread 0's share, then thread 1's, ...: ascending, as one thread's.
void group_by_row(const std::vector<std::int64_t>& idx, std::int64_t vocab, Csr& g) {
  const auto n = static_cast<std::int64_t>(idx.size()), V = vocab;
  constexpr std::int64_t kGrain = 1 << 15;  // indices a thread at least
  const int team = static_cast<int>(std::clamp<std::int64_t>(n / kGrain, 1, cpu::threads()));
  g.offset.resize(static_cast<std::size_t>(V) + 1);
  g.pos.resize(static_cast<std::size_t>(n));
  g.counts.resize(static_cast<std::size_t>(team * V));
  std::vector<std::int64_t> block(static_cast<std::size_t>(team) + 1, 0);
  // Plain pointers: through the vectors, the loops would reload their data pointers.
  std::int32_t* const off = g.offset.data();
  std::int32_t* const pos = g.pos.data();
  std::int32_t* const counts = g.counts.data();
  const std::int64_t* const ix = idx.data();
  if (team == 1) {  // the counting sort itself, without the team's passes over the rows
    std::fill(off, off + V + 1, 0);
    for (std::int64_t i = 0; i < n; ++i) ++off[ix[i] + 1];
    for (std::int64_t r = 0; r < V; ++r) off[r + 1] += off[r];
    std::copy(off, off + V, counts);
    std::fill(pos, pos + n, 0);  // pos into the cache in order, before the scattered stores
    for (std::int64_t i = 0; i < n; ++i) pos[counts[ix[i]]++] = static_cast<std::int32_t>(i);
    return;
  }
#pragma omp parallel num_threads(team)
  {
    const int t = omp_get_thread_num();
    const std::int64_t i0 = n * t / team, i1 = n * (t + 1) / team, r0 = V * t / team, r1 = V * (t + 1) / team;
    std::int32_t* const mine = counts + t * V;
    std::fill(mine, mine + V, 0);
    std::fill(pos + i0, pos + i1, 0);  // pos into the caches in order, before the scattered stores
    for (std::int64_t i = i0; i < i1; ++i) ++mine[ix[i]];
#pragma omp barrier
    std::int64_t sum = 0;
    for (std::int64_t r = r0; r < r1; ++r) {
      std::int32_t run = 0;
      for (int u = 0; u < team; ++u) {
        std::int32_t& c = counts[u * V + r];
        const std::int32_t k = c;
        c = run, run += k;
      }
      off[r] = run, sum += run;
    }
    block[static_cast<std::size_t>(t) + 1] = sum;
#pragma omp barrier
#pragma omp single
    for (int u = 0; u < team; ++u) block[static_cast<std::size_t>(u) + 1] += block[static_cast<std::size_t>(u)];
    std::int64_t start = block[static_cast<std::size_t>(t)];
    for (std::int64_t r = r0; r < r1; ++r) {
      const std::int32_t total = off[r];
      off[r] = static_cast<std::int32_t>(start);
      for (int u = 0; u < team; ++u) counts[u * V + r] += off[r];
      start += total;
    }
#pragma omp barrier
    if (t == team - 1) off[V] = static_cast<std::int32_t>(n);
    for (std::int64_t i = i0; i < i1; ++i) pos[mine[ix[i]]++] = static_cast<std::int32_t>(i);
  }
}

Csr group_by_row(const std::vector<std::int64_t>& idx, std::int64_t vocab) {
  Csr g;
  group_by_row(idx, vocab, g);
  return g;
}

Inputs make_inputs(const Shape& s, std::uint64_t seed) {
  const auto n = static_cast<std::size_t>(s.n()), dim = static_cast<std::size_t>(s.dim);
  Inputs in;
  HostBuffer u(DType::f32, n);
  u.fill_uniform(seed, 0, 0.f, 1.f);
  in.idx.resize(n);
  for (std::size_t i = 0; i < n; ++i)
    in.idx[i] = std::min(s.vocab - 1, static_cast<std::int64_t>(u.as<float>()[i] * static_cast<float>(s.vocab)));
  if (s.dir == Direction::fwd) {
    in.W = HostBuffer(s.table_dtype(), static_cast<std::size_t>(s.vocab) * dim);
    in.W.fill_uniform(seed, 1);
  } else {
    in.dout = HostBuffer(s.dtype, n * dim);
    in.dout.fill_uniform(seed, 2);
  }
  return in;
}

HostBuffer make_output(const Shape& s) {
  const auto dim = static_cast<std::size_t>(s.dim);
  if (s.dir == Direction::fwd) return HostBuffer(s.dtype, static_cast<std::size_t>(s.n()) * dim);
  return HostBuffer(DType::f32, static_cast<std::size_t>(s.vocab) * dim);
}

Check verify(const Shape& s, const Inputs& in, const HostBuffer& out) {
  const auto dim = static_cast<std::size_t>(s.dim);
  if (s.dir == Direction::fwd) {
    const std::vector<std::size_t> idx = sample_indices(out.count(), std::size_t(1) << 18, 29);
    return compare(out, idx, [&](std::size_t i) { return reference_fwd(s, in, i); }, 0.0);
  }
  // Whole rows of dW: every row up to ~2^18 elements, else a sample that always has the first and
  // last rows and the most frequent one (the longest sum).
  std::vector<std::size_t> rows =
      sample_indices(static_cast<std::size_t>(s.vocab), std::max<std::size_t>(16, (std::size_t(1) << 18) / dim), 31);
  std::vector<std::int64_t> count(static_cast<std::size_t>(s.vocab), 0);
  for (std::int64_t r : in.idx) ++count[static_cast<std::size_t>(r)];
  const auto busiest = static_cast<std::size_t>(std::max_element(count.begin(), count.end()) - count.begin());
  if (std::find(rows.begin(), rows.end(), busiest) == rows.end()) rows.push_back(busiest);
  const std::vector<double> ref = reference_bwd(s, in, rows);
  std::vector<std::int64_t> slot(static_cast<std::size_t>(s.vocab), -1);
  std::vector<std::size_t> idx;
  idx.reserve(rows.size() * dim);
  for (std::size_t k = 0; k < rows.size(); ++k) {
    slot[rows[k]] = static_cast<std::int64_t>(k);
    for (std::size_t j = 0; j < dim; ++j) idx.push_back(rows[k] * dim + j);
  }
  return compare(
      out, idx,
      [&](std::size_t i) { return ref[static_cast<std::size_t>(slot[i / dim]) * dim + i % dim]; },
      tolerance(DType::f32));
}

HOTOPS_DEFINE_FAMILY(EmbeddingFamily);

}  // namespace hotops::embedding
