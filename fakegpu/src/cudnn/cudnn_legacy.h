/* The fake cuDNN's legacy tensor and filter descriptors (legacy.c), as its other sources
 * (rnn.c, ctc.c, convolution.c) read and make them: through the exported functions, by their
 * cuDNN names, the descriptor itself staying legacy.c's. */
#pragma once

#include "cudnn_status.h"

struct legacy_descriptor;

cudnnStatus_t cudnnSetTensorNdDescriptor(void *d, int data_type, int dims, const int *dim,
                                         const int *stride);
cudnnStatus_t cudnnGetTensorNdDescriptor(const struct legacy_descriptor *d, int requested,
                                         int *data_type, int *dims, int *dim, int *stride);
cudnnStatus_t cudnnSetFilterNdDescriptor(void *d, int data_type, int format, int dims,
                                         const int *dim);
cudnnStatus_t cudnnGetFilterNdDescriptor(const struct legacy_descriptor *d, int requested,
                                         int *data_type, int *format, int *dims, int *dim);
/* A tensor descriptor of no dimensions: what cuDNN describes a part an RNN does not have with. */
void fg_cudnn_describe_nothing(struct legacy_descriptor *d);
