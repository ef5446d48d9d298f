/* safetensors header parsing and config.json validation, good and malformed. */
#include <math.h>
#include <stdio.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>

#include "model/hparams.h"
#include "model/safetensors.h"
#include "testutil.h"

/* Builds [u64 len][header][data_len zero bytes] in a malloc'd buffer. */
static uint8_t *image(const char *header, size_t data_len, size_t *size) {
    size_t hl = strlen(header);
    *size = 8 + hl + data_len;
    uint8_t *b = calloc(1, *size);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(b + 8, header, hl);
    return b;
}

static kvq_status parse(const char *header, size_t data_len, kvq_st *st) {
    size_t size;
    uint8_t *b = image(header, data_len, &size);
    memset(st, 0, sizeof *st);
    kvq_status s = kvq_st_parse(st, b, size, "mem.safetensors", 0);
    free(b);
    return s;
}

static void test_good_header(void **state) {
    kvq_st st;
    assert_int_equal(parse("{\"__metadata__\":{\"format\":\"pt\"},"
                           "\"a\":{\"dtype\":\"F16\",\"shape\":[2,3],\"data_offsets\":[0,12]},"
                           "\"b\":{\"dtype\":\"I8\",\"shape\":[4],\"data_offsets\":[12,16]},"
                           "\"s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[16,20]}}",
                           20, &st),
                     KVQ_OK);
    assert_int_equal(st.n_tensors, 3);
    const kvq_st_tensor *a = kvq_st_find(&st, "a");
    assert_non_null(a);
    assert_int_equal(a->dtype, KVQ_DT_F16);
    assert_int_equal(a->n_dims, 2);
    assert_int_equal(a->shape[1], 3);
    assert_int_equal(a->nbytes, 12);
    const kvq_st_tensor *s = kvq_st_find(&st, "s");
    assert_int_equal(s->n_dims, 0);
    assert_int_equal(s->nbytes, 4);
    assert_null(kvq_st_find(&st, "missing"));
    kvq_st_close(&st);
}

static void expect_bad(const char *header, size_t data_len, const char *needle) {
    kvq_st st;
    kvq_status s = parse(header, data_len, &st);
    kvq_st_close(&st);
    assert_int_not_equal(s, KVQ_OK);
    const char *msg = kvq_last_error();
    if (!strstr(msg, "mem.safetensors") || !strstr(msg, needle)) fail_msg("message '%s' lacks '%s'", msg, needle);
    assert_null(strchr(msg, '\n'));
}

static void test_bad_headers(void **state) {
    expect_bad("{\"a\":{\"dtype\":\"F16\",\"shape\":[2,3],\"data_offsets\":[0,12]}}", 8, "past the end");
    expect_bad("{\"a\":{\"dtype\":\"F16\",\"shape\":[2,3],\"data_offsets\":[0,10]}}", 12, "10 bytes of data");
    expect_bad("{\"a\":{\"dtype\":\"F16\",\"shape\":[2,3],\"data_offsets\":[8,4]}}", 12, "bad data_offsets");
    expect_bad("{\"a\":{\"dtype\":\"Q4\",\"shape\":[2],\"data_offsets\":[0,1]}}", 12, "unknown dtype");
    expect_bad("{\"a\":{\"dtype\":\"F16\",\"shape\":[-2],\"data_offsets\":[0,4]}}", 12, "bad shape");
    expect_bad("{\"a\":{\"dtype\":\"F16\",\"shape\":[4294967296,4294967296,4294967296],\"data_offsets\":[0,4]}}", 12, "overflows");
    expect_bad("{\"a\":{\"dtype\":\"F16\",\"shape\":[2]}}", 12, "data_offsets");
    expect_bad("{\"a\":[1,2]}", 12, "not an object");
    expect_bad("{\"a\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,4]}", 12, "not a JSON object"); /* truncated */
    expect_bad("[1,2,3]", 12, "not a JSON object");
    expect_bad("{\"a\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,4]},\"a\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,4]}}",
               12, "twice");
}

static void test_bad_lengths(void **state) {
    kvq_st st = {0};
    uint8_t tiny[5] = {0};
    assert_int_not_equal(kvq_st_parse(&st, tiny, sizeof tiny, "mem.safetensors", 0), KVQ_OK);
    assert_non_null(strstr(kvq_last_error(), "too short"));
    uint8_t huge[16] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, '{', '}'};
    assert_int_not_equal(kvq_st_parse(&st, huge, sizeof huge, "mem.safetensors", 0), KVQ_OK);
    assert_non_null(strstr(kvq_last_error(), "header length"));
    kvq_st_close(&st);
}

static void test_missing_file(void **state) {
    kvq_st st;
    char dir[512];
    snprintf(dir, sizeof dir, "%s/empty-model", tu_tmpdir());
    mkdir(dir, 0755);
    assert_int_equal(kvq_st_open_dir(&st, dir), KVQ_ERR_IO);
    assert_non_null(strstr(kvq_last_error(), "model.safetensors"));
}

