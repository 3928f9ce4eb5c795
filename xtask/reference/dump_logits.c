/*
 * dump_logits: record llama.cpp's logits and greedy continuations as JSON,
 * so Prima's tests can compare against a reference implementation.
 *
 * Written for Prima against llama.cpp's public C API (include/llama.h) only.
 * Built and run by `cargo xtask reference`; never shipped.
 *
 * usage: dump_logits -m MODEL [-t THREADS] [-n N_PREDICT] [-k TOP_K]
 *                    [-s STRIDE] [-c N_CTX] CASE...
 *   CASE is either  -p TEXT       prompt text, tokenized with add_special=true
 *                                 and parse_special=true
 *               or  -i ID,ID,...  explicit prompt token ids
 *
 * Output: one JSON object per case and line on stdout:
 *   {"n_vocab":N, "prompt_ids":[...], "top_logits":[[id,logit],...],
 *    "sampled_logits":[[id,logit],...], "greedy":[...], "greedy_gaps":[...]}
 * top_logits: the TOP_K largest logits at the last prompt position, by logit
 *   descending, ties by lower id first.
 * sampled_logits: the logit of every STRIDE-th vocab id (0, STRIDE, 2*STRIDE..)
 *   at the last prompt position.
 * greedy: N_PREDICT argmax tokens (lowest id wins a tie); end-of-generation
 *   tokens do NOT stop decoding, so every sequence has exactly N_PREDICT ids.
 * greedy_gaps: for each greedy step, the top-1 minus top-2 logit (how safe the
 *   argmax is against numeric noise).
 *
 * Each case starts from an empty KV cache. Flash attention is disabled so the
 * reference uses plain softmax(QK^T)V attention; the KV cache is F16 (default).
 */
#include "llama.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct dump_case {
    const char *text; /* prompt text, or NULL when ids are given */
    const char *ids;  /* comma-separated ids, or NULL */
};

struct options {
    const char *model;
    int threads;
    int n_predict;
    int top_k;
    int stride;
    int n_ctx;
    struct dump_case *cases;
    int n_cases;
};

static void quiet_log(enum ggml_log_level level, const char *text, void *user) {
    (void)user;
    if (level == GGML_LOG_LEVEL_ERROR || level == GGML_LOG_LEVEL_WARN) {
        fputs(text, stderr);
    }
}

static void usage(void) {
    fprintf(stderr,
            "usage: dump_logits -m MODEL [-t THREADS] [-n N_PREDICT] [-k TOP_K] "
            "[-s STRIDE] [-c N_CTX] (-p TEXT | -i ID,ID,...)...\n");
    exit(2);
}

static struct options parse_args(int argc, char **argv) {
    struct options o = {NULL, 2, 64, 40, 97, 512, NULL, 0};
    o.cases = calloc((size_t)argc, sizeof(struct dump_case));
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (i + 1 >= argc) {
            usage();
        }
        const char *v = argv[++i];
        if (!strcmp(a, "-m")) {
            o.model = v;
        } else if (!strcmp(a, "-t")) {
            o.threads = atoi(v);
        } else if (!strcmp(a, "-n")) {
            o.n_predict = atoi(v);
        } else if (!strcmp(a, "-k")) {
            o.top_k = atoi(v);
        } else if (!strcmp(a, "-s")) {
            o.stride = atoi(v);
        } else if (!strcmp(a, "-c")) {
            o.n_ctx = atoi(v);
        } else if (!strcmp(a, "-p")) {
            o.cases[o.n_cases++] = (struct dump_case){v, NULL};
        } else if (!strcmp(a, "-i")) {
            o.cases[o.n_cases++] = (struct dump_case){NULL, v};
        } else {
            usage();
        }
    }
    if (!o.model || o.n_cases == 0 || o.stride <= 0 || o.top_k < 0 || o.n_predict < 0) {
        usage();
    }
    return o;
}

/* Parse "1,2,3" into a freshly allocated array; returns the count. */
static int parse_ids(const char *s, llama_token **out) {
    int cap = 16, n = 0;
    llama_token *ids = malloc(sizeof(llama_token) * (size_t)cap);
    const char *p = s;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p) {
            fprintf(stderr, "dump_logits: bad token id list '%s'\n", s);
            exit(2);
        }
        if (n == cap) {
            cap *= 2;
            ids = realloc(ids, sizeof(llama_token) * (size_t)cap);
        }
        ids[n++] = (llama_token)v;
        p = (*end == ',') ? end + 1 : end;
    }
    *out = ids;
    return n;
}

static int tokenize(const struct llama_vocab *vocab, const char *text, llama_token **out) {
    int len = (int)strlen(text);
    int n = -llama_tokenize(vocab, text, len, NULL, 0, true, true);
    llama_token *ids = malloc(sizeof(llama_token) * (size_t)(n > 0 ? n : 1));
    if (llama_tokenize(vocab, text, len, ids, n, true, true) != n) {
        fprintf(stderr, "dump_logits: tokenization failed\n");
        exit(1);
    }
    *out = ids;
    return n;
}

static void print_logit(float v) {
    if (isfinite(v)) {
        printf("%.6g", v);
    } else {
        printf("null");
    }
}

