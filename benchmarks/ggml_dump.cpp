// Every intermediate tensor of one llama.cpp step, whole, in float32: what llama-eval-callback prints
// (name, op, shape, a few values, the sum) but all the values, for benchmarks/q8_vs_ggml_ops.py to
// compare with this framework's nodes. Built and run by benchmarks/ggml_intermediates.sh.
//   usage: ggml_dump MODEL.gguf PROMPT OUTDIR [THREADS] [PREFILL] [FLASH_ATTN]
// FLASH_ATTN: on, off or auto (llama.cpp's tools' default, on for the CPU; llama-cpp-python's is off).
// The prompt is tokenized as llama-eval-callback does (BOS where the vocabulary adds it, special tokens
// parsed) and goes in one prefill; with PREFILL, its first PREFILL tokens go in one prefill and the others
// one decode step each, as a generation feeds them. Only the last step's tensors are written:
// OUTDIR/index.tsv, one line per tensor (order, name, op, type, ne0..ne3, its .f32 file), each file
// ne0*ne1*ne2*ne3 floats, ne0 fastest, as ggml lays a contiguous tensor out; OUTDIR/tokens.txt, the ids.
#include "ggml.h"
#include "ggml-backend.h"
#include "llama.h"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

struct dump_state {
    std::string dir;
    FILE * index = nullptr;
    int count = 0;
};

static float value_at(const ggml_tensor * t, const uint8_t * data, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    const uint8_t * p = data + i0 * t->nb[0] + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3];
    switch (t->type) {
        case GGML_TYPE_F32: return *(const float *) p;
        case GGML_TYPE_F16: return ggml_fp16_to_fp32(*(const ggml_fp16_t *) p);
        case GGML_TYPE_I32: return (float) *(const int32_t *) p;
        default: return 0.0f;
    }
}

static bool on_tensor(ggml_tensor * t, bool ask, void * user_data) {
    auto * st = (dump_state *) user_data;
    if (ask || !st->index) {
        return st->index != nullptr;   // every tensor of the step being written, none before it
    }
    if (t->type != GGML_TYPE_F32 && t->type != GGML_TYPE_F16 && t->type != GGML_TYPE_I32) {
        return true;  // quantized results (none on the CPU backend's graph) are skipped
    }
    std::vector<uint8_t> host;
    const uint8_t * data = (const uint8_t *) t->data;
    if (!ggml_backend_buffer_is_host(t->buffer)) {
        host.resize(ggml_nbytes(t));
        ggml_backend_tensor_get(t, host.data(), 0, host.size());
        data = host.data();
    }
    std::vector<float> out;
    out.reserve(ggml_nelements(t));
    for (int64_t i3 = 0; i3 < t->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < t->ne[2]; i2++)
            for (int64_t i1 = 0; i1 < t->ne[1]; i1++)
                for (int64_t i0 = 0; i0 < t->ne[0]; i0++)
                    out.push_back(value_at(t, data, i0, i1, i2, i3));
    const std::string file = std::to_string(st->count) + ".f32";
    FILE * f = fopen((st->dir + "/" + file).c_str(), "wb");
    if (!f || fwrite(out.data(), sizeof(float), out.size(), f) != out.size()) {
        fprintf(stderr, "ggml_dump: cannot write %s/%s\n", st->dir.c_str(), file.c_str());
        exit(1);
    }
    fclose(f);
    fprintf(st->index, "%d\t%s\t%s\t%s\t%lld\t%lld\t%lld\t%lld\t%s\n", st->count, t->name, ggml_op_desc(t),
            ggml_type_name(t->type), (long long) t->ne[0], (long long) t->ne[1], (long long) t->ne[2],
            (long long) t->ne[3], file.c_str());
    st->count++;
    return true;
}

int main(int argc, char ** argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s MODEL.gguf PROMPT OUTDIR [THREADS] [PREFILL] [FLASH_ATTN]\n", argv[0]);
        return 2;
    }
    const std::string fa = argc > 6 ? argv[6] : "auto";
    if (fa != "on" && fa != "off" && fa != "auto") {
        fprintf(stderr, "ggml_dump: FLASH_ATTN is '%s': use on, off or auto\n", fa.c_str());
        return 2;
    }
    dump_state st;
    st.dir = argv[3];
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "ggml_dump: cannot load %s\n", argv[1]);
        return 1;
    }
    const std::string prompt = argv[2];
    const llama_vocab * vocab = llama_model_get_vocab(model);
    std::vector<llama_token> tokens(prompt.size() + 2);
    const int n = llama_tokenize(vocab, prompt.c_str(), (int32_t) prompt.size(), tokens.data(),
                                 (int32_t) tokens.size(), llama_vocab_get_add_bos(vocab), true);
    if (n <= 0) {
        fprintf(stderr, "ggml_dump: the prompt gave no tokens\n");
        return 1;
    }
    tokens.resize(n);
    FILE * ids = fopen((st.dir + "/tokens.txt").c_str(), "w");
    if (!ids) {
        fprintf(stderr, "ggml_dump: cannot write %s/tokens.txt (does the folder exist?)\n", argv[3]);
        return 1;
    }
    for (llama_token t : tokens) {
        fprintf(ids, "%d\n", t);
    }
    fclose(ids);
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 512;
    cp.n_batch = cp.n_ubatch = 512;
    cp.n_threads = cp.n_threads_batch = argc > 4 ? atoi(argv[4]) : 2;
    cp.flash_attn_type = fa == "on"  ? LLAMA_FLASH_ATTN_TYPE_ENABLED
                       : fa == "off" ? LLAMA_FLASH_ATTN_TYPE_DISABLED
                                     : LLAMA_FLASH_ATTN_TYPE_AUTO;
    cp.cb_eval = on_tensor;
    cp.cb_eval_user_data = &st;
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "ggml_dump: no context for %s\n", argv[1]);
        return 1;
    }
    // the steps: one prefill of `first` tokens, then one token a step; the last step is the one written
    const int first = argc > 5 && atoi(argv[5]) > 0 ? atoi(argv[5]) : n;   // 0: the whole prompt
    if (first < 1 || first > n) {
        fprintf(stderr, "ggml_dump: PREFILL %d is not within 1..%d (the prompt's tokens)\n", first, n);
        return 2;
    }
    for (int at = 0; at < n;) {
        const int len = at == 0 ? first : 1;
        if (at + len == n) {
            st.index = fopen((st.dir + "/index.tsv").c_str(), "w");
            if (!st.index) {
                fprintf(stderr, "ggml_dump: cannot write %s/index.tsv (does the folder exist?)\n", argv[3]);
                return 1;
            }
        }
        if (llama_decode(ctx, llama_batch_get_one(tokens.data() + at, len)) != 0) {
            fprintf(stderr, "ggml_dump: the step of %d tokens at %d failed\n", len, at);
            return 1;
        }
        at += len;
    }
    fclose(st.index);
    printf("ggml_dump: %d tensors of the last step (%s, flash attention %s) in %s\n", st.count,
           first == n ? "one prefill" : "a decode step", fa.c_str(), argv[3]);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
