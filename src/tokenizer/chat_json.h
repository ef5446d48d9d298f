/* JSON text as Python's json.dumps writes it (ensure_ascii=False, keys in order):
 * what the templates' tojson filter puts in a prompt. */
#ifndef KVQ_CHAT_JSON_H
#define KVQ_CHAT_JSON_H
#include <cjson/cJSON.h>

/* indent < 0: one line with ", " and ": "; else newlines and indent spaces per level.
 * Returns a malloc'd string, NULL when out of memory. */
char *chat_json_dump(const cJSON *v, int indent);
/* A string as json.dumps writes it, quotes included. */
char *chat_json_quote(const char *s);

#endif
