#include "container/signature.hpp"

#include "common/error.hpp"
#include "common/json.hpp"

#include <openssl/evp.h>
#include <openssl/rand.h>
#include <simdjson.h>

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <fstream>
#include <memory>
#include <sstream>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

#include "container/mapped_file.hpp"
#include "container/writer_parts.hpp"

namespace cmf::container {

namespace {

[[noreturn]] void sig_fail(const std::string &m) { throw Error(CMF_ERR_SIGNATURE, m); }

struct PkeyFree { void operator()(EVP_PKEY *k) const { EVP_PKEY_free(k); } };
struct MdFree { void operator()(EVP_MD_CTX *c) const { EVP_MD_CTX_free(c); } };
using Pkey = std::unique_ptr<EVP_PKEY, PkeyFree>;
using MdCtx = std::unique_ptr<EVP_MD_CTX, MdFree>;

std::string to_hex(const uint8_t *p, size_t n) {
    static const char d[] = "0123456789abcdef";
    std::string s;
    for (size_t i = 0; i < n; ++i) {
        s += d[p[i] >> 4];
        s += d[p[i] & 15];
    }
    return s;
}
bool from_hex(const std::string &h, std::vector<uint8_t> &out) {
    if (h.size() % 2) return false;
    out.clear();
    for (size_t i = 0; i < h.size(); i += 2) {
        auto nib = [](char c) -> int {
            if (c >= '0' && c <= '9') return c - '0';
            if (c >= 'a' && c <= 'f') return c - 'a' + 10;
            if (c >= 'A' && c <= 'F') return c - 'A' + 10;
            return -1;
        };
        int a = nib(h[i]), b = nib(h[i + 1]);
        if (a < 0 || b < 0) return false;
        out.push_back(uint8_t(a * 16 + b));
    }
    return true;
}
std::string trim(std::string s) {
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
    size_t i = 0;
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
    return s.substr(i);
}
bool read_file(const std::string &path, std::string &out) {
    std::ifstream f(path, std::ios::binary);
    if (!f) return false;
    std::ostringstream ss;
    ss << f.rdbuf();
    out = ss.str();
    return true;
}
// Through a temp file, so a writer killed mid-way never leaves a torn
// signature or key: the old file stays, or the new one is complete. A key
// (exclusive) never replaces an existing file.
void write_new_file(const std::string &path, const std::string &text, mode_t mode, bool exclusive) {
    parts::TempFile tmp(path, mode);
    size_t done = 0;
    while (done < text.size()) {
        ssize_t w = ::write(tmp.fd(), text.data() + done, text.size() - done);
        if (w < 0) {
            if (errno == EINTR) continue;
            throw Error(CMF_ERR_IO, "cannot write '" + path + "': " + std::strerror(errno));
        }
        done += size_t(w);
    }
    if (exclusive) tmp.commit_new();
    else tmp.commit();
}

Pkey load_private(const std::string &key_path) {
    std::string text;
    if (!read_file(key_path, text)) throw Error(CMF_ERR_IO, "cannot read key file '" + key_path + "'");
    std::vector<uint8_t> seed;
    if (!from_hex(trim(text), seed) || seed.size() != 32)
        sig_fail("key file '" + key_path + "' must hold 64 hex characters (a 32-byte Ed25519 seed)");
    Pkey k(EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, nullptr, seed.data(), seed.size()));
    if (!k) sig_fail("OpenSSL refused the Ed25519 seed in '" + key_path + "'");
    return k;
}
std::string public_hex(EVP_PKEY *k) {
    uint8_t pub[32];
    size_t n = sizeof pub;
    if (EVP_PKEY_get_raw_public_key(k, pub, &n) != 1 || n != 32) sig_fail("cannot derive the Ed25519 public key");
    return to_hex(pub, 32);
}
std::vector<uint8_t> sha256(const uint8_t *data, uint64_t len) {
    std::vector<uint8_t> d(32);
    unsigned int n = 32;
    if (EVP_Digest(data, size_t(len), d.data(), &n, EVP_sha256(), nullptr) != 1) throw Error(CMF_ERR_INTERNAL, "SHA-256 failed");
    return d;
}

}  // namespace

std::string sha256_hex(const uint8_t *data, uint64_t len) {
    auto d = sha256(data, len);
    return to_hex(d.data(), d.size());
}

