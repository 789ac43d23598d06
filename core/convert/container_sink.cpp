#include "convert/container_sink.hpp"

#include "common/error.hpp"
#include "container/writer.hpp"

namespace cmf::convert {

ContainerSink::ContainerSink(Runtime &rt, std::string path, uint64_t shard_max_bytes)
    : rt_(rt), path_(std::move(path)), shard_max_bytes_(shard_max_bytes) {}

ContainerSink::~ContainerSink() = default;

void ContainerSink::begin(const std::string &header_json, uint64_t, uint64_t planned_tensor_count) {
    writer_ = std::make_unique<container::Writer>(rt_, path_, header_json, shard_max_bytes_, std::nullopt);
    payloads_.reserve(planned_tensor_count);
}

void ContainerSink::add(const std::string &name, int32_t dtype, const std::vector<uint64_t> &shape, const uint8_t *data,
                        uint64_t nbytes) {
    if (!writer_) throw Error(CMF_ERR_INTERNAL, "ContainerSink::add before begin");
    if (shape.size() > CMF_MAX_DIMS)
        throw Error(CMF_ERR_INVALID_ARGUMENT, "tensor \"" + name + "\": more than 6 dimensions");
    payloads_.emplace_back(data, data + nbytes);
    writer_->add_tensor(name, dtype, static_cast<uint32_t>(shape.size()), shape.data(), payloads_.back().data(), nbytes);
}

void ContainerSink::finish(const std::string &vocab_bytes) {
    if (!writer_) throw Error(CMF_ERR_INTERNAL, "ContainerSink::finish before begin");
    if (!vocab_bytes.empty()) writer_->set_vocab(vocab_bytes.data(), vocab_bytes.size());
    writer_->finish();
    writer_.reset();
    payloads_.clear();
}

void ContainerSink::abort() noexcept {
    // An unfinished Writer has written nothing at `path` (it writes a temp
    // file and renames only inside finish, removing the temp on failure).
    writer_.reset();
    payloads_.clear();
}

}  // namespace cmf::convert
