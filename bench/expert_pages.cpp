// Which experts' pages a mixture-of-experts decode actually touches.
//
//   expert_pages MODEL.cmf [-n TOKENS] [--threads N] [--advice runtime|random]
//
// Drops MODEL's pages from the page cache (posix_fadvise DONTNEED: only
// pages no process maps go, so nothing else may have the file open), opens
// it through the public C API, then decodes TOKENS greedy tokens one at a
// time from a one-token prompt. After 1, 2, 4, ... tokens it asks mincore()
// which pages of the file are in the page cache and sets that against the
// session's routing statistics (which experts some token picked so far):
//   - picked experts: how many, and how much of their bytes is resident;
//   - never-picked experts: how many have any resident page, and how many
//     bytes of them are resident (pages wholly inside the expert: a page
//     shared with a neighbouring tensor is not counted against it);
//   - the whole file's resident bytes, and the process's RSS.
// With --advice runtime the mapping keeps the runtime's advice (2 MiB
// pages: a cold read brings in the 2 MiB folio around the touched bytes,
// which on a file of experts smaller than that reaches into neighbours).
// --advice random replaces it, on the whole mapping, by MADV_NOHUGEPAGE +
// MADV_RANDOM (4 KiB pages, no read-ahead): resident then means touched.
#include <cmf/cmf.h>

#include <simdjson.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace {

[[noreturn]] void fail(const std::string &what) {
    std::fprintf(stderr, "expert_pages: %s\n", what.c_str());
    std::exit(1);
}

void check(cmf_error *e, const char *what) {
    if (!e) return;
    std::string msg = cmf_error_message(e);
    cmf_error_free(e);
    fail(std::string(what) + ": " + msg);
}

const uint64_t kPage = uint64_t(sysconf(_SC_PAGESIZE));

// Resident bytes of [begin, end) counting only pages wholly inside it.
uint64_t resident_inside(const uint8_t *begin, const uint8_t *end) {
    const uintptr_t b = (reinterpret_cast<uintptr_t>(begin) + kPage - 1) / kPage * kPage;
    const uintptr_t e = reinterpret_cast<uintptr_t>(end) / kPage * kPage;
    if (e <= b) return 0;
    std::vector<unsigned char> v((e - b) / kPage);
    if (mincore(reinterpret_cast<void *>(b), e - b, v.data()) != 0) fail(std::string("mincore: ") + std::strerror(errno));
    uint64_t n = 0;
    for (unsigned char c : v) n += c & 1;
    return n * kPage;
}

uint64_t status_kib(const char *key) {
    std::ifstream f("/proc/self/status");
    std::string line;
    while (std::getline(f, line))
        if (line.rfind(key, 0) == 0) return std::strtoull(line.c_str() + std::strlen(key), nullptr, 10);
    return 0;
}

double mib(uint64_t b) { return double(b) / (1024.0 * 1024.0); }

struct Expert {
    std::vector<std::pair<const uint8_t *, uint64_t>> parts;  // its tensors' payloads
    uint64_t bytes = 0;
};

}  // namespace

