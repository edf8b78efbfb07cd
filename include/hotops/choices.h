// The setup-time searches' choices kept in a file across processes (--hotops_choices=FILE).
//
// A CUDA plan picks its cuDNN convolution algorithm, or its cublasLt GEMM algorithm, by timing the
// candidates at setup; candidates within a few percent of each other can come out in either order,
// so two processes can run one entry with different algorithms (docs/timing.md measured a convnet
// step whose processes spread by 5%, each set of algorithms within 0.5% of itself). With a choices
// file, the first process that searches a problem writes its choice there, and every later process
// reads it instead of searching: runs that share the file run the same algorithms, as the variants
// of one problem in one process always do (gpu::ChoiceCache). The file names the machine it was
// written on (the GPU, the driver, cuBLAS and cuDNN); a file of another machine is refused, since
// its choices were timed elsewhere.
//
// Format, one line each: "# ..." comments; "machine<TAB><what the choices depend on>", first; then
// "<kind><TAB><key><TAB><the choice's bytes in hex>", kind "conv", "gemm", "dbias" (addmm's bias
// gradient: epilogue or column sums) or "direct" (conv2d's direct kernel or cuDNN), key the search's own
// text of its problem.
#pragma once
#include <cstddef>
#include <string>

namespace hotops {

// Opens `path` for this process's searches: reads the choices it holds (it may not exist yet; it is
// created with its machine line) and appends each new one. Returns "" or the one line that says why
// the file cannot be used (another machine's, a malformed line, not writable). A later call
// replaces the earlier file; an empty path closes it.
std::string open_choices(const std::string& path, const std::string& machine);

// The stored choice of `kind` under `key` into the `size` bytes at `out`; false when there is none
// (or no file is open). Throws Error when the stored choice is not `size` bytes (a file written by
// another build).
bool stored_choice(const std::string& kind, const std::string& key, void* out, std::size_t size);

// Appends a new choice to the open file (nothing without one). Throws Error when the write fails.
void store_choice(const std::string& kind, const std::string& key, const void* data, std::size_t size);

}  // namespace hotops
