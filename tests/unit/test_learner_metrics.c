/* The learner's metrics outputs (common/learner/metrics.h): two updates published to
 * /metrics and to a TensorBoard file, read back over a plain socket and through the
 * independent event reader; an update needs Kafka in the daemon, not here. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "learner/metrics.h"
#include "metrics/tfevents.h"
#include "support/http_client.h"
#include "support/test_files.h"
#include "support/tfevents_reader.h"

/* The scalar keys of a metrics.jsonl line (services/learner/update.c, write_metrics), in
 * order, without step (the event's step) and the group-id lists. */
static const char *const JSONL_KEYS[] = {
    "version", "groups_used", "groups_dropped", "reward_mean", "reward_std", "accuracy", "response_len_mean",
    "version_min", "version_max", "kl_behav_prox", "max_w", "entropy", "loss", "tis_frac", "acr_frac",
    "clip_low", "clip_high", "grad_norm", "lr", "steps_taken", "steps_skipped", "tokens_trained",
    "train_tokens_per_s", "update_s", "snapshot_s"};
#define N_KEYS (sizeof JSONL_KEYS / sizeof JSONL_KEYS[0])

/* An update's record: the stats in *s, the timings in the record. */
typedef struct job {
    qrl_learner_stats stats;
    qrl_learner_metrics_record rec;
} job;

static const qrl_learner_metrics_record *fill_job(job *j, double k) {
    memset(j, 0, sizeof *j);
    qrl_learner_stats *s = &j->stats;
    j->rec.stats = s;
    s->groups_used = 6;
    s->groups_dropped = 2;
    s->reward_mean = 0.25 * k;
    s->reward_std = 0.5;
    s->accuracy = 0.125 * k;
    s->response_len_mean = 17;
    s->version_min = 3;
    s->version_max = 4;
    s->kl_behav_prox = 1e-4;
    s->max_w = 1.75;
    s->entropy_mean = 2.5;
    s->loss_mean = -0.0625;
    s->tis_frac = 0.01;
    s->acr_frac = 0.02;
    s->clip_frac_low = 0.03;
    s->clip_frac_high = 0.04;
    s->grad_norm_mean = 0.9;
    s->lr = 1e-6;
    s->steps_taken = 2;
    s->steps_skipped = 1;
    s->tokens_trained = 100;
    s->train_tokens_per_s = 1234.5;
    j->rec.update_s = 1.5 * k;
    j->rec.snapshot_s = 0.03125;
    return &j->rec;
}

static bool has_line(const char *text, const char *line) {
    char want[256];
    snprintf(want, sizeof want, "\n%s\n", line);
    return strstr(text, want) != NULL;
}

Test(learner_metrics, off_when_both_keys_are_empty) {
    qrl_learner_metrics_t *m = (qrl_learner_metrics_t *)1;
    qrl_error err;
    cr_expect_eq(qrl_learner_metrics_start("", "", &m, &err), QRL_OK);
    cr_expect_null(m);
    job j;
    qrl_learner_metrics_update(NULL, 1, 1, fill_job(&j, 1)); /* no-ops */
    qrl_learner_metrics_tick(NULL, &(qrl_learner_metrics_state){0});
    qrl_learner_metrics_stop(NULL);
}