/* Index of the largest logit (lowest id on ties) and the gap to the runner-up. */
static llama_token argmax(const float *logits, int n_vocab, float *gap) {
    int best = 0, second = -1;
    for (int i = 1; i < n_vocab; i++) {
        if (logits[i] > logits[best]) {
            second = best;
            best = i;
        } else if (second < 0 || logits[i] > logits[second]) {
            second = i;
        }
    }
    *gap = second < 0 ? 0.0f : logits[best] - logits[second];
    return best;
}

static const float *g_sort_logits;

static int by_logit_desc(const void *a, const void *b) {
    int ia = *(const int *)a, ib = *(const int *)b;
    float la = g_sort_logits[ia], lb = g_sort_logits[ib];
    if (la != lb) {
        return la > lb ? -1 : 1;
    }
    return ia - ib;
}

static void print_top_k(const float *logits, int n_vocab, int k) {
    int *order = malloc(sizeof(int) * (size_t)n_vocab);
    for (int i = 0; i < n_vocab; i++) {
        order[i] = i;
    }
    g_sort_logits = logits;
    qsort(order, (size_t)n_vocab, sizeof(int), by_logit_desc);
    if (k > n_vocab) {
        k = n_vocab;
    }
    for (int i = 0; i < k; i++) {
        printf(i ? ",[%d," : "[%d,", order[i]);
        print_logit(logits[order[i]]);
        printf("]");
    }
    free(order);
}

static void decode_or_die(struct llama_context *ctx, llama_token *ids, int n) {
    int rc = llama_decode(ctx, llama_batch_get_one(ids, n));
    if (rc != 0) {
        fprintf(stderr, "dump_logits: llama_decode failed (%d)\n", rc);
        exit(1);
    }
}

static void run_case(struct llama_context *ctx, const struct llama_vocab *vocab,
                     const struct options *o, const struct dump_case *c) {
    llama_token *prompt;
    int n_prompt = c->text ? tokenize(vocab, c->text, &prompt) : parse_ids(c->ids, &prompt);
    int n_vocab = llama_vocab_n_tokens(vocab);
    if (n_prompt == 0 || n_prompt + o->n_predict > o->n_ctx) {
        fprintf(stderr, "dump_logits: prompt of %d tokens does not fit n_ctx %d\n", n_prompt,
                o->n_ctx);
        exit(1);
    }
    for (int i = 0; i < n_prompt; i++) {
        if (prompt[i] < 0 || prompt[i] >= n_vocab) {
            fprintf(stderr, "dump_logits: token id %d out of vocab (%d)\n", prompt[i], n_vocab);
            exit(1);
        }
    }

    llama_memory_clear(llama_get_memory(ctx), true);
    decode_or_die(ctx, prompt, n_prompt);
    const float *logits = llama_get_logits_ith(ctx, -1);

    printf("{\"n_vocab\":%d,\"prompt_ids\":[", n_vocab);
    for (int i = 0; i < n_prompt; i++) {
        printf(i ? ",%d" : "%d", prompt[i]);
    }
    printf("],\"top_logits\":[");
    print_top_k(logits, n_vocab, o->top_k);
    printf("],\"sampled_logits\":[");
    for (int i = 0; i < n_vocab; i += o->stride) {
        printf(i ? ",[%d," : "[%d,", i);
        print_logit(logits[i]);
        printf("]");
    }

    llama_token *greedy = malloc(sizeof(llama_token) * (size_t)(o->n_predict + 1));
    float *gaps = malloc(sizeof(float) * (size_t)(o->n_predict + 1));
    for (int step = 0; step < o->n_predict; step++) {
        if (step > 0) {
            decode_or_die(ctx, &greedy[step - 1], 1);
            logits = llama_get_logits_ith(ctx, -1);
        }
        greedy[step] = argmax(logits, n_vocab, &gaps[step]);
    }
    printf("],\"greedy\":[");
    for (int i = 0; i < o->n_predict; i++) {
        printf(i ? ",%d" : "%d", greedy[i]);
    }
    printf("],\"greedy_gaps\":[");
    for (int i = 0; i < o->n_predict; i++) {
        if (i) {
            printf(",");
        }
        print_logit(gaps[i]);
    }
    printf("]}\n");
    fflush(stdout);
    free(greedy);
    free(gaps);
    free(prompt);
}

int main(int argc, char **argv) {
    struct options o = parse_args(argc, argv);

    llama_log_set(quiet_log, NULL);
    llama_backend_init();

    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    struct llama_model *model = llama_model_load_from_file(o.model, mp);
    if (!model) {
        fprintf(stderr, "dump_logits: cannot load model %s\n", o.model);
        return 1;
    }

    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)o.n_ctx;
    cp.n_batch = (uint32_t)o.n_ctx;
    cp.n_ubatch = (uint32_t)o.n_ctx;
    cp.n_threads = o.threads;
    cp.n_threads_batch = o.threads;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.no_perf = true;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "dump_logits: cannot create a context for %s\n", o.model);
        return 1;
    }

    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    for (int i = 0; i < o.n_cases; i++) {
        run_case(ctx, vocab, &o, &o.cases[i]);
    }

    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    free(o.cases);
    return 0;
}
