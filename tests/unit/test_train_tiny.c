/* End to end: a 1-layer Llama-style model built from the training layers (train_ops.h)
 * and trained with AdamW (adamw.h) on a synthetic copy task, on CPU.
 *
 *   embedding -> RMSNorm -> q,k,v -> RoPE -> packed GQA attention -> o -> residual
 *             -> RMSNorm -> SwiGLU MLP -> residual -> RMSNorm -> LM head -> log-probs
 *
 * Task: sequences [BOS d1..d6 SEP d1..d6] of random digits, 16 per batch packed into one
 * row of T = 224 tokens (segment ids, positions restarting at 0 in each sequence); the
 * loss is the mean -log p of the 6 copied digits of every sequence (every other target
 * is QRL_TRAIN_TARGET_IGNORE).  Sizes: V 16, D 32, 4 query heads / 2 kv heads of 8,
 * MLP 64; about 12k parameters. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "cpu/train_ops.h"
#include "train/adamw.h"
#include "train/lr_schedule.h"

enum { V = 16, D = 32, H = 4, KV = 2, HD = 8, F = 64, K = 6, SEQ = 2 * K + 2, NSEQ = 16,
       T = SEQ * NSEQ, BOS = 10, SEP = 11 };
#define EPS 1e-5f

/* parameter tensors, in the order of the flat block */
enum { P_EMB, P_G1, P_WQ, P_WK, P_WV, P_WO, P_G2, P_WG, P_WU, P_WD, P_G3, P_LM, P_COUNT };
static const size_t p_size[P_COUNT] = {V * D, D, H * HD * D, KV * HD * D, KV * HD * D,
                                       D * H * HD, D, F * D, F * D, D * F, D, V * D};
static const char *p_name[P_COUNT] = {"embed", "norm1", "wq", "wk", "wv", "wo",
                                      "norm2", "gate", "up", "down", "norm3", "lm_head"};

/* activations; A_* with a gradient twin in the d-block */
enum { A_X0, A_H1, A_Q, A_K, A_V, A_QR, A_KR, A_ATT, A_AO, A_X1, A_H2, A_GT, A_UP, A_HM, A_MO,
       A_X2, A_H3, A_LOGITS, A_COUNT };
static const size_t a_size[A_COUNT] = {T * D, T * D, T * H * HD, T * KV * HD, T * KV * HD,
                                       T * H * HD, T * KV * HD, T * H * HD, T * D, T * D, T * D,
                                       T * F, T * F, T * F, T * D, T * D, T * D, T * V};

typedef struct {
    float *params, *grads, *p[P_COUNT], *g[P_COUNT];
    size_t n_params;
    float *act, *dact, *a[A_COUNT], *da[A_COUNT];
    size_t n_act;
    float r1[T], r2[T], r3[T], lse_att[H * T], lse_v[T], logp[T], ent[T], dlogp[T];
    float cos_t[T * HD / 2], sin_t[T * HD / 2], inv_freq[HD / 2];
    int32_t tok[T], tgt[T], pos[T], seg[T];
    int n_targets;
} tiny;

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s >> 12, *s ^= *s << 25, *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1DULL;
}
static float rng_uniform(uint64_t *s, float a) {
    return ((float)(rng_next(s) >> 40) / (float)(1 << 24) * 2.0f - 1.0f) * a;
}

static void tiny_init(tiny *m, uint64_t seed) {
    memset(m, 0, sizeof *m);
    for (int i = 0; i < P_COUNT; i++) m->n_params += p_size[i];
    for (int i = 0; i < A_COUNT; i++) m->n_act += a_size[i];
    m->params = calloc(m->n_params, sizeof(float)), m->grads = calloc(m->n_params, sizeof(float));
    m->act = calloc(m->n_act, sizeof(float)), m->dact = calloc(m->n_act, sizeof(float));
    cr_assert(m->params && m->grads && m->act && m->dact);
    /* llm.c's malloc_and_point: one block per group, tensors carved in order */
    size_t off = 0;
    for (int i = 0; i < P_COUNT; off += p_size[i], i++)
        m->p[i] = m->params + off, m->g[i] = m->grads + off;
    off = 0;
    for (int i = 0; i < A_COUNT; off += a_size[i], i++)
        m->a[i] = m->act + off, m->da[i] = m->dact + off;
    /* PyTorch-like init: Linear U(-1/sqrt(in), 1/sqrt(in)), embedding U(-1, 1), gains 1 */
    const size_t fan_in[P_COUNT] = {0, 0, D, D, D, H * HD, 0, D, D, F, 0, D};
    for (int i = 0; i < P_COUNT; i++)
        for (size_t j = 0; j < p_size[i]; j++)
            m->p[i][j] = (i == P_G1 || i == P_G2 || i == P_G3) ? 1.0f
                         : rng_uniform(&seed, fan_in[i] ? 1.0f / sqrtf((float)fan_in[i]) : 1.0f);
    qrl_train_rope_config rc = {.theta = 10000.0};
    qrl_train_rope_inv_freq(m->inv_freq, HD, &rc);
}

