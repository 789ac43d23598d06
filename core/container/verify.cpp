// cmf_verify (spec §8, §8.1: the hash chain of every shard) and the signature entry points.
#include "common/hash64.hpp"
#include "common/c_api_util.hpp"
#include "container/model.hpp"
#include "container/signature.hpp"
#include "plugin_host/runtime.hpp"

#include <cmf/cmf.h>

#include <algorithm>
#include <atomic>
#include <mutex>

using cmf::Error;
using cmf::guard;
using namespace cmf::container;

struct cmf_verify_report {
    std::vector<std::string> problems;
    struct Sig {
        std::string file, pubkey, fingerprint;
        bool trusted;
    };
    std::vector<Sig> signatures;
};

namespace {

struct HashJob {
    const std::vector<TensorRec> *tensors;
    struct Piece {
        size_t tensor;
        uint64_t begin, len;  // byte range inside the payload; begin % 8 == 0
    };
    std::vector<Piece> pieces;
    std::vector<std::atomic<uint64_t>> acc;
    std::atomic<uint64_t> done{0};
    uint64_t total = 0;
    cmf_progress_fn progress = nullptr;
    void *user = nullptr;
    std::mutex progress_mu;
    uint64_t reported = 0;  // under progress_mu
    explicit HashJob(size_t n) : acc(n) {}
};

void verify_shard(cmf::Runtime &rt, const Shard &s, const std::string &label, const cmf_verify_options &o,
                  std::vector<std::string> &problems, uint64_t &done_before, uint64_t grand_total) {
    const size_t first_problem = problems.size();
    auto problem = [&](const std::string &p) { problems.push_back(label + p); };
    const Envelope &e = s.env;
    if (e.header_hash != 0 && e.len[kHeader] > 0) {
        uint64_t h = cmf::hash64(s.section(kHeader), e.len[kHeader]);
        if (h != e.header_hash) problem("header: hash64 mismatch (envelope " + hex16(e.header_hash) + ", bytes " + hex16(h) + ")");
    }
    if (e.dir_hash != 0 && e.len[kDir] > 0) {
        uint64_t h = cmf::hash64(s.section(kDir), e.len[kDir]);
        if (h != e.dir_hash) problem("directory: hash64 mismatch (envelope " + hex16(e.dir_hash) + ", bytes " + hex16(h) + ")");
    }
    const std::pair<const char *, int> secs[] = {{"masks", kMasks}, {"vocab", kVocab}, {"index", kIndex}};
    for (auto [key, sec] : secs) {
        auto it = s.header.section_hashes.find(key);
        if (it == s.header.section_hashes.end()) continue;
        const std::string &txt = it->second;
        uint64_t want = 0;
        bool ok = !txt.empty() && txt.size() <= 16;
        for (char c : txt) {
            int v = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
            if (v < 0) ok = false;
            else want = want * 16 + uint64_t(v);
        }
        if (!ok) {
            problem(std::string("section_hashes.") + key + ": malformed hash '" + txt + "'");
            continue;
        }
        if (want == 0 || e.len[sec] == 0) continue;
        uint64_t h = cmf::hash64(s.section(sec), e.len[sec]);
        if (h != want) problem(std::string(key) + " section: hash64 mismatch (header " + hex16(want) + ", bytes " + hex16(h) + ")");
    }
    // Tensors: split into <= 8 MiB pieces so one huge tensor still uses every thread.
    constexpr uint64_t kPiece = 8u << 20;
    HashJob job(s.tensors.size());
    job.tensors = &s.tensors;
    job.progress = o.progress;
    job.user = o.progress_user;
    job.total = grand_total;
    job.done = done_before;
    for (size_t i = 0; i < s.tensors.size(); ++i) {
        const uint64_t n = s.tensors[i].nbytes;
        for (uint64_t b = 0; b < n || (b == 0 && n == 0); b += kPiece) {
            job.pieces.push_back({i, b, std::min(kPiece, n - b)});
            if (n == 0) break;
        }
    }
    rt.pool().parallel_for(0, job.pieces.size(), 1, [](void *u, uint64_t b, uint64_t end) {
        auto *j = static_cast<HashJob *>(u);
        for (uint64_t k = b; k < end; ++k) {
            const auto &p = j->pieces[k];
            const TensorRec &t = (*j->tensors)[p.tensor];
            j->acc[p.tensor].fetch_xor(cmf::hash64_partial(t.data + p.begin, size_t(p.len), p.begin / 8));
            uint64_t d = j->done.fetch_add(p.len) + p.len;
            if (j->progress) {
                // Threads reach the lock in any order: report only forward
                // steps, so `done` never falls and the last call is (total, total).
                std::lock_guard<std::mutex> lock(j->progress_mu);
                if (d > j->reported) {
                    j->reported = d;
                    j->progress(j->user, d, j->total);
                }
            }
        }
    }, &job);
    done_before = job.done;
    for (size_t i = 0; i < s.tensors.size(); ++i) {
        const TensorRec &t = s.tensors[i];
        uint64_t h = cmf::hash64_finish(job.acc[i].load(), t.nbytes);
        if (h != t.hash) problem("tensor '" + t.name + "': hash64 mismatch (directory " + hex16(t.hash) + ", payload " + hex16(h) + ")");
    }
    (void)first_problem;
}

}  // namespace