static const char *CFG =
    "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":256,\"intermediate_size\":704,\"num_hidden_layers\":4,"
    "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"vocab_size\":32000,\"rms_norm_eps\":1e-5,%s}";

static kvq_status parse_cfg(const char *extra, kvq_hparams *hp) {
    char text[2048];
    snprintf(text, sizeof text, CFG, extra);
    kvq_status s = kvq_hparams_parse(text, "cfg/config.json", hp);
    return s;
}

static void test_config(void **state) {
    kvq_hparams hp;
    assert_int_equal(parse_cfg("\"rope_theta\":10000", &hp), KVQ_OK);
    assert_int_equal(hp.head_dim, 64);
    assert_int_equal(hp.n_head_kv, 2);
    assert_int_equal(hp.aqlm, 0);
    kvq_hparams_free(&hp);
    assert_int_equal(parse_cfg("\"quantization_config\":{\"quant_method\":\"aqlm\",\"num_codebooks\":2,\"nbits_per_codebook\":8,"
                               "\"in_group_size\":8,\"out_group_size\":1,\"linear_weights_not_to_quantize\":[\"lm_head.weight\"]}",
                               &hp),
                     KVQ_OK);
    assert_int_equal(hp.aqlm_codebooks, 2);
    assert_int_equal(hp.n_not_quantized, 1);
    kvq_hparams_free(&hp);

    struct { const char *extra, *needle; kvq_status s; } bad[] = {
        {"\"quantization_config\":{\"quant_method\":\"gptq\"}", "quant_method 'gptq'", KVQ_ERR_UNSUPPORTED},
        {"\"quantization_config\":{\"quant_method\":\"aqlm\",\"num_codebooks\":9,\"nbits_per_codebook\":8,\"in_group_size\":8}", "num_codebooks", KVQ_ERR_UNSUPPORTED},
        {"\"quantization_config\":{\"quant_method\":\"aqlm\",\"num_codebooks\":1,\"nbits_per_codebook\":17,\"in_group_size\":8}", "nbits_per_codebook", KVQ_ERR_UNSUPPORTED},
        {"\"quantization_config\":{\"quant_method\":\"aqlm\",\"num_codebooks\":1,\"nbits_per_codebook\":16,\"in_group_size\":4}", "in_group_size", KVQ_ERR_UNSUPPORTED},
        {"\"quantization_config\":{\"quant_method\":\"aqlm\",\"num_codebooks\":1,\"nbits_per_codebook\":16,\"in_group_size\":8,\"out_group_size\":2}", "out_group_size", KVQ_ERR_UNSUPPORTED},
        {"\"hidden_act\":\"gelu\"", "hidden_act", KVQ_ERR_UNSUPPORTED},
        {"\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4}", "rope_type 'yarn'", KVQ_ERR_UNSUPPORTED},
        {"\"head_dim\":63", "must be even", KVQ_ERR_FORMAT},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kvq_status s = parse_cfg(bad[i].extra, &hp);
        kvq_hparams_free(&hp);
        if (s != bad[i].s || !strstr(kvq_last_error(), bad[i].needle) || !strstr(kvq_last_error(), "cfg/config.json"))
            fail_msg("case %zu: status %d message '%s'", i, s, kvq_last_error());
    }
    assert_int_not_equal(kvq_hparams_parse("{\"architectures\":[\"GPT2LMHeadModel\"]}", "x/config.json", &hp), KVQ_OK);
    assert_non_null(strstr(kvq_last_error(), "GPT2LMHeadModel"));
    assert_int_not_equal(kvq_hparams_parse("{\"hidden_size\":", "x/config.json", &hp), KVQ_OK);
}

static const char *FAM_CFG =
    "{\"architectures\":[\"%s\"],\"hidden_size\":256,\"intermediate_size\":704,\"num_hidden_layers\":2,"
    "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"vocab_size\":1000,\"max_position_embeddings\":4096%s}";

static kvq_status parse_family(const char *arch, const char *extra, kvq_hparams *hp) {
    char text[4096];
    snprintf(text, sizeof text, FAM_CFG, arch, extra);
    return kvq_hparams_parse(text, "fam/config.json", hp);
}

