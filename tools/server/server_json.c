/* kvq-server: response_format (structured output), and llama-server's top-level "grammar"
 * (GBNF, src/grammar/gbnf_*.c) and "json_schema". json_object: any JSON object;
 * json_schema: {name, schema, strict}, checked when the request is parsed (a schema outside
 * the supported subset is a 400 then, not an error halfway through a reply), compiled on the
 * model's vocabulary when the request is submitted. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server.h"

/* "kvq_layout": "compact" (the default) or "pretty", for response_format and forced calls. */
static int parse_layout(const cJSON *j, srv_params *p, srv_error *e) {
    const cJSON *l = cJSON_GetObjectItemCaseSensitive(j, "kvq_layout");
    if (!l || cJSON_IsNull(l)) return 0;
    if (!cJSON_IsString(l) || (strcmp(l->valuestring, "compact") && strcmp(l->valuestring, "pretty")))
        return srv_fail(e, 400, "invalid_value", "'kvq_layout' must be \"compact\" or \"pretty\"");
    p->json_pretty = !strcmp(l->valuestring, "pretty");
    return 0;
}

/* llama-server's top-level "grammar" (GBNF) and "json_schema" (a schema, not strict). */
static int parse_llama_fields(const cJSON *j, srv_params *p, srv_error *e) {
    const cJSON *g = cJSON_GetObjectItemCaseSensitive(j, "grammar"), *js = cJSON_GetObjectItemCaseSensitive(j, "json_schema");
    if (g && cJSON_IsNull(g)) g = NULL;
    if (js && cJSON_IsNull(js)) js = NULL;
    if (!g && !js) return 0;
    if (p->json_mode) return srv_fail(e, 400, "invalid_value", "'%s' and 'response_format' do not combine", g ? "grammar" : "json_schema");
    if (g && js) return srv_fail(e, 400, "invalid_value", "'grammar' and 'json_schema' do not combine");
    if (js) {
        if (!cJSON_IsObject(js)) return srv_fail(e, 400, "invalid_type", "'json_schema' must be an object (a JSON schema)");
        if (!(p->json_schema = cJSON_PrintUnformatted(js))) return srv_fail(e, 500, NULL, "out of memory");
        p->json_mode = SRV_JSON_SCHEMA;
        char err[256];
        kvq_json_constraint *c = kvq_json_constraint_new(NULL, p->json_schema, 0, err, sizeof err);
        if (!c) return srv_fail(e, 400, "invalid_json_schema", "json_schema: %s", err);
        kvq_json_constraint_free(c);
        return 0;
    }
    if (!cJSON_IsString(g)) return srv_fail(e, 400, "invalid_type", "'grammar' must be a string (GBNF)");
    if (!*g->valuestring) return 0; /* llama-server: an empty grammar is none */
    if (!(p->grammar = strdup(g->valuestring))) return srv_fail(e, 500, NULL, "out of memory");
    p->json_mode = SRV_JSON_GRAMMAR;
    char err[256];
    kvq_json_constraint *c = kvq_grammar_constraint_new(NULL, p->grammar, err, sizeof err);
    if (!c) return srv_fail(e, 400, "invalid_grammar", "grammar: %s", err);
    kvq_json_constraint_free(c);
    return 0;
}

int srv_parse_response_format(const cJSON *j, srv_params *p, srv_error *e) {
    if (parse_layout(j, p, e) || srv_parse_response_format_only(j, p, e)) return -1;
    return parse_llama_fields(j, p, e);
}

int srv_parse_response_format_only(const cJSON *j, srv_params *p, srv_error *e) {
    const cJSON *rf = cJSON_GetObjectItemCaseSensitive(j, "response_format");
    if (!rf || cJSON_IsNull(rf)) return 0;
    if (!cJSON_IsObject(rf)) return srv_fail(e, 400, "invalid_type", "'response_format' must be an object");
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(rf, "type");
    if (!cJSON_IsString(ty)) return srv_fail(e, 400, "invalid_type", "'response_format.type' must be a string");
    if (!strcmp(ty->valuestring, "text")) return 0;
    if (!strcmp(ty->valuestring, "json_object")) {
        p->json_mode = SRV_JSON_OBJECT;
        return 0;
    }
    if (strcmp(ty->valuestring, "json_schema"))
        return srv_fail(e, 400, "invalid_value", "'response_format.type' is \"%.40s\"; it must be text, json_object or json_schema",
                        ty->valuestring);
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(rf, "json_schema");
    if (!cJSON_IsObject(js)) return srv_fail(e, 400, "missing_field", "'response_format.json_schema' (an object) is required");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(js, "name");
    if (name && !cJSON_IsString(name)) return srv_fail(e, 400, "invalid_type", "'response_format.json_schema.name' must be a string");
    const cJSON *strict = cJSON_GetObjectItemCaseSensitive(js, "strict");
    if (strict && !cJSON_IsNull(strict) && !cJSON_IsBool(strict))
        return srv_fail(e, 400, "invalid_type", "'response_format.json_schema.strict' must be true or false");
    const cJSON *schema = cJSON_GetObjectItemCaseSensitive(js, "schema");
    if (schema && !cJSON_IsObject(schema))
        return srv_fail(e, 400, "invalid_type", "'response_format.json_schema.schema' must be an object");
    p->json_mode = SRV_JSON_SCHEMA;
    p->json_strict = cJSON_IsTrue(strict);
    if (!schema) return 0; /* no schema: any object, as json_object */
    if (!(p->json_schema = cJSON_PrintUnformatted(schema))) return srv_fail(e, 500, NULL, "out of memory");
    char err[256];
    kvq_json_constraint *c = kvq_json_constraint_new(NULL, p->json_schema, p->json_strict, err, sizeof err);
    if (!c) return srv_fail(e, 400, "invalid_json_schema", "response_format.json_schema.schema: %s", err);
    kvq_json_constraint_free(c);
    return 0;
}

kvq_json_constraint *srv_json_constraint(const kvq_tokenizer *tok, const srv_params *p, srv_error *e) {
    char err[256];
    if (p->grammar) {
        kvq_json_constraint *g = kvq_grammar_constraint_new(tok, p->grammar, err, sizeof err);
        if (!g) srv_fail(e, 400, "invalid_grammar", "grammar: %s", err);
        return g;
    }
    kvq_json_constraint *c = kvq_json_constraint_new(tok, p->json_schema, p->json_strict, err, sizeof err);
    if (!c) srv_fail(e, 400, "invalid_json_schema", "response_format.json_schema.schema: %s", err);
    kvq_json_constraint_set_layout(c, p->json_pretty);
    return c;
}

void srv_add_fingerprint(cJSON *j, const kvq_json_constraint *c) {
    const char *ig = c ? kvq_json_constraint_ignored(c) : "";
    char fp[300];
    snprintf(fp, sizeof fp, "kvq%s%s", *ig ? " schema-ignored=" : "", ig);
    cJSON_AddStringToObject(j, "system_fingerprint", fp);
}
