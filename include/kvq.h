/* kvq — run AQLM-quantized LLMs with a 4/8-bit quantized KV cache.
 *
 * Public C API. Every fallible call returns a kvq_status; on failure the
 * message (one line, naming the file and the problem) is available from
 * kvq_last_error() on the same thread. The library never exits the process. */
#ifndef KVQ_H
#define KVQ_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Marks the functions libkvq.so exports; everything else in the library is hidden. */
#if defined(__GNUC__) || defined(__clang__)
#define KVQ_API __attribute__((visibility("default")))
#else
#define KVQ_API
#endif

/* Library version, "MAJOR.MINOR.PATCH". */
KVQ_API const char *kvq_version(void);
/* Directory of the demo model shipped with kvq, or NULL when none is found: $KVQ_DEMO_MODEL
 * when set (NULL if it holds no config.json), else <prefix>/share/kvq/models/demo found
 * from where libkvq (or the program it is linked into) is installed, else the install
 * prefix kvq was configured with, else the source tree it was built from. */
KVQ_API const char *kvq_demo_model_dir(void);

typedef enum {
    KVQ_OK = 0,
    KVQ_ERR_IO,          /* file missing or unreadable */
    KVQ_ERR_FORMAT,      /* file present but malformed / inconsistent */
    KVQ_ERR_UNSUPPORTED, /* valid input this build cannot run */
    KVQ_ERR_NOMEM,       /* allocation failed */
    KVQ_ERR_ARG,         /* bad argument from the caller */
    KVQ_ERR_BACKEND,     /* backend failed at run time */
} kvq_status;

/* Message for the last failed call on this thread ("" if none). */
KVQ_API const char *kvq_last_error(void);
KVQ_API const char *kvq_status_str(kvq_status s);

/* KV cache element types, chosen separately for K and V. */
typedef enum {
    KVQ_CACHE_F32 = 0,
    KVQ_CACHE_F16 = 1,
    KVQ_CACHE_Q8 = 2, /* 32-value groups, fp16 absmax scale, int8 −127..127 */
    KVQ_CACHE_Q4 = 3, /* 32-value groups, fp16 absmax scale, int4 −8..7 */
} kvq_cache_type;

/* Parses "f32", "f16", "q8", "q4"; returns -1 when unknown. */
KVQ_API int kvq_cache_type_parse(const char *s);
KVQ_API const char *kvq_cache_type_name(kvq_cache_type t);

/* ---- tokenizer ---------------------------------------------------------- */

typedef struct kvq_tokenizer kvq_tokenizer;

/* Loads tokenizer.json (+ tokenizer_config.json, config.json if present) from dir. */
KVQ_API kvq_status kvq_tokenizer_load(const char *dir, kvq_tokenizer **out);
KVQ_API void kvq_tokenizer_free(kvq_tokenizer *tok);

/* Encodes len bytes of UTF-8 text. Writes at most max_ids ids and returns the
 * total count (call again with a bigger buffer if larger than max_ids), or -1
 * on error. add_bos prepends the BOS id when the tokenizer has one. */
KVQ_API int kvq_tokenize(const kvq_tokenizer *tok, const char *text, size_t len, int add_bos,
                 int32_t *ids, int max_ids);

/* Decodes ids to text as HF `decode(ids, skip_special_tokens=skip_special)` would.
 * Writes at most size-1 bytes plus a NUL; returns the full length, or -1 on error. */
KVQ_API int kvq_detokenize(const kvq_tokenizer *tok, const int32_t *ids, int n, int skip_special,
                   char *out, size_t size);

KVQ_API int kvq_vocab_size(const kvq_tokenizer *tok);
KVQ_API int32_t kvq_token_bos(const kvq_tokenizer *tok); /* -1 if none */
KVQ_API int kvq_token_is_eog(const kvq_tokenizer *tok, int32_t id); /* EOS / end-of-turn */

/* Streaming decoder: feed ids one at a time, get the text they complete.
 * Holds back incomplete UTF-8 sequences, so output never splits a character. */
