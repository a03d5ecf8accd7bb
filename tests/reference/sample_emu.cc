// The device sampler's block code (kernels/cuda/sample_dev.cuh) run on the CPU against
// qrl_sampler_sample, with no GPU: every CUDA thread of a block is a fiber (ucontext),
// __syncthreads and the warp shuffles are barriers among the fibers, and the fibers run in
// a fresh random order between barriers, so a missing barrier shows up as a wrong or
// changing result; a barrier not reached by every thread (divergence) is reported as a
// deadlock.  Shared memory is the kernel's `static` locals; atomics are plain (one fiber
// runs at a time).  A lab check for kernel edits (STYLE 7), not part of make test:
//   make build/lib/libqrl.a && g++ -std=c++17 -O2 -DQRL_SAMPLE_NT=64 -Icommon -Ikernels \
//     -Itests/cuda tests/reference/sample_emu.cc build/lib/libqrl.a -fopenmp -lm \
//     -o /tmp/sample_emu && /tmp/sample_emu [rows per small case] [rows per 151936 case]
// (QRL_SAMPLE_NT=512 is the launch size; 64 runs the same code faster.)  Exits 1 on a
// mismatch that is not within 1e-9 of a cumulative boundary, on a log-prob off by more than
// 1e-4, or on a refused row reported differently from the CPU.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#include <algorithm>
#include <functional>
#include <random>
#include <vector>

extern "C" {
#include "model/sampler.h"
}
#include "sample_cases.h"

// ---- the block emulator --------------------------------------------------------------
struct emu_dim3 { unsigned x, y, z; };
static emu_dim3 threadIdx, blockIdx, blockDim;
#define __device__
#define __global__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(n)

struct emu_barrier { int count = 0; unsigned gen = 0; };
static int emu_nt, emu_cur;
static bool emu_progress;
static ucontext_t emu_main;
static std::vector<ucontext_t> emu_ctx;
static std::vector<char> emu_done;
static std::vector<std::vector<char>> emu_stacks;
static emu_barrier emu_bar, emu_wbar[32];
static unsigned long long emu_xbuf[32][32];
static std::function<void()> emu_body;
static std::mt19937 emu_rng(12345);

static void emu_wait(emu_barrier &b, int n) {
    unsigned g = b.gen;
    emu_progress = true;
    if (++b.count == n) {
        b.count = 0;
        b.gen++;
        return;
    }
    while (b.gen == g) swapcontext(&emu_ctx[emu_cur], &emu_main);
}
static void __syncthreads() { emu_wait(emu_bar, emu_nt); }
template <class T> static T emu_exchange(T v, int src) {
    int w = threadIdx.x / 32, l = threadIdx.x % 32;
    memcpy(&emu_xbuf[w][l], &v, sizeof v);
    emu_wait(emu_wbar[w], 32);
    T r;
    memcpy(&r, &emu_xbuf[w][src], sizeof r);
    emu_wait(emu_wbar[w], 32);
    return r;
}
template <class T> static T __shfl_xor_sync(unsigned, T v, int o) {
    return emu_exchange(v, (int)(threadIdx.x & 31) ^ o);
}
template <class T> static T __shfl_up_sync(unsigned, T v, int o) {
    int l = threadIdx.x & 31;
    return emu_exchange(v, l >= o ? l - o : l);
}
static unsigned __ballot_sync(unsigned, int pred) {
    unsigned m = 0;
    for (int l = 0; l < 32; l++) m |= (unsigned)(emu_exchange<int>(pred != 0, l) != 0) << l;
    return m;
}
static int __popc(unsigned x) { return __builtin_popcount(x); }
static unsigned __float_as_uint(float f) {
    unsigned u;
    memcpy(&u, &f, 4);
    return u;
}
static unsigned long long __double2ull_rn(double x) { return (unsigned long long)nearbyint(x); }
static unsigned atomicAdd(unsigned *p, unsigned v) { unsigned o = *p; *p = o + v; return o; }
static unsigned long long atomicAdd(unsigned long long *p, unsigned long long v) {
    unsigned long long o = *p;
    *p = o + v;
    return o;
}
static unsigned atomicMax(unsigned *p, unsigned v) { unsigned o = *p; *p = v > o ? v : o; return o; }

static void emu_entry(int i) {
    emu_body();
    emu_done[i] = 1;
    emu_progress = true;
}

