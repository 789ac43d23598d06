// Encode throughput of the tokenizer, one thread, through the public C API.
//   text_bench TOKENIZER_JSON CORPUS_JSON [MIN_MB]
// The text is the JSON array of strings in CORPUS_JSON (tests/text/fixtures/
// corpus.json: many scripts, code, emoji) joined by newlines and repeated to
// at least MIN_MB (default 4) megabytes; text_bench.mjs builds the same text
// for transformers.js. Encodes it in lines of the corpus (as a server would
// encode prompts), then as one big string.
#include <cmf/cmf.h>

#include <simdjson.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

static std::string slurp(const char *path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) {
        std::fprintf(stderr, "cannot open %s\n", path);
        std::exit(1);
    }
    std::ostringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

int main(int argc, char **argv) {
    if (argc < 3) {
        std::fprintf(stderr, "usage: text_bench TOKENIZER_JSON CORPUS_JSON [MIN_MB]\n");
        return 2;
    }
    double min_mb = argc > 3 ? std::atof(argv[3]) : 4.0;
    std::string json = slurp(argv[1]);
    auto t0 = std::chrono::steady_clock::now();
    cmf_tokenizer *tok = nullptr;
    if (cmf_error *e = cmf_tokenizer_create(json.data(), json.size(), &tok)) {
        std::fprintf(stderr, "%s\n", cmf_error_message(e));
        return 1;
    }
    double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    simdjson::dom::parser p;
    std::vector<std::string> lines;
    simdjson::dom::array arr;
    if (p.load(argv[2]).get(arr)) {
        std::fprintf(stderr, "%s: expected a JSON array of strings\n", argv[2]);
        return 1;
    }
    for (simdjson::dom::element s : arr) {
        std::string_view v;
        if (s.get(v)) {
            std::fprintf(stderr, "%s: expected a JSON array of strings\n", argv[2]);
            return 1;
        }
        lines.emplace_back(v);
    }
    std::vector<std::string> docs;
    size_t total = 0;
    while (total < min_mb * 1e6)
        for (auto &l : lines) {
            docs.push_back(l + "\n");
            total += l.size() + 1;
        }
    std::string big;
    for (auto &d : docs) big += d;

    auto run = [&](auto &&body) {
        auto s = std::chrono::steady_clock::now();
        size_t n = body();
        return std::make_pair(std::chrono::duration<double>(std::chrono::steady_clock::now() - s).count(), n);
    };
    auto encode_all = [&] {
        size_t n = 0;
        for (auto &d : docs) {
            int32_t *ids;
            size_t k;
            if (cmf_error *e = cmf_tokenizer_encode(tok, d.data(), d.size(), 0, &ids, &k)) {
                std::fprintf(stderr, "%s\n", cmf_error_message(e));
                std::exit(1);
            }
            n += k;
            cmf_ids_free(ids);
        }
        return n;
    };
    auto encode_big = [&] {
        int32_t *ids;
        size_t k;
        if (cmf_error *e = cmf_tokenizer_encode(tok, big.data(), big.size(), 0, &ids, &k)) {
            std::fprintf(stderr, "%s\n", cmf_error_message(e));
            std::exit(1);
        }
        cmf_ids_free(ids);
        return k;
    };
    auto [cold_s, cold_n] = run(encode_all);  // fills the word cache
    auto [warm_s, warm_n] = run(encode_all);
    auto [big_s, big_n] = run(encode_big);
    double mb = double(total) / 1e6;
    std::printf("load %.2f s | %.1f MB in %zu lines: first pass %.1f MB/s, second %.1f MB/s (%zu tokens) | one string: %.1f MB/s\n",
                load_s, mb, docs.size(), mb / cold_s, mb / warm_s, warm_n, mb / big_s);
    (void)cold_n;
    (void)big_n;
    cmf_tokenizer_free(tok);
    return 0;
}
