/* The gRPC method table (rpc_paths.h). */
#include "wire/rpc_paths.h"

#include <string.h>

#include "core/status.h"
#include "qrl.pb-c.h"

static const qrl_rpc_method methods[QRL_RPC_COUNT_] = {
#define QRL_X_(id, svc, meth, req, resp, stream, token)                                       \
    {QRL_RPC_##id, "/qrl." #svc "/" #meth, "qrl." #svc, #meth, &qrl__##req##__descriptor,      \
     &qrl__##resp##__descriptor, stream, token},
    QRL_RPC_TABLE(QRL_X_)
#undef QRL_X_
};

const qrl_rpc_method *qrl_rpc_method_get(qrl_rpc_id id) {
    QRL_CHECK((unsigned)id < QRL_RPC_COUNT_);
    return &methods[id];
}

const qrl_rpc_method *qrl_rpc_method_find(const char *path, size_t len) {
    for (size_t i = 0; i < QRL_RPC_COUNT_; i++)
        if (strlen(methods[i].path) == len && memcmp(methods[i].path, path, len) == 0)
            return &methods[i];
    return NULL;
}
