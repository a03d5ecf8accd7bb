/* The learner's membership table (common/learner/members.h): registration checks,
 * heartbeats, the heartbeat timeout marking a replica lost (strictly after timeout_ms of
 * silence), a lost replica coming back clean, and a full table refusing or reusing the
 * oldest lost entry. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "learner/members.h"

static Qrl__ReplicaInfo info_of(const char *id) {
    Qrl__ReplicaInfo i = QRL__REPLICA_INFO__INIT;
    i.id = (char *)id;
    return i;
}

Test(qrl_members, register_heartbeat_expire_return) {
    static qrl_members m; /* large: keep it off the stack */
    memset(&m, 0, sizeof m);
    qrl_error e;
    qrl_replica *r0, *r1, *again;
    Qrl__ReplicaInfo i0 = info_of("r0"), i1 = info_of("r1"), bad = info_of("");
    cr_assert_eq(qrl_members_register(&m, &bad, 0, 0, &r0, &e), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(e.msg, "replica.id") != NULL, "%s", e.msg);
    char longid[129];
    memset(longid, 'x', 128), longid[128] = 0;
    Qrl__ReplicaInfo il = info_of(longid);
    cr_assert_eq(qrl_members_register(&m, &il, 0, 0, &r0, &e), QRL_STATUS_INVALID_ARGUMENT);
    cr_assert_eq(m.n, 0);

    cr_assert_eq(qrl_members_register(&m, &i0, 3, 1000, &r0, &e), QRL_OK);
    cr_assert_eq(qrl_members_register(&m, &i1, 3, 1000, &r1, &e), QRL_OK);
    cr_assert_eq(qrl_members_live(&m), 2);
    cr_assert_eq(qrl_members_find(&m, "r1"), r1);
    cr_assert_null(qrl_members_find(&m, "r2"));
    Qrl__RolloutStatus st = QRL__ROLLOUT_STATUS__INIT;
    st.version = 5;
    qrl_members_heartbeat(r0, &st, 2000);
    cr_assert_eq(r0->version, 5);
    cr_assert_not_null(r0->status);
    cr_assert_eq(r0->status->version, 5);

    /* timeout 1500 ms: r1 (last seen 1000) is lost after 2500, not at it */
    cr_assert_eq(qrl_members_expire(&m, 2500, 1500), 0);
    cr_assert_eq(qrl_members_expire(&m, 2501, 1500), 1);
    cr_assert(r1->lost && !r0->lost);
    cr_assert_eq(qrl_members_live(&m), 1);
    cr_assert_eq(qrl_members_expire(&m, 9000, 1500), 1, "r0 goes too; r1 is not marked twice");

    /* the same id registers again: the same entry, clean */
    r1->draining = true;
    cr_assert_eq(qrl_members_register(&m, &i1, 7, 9100, &again, &e), QRL_OK);
    cr_assert_eq(again, r1);
    cr_assert(!r1->lost && !r1->draining);
    cr_assert_null(r1->status);
    cr_assert_eq(r1->version, 7);
    cr_assert_eq(m.n, 2);
    cr_assert_eq(qrl_members_live(&m), 1);
    qrl_members_free(&m);
}

Test(qrl_members, full_table_busy_or_reuses_oldest_lost) {
    static qrl_members m;
    memset(&m, 0, sizeof m);
    qrl_error e;
    qrl_replica *r;
    char id[32];
    for (int i = 0; i < QRL_MAX_REPLICAS; i++) {
        snprintf(id, sizeof id, "r%d", i);
        Qrl__ReplicaInfo in = info_of(id);
        cr_assert_eq(qrl_members_register(&m, &in, 0, (uint64_t)(1000 + i), &r, &e), QRL_OK);
    }
    Qrl__ReplicaInfo extra = info_of("extra");
    cr_assert_eq(qrl_members_register(&m, &extra, 0, 5000, &r, &e), QRL_STATUS_BUSY);
    cr_assert(strstr(e.msg, "replicas registered already") != NULL, "%s", e.msg);
    /* r3 and r5 go silent; r3 (last seen earlier) is the one replaced */
    for (int i = 0; i < QRL_MAX_REPLICAS; i++)
        if (i != 3 && i != 5) qrl_members_heartbeat(&m.r[i], NULL, 100000);
    cr_assert_eq(qrl_members_expire(&m, 100000, 1000), 2);
    cr_assert_eq(qrl_members_register(&m, &extra, 0, 100001, &r, &e), QRL_OK);
    cr_assert_eq(r, &m.r[3]);
    cr_assert_str_eq(r->id, "extra");
    cr_assert(!r->lost);
    cr_assert_null(qrl_members_find(&m, "r3"));
    cr_assert_not_null(qrl_members_find(&m, "r5"));
    cr_assert_eq(qrl_members_live(&m), QRL_MAX_REPLICAS - 1);
    qrl_members_free(&m);
}
