// Detached Ed25519 signatures (spec §8.2) with OpenSSL 3.
#pragma once

#include <cstdint>
#include <string>

namespace cmf::container {

struct SignatureCheck {
    bool present = false;   // <file>.sig readable
    bool valid = false;
    std::string problem;    // why it is not valid
    std::string pubkey_hex, fingerprint;
};

std::string sha256_hex(const uint8_t *data, uint64_t len);
// 16 hex: the first 8 bytes of SHA-256 over the raw 32-byte public key.
std::string key_fingerprint(const std::string &pubkey_hex);

void keygen(const std::string &key_path);
// Returns the signer's fingerprint.
std::string sign_file(const std::string &file, const std::string &key_path);
// `data` = the whole file's bytes.
SignatureCheck check_signature(const std::string &file, const uint8_t *data, uint64_t len);

}  // namespace cmf::container
