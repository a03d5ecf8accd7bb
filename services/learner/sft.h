/* qrl-learner --mode sft: supervised warm start (issue 8 item 5; docs/learner-daemon.md
 * "SFT mode").  No Kafka, no replicas: next-token cross-entropy on the completion
 * tokens of a JSONL dataset, then an HF folder. */
#ifndef QRL_LEARNER_SFT_H
#define QRL_LEARNER_SFT_H

#include "core/config.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

/* Train `m` in place with the sft.* / dataset.* / adamw.* keys of `cfg`, write
 * sft.out (model + a copy of the tokenizer files at `tok_path`).  Returns the exit
 * status (0 done, 1 error, reported as one line on stderr). */
int ld_sft_run(const qrl_config_t *cfg, qrl_model *m, const qrl_tokenizer *tok,
               const char *tok_path);

#endif
