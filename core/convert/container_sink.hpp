// The TensorSink that writes a .cmf file through the container's W2
// streaming writer (docs/container.md): header from the pipeline (the writer
// appends section_hashes), each payload written to the file as it arrives
// (nothing is kept: memory stays bounded by the tensors in flight), the
// vocab section; sharded when shard_max_bytes > 0. The file appears only at
// finish() (temp + rename).
#pragma once

#include "convert/convert.hpp"

#include <memory>

namespace cmf::container { class StreamWriter; }

namespace cmf::convert {

class ContainerSink : public TensorSink {
public:
    ContainerSink(Runtime &rt, std::string path, uint64_t shard_max_bytes);
    ~ContainerSink() override;

    void begin(const std::string &header_json, uint64_t source_tensor_count, uint64_t planned_tensor_count) override;
    void add(const std::string &name, int32_t dtype, const std::vector<uint64_t> &shape, const uint8_t *data,
             uint64_t nbytes) override;
    void begin_tensor(const std::string &name, int32_t dtype, const std::vector<uint64_t> &shape, uint64_t nbytes) override;
    void append(const uint8_t *data, uint64_t n) override;
    void end_tensor() override;
    void finish(const std::string &vocab_bytes) override;
    void abort() noexcept override;

private:
    Runtime &rt_;
    std::string path_;
    uint64_t shard_max_bytes_;
    std::unique_ptr<container::StreamWriter> writer_;
};

}  // namespace cmf::convert
