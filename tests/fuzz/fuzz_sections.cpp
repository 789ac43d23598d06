// libFuzzer target: the sections of a .cmf file that are parsed rather than
// mapped, each fed directly (fuzz_open reaches them only through a valid
// envelope). Input: four parts, each but the last preceded by its u32 LE
// length: header JSON, directory, masks section, sparse index. The header
// is parsed as open() does and, when accepted, re-emitted as the writers do
// when they rewrite it (append, requant, compact); the masks are decoded against the
// header's arch (or a small fixed one when the header is refused).
// Errors are expected; a crash, hang, leak or sanitizer report is a bug.
#include "common/error.hpp"
#include "container/header.hpp"
#include "container/json_emit.hpp"
#include "container/model.hpp"

#include <boost/json/parse.hpp>

#include <cstring>
#include <string>
#include <vector>

namespace {

// The next length-prefixed part (the rest when fewer than 4 bytes or the
// length runs past the end).
std::vector<uint8_t> take(const uint8_t *&p, size_t &n, bool last) {
    size_t len = n;
    if (!last && n >= 4) {
        uint32_t l;
        std::memcpy(&l, p, 4);
        p += 4;
        n -= 4;
        len = std::min<size_t>(l, n);
    }
    std::vector<uint8_t> part(p, p + len);  // its own allocation: reads past it are caught
    p += len;
    n -= len;
    return part;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *p = data;
    size_t n = size;
    const std::vector<uint8_t> header = take(p, n, false), dir = take(p, n, false), masks = take(p, n, false),
                               index = take(p, n, true);
    cmf::container::ArchInfo arch;
    arch.arch_name = "fuzz";
    arch.hidden_size = 8;
    arch.intermediate_size = 16;
    arch.num_layers = 2;
    arch.num_attention_heads = 2;
    arch.num_kv_heads = 1;
    arch.head_dim = 4;
    arch.vocab_size = 10;
    try {
        arch = cmf::container::parse_header(header.data(), header.size()).arch;
        // Only headers open() accepted are ever re-emitted.
        boost::system::error_code ec;
        boost::json::value v = boost::json::parse(
            std::string_view(reinterpret_cast<const char *>(header.data()), header.size()), ec);
        if (!ec && v.is_object()) (void)cmf::container::json::emit_header(v);
    } catch (const cmf::Error &) {
    }
    try {
        (void)cmf::container::decode_directory(dir.data(), dir.size());
    } catch (const cmf::Error &) {
    }
    try {
        std::vector<cmf::container::MaskRec> recs;
        std::string default_task;
        cmf::container::MaskLayout layout;
        cmf::container::decode_masks(masks.data(), masks.size(), arch, recs, default_task, layout);
    } catch (const cmf::Error &) {
    }
    try {
        std::vector<cmf::container::IndexEntry> entries;
        cmf::container::decode_index(index.data(), index.size(), entries);
    } catch (const cmf::Error &) {
    }
    return 0;
}
