// llama-ref: llama.cpp's own answers for a GGUF file, for the tests that
// check Tessera's GGUF reader against llama.cpp. Built by
// `scripts/llama-cpp.sh llama-ref` against llama.cpp's static libraries.
//
//   llama-ref tokenize MODEL.gguf [--no-special]
//       stdin: a JSON array of strings; stdout: a JSON array with, for each
//       string, its token ids (llama_tokenize; add_special true unless
//       --no-special, so BOS/EOS as the vocabulary's add_bos/add_eos say;
//       parse_special always true: special tokens written in the text are
//       tokens). Only the vocabulary is loaded.
//
//   llama-ref eval MODEL.gguf --tokens 1,2,3 [--steps 16] [--generate 32]
//       [--threads 1] [--kv-type f32|f16] [--flash-attn] --out DIR
//       The prompt in one batch (one ubatch: n_batch = n_ubatch = prompt
//       length), logits at every position; then greedy decoding of
//       --generate tokens, one token per llama_decode through the KV cache,
//       each the argmax of the raw logits (the lowest id among equal
//       maxima; no sampler chain). Writes
//         DIR/prompt_logits.npy  float32 [prompt_len, n_vocab]
//         DIR/step_logits.npy    float32 [steps, n_vocab]: row i is the
//                                logits after feeding generated token i
//                                (position prompt_len + i)
//         DIR/greedy.json        {"tokens": [...]}, token 0 the argmax of
//                                the last prompt position
//         DIR/single_logits.npy  float32 [prompt_len, n_vocab]: row i is
//                                prompt token i alone at position 0
//       Settings, all explicit: CPU only (n_gpu_layers 0), n_seq_max 1,
//       n_ctx = prompt + max(generate, steps + 1) (llama.cpp pads it to a
//       multiple of 256), flash attention off unless --flash-attn, KV cache
//       in F32 unless --kv-type f16 (llama.cpp's default is F16), 1 thread
//       for both prompt and decode unless --threads, no weight repacking
//       (use_extra_bufts off: llama.cpp's plain CPU kernels, see
//       load_model), no RoPE overrides (everything from the GGUF).
//
// llama.cpp's log is silent unless --verbose; an error is one line on
// stderr ("llama-ref: ...", with llama.cpp's last error message where it
// logged one) and exit status 1.

#include "llama.h"
#include "nlohmann/json.hpp"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

using json = nlohmann::json;