typedef struct kvq_detok kvq_detok;
KVQ_API kvq_detok *kvq_detok_new(const kvq_tokenizer *tok, int skip_special);
/* Appends the newly completed text (NUL-terminated) to out; returns its length or -1. */
KVQ_API int kvq_detok_push(kvq_detok *d, int32_t id, char *out, size_t size);
/* Flushes held-back bytes (invalid tails become U+FFFD as HF does). */
KVQ_API int kvq_detok_flush(kvq_detok *d, char *out, size_t size);
KVQ_API void kvq_detok_free(kvq_detok *d);

/* ---- model -------------------------------------------------------------- */

typedef struct kvq_model kvq_model;

typedef struct {
    const char *backend; /* "cpu", "vulkan", or NULL/"auto": a real GPU when present, else the CPU */
    int n_threads;       /* 0: all cores */
    const char *device;  /* GPU device index ("0", "1"...) or part of its name; NULL: the best
                            (a GPU backend also reads KVQ_VK_DEVICE) */
    int aqlm_cb8;        /* CPU only, opt-in and lossy: one-codebook AQLM with 9..16-bit codes
                            (1x16) keeps its codebook as int8, one scale per codebook: half the
                            bytes, faster decode; ~1% RMS change of the weights (README) */
    int aqlm_lut8;       /* CPU with AVX-512 VBMI only, opt-in and lossy: 8-bit-code (2x8) AQLM
                            matmuls look up int8 tables instead of int16 ones: faster prompts,
                            ~1% RMS change of each matmul's outputs (README) */
    int aqlm_i8;         /* CPU only; 1 (the default): auto, on where the CPU class decodes faster
                            with it (AVX-512 VNNI; the load line says what was picked), 2: on, 0:
                            off. Lossy: one-codebook AQLM with 9..16-bit
                            codes (1x16, 1x16gN) keeps int8 codewords (64 power-of-two scale
                            classes) and multiplies steps of up to 16 tokens with 12-bit-quantized
                            activations (integer dot products; prompts past 16 tokens take the int8
                            tiles on the same codewords): steps of 2-16 tokens cost little more
                            than one; ~1% RMS change of the matmuls' outputs (docs/performance.md).
                            Off: the fp16 codebook and exact codeword gathers. Off with exact or
                            with aqlm_cb8 (which asks for that codebook form instead) */
    int exact;           /* CPU: 1 = prompts (batches of tokens) through the exact AQLM paths too.
                            0 (default): AQLM prompts take int8 tiles / int8 tables, whose
                            per-output error bound keeps kvq-ppl within the README's budget
                            (+0.1%); decode (one token per step) is the same either way.
                            Vulkan: 1 = 8-bit AQLM decode looks up f32 tables and AQLM prompts
                            take f32 tiles; 0 (default): fp16 tables where the device has fp16
                            arithmetic (README, mm_lut_h), int8 tiles where it has integer dot
                            products (mm_tile_i8, the CPU's bound) */
    int n_gpu_layers;    /* with a GPU backend: how many of the last layers run on it (with the
                            LM head), the rest on the CPU; -1 (the default) or >= the layer
                            count: all; 0: none (the CPU alone); KVQ_GPU_LAYERS_AUTO: as many as
                            the device's free memory holds with the KV cache of plan_ctx
                            positions. Ignored on the CPU backend. */
    int plan_ctx;        /* positions of KV cache the plan counts (and, with KVQ_GPU_LAYERS_AUTO,
                            leaves room for on the device); 0: min(trained context, 4096) */
    int plan_type_k, plan_type_v; /* kvq_cache_type of that cache (default f16) */
} kvq_model_params;

#define KVQ_GPU_LAYERS_AUTO (-2)

KVQ_API kvq_model_params kvq_model_default_params(void);

/* Loads an HF model directory (config.json, model.safetensors or
 * model.safetensors.index.json, tokenizer.json). */
KVQ_API kvq_status kvq_model_load(const char *dir, const kvq_model_params *p, kvq_model **out);
KVQ_API void kvq_model_free(kvq_model *m);

