// The CPU runtime: one oneDNN engine and stream for the process, and the thread count.
#pragma once
#include <string>

#include <dnnl.hpp>

namespace hotops::cpu {

dnnl::engine& engine();
dnnl::stream& stream();

// Threads used by oneDNN and by hotops' own OpenMP loops (--hotops_threads; default: all cores).
void set_threads(int n);
int threads();

std::string isa_name();       // the ISA oneDNN dispatches to, e.g. "avx512_core_amx"
std::string onednn_version();
std::string cpu_model();

}  // namespace hotops::cpu