static void tiny_free(tiny *m) { free(m->params), free(m->grads), free(m->act), free(m->dact); }

/* A fresh batch of NSEQ packed copy sequences. */
static void tiny_batch(tiny *m, uint64_t *s) {
    m->n_targets = 0;
    for (int b = 0; b < NSEQ; b++) {
        int32_t *tk = m->tok + b * SEQ;
        tk[0] = BOS, tk[K + 1] = SEP;
        for (int i = 0; i < K; i++) tk[1 + i] = tk[K + 2 + i] = (int32_t)(rng_next(s) % 10);
        for (int p = 0; p < SEQ; p++) {
            m->pos[b * SEQ + p] = p, m->seg[b * SEQ + p] = b;
            /* position p predicts token p + 1 when that is a copied digit */
            int want = p + 1 >= K + 2 && p + 1 < SEQ;
            m->tgt[b * SEQ + p] = want ? tk[p + 1] : QRL_TRAIN_TARGET_IGNORE;
            m->n_targets += want;
        }
    }
    qrl_train_rope_cos_sin(m->cos_t, m->sin_t, m->pos, m->inv_freq, T, HD);
}

/* Forward; returns the mean -log p over the targets (in double). */
static double tiny_forward(tiny *m) {
    float **a = m->a, **p = m->p;
    cr_assert_eq(qrl_train_embedding_forward(a[A_X0], m->tok, p[P_EMB], T, V, D, NULL), QRL_OK);
    qrl_train_rmsnorm_forward(a[A_H1], m->r1, a[A_X0], p[P_G1], T, D, EPS);
    qrl_train_matmul_forward(a[A_Q], a[A_H1], p[P_WQ], NULL, T, D, H * HD);
    qrl_train_matmul_forward(a[A_K], a[A_H1], p[P_WK], NULL, T, D, KV * HD);
    qrl_train_matmul_forward(a[A_V], a[A_H1], p[P_WV], NULL, T, D, KV * HD);
    qrl_train_rope_forward(a[A_QR], a[A_Q], m->cos_t, m->sin_t, T, H, HD);
    qrl_train_rope_forward(a[A_KR], a[A_K], m->cos_t, m->sin_t, T, KV, HD);
    qrl_train_attention_forward(a[A_ATT], m->lse_att, a[A_QR], a[A_KR], a[A_V], m->seg, T, H,
                                KV, HD);
    qrl_train_matmul_forward(a[A_AO], a[A_ATT], p[P_WO], NULL, T, H * HD, D);
    qrl_train_residual_forward(a[A_X1], a[A_X0], a[A_AO], T * D);
    qrl_train_rmsnorm_forward(a[A_H2], m->r2, a[A_X1], p[P_G2], T, D, EPS);
    qrl_train_matmul_forward(a[A_GT], a[A_H2], p[P_WG], NULL, T, D, F);
    qrl_train_matmul_forward(a[A_UP], a[A_H2], p[P_WU], NULL, T, D, F);
    qrl_train_swiglu_forward(a[A_HM], a[A_GT], a[A_UP], T * F);
    qrl_train_matmul_forward(a[A_MO], a[A_HM], p[P_WD], NULL, T, F, D);
    qrl_train_residual_forward(a[A_X2], a[A_X1], a[A_MO], T * D);
    qrl_train_rmsnorm_forward(a[A_H3], m->r3, a[A_X2], p[P_G3], T, D, EPS);
    qrl_train_matmul_forward(a[A_LOGITS], a[A_H3], p[P_LM], NULL, T, D, V);
    cr_assert_eq(qrl_train_logprob_forward(m->logp, m->ent, m->lse_v, a[A_LOGITS], m->tgt, T, V,
                                           NULL), QRL_OK);
    double loss = 0.0;
    for (int t = 0; t < T; t++) loss -= m->logp[t];
    return loss / m->n_targets;
}