KVQ_API const kvq_tokenizer *kvq_model_tokenizer(const kvq_model *m);
KVQ_API int kvq_model_n_vocab(const kvq_model *m);
KVQ_API int kvq_model_n_ctx_train(const kvq_model *m);
/* The backend and device in use, e.g. "cpu: 2 threads, avx512". */
KVQ_API const char *kvq_model_backend_name(const kvq_model *m);
/* Why automatic selection passed over a preferred backend ("" if it did not). */
KVQ_API const char *kvq_model_backend_note(const kvq_model *m);
/* Comma-separated names of the backends built into this library, best first. */
KVQ_API const char *kvq_backend_names(void);
/* Bytes of weights one decoded token streams: all of them but the embedding
 * table, of which it reads one row (a tied table counts, as the LM head). */
KVQ_API size_t kvq_model_weight_bytes(const kvq_model *m);
/* Weight bytes one decoded token reads: kvq_model_weight_bytes, except that a mixture of
 * experts counts only the experts a token uses (Mixtral: 2 of 8). */
KVQ_API size_t kvq_model_step_bytes(const kvq_model *m);
/* Layers on the GPU backend (0 on the CPU alone, the layer count when all are). */
KVQ_API int kvq_model_gpu_layers(const kvq_model *m);
/* Most token rows one forward computes each bit for bit as a one-token decode: the fewest over
 * the backends the model runs on (the CPU, the GPU, both with offload; 16 on each now). A
 * speculative verify (the pending token and its drafts) or a server step's decode rows within it
 * give plain decoding's output; kvq_spec_new caps draft_max at one fewer. */
KVQ_API int kvq_model_exact_rows(const kvq_model *m);
/* One line: "plan: gpu_layers=<n>/<N> gpu_mib=<x> cpu_mib=<x> kv_gpu_mib=<x> kv_cpu_mib=<x>
 * allocs=<n>": weight bytes per backend, the KV cache of plan_ctx positions per backend, the
 * GPU's device allocations; " host_fallback_mib=<x>" when a full device put buffers in host memory. */
KVQ_API const char *kvq_model_plan(const kvq_model *m);
/* The same line for a model not loaded: from config.json and the checkpoint's headers only
 * (weights counted at their checkpoint size, allocations as the GPU backend would place them). */
KVQ_API kvq_status kvq_model_plan_only(const char *dir, const kvq_model_params *p, char *line, size_t size);

/* Counters of a model's backends since load, summed over them (zeros on the CPU alone). */
typedef struct {
    uint64_t dispatches, barriers, submits; /* GPU commands recorded */
    int allocs;                             /* device memory allocations held */
    size_t host_fallback_bytes;             /* buffers in host memory because the device was full */
    int pipelines;                          /* compute pipelines created so far (at load and context creation) */
    uint64_t dsets;                         /* descriptor sets allocated and written (0 per token when reused) */
    uint64_t waits;                         /* times the host blocked on the GPU's fences */
} kvq_backend_stats;
KVQ_API void kvq_model_backend_stats(const kvq_model *m, kvq_backend_stats *out);
/* With KVQ_VK_PROFILE=1 in the environment at load (the GPU then runs one command at a time):
 * device time per op kind since the last call, one "op=<kind> calls=<n> ms=<x> gbs=<x>" line
 * each; "" otherwise. out NULL: just reset. */
KVQ_API void kvq_model_profile(const kvq_model *m, char *out, size_t size);
/* One-line human description (architecture, sizes, weight format). */
KVQ_API const char *kvq_model_desc(const kvq_model *m);

/* ---- context: KV cache + evaluation -------------------------------------- */

typedef struct kvq_context kvq_context;

typedef struct {
    int n_ctx;                 /* 0: min(model's trained context, 4096) */
    int n_batch;               /* max tokens per forward pass; 0: 512 */
    kvq_cache_type type_k, type_v;
    int kv_rotate;             /* Hadamard-rotate head vectors before quantizing:
                                  -1: default (on for q4), 0 off, 1 on */
    int logits_all;            /* keep logits for every position of a batch (perplexity) */
    int embeddings;            /* keep the mean final-normed hidden state (kvq_embedding) */
} kvq_context_params;