Test(learner_metrics, updates_reach_prometheus_and_tensorboard) {
    char dir[64], tb[128];
    qrl_test_mkdtemp(dir);
    snprintf(tb, sizeof tb, "%s/runs", dir);
    qrl_learner_metrics_t *m;
    qrl_error err;
    cr_assert_eq(qrl_learner_metrics_start("127.0.0.1:0", tb, &m, &err), QRL_OK, "%s", err.msg);
    job j;
    qrl_learner_metrics_update(m, 1, 1, fill_job(&j, 1));
    qrl_learner_metrics_update(m, 2, 2, fill_job(&j, 2));
    qrl_learner_metrics_tick(m, &(qrl_learner_metrics_state){.groups_dispatched = 40, .groups_in_flight = 7, .groups_buffered = 3,
                                                        .results = 33, .duplicates = 1, .dead_letters = 2, .replicas = 4,
                                                        .replicas_synced = 3, .state = 2});

    char *resp = qrl_test_http(qrl_learner_metrics_port(m), "GET /metrics HTTP/1.0\r\n\r\n");
    const char *body = qrl_test_http_body(resp) - 1; /* keep the '\n' before the first line */
    const char *want[] = {
        "qrl_learner_step 2", "qrl_learner_version 2", "qrl_learner_reward_mean 0.5", "qrl_learner_accuracy 0.25",
        "qrl_learner_update_seconds 3", "qrl_learner_snapshot_seconds 0.03125", "qrl_learner_kl_behav_prox 0.0001",
        "qrl_learner_tis_fraction 0.01", "qrl_learner_acr_fraction 0.02", "qrl_learner_loss -0.0625",
        "qrl_learner_tokens_trained 100", "qrl_learner_tokens_trained_total 200", /* summed over both updates */
        "qrl_learner_steps_skipped_total 2", "qrl_learner_groups_in_flight 7", "qrl_learner_groups_buffered 3",
        "qrl_learner_replicas 4", "qrl_learner_replicas_synced 3", "qrl_learner_groups_dispatched_total 40",
        "qrl_learner_results_total 33", "qrl_learner_dead_letters_total 2", "qrl_learner_state 2",
        "# TYPE qrl_learner_results_total counter", "# TYPE qrl_learner_reward_mean gauge",
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        cr_expect(has_line(body, want[i]), "missing '%s' in:\n%s", want[i], body);
    free(resp);

    char path[512];
    snprintf(path, sizeof path, "%s", qrl_learner_metrics_events_path(m));
    qrl_learner_metrics_stop(m);
    tfr_event ev[4];
    int n;
    char why[64];
    cr_assert(tfr_read_events(path, ev, 4, &n, why), "%s", why);
    cr_assert_eq(n, 3); /* file_version + one per update */
    cr_expect_str_eq(ev[0].file_version, "brain.Event:2");
    for (int e = 1; e <= 2; e++) {
        cr_expect_eq(ev[e].step, e);
        cr_assert_eq(ev[e].n, (int)N_KEYS);
        for (size_t i = 0; i < N_KEYS; i++) cr_expect_str_eq(ev[e].v[i].tag, JSONL_KEYS[i]);
        cr_expect_eq(ev[e].v[0].value, (float)e);            /* version */
        cr_expect_eq(ev[e].v[3].value, 0.25f * (float)e);    /* reward_mean */
        cr_expect_eq(ev[e].v[9].value, (float)1e-4);         /* kl_behav_prox */
        cr_expect_eq(ev[e].v[13].value, 0.01f);              /* tis_frac */
        cr_expect_eq(ev[e].v[23].value, 1.5f * (float)e);    /* update_s */
    }
    qrl_test_rmtree(dir);
}

Test(learner_metrics, bad_values_name_the_key) {
    char dir[64], file[128];
    qrl_test_mkdtemp(dir);
    snprintf(file, sizeof file, "%s/f", dir);
    FILE *f = fopen(file, "w");
    fclose(f);
    qrl_learner_metrics_t *m;
    qrl_error err;
    cr_expect_eq(qrl_learner_metrics_start("127.0.0.1:x", "", &m, &err), QRL_STATUS_INVALID_ARGUMENT);
    cr_expect(strncmp(err.msg, "metrics.listen: ", 16) == 0, "%s", err.msg);
    cr_expect_null(m);
    /* the server is started, then given back */
    cr_expect_eq(qrl_learner_metrics_start("127.0.0.1:0", file, &m, &err), QRL_STATUS_IO);
    cr_expect(strncmp(err.msg, "metrics.tensorboard_dir: ", 25) == 0, "%s", err.msg);
    cr_expect_null(m);
    qrl_test_rmtree(dir);
}
