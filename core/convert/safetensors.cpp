#include "convert/safetensors.hpp"

#include "common/error.hpp"
#include "common/json.hpp"

#include <simdjson.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace cmf::convert {

namespace fs = std::filesystem;

namespace {

[[noreturn]] void fail(int32_t code, const std::string &file, const std::string &what) {
    throw Error(code, file + ": " + what);
}

// Every safetensors dtype name we know, to tell "unsupported" from "garbage".
bool is_known_safetensors_dtype(std::string_view s) {
    static const char *const known[] = {"BOOL", "U8", "I8", "I16", "U16", "I32", "U32", "I64", "U64",
                                        "F64", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F4", "F6_E2M3",
                                        "F6_E3M2", "C64", "E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ"};
    for (const char *k : known)
        if (s == k) return true;
    return false;
}

struct Span {
    uint64_t begin, end;
    const SourceTensor *t;
};

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string &path) : path_(path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int err = errno;
        fail(err == ENOENT ? CMF_ERR_FILE_NOT_FOUND : CMF_ERR_IO, path, std::string("cannot open: ") + std::strerror(err));
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
        int err = errno;
        ::close(fd);
        fail(CMF_ERR_IO, path, std::string("cannot stat: ") + std::strerror(err));
    }
    size_ = static_cast<uint64_t>(st.st_size);
    if (size_ > 0) {
        map_ = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map_ == MAP_FAILED) {
            int err = errno;
            map_ = nullptr;
            ::close(fd);
            fail(CMF_ERR_IO, path, std::string("cannot map: ") + std::strerror(err));
        }
    }
    ::close(fd);
    try {
        parse(static_cast<const uint8_t *>(map_));
    } catch (...) {
        if (map_) ::munmap(map_, size_);
        map_ = nullptr;
        throw;
    }
}

SafetensorsFile::SafetensorsFile(const std::string &name, const uint8_t *bytes, uint64_t size) : path_(name), size_(size) {
    parse(bytes);
}

