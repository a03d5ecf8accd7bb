#include <criterion/criterion.h>
#include <string.h>

#include "core/status.h"

static qrl_status inner(int x, qrl_error *err) {
    if (x < 0) return qrl_error_set(err, QRL_STATUS_OUT_OF_RANGE, "field 'x' = %d is negative", x);
    return QRL_OK;
}

static qrl_status outer(int x, qrl_error *err) {
    QRL_TRY(inner(x, err));
    return QRL_OK;
}

Test(status, table_names_and_retriable) {
    cr_assert_str_eq(qrl_status_name(QRL_OK), "OK");
    cr_assert_str_eq(qrl_status_name(QRL_STATUS_CORRUPT), "CORRUPT");
    cr_assert(qrl_status_retriable(QRL_STATUS_NETWORK));
    cr_assert(qrl_status_retriable(QRL_STATUS_TIMEOUT));
    cr_assert_not(qrl_status_retriable(QRL_STATUS_CORRUPT));
    cr_assert_not(qrl_status_retriable(QRL_STATUS_PARSE));
    cr_assert_str_eq(qrl_status_name((qrl_status)999), "UNKNOWN");
}

Test(status, try_propagates_message_and_call_site) {
    qrl_error err;
    qrl_error_clear(&err);
    cr_assert_eq(outer(1, &err), QRL_OK);
    qrl_status st = outer(-3, &err);
    cr_assert_eq(st, QRL_STATUS_OUT_OF_RANGE);
    cr_assert_eq(err.status, QRL_STATUS_OUT_OF_RANGE);
    cr_assert_str_eq(err.msg, "field 'x' = -3 is negative");
    cr_assert(strstr(err.trace, "test_status.c:") != NULL, "trace: %s", err.trace);
    /* NULL error buffer is allowed */
    cr_assert_eq(outer(-1, NULL), QRL_STATUS_OUT_OF_RANGE);
}
