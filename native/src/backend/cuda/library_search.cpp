// The search of library_search.h: each place either loads a library or leaves a note of what
// it held, and the notes become the caller's error when no place loads one.
#include "backend/cuda/library_search.h"

#include <dlfcn.h>
#include <glob.h>
#include <link.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <set>

namespace sr1::cuda {
namespace {

std::string env(const std::string& name) {
  const char* v = std::getenv(name.c_str());
  return v ? v : "";
}

bool is_folder(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// The search so far: one note per place looked in, and the file once one has loaded.
class Search {
 public:
  explicit Search(const LibrarySearch& what) : what_(what) {}

  // Opens the library file the user named.
  bool file(const std::string& path, const std::string& label) {
    return open(path) || note(label, last_error_);
  }

  // Tries the library names that exist in `dir`.
  bool folder(const std::string& dir, const std::string& label) {
    if (!seen_.insert(dir).second) return false;
    if (!is_folder(dir)) return note(label, "no such folder");
    std::string outcome = what_.none_there;
    for (const std::string& name : what_.names) {
      const std::string path = dir + "/" + name;
      if (access(path.c_str(), F_OK) != 0) continue;
      if (open(path)) return true;
      outcome = last_error_;
    }
    return note(label, outcome);
  }

  // The wheels' library folders in the site-packages of the Python environment at `prefix`.
  bool wheels(const std::string& prefix) {
    for (const std::string& wheel : what_.wheels) {
      const std::string pattern = prefix + "/lib/python3*/site-packages/nvidia/" + wheel + "/lib";
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
    for (const std::string& name : what_.names) {
      if (open(name)) return true;
    }
    return note("the system's library path (LD_LIBRARY_PATH, ldconfig)", last_error_);
  }

  FoundLibrary result() const {
    FoundLibrary r;
    r.path = path_;
    for (size_t i = 0; i < notes_.size(); i++) r.notes += (i ? "; " : "") + notes_[i];
    return r;
  }

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
    if (const char* missing = what_.resolve(lib)) {
      last_error_ = file + " has no " + missing + " " + what_.lacking;
      dlclose(lib);
      return false;
    }
    // A bare name was found by the loader: ask it which file that was.
    const link_map* map = nullptr;
    const bool named = dlinfo(lib, RTLD_DI_LINKMAP, &map) == 0 && map && map->l_name[0];
    path_ = named ? map->l_name : file;
    return true;
  }

  // Records what `place` held instead of a usable library; false, for the caller to return.
  bool note(const std::string& place, const std::string& outcome) {
    notes_.push_back(place + ": " + outcome);
    return false;
  }

  const LibrarySearch& what_;
  std::string path_;
  std::vector<std::string> notes_;
  std::set<std::string> seen_;  // folders already tried, as several variables may name one
  std::string last_error_;
};

// The places of library_search.h, in order; true once one has loaded the library.
bool search(Search& s, const std::string& user_var) {
  const std::string user = env(user_var);
  // (dlopen's errors name the file, so that label need not)
  if (!user.empty() && (is_folder(user) ? s.folder(user, user_var + "=" + user)
                                        : s.file(user, user_var))) {
    return true;
  }
  for (const char* var : {"VIRTUAL_ENV", "CONDA_PREFIX"}) {
    const std::string prefix = env(var);
    if (!prefix.empty() && s.wheels(prefix)) return true;
  }
  const std::string conda = env("CONDA_PREFIX");
  if (!conda.empty() && s.folder(conda + "/lib", conda + "/lib")) return true;
  std::vector<std::string> toolkits;
  for (const char* var : {"CUDA_HOME", "CUDA_PATH"}) {
    if (!env(var).empty()) toolkits.push_back(env(var) + "/lib64");
  }
  toolkits.push_back("/usr/local/cuda/lib64");
#ifdef SR1_CUDA_TOOLKIT_LIBDIR
  toolkits.push_back(SR1_CUDA_TOOLKIT_LIBDIR);
#endif
  for (const std::string& dir : toolkits) {
    if (s.folder(dir, dir)) return true;
  }
  return s.system();
}

}  // namespace

FoundLibrary find_library(const LibrarySearch& what) {
  Search s(what);
  search(s, what.env);  // when it finds nothing, the notes say why
  return s.result();
}

}  // namespace sr1::cuda
