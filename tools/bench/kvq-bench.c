/* kvq-bench: micro-benchmarks of the CPU kernels against this machine's
 * memory bandwidth. Each subcommand lives in tools/bench/bench_<name>.c. */
#include <stdio.h>
#include <string.h>

#include "common.h"

int kvq_bench_attn(int argc, char **argv);
int kvq_bench_aqlm(int argc, char **argv);
int kvq_bench_isa(int argc, char **argv);
int kvq_bench_model(int argc, char **argv);
int kvq_bench_vk_aqlm(int argc, char **argv);
int kvq_bench_longctx(int argc, char **argv);
int kvq_bench_step(int argc, char **argv);
int kvq_bench_spec(int argc, char **argv);

static const struct {
    const char *name, *help;
    int (*run)(int argc, char **argv);
} CMDS[] = {
    {"attn", "decode attention from f16/q8/q4 KV caches (tools/bench/bench_attn.c)", kvq_bench_attn},
    {"aqlm", "AQLM decode GEMV (tools/bench/bench_aqlm.c)", kvq_bench_aqlm},
    {"isa", "every CPU class this machine runs, side by side: GEMV ratios, 7B speed, lookup ceiling (bench_isa.c)",
     kvq_bench_isa},
    {"step", "AQLM matmul of a 1-16 token step, CPU time, and its ceilings (tools/bench/bench_step.c)", kvq_bench_step},
    {"model", "whole-model prompt and decode speed (tools/bench/bench_model.c)", kvq_bench_model},
    {"spec", "speculative decoding against plain decode, same run (tools/bench/bench_spec.c)", kvq_bench_spec},
    {"longctx-model", "writes a random long-context model and token stream for kvq-ppl's KL check (tools/bench/bench_longctx.c)",
     kvq_bench_longctx},
};

static int usage(FILE *f) {
    fprintf(f, "usage: kvq-bench <subcommand> [options]   (kvq-bench <subcommand> --help for its options; --version)\n"
               "subcommands:\n");
    for (size_t i = 0; i < sizeof CMDS / sizeof CMDS[0]; i++) fprintf(f, "  %-6s %s\n", CMDS[i].name, CMDS[i].help);
    return 0;
}

int main(int argc, char **argv) {
    if (kvq_tool_version("kvq-bench", argc, argv)) return 0;
    if (argc < 2) {
        fprintf(stderr, "kvq-bench: no subcommand given (see --help)\n");
        return 1;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) return usage(stdout);
    if (!strcmp(argv[1], "aqlm")) /* `aqlm --backend vulkan`: tools/bench/bench_vk_aqlm.c */
        for (int i = 2; i + 1 < argc; i++)
            if (!strcmp(argv[i], "--backend") && !strcmp(argv[i + 1], "vulkan")) return kvq_bench_vk_aqlm(argc - 1, argv + 1);
    for (size_t i = 0; i < sizeof CMDS / sizeof CMDS[0]; i++)
        if (!strcmp(argv[1], CMDS[i].name)) return CMDS[i].run(argc - 1, argv + 1); /* argv[0] = subcommand */
    fprintf(stderr, "kvq-bench: unknown subcommand '%s' (see --help)\n", argv[1]);
    return 1;
}
