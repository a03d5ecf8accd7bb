/* qrl status codes and error reporting: defined by the kernels' base, kernels/base/status.h
 * (the CUDA library's only dependency, so it links once), and used under this name by all
 * of common/ and services/. */
#ifndef QRL_CORE_STATUS_H
#define QRL_CORE_STATUS_H

#include "base/status.h"

#endif
