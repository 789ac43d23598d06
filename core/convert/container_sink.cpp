#include "convert/container_sink.hpp"

#include "common/error.hpp"
#include "container/writer.hpp"

#include <algorithm>

namespace cmf::convert {

ContainerSink::ContainerSink(Runtime &rt, std::string path, uint64_t shard_max_bytes)
    : rt_(rt), path_(std::move(path)), shard_max_bytes_(shard_max_bytes) {}

ContainerSink::~ContainerSink() = default;

void ContainerSink::begin(const std::string &header_json, uint64_t source_tensor_count, uint64_t planned_tensor_count) {
    // The gap must hold the directory of every output tensor (a fused
    // source tensor may give several).
    writer_ = std::make_unique<container::StreamWriter>(rt_, path_, header_json,
                                                        std::max(source_tensor_count, planned_tensor_count),
                                                        shard_max_bytes_, std::nullopt);
}

void ContainerSink::add(const std::string &name, int32_t dtype, const std::vector<uint64_t> &shape, const uint8_t *data,
                        uint64_t nbytes) {
    if (!writer_) throw Error(CMF_ERR_INTERNAL, "ContainerSink::add before begin");
    if (shape.size() > CMF_MAX_DIMS)
        throw Error(CMF_ERR_INVALID_ARGUMENT, "tensor \"" + name + "\": more than 6 dimensions");
    writer_->add_tensor(name, dtype, static_cast<uint32_t>(shape.size()), shape.data(), data, nbytes);
}

void ContainerSink::begin_tensor(const std::string &name, int32_t dtype, const std::vector<uint64_t> &shape, uint64_t nbytes) {
    if (!writer_) throw Error(CMF_ERR_INTERNAL, "ContainerSink::begin_tensor before begin");
    if (shape.size() > CMF_MAX_DIMS)
        throw Error(CMF_ERR_INVALID_ARGUMENT, "tensor \"" + name + "\": more than 6 dimensions");
    writer_->begin_tensor(name, dtype, static_cast<uint32_t>(shape.size()), shape.data(), nbytes);
}

void ContainerSink::append(const uint8_t *data, uint64_t n) {
    if (!writer_) throw Error(CMF_ERR_INTERNAL, "ContainerSink::append before begin");
    writer_->append(data, n);
}

void ContainerSink::end_tensor() {
    if (!writer_) throw Error(CMF_ERR_INTERNAL, "ContainerSink::end_tensor before begin");
    writer_->end_tensor();
}

void ContainerSink::finish(const std::string &vocab_bytes) {
    if (!writer_) throw Error(CMF_ERR_INTERNAL, "ContainerSink::finish before begin");
    if (!vocab_bytes.empty()) writer_->set_vocab(vocab_bytes.data(), vocab_bytes.size());
    writer_->finish();
    writer_.reset();
}

void ContainerSink::abort() noexcept {
    // An unfinished writer has written nothing at `path`: its temp files
    // are unlinked when it is destroyed.
    writer_.reset();
}

}  // namespace cmf::convert
