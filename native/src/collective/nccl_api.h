// The part of NCCL that NcclComm uses, declared here so that the build needs neither NCCL's
// headers nor a link against it: libnccl.so.2 is opened at run time (nccl_comm.cpp, the way
// backend/cuda/cublaslt_loader.cpp opens cuBLASLt) and called through a table of pointers.
// Values and layouts are those of nccl.h (NCCL 2.x; ncclUniqueId is 128 bytes, the enums'
// values have not changed since NCCL 2.0), which NVIDIA keeps stable within major version 2.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

namespace sr1::nccl {

enum ncclResult_t : int {
  ncclSuccess = 0,
  ncclInProgress = 7,
};

enum ncclDataType_t : int {
  ncclUint8 = 1,
  ncclFloat32 = 7,
  ncclFloat64 = 8,
};

enum ncclRedOp_t : int {
  ncclSum = 0,
};

struct ncclUniqueId {
  char internal[128];
};

struct ncclComm;
using ncclComm_t = ncclComm*;

struct Api {
  ncclResult_t (*ncclGetVersion)(int* version);
  ncclResult_t (*ncclGetUniqueId)(ncclUniqueId* id);
  ncclResult_t (*ncclCommInitRank)(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank);
  ncclResult_t (*ncclCommDestroy)(ncclComm_t comm);
  ncclResult_t (*ncclCommAbort)(ncclComm_t comm);
  ncclResult_t (*ncclCommGetAsyncError)(ncclComm_t comm, ncclResult_t* error);
  const char* (*ncclGetErrorString)(ncclResult_t result);
  ncclResult_t (*ncclAllReduce)(const void* send, void* recv, size_t count, ncclDataType_t type,
                                ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
  ncclResult_t (*ncclReduce)(const void* send, void* recv, size_t count, ncclDataType_t type,
                             ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream);
  ncclResult_t (*ncclAllGather)(const void* send, void* recv, size_t sendcount,
                                ncclDataType_t type, ncclComm_t comm, cudaStream_t stream);
};

// The library, found once per process: `api` set and `path` the file loaded, or `error` saying
// where it looked and what each place held.
struct Library {
  const Api* api = nullptr;
  std::string path, error;
};
const Library& load_nccl();

}  // namespace sr1::nccl
