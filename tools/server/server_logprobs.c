/* kvq-server: token log-probabilities. They are of the model's own distribution (the raw
 * logits, before penalties, temperature and truncation), as OpenAI and llama-server report
 * them, so they do not change with the sampling settings. */
#include <math.h>

#include "server.h"

void srv_logprobs(const float *lg, int n_vocab, int32_t id, int n_top, srv_lp *out) {
    double mx = -INFINITY, sum = 0;
    for (int i = 0; i < n_vocab; i++)
        if (lg[i] > mx) mx = lg[i];
    for (int i = 0; i < n_vocab; i++) sum += exp((double)lg[i] - mx);
    const double lse = mx + log(sum);
    out->id = id;
    out->logprob = (float)((double)lg[id] - lse);
    if (n_top > SRV_MAX_TOP) n_top = SRV_MAX_TOP;
    if (n_top > n_vocab) n_top = n_vocab;
    /* partial selection: a sorted list of the best n_top seen so far; most logits fall below its
     * last entry and cost one comparison */
    int k = 0;
    for (int i = 0; i < n_vocab && n_top > 0; i++) {
        float v = lg[i];
        if (k == n_top && v <= lg[out->top_id[k - 1]]) continue;
        int j = k < n_top ? k++ : k - 1;
        while (j > 0 && lg[out->top_id[j - 1]] < v) {
            out->top_id[j] = out->top_id[j - 1];
            j--;
        }
        out->top_id[j] = i;
    }
    out->n_top = k;
    for (int j = 0; j < k; j++) out->top_lp[j] = (float)((double)lg[out->top_id[j]] - lse);
}