// Run body on nt fibers as one block; exits on a deadlock.
static void emu_block(int nt, std::function<void()> body) {
    emu_nt = nt;
    blockDim.x = nt;
    emu_body = std::move(body);
    emu_ctx.assign(nt, ucontext_t());
    emu_done.assign(nt, 0);
    emu_stacks.resize(nt);
    for (int i = 0; i < nt; i++) {
        emu_stacks[i].resize(1 << 16);
        getcontext(&emu_ctx[i]);
        emu_ctx[i].uc_stack.ss_sp = emu_stacks[i].data();
        emu_ctx[i].uc_stack.ss_size = emu_stacks[i].size();
        emu_ctx[i].uc_link = &emu_main;
        makecontext(&emu_ctx[i], (void (*)())emu_entry, 1, i);
    }
    std::vector<int> order(nt);
    for (int i = 0; i < nt; i++) order[i] = i;
    for (;;) {
        bool all = true;
        emu_progress = false;
        std::shuffle(order.begin(), order.end(), emu_rng);
        for (int i : order) {
            if (emu_done[i]) continue;
            all = false;
            threadIdx.x = i;
            emu_cur = i;
            swapcontext(&emu_main, &emu_ctx[i]);
        }
        if (all) return;
        if (!emu_progress) {
            fprintf(stderr, "deadlock: a barrier not reached by every thread\n");
            exit(2);
        }
    }
}

#include "cuda/sample_dev.cuh"

// ---- the comparison -------------------------------------------------------------------
static qrl_cuda_sample_out run_row(const float *x, int V, const qrl_cuda_sample_req &q) {
    qrl_cuda_sample_out o;
    memset(&o, 0xa5, sizeof o);
    blockIdx.x = 0;
    emu_block(SMP_NT, [&] { smp_sample_kernel(x, V, &q, &o); });
    return o;
}

static int n_draws, n_mismatch, n_fail;
static double worst_lp;

static void check(const float *x, int V, const qrl_sampling_params &sp, uint64_t group,
                  uint32_t resp, uint32_t pos, const char *what) {
    qrl_sampler *s;
    qrl_error err;
    if (qrl_sampler_new(V, &s, &err) != QRL_OK) exit(3);
    qrl_sample want;
    qrl_status st = qrl_sampler_sample(s, x, &sp, group, resp, pos, &want, &err);
    qrl_sampler_free(s);
    qrl_cuda_sample_req q = {sp.seed, group, resp, pos, sp.temperature, sp.top_k, sp.top_p, 0};
    qrl_cuda_sample_out o = run_row(x, V, q);
    n_draws++;
    if (st != QRL_OK) {
        char msg[QRL_ERROR_MSG_MAX] = "";
        if (o.fail == QRL_CUDA_SAMPLE_OK) {
            printf("FAIL %s: cpu refused (%s), device sampled %d\n", what, err.msg, o.token);
            n_fail++;
            return;
        }
        switch (o.fail) {
        case QRL_CUDA_SAMPLE_NAN: snprintf(msg, sizeof msg, "sampling: logits[%d] is NaN", o.fail_index); break;
        case QRL_CUDA_SAMPLE_POSINF: snprintf(msg, sizeof msg, "sampling: logits[%d] is +inf", o.fail_index); break;
        default: snprintf(msg, sizeof msg, "sampling: all logits are -inf"); break;
        }
        if (strcmp(msg, err.msg) != 0) {
            printf("FAIL %s: cpu '%s', device '%s'\n", what, err.msg, msg);
            n_fail++;
        }
        return;
    }
    if (o.fail != QRL_CUDA_SAMPLE_OK) {
        printf("FAIL %s: device refused (fail %d at %d), cpu sampled\n", what, o.fail, o.fail_index);
        n_fail++;
        return;
    }
    if (o.token != want.token) {
        double u = qrl_sampler_uniform(sp.seed, group, resp, pos);
        double d = sc_boundary_dist(x, V, &sp, u, want.token, o.token);
        n_mismatch++;
        printf("%s %s: token cpu %d device %d, boundary distance %.3g\n",
               d <= 1e-9 ? "note" : "FAIL", what, want.token, o.token, d);
        if (d > 1e-9) n_fail++;
        return;
    }
    double dl = fmax(fabs(o.logprob - want.logprob), fabs(o.logprob_truncated - want.logprob_truncated));
    if (dl > 1e-4 && o.truncated == (int)want.truncated) { /* a top-p cut one token apart? */
        double d = sc_boundary_dist(x, V, &sp, qrl_sampler_uniform(sp.seed, group, resp, pos),
                                    o.token, o.token);
        if (d <= 1e-9) {
            printf("note %s: top-p cut within %.3g of p: logprob_truncated cpu %g device %g\n",
                   what, d, want.logprob_truncated, o.logprob_truncated);
            return;
        }
    }
    worst_lp = fmax(worst_lp, dl);
    if (dl > 1e-4 || o.truncated != (int)want.truncated) {
        printf("FAIL %s: token %d logprob cpu %g/%g/%d device %g/%g/%d\n", what, o.token,
               want.logprob, want.logprob_truncated, want.truncated, o.logprob,
               o.logprob_truncated, o.truncated);
        n_fail++;
    }
}

