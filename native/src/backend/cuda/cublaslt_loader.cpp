// Finds and opens libcublasLt at run time (search order in cublaslt_api.h), so one build runs
// with whichever cuBLAS 12 or 13 the machine has: a pip wheel, conda or the CUDA toolkit.
#include <dlfcn.h>
#include <glob.h>
#include <link.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "backend/cuda/cublaslt_api.h"

namespace sr1::cuda {
namespace {

constexpr const char* kNames[] = {"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"};

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

bool is_folder(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

template <typename F>
bool resolve(void* lib, const char* name, F* fn, const char** missing) {
  *fn = reinterpret_cast<F>(dlsym(lib, name));
  if (*fn == nullptr) *missing = name;
  return *fn != nullptr;
}

// Fills `api` from `lib`; returns the first function it lacks, or null.
const char* resolve_all(void* lib, CublasLt* api) {
  const char* missing = nullptr;
#define SR1_RESOLVE(f) resolve(lib, #f, &api->f, &missing)
  const bool ok = SR1_RESOLVE(cublasLtCreate) && SR1_RESOLVE(cublasLtDestroy) &&
                  SR1_RESOLVE(cublasLtGetStatusName) && SR1_RESOLVE(cublasLtMatmulDescCreate) &&
                  SR1_RESOLVE(cublasLtMatmulDescDestroy) &&
                  SR1_RESOLVE(cublasLtMatmulDescSetAttribute) &&
                  SR1_RESOLVE(cublasLtMatrixLayoutCreate) &&
                  SR1_RESOLVE(cublasLtMatrixLayoutDestroy) &&
                  SR1_RESOLVE(cublasLtMatmulPreferenceCreate) &&
                  SR1_RESOLVE(cublasLtMatmulPreferenceDestroy) &&
                  SR1_RESOLVE(cublasLtMatmulPreferenceSetAttribute) &&
                  SR1_RESOLVE(cublasLtMatmulAlgoGetHeuristic) && SR1_RESOLVE(cublasLtMatmul);
#undef SR1_RESOLVE
  return ok ? nullptr : missing;
}

// The search so far: one note per place looked in (for the failure message), and the
// library once one has loaded.
class Search {
 public:
  explicit Search(CublasLt* table) : table_(table) {}

  // Opens the library file the user named.
  bool file(const std::string& path, const std::string& label) {
    return open(path) || note(label, last_error_);
  }

  // Tries the library names that exist in `dir`.
  bool folder(const std::string& dir, const std::string& label) {
    if (!seen_.insert(dir).second) return false;
    if (!is_folder(dir)) return note(label, "no such folder");
    std::string outcome = "no libcublasLt there";
    for (const char* name : kNames) {
      const std::string path = dir + "/" + name;
      if (access(path.c_str(), F_OK) != 0) continue;
      if (open(path)) return true;
      outcome = last_error_;
    }
    return note(label, outcome);
  }

  // The cuBLAS wheels' library folders in the site-packages of the Python environment at
  // `prefix`.
  bool wheels(const std::string& prefix) {
    for (const char* sub : {"cu13", "cublas"}) {
      const std::string pattern = prefix + "/lib/python3*/site-packages/nvidia/" + sub + "/lib";
      glob_t g;
      if (glob(pattern.c_str(), GLOB_ONLYDIR, nullptr, &g) != 0) {
        note(pattern, "no such folder");
        continue;
      }
      const std::vector<std::string> dirs(g.gl_pathv, g.gl_pathv + g.gl_pathc);
      globfree(&g);
      for (const std::string& dir : dirs) {
        if (folder(dir, dir)) return true;
      }
    }
    return false;
  }

  // The dynamic loader's own search, by name.
  bool system() {
    for (const char* name : kNames) {
      if (open(name)) return true;
    }
    return note("the system's library path (LD_LIBRARY_PATH, ldconfig)", last_error_);
  }

  // The result of a search that found nothing.
  CublasLtLibrary failure() const {
    std::string msg = "cuBLASLt could not be loaded (tried libcublasLt.so.13, .so.12 and .so): ";
    for (size_t i = 0; i < notes_.size(); i++) msg += (i ? "; " : "") + notes_[i];
    msg += ". Install it (pip install nvidia-cublas, or nvidia-cublas-cu12, or the CUDA "
           "toolkit) or set SEARCHR1_CUBLAS_PATH to libcublasLt or its folder";
    CublasLtLibrary failed;
    failed.error = msg;
    return failed;
  }

  const CublasLtLibrary& found() const { return found_; }

 private:
  // Opens `file` (a path, or a bare name for the system's search); false with last_error_
  // set when it cannot be loaded or lacks a function.
  bool open(const std::string& file) {
    void* lib = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char* e = dlerror();
      last_error_ = e ? e : file + ": dlopen failed";
      return false;
    }
    CublasLt api{};
    if (const char* missing = resolve_all(lib, &api)) {
      last_error_ = file + " has no " + missing + " (too old a cuBLASLt?)";
      dlclose(lib);
      return false;
    }
    *table_ = api;
    // A bare name was found by the loader: ask it which file that was.
    const link_map* map = nullptr;
    const bool named = dlinfo(lib, RTLD_DI_LINKMAP, &map) == 0 && map && map->l_name[0];
    found_.api = table_;
    found_.path = named ? map->l_name : file;
    return true;
  }

  // Records what `place` held instead of a usable library; false, for the caller to return.
  bool note(const std::string& place, const std::string& outcome) {
    notes_.push_back(place + ": " + outcome);
    return false;
  }

  CublasLt* table_;
  CublasLtLibrary found_;
  std::vector<std::string> notes_;
  std::set<std::string> seen_;  // folders already tried, as several variables may name one
  std::string last_error_;
};

CublasLtLibrary search(CublasLt* table) {
  Search s(table);
  const std::string user = env("SEARCHR1_CUBLAS_PATH");
  if (!user.empty()) {
    // (dlopen's errors name the file, so that label need not)
    const bool found = is_folder(user) ? s.folder(user, "SEARCHR1_CUBLAS_PATH=" + user)
                                       : s.file(user, "SEARCHR1_CUBLAS_PATH");
    if (found) return s.found();
  }
  for (const char* var : {"VIRTUAL_ENV", "CONDA_PREFIX"}) {
    const std::string prefix = env(var);
    if (!prefix.empty() && s.wheels(prefix)) return s.found();
  }
  const std::string conda = env("CONDA_PREFIX");
  if (!conda.empty() && s.folder(conda + "/lib", conda + "/lib")) return s.found();
  std::vector<std::string> toolkits;
  for (const char* var : {"CUDA_HOME", "CUDA_PATH"}) {
    if (!env(var).empty()) toolkits.push_back(env(var) + "/lib64");
  }
  toolkits.push_back("/usr/local/cuda/lib64");
#ifdef SR1_CUDA_TOOLKIT_LIBDIR
  toolkits.push_back(SR1_CUDA_TOOLKIT_LIBDIR);
#endif
  for (const std::string& dir : toolkits) {
    if (s.folder(dir, dir)) return s.found();
  }
  if (s.system()) return s.found();
  return s.failure();
}

}  // namespace

const CublasLtLibrary& load_cublaslt() {
  static CublasLt table{};
  static const CublasLtLibrary loaded = search(&table);
  return loaded;
}

}  // namespace sr1::cuda