int main(int argc, char **argv) {
    std::string model, advice = "runtime";
    uint32_t n_tokens = 64;
    int threads = 0;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc) fail(a + " needs a value");
            return argv[++i];
        };
        if (a == "-h" || a == "--help") {
            std::printf("expert_pages MODEL.cmf [-n TOKENS] [--threads N] [--advice runtime|random]\n"
                        "Evicts MODEL from the page cache, decodes TOKENS greedy tokens and reports which experts'\n"
                        "pages are resident against which experts the routing picked; see bench/expert_pages.cpp.\n");
            return 0;
        } else if (a == "-n") {
            n_tokens = uint32_t(std::strtoul(value().c_str(), nullptr, 10));
        } else if (a == "--threads") {
            threads = std::atoi(value().c_str());
        } else if (a == "--advice") {
            advice = value();
            if (advice != "runtime" && advice != "random") fail("--advice must be runtime or random");
        } else if (!a.empty() && a[0] != '-' && model.empty()) {
            model = a;
        } else {
            fail("unknown argument " + a + " (--help)");
        }
    }
    if (model.empty() || n_tokens == 0) fail("usage: expert_pages MODEL.cmf [-n TOKENS] (--help)");

    {
        const int fd = open(model.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0) fail(model + ": " + std::strerror(errno));
        fdatasync(fd);
        if (posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) != 0) fail("posix_fadvise failed");
        close(fd);
    }
    cmf_runtime_options ro;
    cmf_runtime_options_init(&ro);
    ro.n_threads = threads;
    cmf_runtime *rt = nullptr;
    check(cmf_runtime_create(&ro, &rt), "runtime");
    cmf_model *m = nullptr;
    check(cmf_open(rt, model.c_str(), nullptr, &m), model.c_str());

    // The experts' payloads; the file's mapping spans all payloads.
    std::map<std::pair<long, long>, Expert> experts;  // (layer, expert)
    const uint8_t *lo = nullptr, *hi = nullptr;
    uint64_t payload_bytes = 0;
    for (size_t i = 0; i < cmf_tensor_count(m); ++i) {
        cmf_tensor_info t;
        cmf_tensor_info_init(&t);
        check(cmf_tensor_at(m, i, &t), "tensor");
        const auto *p = static_cast<const uint8_t *>(t.data);
        lo = lo ? std::min(lo, p) : p;
        hi = std::max(hi, p + t.nbytes);
        payload_bytes += t.nbytes;
        long layer = -1, expert = -1;
        int used = 0;
        if (std::sscanf(t.name, "model.layers.%ld.mlp.experts.%ld.%n", &layer, &expert, &used) == 2 && used > 0) {
            Expert &e = experts[{layer, expert}];
            e.parts.push_back({p, t.nbytes});
            e.bytes += t.nbytes;
        }
    }
    if (experts.empty()) fail(model + " has no experts (model.layers.*.mlp.experts.*)");
    uint64_t expert_bytes = 0;
    for (const auto &[k, e] : experts) expert_bytes += e.bytes;
    if (advice == "random") {
        const uintptr_t b = reinterpret_cast<uintptr_t>(lo) / kPage * kPage;
        const uintptr_t e = (reinterpret_cast<uintptr_t>(hi) + kPage - 1) / kPage * kPage;
        if (madvise(reinterpret_cast<void *>(b), e - b, MADV_NOHUGEPAGE) != 0 ||
            madvise(reinterpret_cast<void *>(b), e - b, MADV_RANDOM) != 0)
            fail(std::string("madvise: ") + std::strerror(errno));
    }
    std::printf("%s: %zu experts in %zu MiB of %.0f MiB of payloads; page cache dropped; advice %s\n", model.c_str(),
                experts.size(), size_t(mib(expert_bytes)), mib(payload_bytes), advice.c_str());

    cmf_session_options so;
    cmf_session_options_init(&so);
    so.n_ctx = n_tokens + 1;
    cmf_session *s = nullptr;
    check(cmf_session_create_for_model(rt, m, &so, &s), "session");
    std::vector<float> logits(cmf_session_vocab_size(s));

    auto report = [&](const char *when) {
        char *json = nullptr;
        check(cmf_session_route_stats(s, &json), "route stats");
        simdjson::dom::parser parser;
        std::set<std::pair<long, long>> picked;
        for (auto [key, counts] : parser.parse(std::string(json)).get_object()) {
            long e = 0;
            for (simdjson::dom::element c : counts.get_array()) {
                if (uint64_t(c) > 0) picked.insert({std::strtol(std::string(key).c_str(), nullptr, 10), e});
                ++e;
            }
        }
        cmf_string_free(json);
        uint64_t picked_bytes = 0, picked_resident = 0, other_resident = 0, other_touched = 0;
        for (const auto &[k, e] : experts) {
            uint64_t r = 0;
            for (const auto &[p, n] : e.parts) r += resident_inside(p, p + n);
            if (picked.count(k)) {
                picked_bytes += e.bytes;
                picked_resident += r;
            } else {
                other_resident += r;
                other_touched += r > 0;
            }
        }
        std::printf("%-10s picked %4zu of %zu experts: %7.1f of %7.1f MiB resident | never picked: %4zu with resident "
                    "pages, %7.1f MiB | file resident %7.1f MiB, RSS %7.1f MiB\n",
                    when, picked.size(), experts.size(), mib(picked_resident), mib(picked_bytes), size_t(other_touched),
                    mib(other_resident), mib(resident_inside(lo, hi)), double(status_kib("VmRSS:")) / 1024.0);
    };
    report("bound");
    int32_t tok = 1;
    uint32_t next_report = 1;
    for (uint32_t i = 1; i <= n_tokens; ++i) {
        check(cmf_session_eval(s, &tok, 1, CMF_LOGITS_LAST, logits.data(), logits.size()), "decode");
        tok = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
        if (i == next_report || i == n_tokens) {
            report((std::to_string(i) + " tok").c_str());
            next_report *= 2;
        }
    }
    cmf_session_free(s);
    cmf_close(m);
    cmf_runtime_free(rt);
    return 0;
}