namespace {

bool g_verbose = false;
std::string g_last_error;

void log_callback(ggml_log_level level, const char * text, void *) {
    if (g_verbose) {
        fputs(text, stderr);
    }
    if (level == GGML_LOG_LEVEL_ERROR) {
        std::string line(text);
        while (!line.empty() && (line.back() == '\n' || line.back() == ' ')) {
            line.pop_back();
        }
        if (!line.empty()) {
            g_last_error = line;
        }
    }
}

[[noreturn]] void fail(const std::string & message) {
    std::string line = "llama-ref: " + message;
    if (!g_last_error.empty()) {
        line += " (llama.cpp: " + g_last_error + ")";
    }
    for (char & c : line) {
        if (c == '\n') c = ' ';
    }
    fprintf(stderr, "%s\n", line.c_str());
    exit(1);
}

const char * usage =
    "usage: llama-ref tokenize MODEL.gguf [--no-special] [--verbose]  (JSON array of strings on stdin)\n"
    "       llama-ref eval MODEL.gguf --tokens 1,2,3 --out DIR [--steps 16] [--generate 32]\n"
    "                 [--threads 1] [--kv-type f32|f16] [--flash-attn] [--verbose]";

int parse_int(const std::string & flag, const std::string & value, int min) {
    char * end = nullptr;
    errno = 0;
    long v = strtol(value.c_str(), &end, 10);
    if (value.empty() || *end != '\0' || errno != 0 || v < min || v > 1000000000L) {
        fail(flag + " wants an integer >= " + std::to_string(min) + ", not '" + value + "'");
    }
    return (int) v;
}

std::vector<llama_token> parse_tokens(const std::string & list) {
    std::vector<llama_token> tokens;
    std::stringstream in(list);
    std::string item;
    while (std::getline(in, item, ',')) {
        tokens.push_back(parse_int("--tokens", item, 0));
    }
    if (tokens.empty()) {
        fail("--tokens is empty");
    }
    return tokens;
}

llama_model * load_model(const std::string & path, bool vocab_only) {
    struct stat st;
    if (stat(path.c_str(), &st) != 0) {
        fail("no such file: " + path);
    }
    llama_model_params params = llama_model_default_params();
    params.n_gpu_layers = 0;
    params.vocab_only = vocab_only;
    // llama.cpp's plain CPU kernels: no weights repacked into its
    // interleaved layouts. Its repacked Q4_K path for experts (mul_mat_id)
    // differs from its own plain kernels by up to 1.7e-2 of the largest
    // logit on a random mixture of experts (measured), where the plain
    // kernels agree with each other and with Tessera's to float32's last
    // bits; for dense layers the two agree.
    params.use_extra_bufts = false;
    llama_model * model = llama_model_load_from_file(path.c_str(), params);
    if (model == nullptr) {
        fail("cannot load " + path);
    }
    return model;
}

std::vector<llama_token> tokenize_one(const llama_vocab * vocab, const std::string & text, bool add_special) {
    std::vector<llama_token> tokens(text.size() + 16);
    int32_t n = llama_tokenize(vocab, text.data(), (int32_t) text.size(), tokens.data(),
                               (int32_t) tokens.size(), add_special, /*parse_special=*/true);
    if (n == INT32_MIN) {
        fail("tokenization overflowed");
    }
    if (n < 0) {
        tokens.resize(-n);
        n = llama_tokenize(vocab, text.data(), (int32_t) text.size(), tokens.data(),
                           (int32_t) tokens.size(), add_special, true);
        if (n < 0) {
            fail("llama_tokenize failed");
        }
    }
    tokens.resize(n);
    return tokens;
}

int cmd_tokenize(const std::string & model_path, bool add_special) {
    std::string input((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
    json texts;
    try {
        texts = json::parse(input);
    } catch (const std::exception & e) {
        fail(std::string("stdin is not JSON: ") + e.what());
    }
    if (!texts.is_array()) {
        fail("stdin must be a JSON array of strings");
    }
    for (const auto & t : texts) {
        if (!t.is_string()) {
            fail("stdin must be a JSON array of strings (found " + std::string(t.type_name()) + ")");
        }
    }
    llama_model * model = load_model(model_path, /*vocab_only=*/true);
    const llama_vocab * vocab = llama_model_get_vocab(model);
    json out = json::array();
    for (const auto & t : texts) {
        out.push_back(tokenize_one(vocab, t.get<std::string>(), add_special));
    }
    std::cout << out.dump() << "\n";
    llama_model_free(model);
    return 0;
}

// A float32 C-order .npy file (format version 1.0).
void write_npy(const std::string & path, const std::vector<float> & data, size_t rows, size_t cols) {
    std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + std::to_string(rows) +
                         ", " + std::to_string(cols) + "), }";
    // magic (6) + version (2) + header length (2) + header + '\n', a multiple of 64
    size_t total = 10 + header.size() + 1;
    header.append((64 - total % 64) % 64, ' ');
    header.push_back('\n');
    std::ofstream out(path, std::ios::binary);
    if (!out) {
        fail("cannot write " + path);
    }
    const char magic[8] = {'\x93', 'N', 'U', 'M', 'P', 'Y', 1, 0};
    out.write(magic, 8);
    uint16_t len = (uint16_t) header.size();
    const unsigned char len_le[2] = {(unsigned char) (len & 0xff), (unsigned char) (len >> 8)};
    out.write((const char *) len_le, 2);
    out.write(header.data(), (std::streamsize) header.size());
    out.write((const char *) data.data(), (std::streamsize) (rows * cols * sizeof(float)));
    if (!out) {
        fail("cannot write " + path);
    }
}

llama_token argmax(const float * logits, int n_vocab) {
    int best = 0;
    for (int i = 1; i < n_vocab; i++) {
        if (logits[i] > logits[best]) {
            best = i;
        }
    }
    return best;
}

struct EvalArgs {
    std::string model;
    std::vector<llama_token> tokens;
    int steps = 16;
    int generate = 32;
    int threads = 1;
    ggml_type kv_type = GGML_TYPE_F32;
    bool flash_attn = false;
    std::string out;
};

int cmd_eval(const EvalArgs & args) {
    mkdir(args.out.c_str(), 0755);
    struct stat st;
    if (stat(args.out.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
        fail("cannot make the folder " + args.out);
    }
    llama_model * model = load_model(args.model, /*vocab_only=*/false);
    const llama_vocab * vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);
    const int n_prompt = (int) args.tokens.size();
    for (llama_token t : args.tokens) {
        if (t >= n_vocab) {
            fail("token " + std::to_string(t) + " is not below the vocabulary size " + std::to_string(n_vocab));
        }
    }
    // Decode steps: generated tokens 1.. need one each, and --steps wants
    // the logits of that many.
    const int n_steps = std::max(args.generate - 1, args.steps);

    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t) (n_prompt + n_steps + 1);
    cp.n_batch = (uint32_t) n_prompt;
    cp.n_ubatch = (uint32_t) n_prompt;
    cp.n_seq_max = 1;
    cp.n_outputs_max = 0;          // = n_batch: every prompt position
    cp.n_outputs_max_per_seq = 0;
    cp.n_threads = args.threads;
    cp.n_threads_batch = args.threads;
    cp.flash_attn_type = args.flash_attn ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.type_k = args.kv_type;
    cp.type_v = args.kv_type;
    cp.offload_kqv = false;
    cp.op_offload = false;
    cp.no_perf = true;
    llama_context * ctx = llama_init_from_model(model, cp);
    if (ctx == nullptr) {
        fail("cannot make a context for " + args.model);
    }

    llama_batch batch = llama_batch_init(n_prompt, 0, 1);
    batch.n_tokens = n_prompt;
    for (int i = 0; i < n_prompt; i++) {
        batch.token[i] = args.tokens[i];
        batch.pos[i] = i;
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i] = 1;
    }
    int rc = llama_decode(ctx, batch);
    if (rc != 0) {
        fail("llama_decode of the prompt returned " + std::to_string(rc));
    }
    std::vector<float> prompt_logits((size_t) n_prompt * n_vocab);
    for (int i = 0; i < n_prompt; i++) {
        const float * row = llama_get_logits_ith(ctx, i);
        if (row == nullptr) {
            fail("no logits for prompt position " + std::to_string(i));
        }
        std::copy(row, row + n_vocab, prompt_logits.begin() + (size_t) i * n_vocab);
    }
    llama_batch_free(batch);

    std::vector<llama_token> generated;
    std::vector<float> step_logits((size_t) args.steps * n_vocab);
    llama_token next = argmax(prompt_logits.data() + (size_t) (n_prompt - 1) * n_vocab, n_vocab);
    if (args.generate > 0) {
        generated.push_back(next);
    }
    llama_batch one = llama_batch_init(1, 0, 1);
    for (int step = 0; step < n_steps; step++) {
        one.n_tokens = 1;
        one.token[0] = next;
        one.pos[0] = n_prompt + step;
        one.n_seq_id[0] = 1;
        one.seq_id[0][0] = 0;
        one.logits[0] = 1;
        rc = llama_decode(ctx, one);
        if (rc != 0) {
            fail("llama_decode of step " + std::to_string(step) + " returned " + std::to_string(rc));
        }
        const float * row = llama_get_logits_ith(ctx, 0);
        if (row == nullptr) {
            fail("no logits for step " + std::to_string(step));
        }
        if (step < args.steps) {
            std::copy(row, row + n_vocab, step_logits.begin() + (size_t) step * n_vocab);
        }
        next = argmax(row, n_vocab);
        if ((int) generated.size() < args.generate) {
            generated.push_back(next);
        }
    }

    // Each prompt token alone at position 0 (the cache cleared before
    // each): rows no other position's rounding reaches.
    std::vector<float> single_logits((size_t) n_prompt * n_vocab);
    for (int i = 0; i < n_prompt; i++) {
        llama_memory_clear(llama_get_memory(ctx), true);
        one.n_tokens = 1;
        one.token[0] = args.tokens[i];
        one.pos[0] = 0;
        one.n_seq_id[0] = 1;
        one.seq_id[0][0] = 0;
        one.logits[0] = 1;
        rc = llama_decode(ctx, one);
        if (rc != 0) {
            fail("llama_decode of token " + std::to_string(i) + " alone returned " + std::to_string(rc));
        }
        const float * row = llama_get_logits_ith(ctx, 0);
        if (row == nullptr) {
            fail("no logits for token " + std::to_string(i) + " alone");
        }
        std::copy(row, row + n_vocab, single_logits.begin() + (size_t) i * n_vocab);
    }
    llama_batch_free(one);

    write_npy(args.out + "/prompt_logits.npy", prompt_logits, n_prompt, n_vocab);
    write_npy(args.out + "/single_logits.npy", single_logits, n_prompt, n_vocab);
    write_npy(args.out + "/step_logits.npy", step_logits, args.steps, n_vocab);
    {
        std::ofstream out(args.out + "/greedy.json");
        out << json{{"tokens", generated}}.dump() << "\n";
        if (!out) {
            fail("cannot write " + args.out + "/greedy.json");
        }
    }
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}

}  // namespace