KVQ_API kvq_context_params kvq_context_default_params(void);

KVQ_API kvq_status kvq_context_new(kvq_model *m, const kvq_context_params *p, kvq_context **out);
KVQ_API void kvq_context_free(kvq_context *c);
/* A warning about the context as made, "" when there is none: a GPU whose memory was full put
 * MiB of its KV cache and activations in host memory, which it reads over the bus (slower; fewer
 * GPU layers or a smaller context keep them on the device). The tools print it on stderr. */
KVQ_API const char *kvq_context_note(const kvq_context *c);

/* Evaluates n tokens at positions n_past .. n_past+n-1 (n_past = tokens already in
 * the cache). Splits into n_batch pieces internally. Longrope (Phi-3): a call that takes the
 * sequence across original_max_position_embeddings, either way, first evaluates the cached
 * tokens again with the other frequency table (as HF does). */
KVQ_API kvq_status kvq_eval(kvq_context *c, const int32_t *ids, int n);
/* Evaluates several contexts of the same model in one step: ctx[i] takes
 * n[i] tokens ids[i] at its own positions, with its own cache (a server's slots).
 * Each context's logits are as after kvq_eval. All contexts must share the model. */
KVQ_API kvq_status kvq_eval_batch(kvq_context *const *ctx, const int32_t *const *ids, const int *n, int count);
/* Turns logits_all on or off for the next evaluations (kvq_eval_batch then returns every row
 * of this context: a server verifying several slots' drafts in one step). */
KVQ_API kvq_status kvq_logits_all_set(kvq_context *c, int on);
/* Tokens currently in the cache. */
KVQ_API int kvq_n_past(const kvq_context *c);
/* Positions the context holds (its n_ctx after defaults were applied). */
KVQ_API int kvq_n_ctx(const kvq_context *c);
/* Drops cache positions >= n_past (e.g. to restart generation). */
KVQ_API kvq_status kvq_kv_truncate(kvq_context *c, int n_past);

/* Logits of the last evaluated position (n_vocab floats), or of batch row i
 * (0-based within the last kvq_eval call) when logits_all is set. */
KVQ_API const float *kvq_logits(const kvq_context *c);
KVQ_API const float *kvq_logits_row(const kvq_context *c, int i);

/* Bytes the KV cache occupies in total, and for the positions in use. */
KVQ_API size_t kvq_kv_bytes_total(const kvq_context *c);
KVQ_API size_t kvq_kv_bytes_used(const kvq_context *c);

/* KV sessions on disk. kvq_context_save writes the cache's first n_past positions in the
 * stored format (a q4 cache's file is about a quarter of an f16 one's) with the n_past tokens
 * that made them (the caller's: tokens[0..n_tokens), n_tokens == kvq_n_past(c)), under a
 * versioned, checksummed header naming the model and the cache's shape and types.
 * kvq_context_restore reads such a file into c (same model, cache types, rotation; n_ctx at
 * least the saved positions), replacing its cache: on success n_past is the saved count and
 * tokens[0..*n_tokens) the saved tokens (cap: room in tokens). It checks the whole file
 * before it changes anything; a mismatch or a damaged file is KVQ_ERR_FORMAT / KVQ_ERR_ARG
 * with one line naming the file and the problem. Logits are not saved: to sample right after
 * a restore, truncate one position and evaluate the last token again. */
KVQ_API kvq_status kvq_context_save(const kvq_context *c, const char *path, const int32_t *tokens, int n_tokens);
KVQ_API kvq_status kvq_context_restore(kvq_context *c, const char *path, int32_t *tokens, int cap, int *n_tokens);
/* Copies src's cached positions into dst (same model, cache types and rotation, dst's n_ctx
 * large enough), replacing dst's cache: n parallel choices share one prompt's evaluation. */
KVQ_API kvq_status kvq_context_copy(kvq_context *dst, const kvq_context *src);
/* With kvq_context_params.embeddings: the mean over every position evaluated by kvq_eval since
 * the cache was last empty of the hidden state after the final norm (n_embd floats into out,
 * not normalized). KVQ_ERR_ARG without the flag or before any position. */
