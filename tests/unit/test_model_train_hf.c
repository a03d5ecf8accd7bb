/* Training engine vs PyTorch: per-token log-probs and the gradient of every parameter of
 * each HF fixture (tests/fixtures/hf/<name>/grads.{json,safetensors}, written by
 * tests/reference/make_hf_grads.py with transformers in float32, eager attention) for
 *   loss = sum_t c_t * log p(ids[t + 1] | ids[..t]),   c_t = ((t * 7) % 5 - 2) / 3.
 * Bound: max|ours - torch| / max|torch| <= 1e-4 per tensor (both F32; summation orders
 * differ).  A tied head's gradient is the embedding's (torch lists the tied weight once,
 * as model.embed_tokens.weight).  Skipped while the reference files are absent. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "io/safetensors.h"
#include "model/model.h"
#include "train/model_train.h"

#define GRAD_TOL 1e-4
#define LOGP_TOL 1e-5

/* Compare one fixture; returns 0 when its reference files are absent. */
static int check_fixture(const char *dir, const char *name, double *worst_g, double *worst_lp) {
    char jp[600], sp[600];
    snprintf(jp, sizeof jp, "%s/grads.json", dir);
    snprintf(sp, sizeof sp, "%s/grads.safetensors", dir);
    if (access(jp, R_OK) != 0 || access(sp, R_OK) != 0) return 0;
    json_error_t je;
    json_t *root = json_load_file(jp, 0, &je);
    cr_assert_not_null(root, "%s: %s", jp, je.text);
    json_t *ja = json_object_get(root, "input_ids"), *jc = json_object_get(root, "coef"),
           *jl = json_object_get(root, "logprobs"), *jn = json_object_get(root, "params");
    int n = (int)json_array_size(ja);
    cr_assert(n >= 2 && (int)json_array_size(jc) == n - 1 && (int)json_array_size(jl) == n - 1,
              "%s: input_ids/coef/logprobs sizes", jp);

    qrl_error err;
    qrl_model *m;
    cr_assert_eq(qrl_model_load_hf(dir, &m, &err), QRL_OK, "%s", err.msg);
    int32_t *ids = malloc(n * sizeof *ids), *tgt = malloc(n * sizeof *tgt),
            *pos = malloc(n * sizeof *pos), *seg = calloc(n, sizeof *seg);
    float *lp = malloc(n * sizeof *lp), *dlp = calloc(n, sizeof *dlp);
    for (int t = 0; t < n; t++) {
        ids[t] = (int32_t)json_integer_value(json_array_get(ja, t));
        pos[t] = t;
    }
    for (int t = 0; t < n; t++) {
        tgt[t] = t + 1 < n ? ids[t + 1] : -1;
        if (t + 1 < n) dlp[t] = (float)json_number_value(json_array_get(jc, t));
    }
    qrl_model_train_t *tr;
    cr_assert_eq(qrl_model_train_new(m, n, &tr, &err), QRL_OK, "%s", err.msg);
    cr_assert_eq(qrl_model_train_forward(tr, ids, tgt, pos, seg, n, lp, NULL, &err), QRL_OK,
                 "%s", err.msg);
    double md = 0, mr = 0;
    for (int t = 0; t + 1 < n; t++) {
        double r = json_number_value(json_array_get(jl, t));
        md = fmax(md, fabs(lp[t] - r)), mr = fmax(mr, fabs(r));
    }
    double lpe = md / mr;
    *worst_lp = fmax(*worst_lp, lpe);
    cr_expect(lpe <= LOGP_TOL, "%s: logprobs max|diff| %.3e / max|ref| %.3g", name, md, mr);
    qrl_model_train_zero_grad(tr);
    cr_assert_eq(qrl_model_train_backward(tr, dlp, NULL, &err), QRL_OK, "%s", err.msg);

    qrl_safetensors *st;
    cr_assert_eq(qrl_safetensors_open(sp, &st, &err), QRL_OK, "%s", err.msg);
    /* every torch parameter is one of ours, and every one of ours is in the file */
    cr_expect_eq((int)json_array_size(jn), m->n_tensors, "%s: torch has %zu params, we %d",
                 name, json_array_size(jn), m->n_tensors);
    double worst = 0;
    for (int i = 0; i < m->n_tensors; i++) {
        const qrl_model_tensor *t = &m->tensors[i];
        size_t cnt = (size_t)t->shape[0] * (size_t)(t->ndim == 2 ? t->shape[1] : 1);
        qrl_tensor rt;
        cr_assert_eq(qrl_safetensors_get(st, t->name, &rt, &err), QRL_OK, "%s: %s", name,
                     err.msg);
        cr_assert_eq(rt.dtype, QRL_DTYPE_F32, "%s: %s not F32", name, t->name);
        size_t rcnt = 1;
        for (int d = 0; d < rt.ndim; d++) rcnt *= (size_t)rt.shape[d];
        cr_assert_eq(rcnt, cnt, "%s: %s has %zu elements in torch, %zu here", name, t->name,
                     rcnt, cnt);
        const float *g = qrl_model_train_grad_of(tr, t);
        double d = 0, r = 0;
        for (size_t j = 0; j < cnt; j++) {
            float ref;
            memcpy(&ref, (const char *)rt.data + j * 4, 4); /* the mapping may be unaligned */
            double e = fabs((double)g[j] - ref);
            if (!(e <= d)) d = e;
            r = fmax(r, fabs(ref));
        }
        double e = r > 0 ? d / r : d;
        worst = fmax(worst, e);
        cr_expect(e <= GRAD_TOL, "%s: %s gradient max|diff| %.3e / max|ref| %.3e", name,
                  t->name, d, r);
    }
    fprintf(stderr, "model_train_hf %-12s logp rel %.2e, worst tensor gradient rel %.2e (%d "
            "tensors)\n", name, lpe, worst, m->n_tensors);
    *worst_g = fmax(*worst_g, worst);
    qrl_safetensors_close(st);
    qrl_model_train_destroy(tr);
    qrl_model_free(m);
    json_decref(root);
    free(ids), free(tgt), free(pos), free(seg), free(lp), free(dlp);
    return 1;
}

Test(model_train_hf, gradients_match_pytorch) {
    DIR *d = opendir("tests/fixtures/hf");
    if (!d) cr_skip_test("tests/fixtures/hf not found (run from the repo root)");
    int done = 0;
    double wg = 0, wl = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char dir[512];
        snprintf(dir, sizeof dir, "tests/fixtures/hf/%s", e->d_name);
        done += check_fixture(dir, e->d_name, &wg, &wl);
    }
    closedir(d);
    if (!done)
        cr_skip_test("no tests/fixtures/hf/*/grads.safetensors: run "
                     "tests/reference/make_hf_grads.py on the GPU machine");
    fprintf(stderr, "model_train_hf: %d fixtures, worst logp rel %.2e, worst gradient rel %.2e\n",
            done, wl, wg);
}
