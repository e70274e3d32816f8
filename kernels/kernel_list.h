// kernels/kernel_list.h — every kernel Loom declares, as an X-macro list. The registry test
// checks that each has a CPU implementation and that nothing is registered that is not listed.
// Add a line here when you declare a kernel in kernels/<op>.h.
#pragma once

#define LOOM_FOR_EACH_KERNEL(X)   \
  X(copy)                         \
  X(fill)                         \
  X(binary_forward)               \
  X(scale_forward)                \
  X(axpy)                         \
  X(sum_dim_forward)              \
  X(sum_squares_forward)          \
  X(clip_factor_forward)          \
  X(loss_scale_step)              \
  X(gemm)                         \
  X(gemm_bias)                    \
  X(gemm_bias_gelu)               \
  X(gemm_dgelu_bgrad)             \
  X(gelu_forward)                 \
  X(gelu_backward)                \
  X(silu_forward)                 \
  X(silu_backward)                \
  X(swiglu_forward)               \
  X(swiglu_backward)              \
  X(layer_norm_forward)           \
  X(layer_norm_backward)          \
  X(rms_norm_forward)             \
  X(rms_norm_backward)            \
  X(residual_layer_norm_forward)  \
  X(residual_layer_norm_backward) \
  X(softmax_forward)              \
  X(softmax_backward)             \
  X(dropout_forward)              \
  X(dropout_backward)             \
  X(dropout_rows_forward)         \
  X(dropout_rows_backward)        \
  X(embedding_forward)            \
  X(embedding_backward)           \
  X(vocab_parallel_ids)           \
  X(rope_forward)                 \
  X(rope_backward)                \
  X(attention_forward)            \
  X(attention_backward)           \
  X(attention_block_forward)      \
  X(attention_block_merge)        \
  X(attention_block_backward)     \
  X(cross_entropy_forward)        \
  X(cross_entropy_backward)       \
  X(vocab_parallel_ce_forward)    \
  X(vocab_parallel_ce_backward)   \
  X(vocab_parallel_lse_combine)   \
  X(adamw_step)                   \
  X(adamw_multi_step)

// Kernels a device backend registers that have no CPU form (host↔device transfers, pinned host
// buffers for staging communication and for reading a step's numbers without waiting).
#define LOOM_FOR_EACH_DEVICE_ONLY_KERNEL(X) \
  X(copy_device_to_host)                    \
  X(copy_host_to_device)                    \
  X(device_count)                           \
  X(device_name)                            \
  X(set_current_device)                     \
  X(pinned_host_alloc)                      \
  X(pinned_host_free)                       \
  X(copy_device_to_pinned)                  \
  X(copy_pinned_to_device)                  \
  X(copy_device_to_pinned_async)            \
  X(hold_compute_stream)