KVQ_API kvq_status kvq_embedding(const kvq_context *c, float *out);
KVQ_API int kvq_model_n_embd(const kvq_model *m);

/* ---- speculative decoding ------------------------------------------------ */

/* Drafts K tokens cheaply, verifies them with ONE forward of the target over the pending
 * token and the drafts, keeps the longest accepted prefix and rolls both caches back past it.
 * Greedy output equals plain decoding token for token; with sampling the accept/resample rule
 * (kvq_sampler_verify) leaves the output distribution unchanged (docs/library.md). */
typedef struct kvq_spec kvq_spec;
typedef struct kvq_sampler kvq_sampler; /* (sampling, below) */

typedef struct {
    kvq_context *draft; /* a second model's context with the same tokenizer, or NULL */
    int lookup_n;       /* draft NULL: prompt lookup, the continuation of the most recent earlier
                           occurrence of the context's last lookup_n tokens (default 3) */
    int draft_max;      /* K, drafts per step; 0: 8 with a draft model, 6 with lookup; at most
                           kvq_model_exact_rows - 1 (and the target's n_batch - 1) */
    float draft_min_p;  /* a draft model stops drafting when its top probability is below; 0: off */
} kvq_spec_params;

KVQ_API kvq_spec_params kvq_spec_default_params(void);
/* OK when the two models' vocabularies agree (size, every token's text, BOS and end ids);
 * else KVQ_ERR_ARG with one line saying what differs. */
KVQ_API kvq_status kvq_vocab_check(const kvq_model *target, const kvq_model *draft);
/* target and p->draft must be empty (n_past 0); they stay the caller's to free, after s. */
KVQ_API kvq_status kvq_spec_new(kvq_context *target, const kvq_spec_params *p, kvq_spec **out);
KVQ_API void kvq_spec_free(kvq_spec *s);
/* Evaluates the prompt on the target and the draft. */
KVQ_API kvq_status kvq_spec_prompt(kvq_spec *s, const int32_t *ids, int n);
/* Instead of kvq_spec_prompt, at any point: the target's cache holds exactly ids[0..n) (its
 * n_past, evaluated by the caller, ids[n-1]'s logits current), e.g. a conversation's next turn or
 * a cache rebuilt after a context shift. The next step starts from those logits; the draft's cache
 * keeps the prefix it shares with the tokens it saw before. */
KVQ_API kvq_status kvq_spec_sync(kvq_spec *s, const int32_t *ids, int n);
/* Generates 1..cap tokens into out with smp (each one recorded with kvq_sampler_accept) and
 * returns how many, or -1 on error (kvq_last_error). The last one is not yet in the caches:
 * the next step evaluates it first. */
KVQ_API int kvq_spec_step(kvq_spec *s, kvq_sampler *smp, int32_t *out, int cap);
/* Tokens drafted and accepted since kvq_spec_new. */
KVQ_API void kvq_spec_stats(const kvq_spec *s, uint64_t *drafted, uint64_t *accepted);

/* ---- sampling ------------------------------------------------------------ */

typedef struct kvq_sampler kvq_sampler;

/* The llama.cpp chain: repeat penalty, top-k, top-p, min-p, temperature, draw.
 * Top-k/top-p select partially (no sort of the whole vocabulary). */
typedef struct {
    float temp;   /* <= 0: greedy */
    int top_k;    /* <= 0: off */
    float top_p;  /* >= 1: off */
    uint64_t seed;
    float min_p;          /* keep tokens with p >= min_p * p_max; <= 0: off */
    float repeat_penalty; /* 1: off; > 1 divides positive / multiplies negative logits */
    int repeat_last_n;    /* tokens of history the penalty looks at (0: off) */
} kvq_sampler_params;

KVQ_API kvq_sampler_params kvq_sampler_default_params(void);
KVQ_API kvq_sampler *kvq_sampler_new(const kvq_sampler_params *p);
/* Picks the next token; does not record it (call kvq_sampler_accept). */
KVQ_API int32_t kvq_sample(kvq_sampler *s, const float *logits, int n_vocab);
/* Records a token fed to the model (prompt or generated) for the repeat penalty. */
KVQ_API void kvq_sampler_accept(kvq_sampler *s, int32_t id);
/* The distribution kvq_sample draws from (after repeat penalty, top-k, top-p, min-p and
 * temperature) into probs[0..n_vocab): zero outside the kept tokens; greedy: one-hot. */