/* Each family's config turns into the switches its forward needs, with HF's defaults. */
static void test_family_configs(void **state) {
    kvq_hparams hp;
    assert_int_equal(parse_family("MixtralForCausalLM", ",\"num_local_experts\":8,\"num_experts_per_tok\":2", &hp), KVQ_OK);
    assert_int_equal(hp.family, KVQ_FAM_MIXTRAL);
    assert_int_equal(hp.n_expert, 8);
    assert_int_equal(hp.n_expert_used, 2);
    kvq_hparams_free(&hp);
    assert_int_equal(parse_family("CohereForCausalLM", ",\"layer_norm_eps\":1e-3,\"use_qk_norm\":true", &hp), KVQ_OK);
    assert_true(hp.layer_norm && hp.parallel_block && hp.rope_pairs && hp.qk_norm && hp.tie_embeddings);
    assert_float_equal(hp.rms_eps, 1e-3, 1e-9);
    assert_float_equal(hp.logit_scale, 0.0625, 1e-9); /* CohereConfig's default */
    kvq_hparams_free(&hp);
    assert_int_equal(parse_family("GemmaForCausalLM", ",\"head_dim\":256,\"hidden_act\":\"gelu\"", &hp), KVQ_OK);
    assert_true(hp.norm_plus_one && hp.gelu && hp.embed_scale && hp.tie_embeddings);
    assert_int_equal(hp.head_dim, 256);
    kvq_hparams_free(&hp);
    assert_int_equal(parse_family("Qwen2ForCausalLM", ",\"sliding_window\":4096,\"use_sliding_window\":false,\"tie_word_embeddings\":true", &hp), KVQ_OK);
    assert_int_equal(hp.sliding_window, 0);
    assert_true(hp.tie_embeddings);
    kvq_hparams_free(&hp);
    /* Phi-3 longrope: factors by context length, attention factor from the trained lengths */
    char extra[2048] = ",\"original_max_position_embeddings\":1024,\"rope_scaling\":{\"type\":\"longrope\",\"short_factor\":[";
    for (int i = 0; i < 32; i++) snprintf(extra + strlen(extra), sizeof extra - strlen(extra), "%s1.0", i ? "," : "");
    strcat(extra, "],\"long_factor\":[");
    for (int i = 0; i < 32; i++) snprintf(extra + strlen(extra), sizeof extra - strlen(extra), "%s%d.0", i ? "," : "", 1 + i);
    strcat(extra, "]}");
    assert_int_equal(parse_family("Phi3ForCausalLM", extra, &hp), KVQ_OK);
    assert_true(hp.fused_qkv);
    assert_int_equal(hp.rope_scaling, KVQ_ROPE_LONGROPE);
    assert_float_equal(hp.rope_attn_factor, sqrt(1 + log(4.0) / log(1024.0)), 1e-6);
    float fs[32], fl[32];
    kvq_hparams_rope_freqs(&hp, fs, 0);
    kvq_hparams_rope_freqs(&hp, fl, 1);
    assert_float_equal(fl[5], fs[5] / 6, 1e-9);
    kvq_hparams_free(&hp);

    struct { const char *arch, *extra, *needle; } bad[] = {
        {"MixtralForCausalLM", "", "num_local_experts"},
        {"MixtralForCausalLM", ",\"num_local_experts\":8,\"num_experts_per_tok\":9", "num_experts_per_tok"},
        {"GemmaForCausalLM", ",\"hidden_activation\":\"gelu\"", "hidden_activation 'gelu'"},
        {"Qwen2ForCausalLM", ",\"use_sliding_window\":true", "use_sliding_window"},
        {"Phi3ForCausalLM", ",\"partial_rotary_factor\":0.5", "partial_rotary_factor"},
        {"Phi3ForCausalLM", ",\"original_max_position_embeddings\":1024,\"rope_scaling\":{\"type\":\"su\",\"short_factor\":[1],\"long_factor\":[1]}", "short_factor"},
        {"CohereForCausalLM", ",\"hidden_act\":\"gelu\"", "hidden_act"},
        {"Gemma2ForCausalLM", "", "Gemma2ForCausalLM"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kvq_status s = parse_family(bad[i].arch, bad[i].extra, &hp);
        kvq_hparams_free(&hp);
        if (s == KVQ_OK || !strstr(kvq_last_error(), bad[i].needle) || !strstr(kvq_last_error(), "fam/config.json"))
            fail_msg("case %zu: status %d message '%s'", i, s, kvq_last_error());
    }
}

static void test_llama3_rope(void **state) {
    kvq_hparams hp;
    assert_int_equal(parse_cfg("\"rope_theta\":500000,\"rope_scaling\":{\"factor\":32.0,\"low_freq_factor\":1.0,"
                               "\"high_freq_factor\":4.0,\"original_max_position_embeddings\":8192,\"rope_type\":\"llama3\"}",
                               &hp),
                     KVQ_OK);
    float f[32];
    kvq_hparams_rope_freqs(&hp, f, 0);
    /* highest frequency untouched, lowest divided by the factor */
    assert_float_equal(f[0], 1.0f, 1e-6);
    double base_last = pow(500000.0, -62.0 / 64.0);
    assert_float_equal(f[31], (float)(base_last / 32.0), 1e-12);
    kvq_hparams_free(&hp);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_good_header), cmocka_unit_test(test_bad_headers), cmocka_unit_test(test_bad_lengths),
        cmocka_unit_test(test_missing_file), cmocka_unit_test(test_config),       cmocka_unit_test(test_llama3_rope), cmocka_unit_test(test_family_configs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
