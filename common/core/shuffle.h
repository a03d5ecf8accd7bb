/* Seeded epoch orders: the permutation a dataset is walked in, the same for the same
 * (seed, epoch) on every machine (the learner's dispatch, its checkpoints' resume, and the
 * SFT tool's batches all rely on that). */
#ifndef QRL_CORE_SHUFFLE_H
#define QRL_CORE_SHUFFLE_H

#include <stddef.h>
#include <stdint.h>

/* Fill perm[n] (caller's) with the order of epoch `epoch`: a permutation of 0..n-1
 * (Fisher-Yates over splitmix64 seeded with seed and epoch). */
void qrl_epoch_order(size_t n, uint64_t seed, uint32_t epoch, uint32_t *perm);

#endif