std::string key_fingerprint(const std::string &pubkey_hex) {
    std::vector<uint8_t> raw;
    if (!from_hex(pubkey_hex, raw)) return "";
    auto d = sha256(raw.data(), raw.size());
    return to_hex(d.data(), 8);
}

void keygen(const std::string &key_path) {
    uint8_t seed[32];
    if (RAND_bytes(seed, sizeof seed) != 1) throw Error(CMF_ERR_INTERNAL, "no randomness for a key");
    Pkey k(EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, nullptr, seed, sizeof seed));
    if (!k) sig_fail("OpenSSL cannot make an Ed25519 key");
    write_new_file(key_path, to_hex(seed, 32), 0600, true);
    write_new_file(key_path + ".pub", public_hex(k.get()), 0644, false);
}

std::string sign_file(const std::string &file, const std::string &key_path) {
    Pkey k = load_private(key_path);
    MappedFile f(file, true);
    auto digest = sha256(f.data(), f.size());
    MdCtx ctx(EVP_MD_CTX_new());
    uint8_t sig[64];
    size_t sig_len = sizeof sig;
    // Pure Ed25519 (RFC 8032) over the 32 raw digest bytes: no digest in the init.
    if (!ctx || EVP_DigestSignInit(ctx.get(), nullptr, nullptr, nullptr, k.get()) != 1 ||
        EVP_DigestSign(ctx.get(), sig, &sig_len, digest.data(), digest.size()) != 1 || sig_len != 64)
        sig_fail("Ed25519 signing failed");
    const std::string pub = public_hex(k.get());
    // As the original writes .sig files: pretty JSON, 2-space indent, sorted
    // keys, no trailing newline.
    std::string json = "{\n  \"alg\": \"ed25519-sha256\",\n  \"pubkey\": \"" + pub + "\",\n  \"sha256\": \"" +
                       to_hex(digest.data(), 32) + "\",\n  \"sig\": \"" + to_hex(sig, 64) + "\"\n}";
    write_new_file(file + ".sig", json, 0644, false);
    return key_fingerprint(pub);
}

SignatureCheck check_signature(const std::string &file, const uint8_t *data, uint64_t len) {
    SignatureCheck r;
    std::string text;
    if (!read_file(file + ".sig", text)) return r;  // absent: not an error
    r.present = true;
    auto bad = [&](const std::string &why) {
        r.problem = why;
        return r;
    };
    simdjson::dom::parser parser;
    simdjson::dom::object o;
    try {
        if (parse_json(parser, text, file + ".sig").get(o) != simdjson::SUCCESS) return bad("signature file is not a JSON object");
    } catch (const Error &e) {
        return bad(e.message());
    }
    std::string_view alg, pub, sha, sig;
    if (o["alg"].get(alg) != simdjson::SUCCESS || alg != "ed25519-sha256") return bad("signature alg is not \"ed25519-sha256\"");
    std::vector<uint8_t> pub_raw, sig_raw;
    if (o["pubkey"].get(pub) != simdjson::SUCCESS || !from_hex(std::string(pub), pub_raw) || pub_raw.size() != 32)
        return bad("signature pubkey is not 32 bytes of hex");
    if (o["sig"].get(sig) != simdjson::SUCCESS || !from_hex(std::string(sig), sig_raw) || sig_raw.size() != 64)
        return bad("signature sig is not 64 bytes of hex");
    if (o["sha256"].get(sha) != simdjson::SUCCESS) return bad("signature has no sha256");
    r.pubkey_hex = to_hex(pub_raw.data(), 32);
    r.fingerprint = key_fingerprint(r.pubkey_hex);
    auto digest = sha256(data, len);
    std::string want(sha);
    for (auto &c : want) c = char(std::tolower(static_cast<unsigned char>(c)));
    if (to_hex(digest.data(), 32) != want) return bad("SHA-256 of the file does not match the signature's sha256 (file changed after signing)");
    Pkey k(EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, nullptr, pub_raw.data(), 32));
    MdCtx ctx(EVP_MD_CTX_new());
    if (!k || !ctx || EVP_DigestVerifyInit(ctx.get(), nullptr, nullptr, nullptr, k.get()) != 1 ||
        EVP_DigestVerify(ctx.get(), sig_raw.data(), 64, digest.data(), 32) != 1)
        return bad("Ed25519 signature does not verify (signed by key " + r.fingerprint + ")");
    r.valid = true;
    return r;
}

}  // namespace cmf::container
