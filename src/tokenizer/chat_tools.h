/* Between chat_template.c and the renderers of conversations with tools
 * (chat_tools_render.c): which tool format a template has and what it needs. */
#ifndef KVQ_CHAT_TOOLS_H
#define KVQ_CHAT_TOOLS_H
#include "chat_buf.h"
#include "kvq.h"

typedef enum {
    TOOLS_NONE,
    TOOLS_LLAMA3,  /* Llama-3.1/3.2: tools in the first user turn, calls as {"name", "parameters"} */
    TOOLS_MISTRAL, /* Mistral v0.3: [AVAILABLE_TOOLS], [TOOL_CALLS], [TOOL_RESULTS] */
    TOOLS_QWEN,    /* Qwen2.5: <tools> in the system turn, <tool_call> / <tool_response> */
    TOOLS_COMMAND_R, /* Command-R's tool_use template: Python signatures, Action: ```json [...]``` */
} chat_tool_fmt;

typedef struct {
    chat_tool_fmt fmt;
    const char *bos, *eos;
    const char *date;        /* Llama: the "Today Date" */
    const char *default_sys; /* Qwen: the system text when none is given */
} chat_tool_tmpl;

/* The conversation has tool calls or tool results in it. */
int chat_has_tool_msgs(const kvq_chat_msg *m, int n);
/* Renders a conversation with tools (tools_json: the tools array, or NULL) or tool
 * messages. 0, or -1 with the error set (the template's message where it raises). */
int chat_render_tools(const chat_tool_tmpl *t, const kvq_chat_msg *m, int n, const char *tools_json, int gen, sbuf *b);
/* chat_tools_command_r.c: Command-R's tool_use template (tools: the parsed array). */
int chat_render_command_r_tools(const chat_tool_tmpl *t, const kvq_chat_msg *m, int n, const cJSON *tools, int gen, sbuf *b);

#endif
