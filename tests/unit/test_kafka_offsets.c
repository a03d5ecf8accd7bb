#include <criterion/criterion.h>

#include "kafka/offsets.h"

Test(kafka_offsets, commits_only_the_done_prefix_in_order) {
    qrl_kafka_offsets *t = qrl_kafka_offsets_new();
    qrl_kafka_offset *a = qrl_kafka_offsets_push(t, 2, 10);
    qrl_kafka_offset *b = qrl_kafka_offsets_push(t, 2, 11);
    qrl_kafka_offset *c = qrl_kafka_offsets_push(t, 2, 12);
    qrl_kafka_offset *x = qrl_kafka_offsets_push(t, 0, 5);
    int32_t p = -1;
    cr_assert_eq(qrl_kafka_offset_value(b), 11);
    cr_assert_eq(qrl_kafka_offsets_done(t, b, &p), -1, "11 done but 10 is not: nothing to commit");
    cr_assert_eq(p, 2);
    cr_assert_eq(qrl_kafka_offsets_done(t, a, &p), 12, "10 and 11 done: commit up to 12");
    qrl_kafka_offsets_committed(t, 2, 12);
    cr_assert_eq(qrl_kafka_offsets_done(t, x, &p), 6);
    cr_assert_eq(p, 0);
    cr_assert_eq(qrl_kafka_offsets_done(t, c, &p), 13);
    qrl_kafka_offsets_free(t);
}

Test(kafka_offsets, never_moves_backwards_after_redelivery) {
    qrl_kafka_offsets *t = qrl_kafka_offsets_new();
    qrl_kafka_offset *a = qrl_kafka_offsets_push(t, 1, 7);
    cr_assert_eq(qrl_kafka_offsets_done(t, a, NULL), 8);
    qrl_kafka_offsets_committed(t, 1, 8);
    /* a rebalance redelivers offset 5 (committed by another member before) */
    qrl_kafka_offset *r = qrl_kafka_offsets_push(t, 1, 5);
    cr_assert_eq(qrl_kafka_offsets_done(t, r, NULL), -1);
    /* a failed commit is retried by the next done record */
    qrl_kafka_offset *b = qrl_kafka_offsets_push(t, 1, 8);
    qrl_kafka_offset *c = qrl_kafka_offsets_push(t, 1, 9);
    cr_assert_eq(qrl_kafka_offsets_done(t, b, NULL), 9); /* commit fails: not recorded */
    cr_assert_eq(qrl_kafka_offsets_done(t, c, NULL), 10);
    qrl_kafka_offsets_free(t); /* frees nothing pending: no leak under ASan */
}

Test(kafka_offsets, free_releases_pending_entries) {
    qrl_kafka_offsets *t = qrl_kafka_offsets_new();
    for (int i = 0; i < 100; i++) qrl_kafka_offsets_push(t, i % 7, i);
    qrl_kafka_offsets_free(t); /* LeakSanitizer would report pending entries */
}