void SafetensorsFile::parse(const uint8_t *bytes) {
    const std::string &path = path_;
    if (size_ < 8) fail(CMF_ERR_PARSE, path, "truncated: " + std::to_string(size_) + " bytes, a safetensors file starts with an 8-byte header length");
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; --i) hlen = (hlen << 8) | bytes[i];
    if (hlen > kMaxSafetensorsHeader)
        fail(CMF_ERR_PARSE, path, "header length " + std::to_string(hlen) + " exceeds the " + std::to_string(kMaxSafetensorsHeader) + "-byte limit (not a safetensors file?)");
    if (hlen < 2) fail(CMF_ERR_PARSE, path, "header length " + std::to_string(hlen) + " is too small for a JSON object");
    if (hlen > size_ - 8)
        fail(CMF_ERR_PARSE, path, "truncated: header length " + std::to_string(hlen) + " but only " + std::to_string(size_ - 8) + " bytes follow");
    const uint64_t data_start = 8 + hlen;
    const uint64_t data_len = size_ - data_start;
    const uint8_t *data = bytes + data_start;

    simdjson::dom::parser parser;
    simdjson::dom::element doc = parse_json(parser, std::string_view(reinterpret_cast<const char *>(bytes + 8), hlen), path + ": header");
    simdjson::dom::object root;
    if (doc.get_object().get(root)) fail(CMF_ERR_PARSE, path, "header is not a JSON object");

    std::set<std::string_view> seen;
    for (auto field : root) {
        std::string name(field.key);
        if (!seen.insert(field.key).second) fail(CMF_ERR_PARSE, path, "duplicate key \"" + name + "\" in the header");
        if (name == "__metadata__") {
            simdjson::dom::object meta;
            if (field.value.get_object().get(meta)) fail(CMF_ERR_PARSE, path, "__metadata__ is not an object");
            for (auto m : meta) {
                std::string_view v;
                if (m.value.get_string().get(v))
                    fail(CMF_ERR_PARSE, path, "__metadata__ value of \"" + std::string(m.key) + "\" is not a string");
                metadata_[std::string(m.key)] = std::string(v);
            }
            continue;
        }
        const std::string where = "tensor \"" + name + "\": ";
        simdjson::dom::object info;
        if (field.value.get_object().get(info)) fail(CMF_ERR_PARSE, path, where + "entry is not an object");
        std::string_view dtype;
        if (info["dtype"].get_string().get(dtype)) fail(CMF_ERR_PARSE, path, where + "missing or non-string \"dtype\"");
        SourceTensor t;
        t.name = name;
        t.file = path;
        t.owner = this;
        if (dtype == "F32") t.dtype = SourceDtype::F32;
        else if (dtype == "F16") t.dtype = SourceDtype::F16;
        else if (dtype == "BF16") t.dtype = SourceDtype::BF16;
        else if (is_known_safetensors_dtype(dtype))
            fail(CMF_ERR_UNKNOWN_DTYPE, path, where + "dtype " + std::string(dtype) + " is not supported (the converter reads F32, F16 and BF16)");
        else
            fail(CMF_ERR_PARSE, path, where + "unknown dtype \"" + std::string(dtype) + "\"");
        simdjson::dom::array shape;
        if (info["shape"].get_array().get(shape)) fail(CMF_ERR_PARSE, path, where + "missing or non-array \"shape\"");
        uint64_t n = 1;
        bool overflow = false;
        for (auto d : shape) {
            uint64_t v;
            if (d.get_uint64().get(v)) fail(CMF_ERR_PARSE, path, where + "shape holds a value that is not a non-negative integer");
            t.shape.push_back(v);
            if (v != 0 && n > UINT64_MAX / v) overflow = true;
            n *= v;
        }
        if (overflow || n > UINT64_MAX / 4) fail(CMF_ERR_BOUNDS, path, where + "shape has too many elements");
        t.elements = n;
        simdjson::dom::array offs;
        if (info["data_offsets"].get_array().get(offs) || offs.size() != 2)
            fail(CMF_ERR_PARSE, path, where + "\"data_offsets\" must be an array [begin, end]");
        uint64_t b, e;
        if (offs.at(0).get_uint64().get(b) || offs.at(1).get_uint64().get(e))
            fail(CMF_ERR_PARSE, path, where + "data_offsets must be non-negative integers");
        if (b > e) fail(CMF_ERR_BOUNDS, path, where + "data_offsets begin " + std::to_string(b) + " > end " + std::to_string(e));
        if (e > data_len)
            fail(CMF_ERR_BOUNDS, path, where + "data ends at byte " + std::to_string(e) + " of the data region but the file holds only " +
                                           std::to_string(data_len) + " (truncated file?)");
        const uint64_t want = n * (t.dtype == SourceDtype::F32 ? 4 : 2);
        if (e - b != want)
            fail(CMF_ERR_BOUNDS, path, where + "holds " + std::to_string(e - b) + " bytes but shape x " + std::string(dtype) + " needs " + std::to_string(want));
        t.data = data + b;
        t.nbytes = want;
        tensors_.push_back(std::move(t));
    }
    std::sort(tensors_.begin(), tensors_.end(), [](const SourceTensor &a, const SourceTensor &b) { return a.name < b.name; });
    std::vector<Span> spans;
    spans.reserve(tensors_.size());
    for (const auto &t : tensors_) {
        uint64_t b = static_cast<uint64_t>(t.data - data);
        if (t.nbytes) spans.push_back({b, b + t.nbytes, &t});
    }
    std::sort(spans.begin(), spans.end(), [](const Span &a, const Span &b) { return a.begin < b.begin; });
    for (size_t i = 1; i < spans.size(); ++i)
        if (spans[i].begin < spans[i - 1].end)
            fail(CMF_ERR_BOUNDS, path, "tensors \"" + spans[i - 1].t->name + "\" and \"" + spans[i].t->name + "\" overlap in the data region");
}

SafetensorsFile::~SafetensorsFile() {
    if (map_) ::munmap(map_, size_);
}

