#include "cuda/sample.cuh"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "cuda/launch.cuh"
#include "cuda/sample_dev.cuh"

qrl_status qrl_cuda_sample(const float *logits, int n, int vocab, const qrl_cuda_sample_req *req,
                           qrl_cuda_sample_out *out, void *stream, qrl_error *err) {
    if (n < 1 || vocab < 1)
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "sample: n=%d vocab=%d", n, vocab);
    if (vocab > QRL_CUDA_SAMPLE_MAX_VOCAB)
        return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE,
                             "sample: vocab %d exceeds the %d token ids the key holds", vocab,
                             QRL_CUDA_SAMPLE_MAX_VOCAB);
    smp_sample_kernel<<<n, SMP_NT, 0, (cudaStream_t)stream>>>(logits, vocab, req, out);
    return qrl_cuda_launch_status_("sample", err);
}

qrl_status qrl_cuda_sample_check(const qrl_cuda_sample_out *o, qrl_error *err) {
    switch (o->fail) {
    case QRL_CUDA_SAMPLE_OK: return QRL_OK;
    case QRL_CUDA_SAMPLE_NAN:
    case QRL_CUDA_SAMPLE_POSINF:
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "sampling: logits[%d] is %s",
                             o->fail_index, o->fail == QRL_CUDA_SAMPLE_NAN ? "NaN" : "+inf");
    case QRL_CUDA_SAMPLE_ALL_NEGINF:
        return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "sampling: all logits are -inf");
    }
    return qrl_error_set(err, QRL_STATUS_INTERNAL, "sampling: unknown device result %d", o->fail);
}

qrl_status qrl_cuda_philox4x32_10(const uint32_t *in, uint32_t *out, int n, void *stream,
                                  qrl_error *err) {
    if (n < 1) return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "philox: n=%d", n);
    smp_philox_kernel<<<(n + 255) / 256, 256, 0, (cudaStream_t)stream>>>(in, out, n);
    return qrl_cuda_launch_status_("philox", err);
}

qrl_status qrl_cuda_sample_uniform(const uint64_t *keys, double *u, int n, void *stream,
                                   qrl_error *err) {
    if (n < 1) return qrl_error_set(err, QRL_STATUS_INVALID_ARGUMENT, "sample uniform: n=%d", n);
    smp_uniform_kernel<<<(n + 255) / 256, 256, 0, (cudaStream_t)stream>>>(keys, u, n);
    return qrl_cuda_launch_status_("sample uniform", err);
}
