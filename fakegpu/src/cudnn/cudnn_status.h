/* The fake cuDNN's statuses (cudnnStatus_t, cudnn_graph.h's values), shared by its sources:
 * the ones it returns. */
#pragma once

typedef int cudnnStatus_t;
enum {
    CUDNN_STATUS_SUCCESS = 0,
    CUDNN_STATUS_NOT_INITIALIZED = 1001,
    CUDNN_STATUS_BAD_PARAM = 2000,
    CUDNN_STATUS_BAD_PARAM_NULL_POINTER = 2002,
    CUDNN_STATUS_NOT_SUPPORTED = 3000,
    CUDNN_STATUS_ALLOC_FAILED = 4000,
};