extern "C" {

CMF_API void cmf_verify_options_init(cmf_verify_options *o) {
    if (!o) return;
    std::memset(o, 0, sizeof *o);
    o->struct_size = sizeof *o;
}
CMF_API void cmf_signature_info_init(cmf_signature_info *i) {
    if (!i) return;
    std::memset(i, 0, sizeof *i);
    i->struct_size = sizeof *i;
}

CMF_API cmf_error *cmf_verify(const cmf_model *m, const cmf_verify_options *opts, cmf_verify_report **out) {
    return guard([&] {
        if (!m || !out) throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_verify: NULL argument");
        cmf_verify_options o = cmf::capi::copy_in(opts, cmf_verify_options_init);
        if (o.n_trusted_keys > 0 && !o.trusted_keys) throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_verify: trusted_keys is NULL");
        std::vector<std::string> trusted;
        for (size_t i = 0; i < o.n_trusted_keys; ++i) {
            std::string k = o.trusted_keys[i] ? o.trusted_keys[i] : "";
            for (auto &c : k) c = char(std::tolower(static_cast<unsigned char>(c)));
            if (k.size() != 64 && k.size() != 16)
                throw Error(CMF_ERR_INVALID_ARGUMENT, "trusted key '" + k + "' is neither a 64-hex public key nor a 16-hex fingerprint");
            trusted.push_back(k);
        }
        auto report = std::make_unique<cmf_verify_report>();
        uint64_t total = 0, done = 0;
        for (const Shard &s : m->shards())
            for (const TensorRec &t : s.tensors) total += t.nbytes;
        const bool many = m->shards().size() > 1;
        for (const Shard &s : m->shards()) {
            const std::string &path = s.file->path();
            const std::string label = many ? path + ": " : "";
            const size_t before = report->problems.size();
            verify_shard(m->runtime(), s, label, o, report->problems, done, total);
            if (o.flags & CMF_VERIFY_SKIP_SIGNATURE) continue;
            if (report->problems.size() != before) continue;  // a signature is checked only over clean hashes
            SignatureCheck sig = check_signature(path, s.file->data(), s.file->size());
            if (!sig.present) {
                if (!trusted.empty()) report->problems.push_back(label + "signature: no " + path + ".sig, but trusted keys were given");
                continue;
            }
            if (!sig.valid) {
                report->problems.push_back(label + "signature: " + sig.problem);
                continue;
            }
            bool ok = trusted.empty() ||
                      std::any_of(trusted.begin(), trusted.end(), [&](const std::string &k) { return k == sig.pubkey_hex || k == sig.fingerprint; });
            if (!ok) report->problems.push_back(label + "signature: valid, but signer " + sig.fingerprint + " is not a trusted key");
            report->signatures.push_back({path, sig.pubkey_hex, sig.fingerprint, ok});
        }
        *out = report.release();
    });
}

CMF_API size_t cmf_verify_problem_count(const cmf_verify_report *r) { return r ? r->problems.size() : 0; }
CMF_API const char *cmf_verify_problem(const cmf_verify_report *r, size_t i) {
    return (r && i < r->problems.size()) ? r->problems[i].c_str() : nullptr;
}
CMF_API size_t cmf_verify_signature_count(const cmf_verify_report *r) { return r ? r->signatures.size() : 0; }
CMF_API cmf_error *cmf_verify_signature_at(const cmf_verify_report *r, size_t i, cmf_signature_info *out) {
    return guard([&] {
        if (!r || !out) throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_verify_signature_at: NULL argument");
        if (i >= r->signatures.size()) throw Error(CMF_ERR_INVALID_ARGUMENT, "signature index out of range");
        cmf_signature_info s;
        cmf_signature_info_init(&s);
        s.trusted = r->signatures[i].trusted;
        s.file = r->signatures[i].file.c_str();
        s.pubkey_hex = r->signatures[i].pubkey.c_str();
        s.fingerprint = r->signatures[i].fingerprint.c_str();
        cmf::capi::copy_out(out, s);
    });
}
CMF_API void cmf_verify_report_free(cmf_verify_report *r) { delete r; }

CMF_API cmf_error *cmf_sign_keygen(const char *key_path) {
    return guard([&] {
        if (!key_path) throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_sign_keygen: NULL path");
        keygen(key_path);
    });
}

CMF_API cmf_error *cmf_sign_file(const char *file, const char *key_path, char *fingerprint_out) {
    return guard([&] {
        if (!file || !key_path) throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_sign_file: NULL argument");
        std::string fp = sign_file(file, key_path);
        if (fingerprint_out) std::memcpy(fingerprint_out, fp.c_str(), fp.size() + 1);
    });
}

}  // extern "C"
