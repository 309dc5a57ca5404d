// Finds and opens one of NVIDIA's libraries at run time, as cuBLASLt (cublaslt_loader.cpp)
// and NCCL (collective/nccl_comm.cpp) are opened: so that one build runs with whichever
// release the machine has, and the build needs neither the library nor its headers. Where
// it looks, in order (the first file that loads and has every function the caller needs
// wins):
//  1. $<env>: the library file itself, or a folder that holds it;
//  2. the pip wheels under $VIRTUAL_ENV and then $CONDA_PREFIX:
//     lib/python3*/site-packages/nvidia/<wheel>/lib for each of `wheels`; then $CONDA_PREFIX/lib;
//  3. $CUDA_HOME/lib64, $CUDA_PATH/lib64, /usr/local/cuda/lib64 and the library folder of the
//     toolkit this build was compiled with;
//  4. the system's search (LD_LIBRARY_PATH, the ldconfig cache).
// In each folder the file names tried are `names`, in their order.
#pragma once
#include <functional>
#include <string>
#include <vector>

namespace sr1::cuda {

// What to look for, and the words for what a place held instead.
struct LibrarySearch {
  std::vector<std::string> names;   // file names, preferred first: "libnccl.so.2", ...
  std::string env;                  // the user's override: "SEARCHR1_NCCL_PATH"
  std::vector<std::string> wheels;  // folders under site-packages/nvidia/: "nccl"
  std::string none_there;           // a folder's note when it has none of `names`
  std::string lacking;              // after "<file> has no <function>": "(not NCCL 2?)"
  // Resolves the caller's functions from an opened library into its table; returns the first
  // one missing (the library is then closed and the search goes on), or null.
  std::function<const char*(void* lib)> resolve;
};

struct FoundLibrary {
  std::string path;   // the file loaded, as the dynamic loader resolved it; empty when none was
  std::string notes;  // else "place: what it held; ..." for every place, for the caller's error
};

FoundLibrary find_library(const LibrarySearch& what);

}  // namespace sr1::cuda