KVQ_API kvq_status kvq_sampler_dist(kvq_sampler *s, const float *logits, int n_vocab, float *probs);
/* Draws a token from probs (summing to ~1) with s's random state. */
KVQ_API int32_t kvq_sampler_draw(kvq_sampler *s, const float *probs, int n_vocab);
/* Speculative sampling's rule: keeps draft with probability min(1, p_target/p_draft), else draws
 * from max(0, p_target - p_draft) renormalized. p_draft NULL: a point mass on draft (lookup).
 * Returns the token; *accepted says which happened. */
KVQ_API int32_t kvq_sampler_verify(kvq_sampler *s, const float *p_target, const float *p_draft, int n_vocab,
                                   int32_t draft, int *accepted);
/* Forgets the recorded history (the random state keeps going). */
KVQ_API void kvq_sampler_reset(kvq_sampler *s);
KVQ_API void kvq_sampler_free(kvq_sampler *s);

/* ---- structured output: JSON constrained by a schema ------------------------ */

/* A JSON value being generated under a schema: masks the logits of tokens that cannot continue
 * a valid value (docs/serving.md lists the schema subset). schema: JSON schema text, or NULL for
 * any JSON object (response_format json_object). strict: keywords outside the subset are errors
 * (else ignored, so not enforced). tok NULL: bytes only (kvq_json_constraint_feed). On failure
 * returns NULL with one line in err (and kvq_last_error). */
typedef struct kvq_json_constraint kvq_json_constraint;
KVQ_API kvq_json_constraint *kvq_json_constraint_new(const kvq_tokenizer *tok, const char *schema, int strict, char *err,
                                                     size_t errsz);
/* The same kind of constraint for text under a GBNF grammar (llama.cpp's format, rule `root`);
 * the kvq_json_constraint_* calls below work on it. NULL with "rule 'r', line L column C: why"
 * in err when it does not compile. */
KVQ_API kvq_json_constraint *kvq_grammar_constraint_new(const kvq_tokenizer *tok, const char *gbnf, char *err,
                                                        size_t errsz);
/* Sets the logits of tokens that cannot come next to -inf; end-of-generation tokens stay only
 * when the value is complete. */
KVQ_API void kvq_json_constraint_apply(kvq_json_constraint *c, float *logits, int n_vocab);
/* 1 when token id may come next. */
KVQ_API int kvq_json_constraint_allows(const kvq_json_constraint *c, int32_t id);
/* Records a generated token: 0, or -1 when it is not allowed (nothing changes). */
KVQ_API int kvq_json_constraint_accept(kvq_json_constraint *c, int32_t id);
/* Records text (e.g. forced by the caller): 0, or -1 when it cannot continue the value (nothing changes). */
KVQ_API int kvq_json_constraint_feed(kvq_json_constraint *c, const char *text, size_t len);
/* 1: the value is complete (it may end here); 2: complete and nothing but its end may follow. */
KVQ_API int kvq_json_constraint_complete(const kvq_json_constraint *c);
/* Samples under the constraint: the sampler's pick when allowed, else a pick from the masked
 * logits (the mask is computed only then). Does not accept the token. */
KVQ_API int32_t kvq_json_constraint_sample(kvq_json_constraint *c, kvq_sampler *s, const float *logits, int n_vocab);
/* Layout: 0 (the default) compact, no blank outside strings and escapes only where
 * JSON.stringify writes them; 1 pretty, blanks between tokens (at most 16 a gap, one newline). */
KVQ_API void kvq_json_constraint_set_layout(kvq_json_constraint *c, int pretty);
/* Keywords of a non-strict schema that are not enforced, comma-separated ("" when none). */
KVQ_API const char *kvq_json_constraint_ignored(const kvq_json_constraint *c);
/* Starts over for a new value. */
KVQ_API void kvq_json_constraint_reset(kvq_json_constraint *c);
KVQ_API void kvq_json_constraint_free(kvq_json_constraint *c);

