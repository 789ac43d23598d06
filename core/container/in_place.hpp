// Rewriting tensor payloads inside an existing file, each in its own slot:
// the original's in-place rule (a new payload must not be larger than the
// slot's current nbytes; the record keeps its offset, gets the new dtype,
// nbytes and hash64; the directory hash at 0x78 is recomputed; the header
// and the file length stay; the bytes past a shorter payload go dark).
//
// Unlike the original, which writes payloads, then the directory, and can be
// left with a new payload under an old record by a crash, every rewrite
// goes through a redo journal `<file>.journal`: all the writes (payloads,
// directory, envelope) are first written to `<file>.journal.tmp` with a
// checksum, synced and renamed into place; only then is the file written,
// synced, and the journal removed. A crash before the rename leaves the file
// untouched (the temp journal is dropped); after it, the next open of the
// file (or of any tool) replays the journal, so the file is either all old
// or all new. A journal that does not belong to the file's current
// contents is refused, never applied.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace cmf::container {

struct SlotPatch {
    uint64_t record = 0;          // directory record index in this file
    int32_t dtype = 0;
    std::vector<uint8_t> payload; // size <= the record's nbytes
};

std::string journal_path(const std::string &file);

// Applies `patches` to one file (one shard of a sharded model) atomically
// as described above. Validates every record index and slot size before
// anything is written. Throws cmf::Error.
void rewrite_in_place(const std::string &file, const std::vector<SlotPatch> &patches);

// Completes an interrupted rewrite_in_place of `file` if its journal exists
// (and drops a partial temp journal). Returns true when a journal was
// replayed. Throws cmf::Error when one exists but cannot be applied.
bool recover_in_place(const std::string &file);

}  // namespace cmf::container