/* Backward of the mean -log p: every gradient buffer is zeroed first (the layers add). */
static void tiny_backward(tiny *m) {
    float **a = m->a, **da = m->da, **p = m->p, **g = m->g;
    memset(m->grads, 0, m->n_params * sizeof(float));
    memset(m->dact, 0, m->n_act * sizeof(float));
    for (int t = 0; t < T; t++) m->dlogp[t] = -1.0f / (float)m->n_targets;
    qrl_train_logprob_backward(da[A_LOGITS], a[A_LOGITS], m->tgt, m->lse_v, NULL, m->dlogp, NULL,
                               T, V);
    qrl_train_matmul_backward(da[A_H3], g[P_LM], NULL, da[A_LOGITS], a[A_H3], p[P_LM], T, D, V);
    qrl_train_rmsnorm_backward(da[A_X2], g[P_G3], da[A_H3], a[A_X2], p[P_G3], m->r3, T, D);
    qrl_train_residual_backward(da[A_X1], da[A_MO], da[A_X2], T * D);
    qrl_train_matmul_backward(da[A_HM], g[P_WD], NULL, da[A_MO], a[A_HM], p[P_WD], T, F, D);
    qrl_train_swiglu_backward(da[A_GT], da[A_UP], da[A_HM], a[A_GT], a[A_UP], T * F);
    qrl_train_matmul_backward(da[A_H2], g[P_WG], NULL, da[A_GT], a[A_H2], p[P_WG], T, D, F);
    qrl_train_matmul_backward(da[A_H2], g[P_WU], NULL, da[A_UP], a[A_H2], p[P_WU], T, D, F);
    qrl_train_rmsnorm_backward(da[A_X1], g[P_G2], da[A_H2], a[A_X1], p[P_G2], m->r2, T, D);
    qrl_train_residual_backward(da[A_X0], da[A_AO], da[A_X1], T * D);
    qrl_train_matmul_backward(da[A_ATT], g[P_WO], NULL, da[A_AO], a[A_ATT], p[P_WO], T, H * HD, D);
    qrl_train_attention_backward(da[A_QR], da[A_KR], da[A_V], da[A_ATT], a[A_QR], a[A_KR], a[A_V],
                                 a[A_ATT], m->lse_att, m->seg, T, H, KV, HD);
    qrl_train_rope_backward(da[A_Q], da[A_QR], m->cos_t, m->sin_t, T, H, HD);
    qrl_train_rope_backward(da[A_K], da[A_KR], m->cos_t, m->sin_t, T, KV, HD);
    qrl_train_matmul_backward(da[A_H1], g[P_WQ], NULL, da[A_Q], a[A_H1], p[P_WQ], T, D, H * HD);
    qrl_train_matmul_backward(da[A_H1], g[P_WK], NULL, da[A_K], a[A_H1], p[P_WK], T, D, KV * HD);
    qrl_train_matmul_backward(da[A_H1], g[P_WV], NULL, da[A_V], a[A_H1], p[P_WV], T, D, KV * HD);
    qrl_train_rmsnorm_backward(da[A_X0], g[P_G1], da[A_H1], a[A_X0], p[P_G1], m->r1, T, D);
    qrl_train_embedding_backward(g[P_EMB], da[A_X0], m->tok, T, V, D);
}

/* Fraction of target positions whose argmax logit is the target (teacher forcing). */
static double tiny_accuracy(const tiny *m) {
    int hit = 0;
    for (int t = 0; t < T; t++) {
        if (m->tgt[t] < 0) continue;
        const float *z = m->a[A_LOGITS] + t * V;
        int best = 0;
        for (int j = 1; j < V; j++) if (z[j] > z[best]) best = j;
        hit += best == m->tgt[t];
    }
    return (double)hit / m->n_targets;
}

Test(train_tiny, whole_model_gradient_matches_finite_differences) {
    /* The composed backward against central differences of the composed F32 forward, at
     * the 3 largest-gradient elements of every parameter tensor.  F32 forward: the loss
     * is ~2.8 with rounding noise ~1e-6, so h = 1e-2 (noise/h ~ 1e-4 of a gradient of
     * ~1e-2; curvature error ~h^2); bound 2e-2 relative. */
    static tiny m;
    tiny_init(&m, 7);
    uint64_t s = 99;
    tiny_batch(&m, &s);
    tiny_forward(&m);
    tiny_backward(&m);
    double worst = 0.0;
    for (int i = 0; i < P_COUNT; i++) {
        int used[3] = {-1, -1, -1};
        for (int r = 0; r < 3; r++) {
            int best = -1;
            for (int j = 0; j < (int)p_size[i]; j++) {
                if (j == used[0] || j == used[1]) continue;
                if (best < 0 || fabsf(m.g[i][j]) > fabsf(m.g[i][best])) best = j;
            }
            used[r] = best;
            float keep = m.p[i][best], h = 1e-2f;
            m.p[i][best] = keep + h;
            double lp = tiny_forward(&m);
            m.p[i][best] = keep - h;
            double lm = tiny_forward(&m);
            m.p[i][best] = keep;
            double num = (lp - lm) / (2.0 * h), ana = m.g[i][best];
            double e = fabs(num - ana) / fmax(fabs(ana), 1e-4);
            worst = fmax(worst, e);
            cr_expect(e <= 2e-2, "%s[%d]: analytic %.6g numeric %.6g (rel %.2e)", p_name[i],
                      best, ana, num, e);
        }
    }
    fprintf(stderr, "train_tiny: whole-model grad check, 36 elements: max rel err %.2e\n", worst);
    tiny_free(&m);
}

