// Error checking for cuBLAS calls: a failure becomes a kvb::Error naming the call and
// cuBLAS's status. Host-only.
#pragma once
#include <cublas_v2.h>

#include <string>

#include "sim/core/error.h"

#define KVB_CUBLAS_CHECK(call)                                                                             \
  do {                                                                                                     \
    const cublasStatus_t kvb_st_ = (call);                                                                 \
    if (kvb_st_ != CUBLAS_STATUS_SUCCESS)                                                                  \
      throw ::kvb::Error(std::string("cuBLAS error in ") + #call + ": " + cublasGetStatusString(kvb_st_)); \
  } while (0)