int main(int argc, char ** argv) {
    llama_log_set(log_callback, nullptr);
    std::vector<std::string> argv_s(argv + 1, argv + argc);
    for (const auto & a : argv_s) {
        if (a == "--verbose") g_verbose = true;
        if (a == "-h" || a == "--help") {
            puts(usage);
            return 0;
        }
    }
    if (argv_s.size() < 2) {
        fprintf(stderr, "%s\n", usage);
        return 2;
    }
    const std::string mode = argv_s[0];
    const std::string model = argv_s[1];
    llama_backend_init();
    try {
        if (mode == "tokenize") {
            bool add_special = true;
            for (size_t i = 2; i < argv_s.size(); i++) {
                if (argv_s[i] == "--no-special") add_special = false;
                else if (argv_s[i] != "--verbose") fail("tokenize: unknown argument " + argv_s[i]);
            }
            return cmd_tokenize(model, add_special);
        }
        if (mode == "eval") {
            EvalArgs args;
            args.model = model;
            bool have_tokens = false;
            for (size_t i = 2; i < argv_s.size(); i++) {
                const std::string & a = argv_s[i];
                auto value = [&]() -> std::string {
                    if (i + 1 >= argv_s.size()) fail(a + " wants a value");
                    return argv_s[++i];
                };
                if (a == "--tokens") { args.tokens = parse_tokens(value()); have_tokens = true; }
                else if (a == "--steps") args.steps = parse_int(a, value(), 0);
                else if (a == "--generate") args.generate = parse_int(a, value(), 0);
                else if (a == "--threads") args.threads = parse_int(a, value(), 1);
                else if (a == "--out") args.out = value();
                else if (a == "--flash-attn") args.flash_attn = true;
                else if (a == "--kv-type") {
                    std::string t = value();
                    if (t == "f32") args.kv_type = GGML_TYPE_F32;
                    else if (t == "f16") args.kv_type = GGML_TYPE_F16;
                    else fail("--kv-type wants f32 or f16, not '" + t + "'");
                }
                else if (a != "--verbose") fail("eval: unknown argument " + a);
            }
            if (!have_tokens) fail("eval wants --tokens");
            if (args.out.empty()) fail("eval wants --out DIR");
            return cmd_eval(args);
        }
        fail("unknown mode '" + mode + "' (tokenize or eval)");
    } catch (const std::exception & e) {
        fail(e.what());
    }
}