int main(int argc, char **argv) {
    int rows_small = argc > 1 ? atoi(argv[1]) : 128, rows_big = argc > 2 ? atoi(argv[2]) : 0;
    // Philox against the CPU, bit for bit
    uint64_t rs = 7;
    for (int i = 0; i < 100000; i++) {
        uint32_t in[6], a[4], b[4];
        for (int k = 0; k < 6; k++) in[k] = (uint32_t)sc_next(&rs);
        qrl_philox4x32_10(in, in + 4, a);
        smp_philox(in, in + 4, b);
        if (memcmp(a, b, sizeof a)) { printf("FAIL philox at %d\n", i); return 1; }
        uint64_t k0 = sc_next(&rs), k1 = sc_next(&rs);
        if ((double)smp_uniform_bits(k0, k1, in[0], in[1]) * 0x1p-53 != qrl_sampler_uniform(k0, k1, in[0], in[1])) {
            printf("FAIL uniform at %d\n", i);
            return 1;
        }
    }
    // the grid of tests/cuda/test_cuda_sample.c (its rows per case for 7 and 1000 by default)
    const int Vs[] = {7, 1000, 5000, 151936};
    char what[160];
    for (int vi = 0; vi < 4; vi++) {
        int V = Vs[vi], rows = V > 10000 ? rows_big : V == 7 ? 2 * rows_small : V == 5000 ? (rows_small + 7) / 8 : rows_small;
        std::vector<float> x(V);
        for (int r = 0; r < SC_GRID * rows; r++) {
            qrl_sampling_params sp;
            uint64_t group;
            sc_grid_row(V, rows, r, x.data(), &sp, &group);
            snprintf(what, sizeof what, "V=%d T=%g k=%d p=%g row=%d", V, sp.temperature,
                     sp.top_k, sp.top_p, r);
            check(x.data(), V, sp, group, r, 1000 + r, what);
        }
        printf("V=%d done: draws %d mismatches %d failures %d worst |dlogprob| %.3g\n", V,
               n_draws, n_mismatch, n_fail, worst_lp);
        fflush(stdout);
    }
    // edge cases: tiny p, tiny T (underflowing weights), refusals
    {
        int V = 300;
        std::vector<float> x(V);
        sc_fill(x.data(), V, 1, 99);
        check(x.data(), V, {1.0f, 0, 1e-30f, 5}, 1, 2, 3, "tiny p");
        check(x.data(), V, {0.01f, 0, 1.0f, 5}, 1, 2, 3, "T=0.01");
        check(x.data(), V, {0.01f, 50, 0.95f, 6}, 1, 2, 3, "T=0.01 k=50 p=0.95");
        x[17] = NAN, x[40] = INFINITY;
        check(x.data(), V, {1.0f, 0, 1.0f, 5}, 1, 2, 3, "NaN");
        x[17] = 0;
        check(x.data(), V, {0.0f, 0, 1.0f, 5}, 1, 2, 3, "+inf greedy");
        for (int i = 0; i < V; i++) x[i] = -INFINITY;
        check(x.data(), V, {1.0f, 3, 0.5f, 5}, 1, 2, 3, "all -inf");
        x[0] = -INFINITY, x[V - 1] = 0.0f;
        check(x.data(), V, {1.0f, 3, 1.0f, 5}, 1, 2, 3, "one finite, k=3");
        check(x.data(), V, {0.0f, 0, 1.0f, 5}, 1, 2, 3, "one finite, greedy");
    }
    printf("total: draws %d mismatches %d (all within 1e-9 of a boundary unless FAIL) "
           "failures %d worst |dlogprob| %.3g\n", n_draws, n_mismatch, n_fail, worst_lp);
    return n_fail ? 1 : 0;
}