Test(train_tiny, copy_task_loss_falls) {
    static tiny m;
    tiny_init(&m, 1);
    qrl_adamw_config cfg = {.beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f, .weight_decay = 0.01f,
                            .max_grad_norm = 1.0f};
    qrl_adamw_t *opt = NULL;
    cr_assert_eq(qrl_adamw_new(m.n_params, &cfg, &opt, NULL), QRL_OK);
    qrl_lr_schedule sched = {.decay = QRL_LR_DECAY_COSINE, .lr = 1e-2, .min_lr = 1e-3,
                             .warmup_steps = 20, .total_steps = 300};
    cr_assert_eq(qrl_lr_schedule_check(&sched, NULL), QRL_OK);

    uint64_t eval_seed = 12345, train_seed = 777;
    static tiny eval;
    tiny_init(&eval, 1);
    tiny_batch(&eval, &eval_seed);
    memcpy(m.tok, eval.tok, sizeof m.tok), memcpy(m.tgt, eval.tgt, sizeof m.tgt);
    memcpy(m.pos, eval.pos, sizeof m.pos), memcpy(m.seg, eval.seg, sizeof m.seg);
    memcpy(m.cos_t, eval.cos_t, sizeof m.cos_t), memcpy(m.sin_t, eval.sin_t, sizeof m.sin_t);
    m.n_targets = eval.n_targets;
    double eval0 = tiny_forward(&m), acc0 = tiny_accuracy(&m);

    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    double first = 0.0, last = 0.0;
    const int steps = 300;
    for (int step = 0; step < steps; step++) {
        tiny_batch(&m, &train_seed);
        double loss = tiny_forward(&m);
        tiny_backward(&m);
        qrl_adamw_step_info info;
        qrl_error err;
        cr_assert_eq(qrl_adamw_step(opt, m.params, m.grads, qrl_lr_schedule_at(&sched, step),
                                    &info, &err), QRL_OK, "%s", err.msg);
        if (step < 10) first += loss / 10;
        if (step >= steps - 10) last += loss / 10;
        if (step % 50 == 0 || step == steps - 1)
            fprintf(stderr, "train_tiny: step %3d loss %.4f grad_norm %.3f lr %.2e\n", step, loss,
                    info.grad_norm, qrl_lr_schedule_at(&sched, step));
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);

    memcpy(m.tok, eval.tok, sizeof m.tok), memcpy(m.tgt, eval.tgt, sizeof m.tgt);
    memcpy(m.pos, eval.pos, sizeof m.pos), memcpy(m.seg, eval.seg, sizeof m.seg);
    memcpy(m.cos_t, eval.cos_t, sizeof m.cos_t), memcpy(m.sin_t, eval.sin_t, sizeof m.sin_t);
    m.n_targets = eval.n_targets;
    double eval1 = tiny_forward(&m), acc1 = tiny_accuracy(&m);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    fprintf(stderr, "train_tiny: %zu params, %d steps of %d tokens in %.2f s; train loss "
            "(mean of 10) %.4f -> %.4f; held-out loss %.4f -> %.4f, accuracy %.3f -> %.3f\n",
            m.n_params, steps, T, secs, first, last, eval0, eval1, acc0, acc1);
    /* chance on 10 digits is ln 10 = 2.30; the copy is learnable exactly */
    cr_expect(eval0 > 2.0, "initial held-out loss %.4f", eval0);
    cr_expect(eval1 < eval0 / 20.0, "held-out loss %.4f -> %.4f: fell less than 20x", eval0,
              eval1);
    cr_expect(last < first / 20.0, "train loss %.4f -> %.4f", first, last);
    cr_expect(acc1 >= 0.99, "held-out copy accuracy %.3f", acc1);
    qrl_adamw_destroy(opt);
    tiny_free(&m), tiny_free(&eval);
}