/* ---- chat templates ------------------------------------------------------ */

/* The HF chat template of a model, for the families kvq renders: "llama2"
 * ([INST] with <<SYS>>), "llama3" (header tokens; 3.1/3.2 system header with
 * dates), "mistral" ([INST]; where a system message goes, or whether one is
 * refused, depends on the template's revision: v0.1/v0.2's first user turn, v0.3's
 * last), "chatml", "phi3" (Phi-3, 3.5, 3-small), "gemma", "command-r", and "none"
 * (no template: the messages as running text, each user message on a new line).
 * Renderings equal HF's apply_chat_template for the published templates
 * (tests/data/chat_templates); a conversation the template raises on is refused. */
typedef struct kvq_chat_template kvq_chat_template;

typedef struct {
    const char *role;         /* "system", "user", "assistant", "tool" */
    const char *content;      /* NULL only on an assistant message with tool_calls */
    const char *tool_calls;   /* assistant: OpenAI's tool_calls array as JSON text, or NULL */
    const char *tool_call_id; /* tool: the id of the call this answers, or NULL */
} kvq_chat_msg;

/* Family name for a Jinja template text ("none" for NULL), or NULL when not recognized. */
KVQ_API const char *kvq_chat_template_detect(const char *template_text);
/* Reads chat_template, bos_token and eos_token from dir/tokenizer_config.json
 * (or dir/chat_template.jinja). name (a family name) overrides the template's
 * family; NULL recognizes it from the text, "none" when there is no template. */
KVQ_API kvq_status kvq_chat_template_load(const char *dir, const char *name, kvq_chat_template **out);
KVQ_API const char *kvq_chat_template_name(const kvq_chat_template *t);
/* Renders the conversation as HF apply_chat_template(tokenize=False) does,
 * BOS included as text: tokenize the result without add_bos. Writes at most
 * size-1 bytes plus a NUL; returns the full length, or -1 on error (e.g. roles
 * that the template rejects). */
KVQ_API int kvq_chat_render(const kvq_chat_template *t, const kvq_chat_msg *msgs, int n, int add_generation_prompt, char *out,
                    size_t size);
KVQ_API void kvq_chat_template_free(kvq_chat_template *t);

/* ---- tool calling (docs/serving.md "Tools") ---- */

/* The template's tool-call format: "llama3-json" (Llama-3.1/3.2), "mistral" (v0.3's
 * [TOOL_CALLS]), "qwen" (Qwen2.5's <tool_call>), or NULL when it has none. */
KVQ_API const char *kvq_chat_template_tools(const kvq_chat_template *t);
/* kvq_chat_render with tools: tools_json is OpenAI's tools array as JSON text (NULL:
 * none). Messages may carry tool_calls and tool results. A template without tool
 * calling refuses tools and tool messages (-1). */
KVQ_API int kvq_chat_render_tools(const kvq_chat_template *t, const kvq_chat_msg *msgs, int n, const char *tools_json,
                                  int add_generation_prompt, char *out, size_t size);

typedef struct {
    char *id;        /* the model's id where the format has one (Mistral), else made up */
    char *name;      /* function name */
    char *arguments; /* the arguments object as JSON text */
} kvq_tool_call;

/* The tool calls in a finished reply, in the template's format. Returns how many (0:
 * none, the text is plain content), *calls (free with kvq_tool_calls_free) and
 * *content: the text outside the calls (malloc'd, may be ""). -1 when out of memory. */
KVQ_API int kvq_chat_parse_tools(const kvq_chat_template *t, const char *text, kvq_tool_call **calls, char **content);
KVQ_API void kvq_tool_calls_free(kvq_tool_call *calls, int n);
/* While streaming: how many leading bytes of text are plain content for sure; the
 * rest may be (the start of) a tool call and is held back until the reply ends. */
KVQ_API size_t kvq_chat_tools_plain_prefix(const kvq_chat_template *t, const char *text);

#ifdef __cplusplus
}
#endif
#endif
