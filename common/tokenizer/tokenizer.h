/* Tokenizers and chat templates (SPEC §2).
 *
 * Three kinds, chosen by what `path` holds:
 *   - byte-level BPE (GPT-2 byte<->unicode map): tokenizer.json with a ByteLevel
 *     pre-tokenizer or decoder (Qwen2/2.5/3, Llama-3, GPT-2), or vocab.json + merges.txt;
 *     pre-tokenizer regexes run through PCRE2 (UTF + UCP, JIT when available), NFC through
 *     utf8proc where the tokenizer asks for it;
 *   - SentencePiece-style BPE in tokenizer.json (no ByteLevel: Prepend/Replace "▁"
 *     normalizer or Metaspace, byte_fallback <0xNN> tokens), e.g. TinyStories, Llama-2;
 *   - llama2.c tokenizer.bin (int32 max_token_length, then per token float32 score,
 *     int32 len, bytes), encoded exactly as llama2.c run.c does.
 *
 * Added/special tokens (tokenizer.json "added_tokens", tokenizer_config.json
 * "added_tokens_decoder") are single tokens: with parse_special they split the text
 * first (leftmost, then longest match), as HuggingFace tokenizers does.
 *
 * A loaded tokenizer is immutable: every function taking a const qrl_tokenizer* may be
 * called from several threads at once. */
#ifndef QRL_TOKENIZER_TOKENIZER_H
#define QRL_TOKENIZER_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

typedef struct qrl_tokenizer qrl_tokenizer; /* opaque */

/* Load a tokenizer.  `path` is
 *   - a directory holding tokenizer.json, or vocab.json + merges.txt (merges.txt may start
 *     with a "#version" line); tokenizer_config.json beside them, when present, adds
 *     added_tokens_decoder entries, bos_token / eos_token and the chat template;
 *   - a tokenizer.json file (tokenizer_config.json in the same folder is read too);
 *   - a llama2.c tokenizer.bin: then `vocab_size_hint` (the model's vocab size, as run.c
 *     takes it) is required; it is ignored for the other kinds.
 * *out is owned by the caller (qrl_tokenizer_free).  Errors name the file and field:
 * NOT_FOUND / IO (missing or unreadable file), PARSE (invalid JSON), CORRUPT (missing or
 * inconsistent field, truncated tokenizer.bin, a merge naming an unknown token),
 * UNSUPPORTED (a model / normalizer / pre-tokenizer type not implemented),
 * INVALID_ARGUMENT (tokenizer.bin without vocab_size_hint). */
qrl_status qrl_tokenizer_load(const char *path, int vocab_size_hint, qrl_tokenizer **out,
                              qrl_error *err);
void qrl_tokenizer_free(qrl_tokenizer *tok);

/* The tokenizer that belongs to a model when none is named: for a HuggingFace checkpoint
 * folder the folder itself when it holds tokenizer.json or vocab.json, else its
 * tokenizer.bin (a llama2.c model exported by qrl_model_save_hf); for a llama2.c .bin
 * the tokenizer.bin, else tok<vocab_size>.bin, beside it.  Returns `model_path`, `buf`
 * (filled, n bytes) or NULL when there is none. */
const char *qrl_tokenizer_find_default(const char *model_path, int vocab_size, char *buf, size_t n);

/* Number of ids (highest id + 1, added tokens included). */
int qrl_tokenizer_vocab_size(const qrl_tokenizer *tok);

/* Encode `len` bytes of `text` (need not be NUL-terminated).  *ids is malloc'd (caller
 * frees; non-NULL even when *n_ids == 0).  add_bos prepends BOS when the tokenizer has
 * one.  parse_special recognises special tokens (e.g. <|im_start|>) in the text; added
 * tokens not marked special are recognised either way (as HuggingFace's
 * split_special_tokens does).  llama2.c: BOS = 1, and a non-empty text gets run.c's
 * dummy-prefix " " token whether or not add_bos is set.
 * Errors: INVALID_ARGUMENT (text is not valid UTF-8, byte offset given; not checked for
 * llama2.c, which byte-falls-back anything), NOMEM. */
qrl_status qrl_tokenizer_encode(const qrl_tokenizer *tok, const char *text, size_t len,
                                bool add_bos, bool parse_special, int32_t **ids,
                                size_t *n_ids, qrl_error *err);

/* Decode ids to text; *text is malloc'd and NUL-terminated (caller frees).
 * skip_special drops special tokens (BOS/EOS/<|im_start|>...).  Byte-level and
 * byte-fallback tokens whose bytes do not form valid UTF-8 (a multi-byte character
 * split across a cut) are emitted as those raw bytes, unlike HuggingFace which writes
 * U+FFFD: concatenating the decodes of consecutive chunks gives the decode of the whole.
 * llama2.c: the piece after BOS loses its leading space and <0xNN> becomes the byte (run.c).
 * decode(encode(s)) == s for valid UTF-8 s, except where the tokenizer itself changes text:
 * NFC tokenizers give NFC(s); "▁" decodes to " " in Metaspace / sentencepiece-style ones;
 * characters outside a vocabulary without byte tokens become <unk>; a ByteLevel
 * add_prefix_space adds a leading space.  The text holds a NUL byte only where an id decodes
 * to byte 0.
 * Errors: INVALID_ARGUMENT (an id out of range or unassigned, with its index), NOMEM. */
qrl_status qrl_tokenizer_decode(const qrl_tokenizer *tok, const int32_t *ids, size_t n,
                                bool skip_special, char **text, qrl_error *err);

/* Raw piece string of one id as stored in the vocabulary (byte-level pieces in their
 * mapped form, e.g. "Ġthe"), valid while tok lives; NULL when out of range. */
const char *qrl_tokenizer_piece(const qrl_tokenizer *tok, int32_t id);
int32_t qrl_tokenizer_bos(const qrl_tokenizer *tok); /* -1 when none */
int32_t qrl_tokenizer_eos(const qrl_tokenizer *tok); /* -1 when none */
/* Id of a piece (model vocabulary or added token), -1 when absent. */
int32_t qrl_tokenizer_token_id(const qrl_tokenizer *tok, const char *piece);
/* True when `id` is a special token (skipped by decode's skip_special). */
bool qrl_tokenizer_is_special(const qrl_tokenizer *tok, int32_t id);
/* Chat template family named by tokenizer_config.json's chat_template: "chatml" when it
 * uses <|im_start|>, "llama3" when it uses <|start_header_id|>, else "plain".
 * Static string. */
const char *qrl_tokenizer_chat_template_name(const qrl_tokenizer *tok);

/* Render a one-turn prompt ending where the assistant's reply starts.  *out is malloc'd
 * (caller frees).  `system` may be NULL (no system block).  Encode the result with
 * parse_special = true and add_bos = false (llama3 already starts with <|begin_of_text|>).
 *   plain:  "{system}\n\n{user}"  (just "{user}" without system)
 *   chatml: "<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
 *           "<|im_start|>assistant\n"
 *   llama3: "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n{system}<|eot_id|>"
 *           "<|start_header_id|>user<|end_header_id|>\n\n{user}<|eot_id|>"
 *           "<|start_header_id|>assistant<|end_header_id|>\n\n"
 * Errors: UNSUPPORTED (unknown name), INVALID_ARGUMENT (NULL name or user), NOMEM. */
qrl_status qrl_chat_template_apply(const char *name, const char *system, const char *user,
                                   char **out, qrl_error *err);

#endif
