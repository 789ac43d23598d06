// The model files libcmf has mapped, so that pages of them can be dropped
// from the process on request (cmf_host_api.release_pages) without ever
// touching memory that is not such a mapping: MADV_DONTNEED unmaps the
// pages of a read-only file mapping (a later read maps them again from the
// page cache or the file) but would zero anonymous ones.
#pragma once

#include <cstdint>

namespace cmf::file_mappings {

// A read-only file mapping of [p, p + n) came into being / goes away
// (remove before munmap, so no release can reach an unmapped range).
void add(const void *p, uint64_t n);
void remove(const void *p) noexcept;
// Drops the whole pages inside [p, p + n) when the range lies in one live
// mapping; returns whether it did. Anything else is left alone.
bool release_pages(const void *p, uint64_t n) noexcept;

}  // namespace cmf::file_mappings