const SourceTensor *SafetensorsFile::find(const std::string &name) const {
    auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name, [](const SourceTensor &t, const std::string &n) { return t.name < n; });
    return it != tensors_.end() && it->name == name ? &*it : nullptr;
}

void SafetensorsFile::release_bytes(const uint8_t *from, const uint8_t *to) const { release_mapped_pages(map_, from, to); }

Checkpoint::Checkpoint(const std::string &dir, const std::string &stem) : dir_(dir) {
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) throw Error(CMF_ERR_FILE_NOT_FOUND, dir + ": not a directory (expected a Hugging Face checkpoint directory)");
    const fs::path single = fs::path(dir) / (stem + ".safetensors");
    const fs::path index = fs::path(dir) / (stem + ".safetensors.index.json");
    std::vector<std::string> names;
    std::map<std::string, std::string> weight_map;
    if (fs::exists(index, ec)) {
        simdjson::dom::parser parser;
        simdjson::padded_string text;
        if (simdjson::padded_string::load(index.string()).get(text)) throw Error(CMF_ERR_IO, index.string() + ": cannot read");
        simdjson::dom::element doc = parse_json(parser, std::string_view(text.data(), text.size()), index.string());
        simdjson::dom::object wm;
        if (doc["weight_map"].get_object().get(wm)) throw Error(CMF_ERR_PARSE, index.string() + ": no \"weight_map\" object");
        std::set<std::string> files;
        for (auto f : wm) {
            std::string_view file;
            if (f.value.get_string().get(file))
                throw Error(CMF_ERR_PARSE, index.string() + ": weight_map value of \"" + std::string(f.key) + "\" is not a string");
            std::string fname(file);
            if (fname.empty() || fname.find('/') != std::string::npos || fname == "." || fname == "..")
                throw Error(CMF_ERR_PARSE, index.string() + ": weight_map names file \"" + fname + "\", which is not a plain file name in the checkpoint directory");
            files.insert(fname);
            weight_map[std::string(f.key)] = fname;
        }
        if (files.empty()) throw Error(CMF_ERR_PARSE, index.string() + ": weight_map is empty");
        names.assign(files.begin(), files.end());
    } else if (fs::exists(single, ec)) {
        names.push_back(stem + ".safetensors");
    } else {
        throw Error(CMF_ERR_FILE_NOT_FOUND, dir + ": neither " + stem + ".safetensors nor " + stem + ".safetensors.index.json found");
    }
    for (size_t i = 0; i < names.size(); ++i) {
        files_.push_back(std::make_unique<SafetensorsFile>((fs::path(dir) / names[i]).string()));
        for (const auto &t : files_.back()->tensors()) {
            if (!by_name_.emplace(t.name, std::make_pair(&t, i)).second)
                throw Error(CMF_ERR_PARSE, files_.back()->path() + ": tensor \"" + t.name + "\" also appears in " + file_of(*by_name_.at(t.name).first).path());
            all_.push_back(&t);
        }
    }
    // The index must describe the shards truthfully: every listed tensor
    // exists in the file it names.
    for (const auto &[name, file] : weight_map) {
        auto it = by_name_.find(name);
        if (it == by_name_.end())
            throw Error(CMF_ERR_MISSING_TENSOR, index.string() + ": tensor \"" + name + "\" is listed in weight_map but absent from " + file);
        if (fs::path(files_[it->second.second]->path()).filename() != file)
            throw Error(CMF_ERR_PARSE, index.string() + ": tensor \"" + name + "\" is listed in " + file + " but stored in " + files_[it->second.second]->path());
    }
}

const SourceTensor *Checkpoint::find(const std::string &name) const {
    auto it = by_name_.find(name);
    return it == by_name_.end() ? nullptr : it->second.first;
}

const SafetensorsFile &Checkpoint::file_of(const SourceTensor &t) const {
    auto it = by_name_.find(t.name);
    if (it == by_name_.end()) throw Error(CMF_ERR_INTERNAL, "tensor not in checkpoint: " + t.name);
    return *files_[it->second.second];
}

}  // namespace cmf::convert
