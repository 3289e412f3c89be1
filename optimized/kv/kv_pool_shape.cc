#include "optimized/kv/kv_pool_shape.h"

namespace kvp {

Status KvPoolShape::validate() const {
  if (num_layers < 0) return Status::error("num_layers must be >= 0");
  if (num_kv_heads < 0) return Status::error("num_kv_heads must be >= 0");
  if (head_dim < 0) return Status::error("head_dim must be >= 0");
  if (block_size <= 0) return Status::error("block_size must be > 0");
  if (num_device_blocks < 0) return Status::error("num_device_blocks must be >= 0");
  if (num_host_blocks < 0) return Status::error("num_host_blocks must be >= 0");
  return Status::ok();
}

Status KvPoolShape::validate_for_backend() const {
  KVP_RETURN_IF_ERROR(validate());
  if (num_layers <= 0) return Status::error("num_layers must be > 0");
  if (num_kv_heads <= 0) return Status::error("num_kv_heads must be > 0");
  if (head_dim <= 0) return Status::error("head_dim must be > 0");
  if (num_device_blocks <= 0) return Status::error("num_device_blocks must be > 0");
  return Status::ok();
}

std::string KvPoolShape::to_string() const {
  return "layers " + std::to_string(num_layers) + ", kv heads " + std::to_string(num_kv_heads) + ", head dim " +
         std::to_string(head_dim) + ", block size " + std::to_string(block_size) + ", device blocks " +
         std::to_string(num_device_blocks) + ", host blocks " + std::to_string(num_host_blocks) + ", " +
         std::string(dtype_name(kv_dtype));
}

}  // namespace kvp
