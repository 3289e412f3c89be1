#include "optimized/backends/plan_validation.h"

#include <string>

#include "common/text.h"
#include "kernels/cpu_attention.h"
#include "kernels/kv_index.h"

namespace kvp {

namespace {

// `where` makes the message's prefix only when the check fails: validation runs on every
// plan, and building strings on the success path would cost more than the checks.
template <typename Where>
Status check_block(int64_t id, int64_t num_blocks, const char* pool, const Where& where) {
  if (id < 0 || id >= num_blocks)
    return Status::error(std::string(where()) + ": block " + str(id) + " is outside the " + pool + " pool [0, " +
                         str(num_blocks) + ")");
  return Status::ok();
}

auto fixed(const char* text) {
  return [text] { return text; };
}

Status validate_ops(const KvPlanOps& ops, const KvPoolShape& pool) {
  const int64_t dev = pool.num_device_blocks, host = pool.num_host_blocks;
  for (const BlockCopy& s : ops.swap_out) {
    KVP_RETURN_IF_ERROR(check_block(s.src, dev, "device", fixed("plan: swap_out source")));
    KVP_RETURN_IF_ERROR(check_block(s.dst, host, "host", fixed("plan: swap_out destination")));
  }
  for (const BlockCopy& s : ops.block_copies) {
    KVP_RETURN_IF_ERROR(check_block(s.src, dev, "device", fixed("plan: block copy source")));
    KVP_RETURN_IF_ERROR(check_block(s.dst, dev, "device", fixed("plan: block copy destination")));
  }
  for (int32_t b : ops.poison) KVP_RETURN_IF_ERROR(check_block(b, dev, "device", fixed("plan: poison")));
  for (const BlockCopy& s : ops.swap_in) {
    KVP_RETURN_IF_ERROR(check_block(s.src, host, "host", fixed("plan: swap_in source")));
    KVP_RETURN_IF_ERROR(check_block(s.dst, dev, "device", fixed("plan: swap_in destination")));
  }
  return Status::ok();
}

}  // namespace

KvPoolShape pool_shape_for(const ModelConfig& model, int32_t block_size, int32_t num_device_blocks,
                           int32_t num_host_blocks, DType kv_dtype) {
  KvPoolShape p;
  p.num_layers = static_cast<int32_t>(model.num_layers);
  p.num_kv_heads = static_cast<int32_t>(model.num_kv_heads);
  p.head_dim = static_cast<int32_t>(model.head_dim);
  p.block_size = block_size;
  p.num_device_blocks = num_device_blocks;
  p.num_host_blocks = num_host_blocks;
  p.kv_dtype = kv_dtype;
  return p;
}

Status check_pool_matches_model(const KvPoolShape& pool, const ModelConfig& model) {
  auto differs = [](const char* what, int64_t pool_v, int64_t model_v) {
    return Status::error(std::string("pool ") + what + " " + str(pool_v) + " is not the model's " + str(model_v));
  };
  if (pool.num_layers != model.num_layers) return differs("num_layers", pool.num_layers, model.num_layers);
  if (pool.num_kv_heads != model.num_kv_heads) return differs("num_kv_heads", pool.num_kv_heads, model.num_kv_heads);
  if (pool.head_dim != model.head_dim) return differs("head_dim", pool.head_dim, model.head_dim);
  return Status::ok();
}

Status validate_plan(const BatchPlan& plan, const KvPoolShape& pool, const PlanLimits& limits) {
  // The pool's fp8 scales travel with its shape; a pool whose scales went missing or bad (a
  // scale that never reaches the kernel reads every fp8 code unscaled) runs nothing.
  if (Status sc = pool.validate_scales(); !sc) return sc.with_context("plan's pool");
  const int64_t num_seqs = plan.num_seqs();
  const int64_t num_tokens = plan.num_tokens();
  const auto n_seqs = static_cast<std::size_t>(num_seqs);
  const auto n_tokens = static_cast<std::size_t>(num_tokens);
  const int64_t bs = pool.block_size;

  const bool no_query_start = num_seqs == 0 && plan.query_start.empty();
  if (!no_query_start && plan.query_start.size() != n_seqs + 1)
    return Status::error("plan: query_start has " + str(static_cast<int64_t>(plan.query_start.size())) +
                         " entries, expected num_seqs + 1 = " + str(num_seqs + 1));
  if (plan.context_lens.size() != n_seqs || plan.needs_logits.size() != n_seqs || plan.logits_all.size() != n_seqs)
    return Status::error("plan: context_lens, needs_logits and logits_all must each have num_seqs = " + str(num_seqs) +
                         " entries");
  if (plan.max_blocks_per_seq < 0) return Status::error("plan: max_blocks_per_seq must be >= 0");
  const int64_t groups = limits.num_groups();
  if (plan.num_groups != groups)
    return Status::error("plan: num_groups is " + str(plan.num_groups) + ", the backend's KV cache has " + str(groups) +
                         " group" + (groups == 1 ? "" : "s"));
  const auto n_groups = static_cast<std::size_t>(groups);
  if (plan.block_tables.size() != n_groups * n_seqs * static_cast<std::size_t>(plan.max_blocks_per_seq))
    return Status::error("plan: block_tables has " + str(static_cast<int64_t>(plan.block_tables.size())) +
                         " entries, expected num_groups * num_seqs * max_blocks_per_seq = " +
                         str(groups * num_seqs * plan.max_blocks_per_seq));
  if (plan.positions.size() != n_tokens)
    return Status::error("plan: positions must have num_tokens = " + str(num_tokens) + " entries");
  if (plan.slot_mapping.size() != n_groups * n_tokens)
    return Status::error("plan: slot_mapping must have num_groups * num_tokens = " + str(groups * num_tokens) +
                         " entries");
  if (no_query_start && num_tokens != 0) return Status::error("plan: tokens without sequences");
  const bool audit = !plan.seq_tenants.empty() || !plan.block_tenants.empty();
  if (audit && (plan.seq_tenants.size() != n_seqs ||
                plan.block_tenants.size() != static_cast<std::size_t>(pool.num_device_blocks)))
    return Status::error("plan: audit arrays must have num_seqs = " + str(num_seqs) +
                         " and num_device_blocks = " + str(pool.num_device_blocks) + " entries, have " +
                         str(static_cast<int64_t>(plan.seq_tenants.size())) + " and " +
                         str(static_cast<int64_t>(plan.block_tenants.size())));

  const int64_t device_slots = pool.num_device_slots();
  for (std::size_t t = 0; t < n_tokens; ++t) {
    if (plan.token_ids[t] < 0 || plan.token_ids[t] >= limits.vocab_size)
      return Status::error("plan: token_ids[" + str(static_cast<int64_t>(t)) + "] = " + str(plan.token_ids[t]) +
                           " is outside the vocabulary [0, " + str(limits.vocab_size) + ")");
  }
  for (std::size_t t = 0; t < n_groups * n_tokens; ++t) {
    const int64_t slot = plan.slot_mapping[t];
    if (slot != kernels::kSkipSlot && (slot < 0 || slot >= device_slots))
      return Status::error("plan: slot_mapping[" + str(static_cast<int64_t>(t)) + "] = " + str(slot) +
                           " is outside the device pool [0, " + str(device_slots) + ")");
  }

  if (!no_query_start) {
    if (plan.query_start[0] != 0) return Status::error("plan: query_start[0] must be 0");
    if (plan.query_start[n_seqs] != num_tokens)
      return Status::error("plan: query_start[num_seqs] = " + str(plan.query_start[n_seqs]) + " but the plan has " +
                           str(num_tokens) + " tokens");
  }
  for (std::size_t i = 0; i < n_seqs; ++i) {
    const auto where = [i] { return "plan: sequence " + str(static_cast<int64_t>(i)); };
    const int64_t start = plan.query_start[i];
    const int64_t end = plan.query_start[i + 1];
    const int64_t context_len = plan.context_lens[i];
    if (end <= start) return Status::error(where() + ": query_start must increase (every sequence has a new token)");
    if (end > num_tokens) return Status::error(where() + ": query_start runs past the tokens");
    if (context_len < end - start)
      return Status::error(where() + ": context_len " + str(context_len) + " is shorter than its " + str(end - start) +
                           " new tokens");
    if (context_len > limits.max_position_embeddings)
      return Status::error(where() + ": context_len " + str(context_len) + " exceeds max_position_embeddings " +
                           str(limits.max_position_embeddings));
    const int64_t blocks = kernels::blocks_for_tokens(context_len, bs);
    if (blocks > plan.max_blocks_per_seq)
      return Status::error(where() + ": context_len " + str(context_len) + " needs " + str(blocks) +
                           " blocks, max_blocks_per_seq is " + str(plan.max_blocks_per_seq));
    for (int64_t g = 0; g < groups; ++g) {
      const int32_t* table = plan.table_row(g, static_cast<int64_t>(i));
      const int64_t window = limits.window_of(g);
      // Entries before the first block any new token attends to are never read: a window may
      // have released them (-1).
      const int64_t first_read = kernels::window_first(context_len - (end - start), window) / bs;
      for (int64_t j = 0; j < blocks; ++j) {
        if (j < first_read && table[j] == -1) continue;
        KVP_RETURN_IF_ERROR(check_block(table[j], pool.num_device_blocks, "device", [&] {
          return where() + (groups > 1 ? ": group " + str(g) : std::string()) + ": block table entry " + str(j) +
                 (window > 0 && table[j] == -1 ? " (released, but a new token attends to it)" : "");
        }));
      }
    }
    // The new tokens are the sequence's last ones, in order.
    for (int64_t t = start; t < end; ++t) {
      const int64_t expected = context_len - (end - t);
      if (plan.positions[static_cast<std::size_t>(t)] != expected)
        return Status::error(where() + ": positions[" + str(t) +
                             "] = " + str(plan.positions[static_cast<std::size_t>(t)]) + ", expected " + str(expected) +
                             " (new tokens are the last of context_len " + str(context_len) + ")");
    }
  }
  return validate_ops(plan.ops, pool);
}

Result<int64_t> check_plan_read_scope(const BatchPlan& plan, const KvPoolShape& pool, int64_t window) {
  PlanLimits limits;
  limits.window = window;
  return check_plan_read_scope(plan, pool, limits);
}

Result<int64_t> check_plan_read_scope(const BatchPlan& plan, const KvPoolShape& pool, const PlanLimits& limits) {
  if (plan.block_tenants.empty() && plan.seq_tenants.empty()) return int64_t{0};
  int64_t reads = 0;
  for (int64_t g = 0; g < plan.num_groups; ++g) {
    for (int64_t i = 0; i < plan.num_seqs(); ++i) {
      const auto ui = static_cast<std::size_t>(i);
      const int64_t nblocks = kernels::blocks_for_tokens(plan.context_lens[ui], pool.block_size);
      const int64_t first_new = plan.context_lens[ui] - (plan.query_start[ui + 1] - plan.query_start[ui]);  // validated
      for (int64_t j = kernels::window_first(first_new, limits.window_of(g)) / pool.block_size; j < nblocks; ++j) {
        const int32_t b = plan.table_row(g, i)[j];
        const int64_t holder = plan.block_tenants[static_cast<std::size_t>(b)];
        if (holder != plan.seq_tenants[ui])
          return Status::error("audit: sequence " + str(plan.seq_ids[ui]) + " of tenant " + str(plan.seq_tenants[ui]) +
                               " would read block " + str(b) + " (block-table index " + str(j) + "), held by " +
                               (holder < 0 ? std::string("no one") : "tenant " + str(holder)));
        ++reads;
      }
    }
  }
  return reads;
}

Result<int64_t> preflight_plan(const BatchPlan& plan, const KvPoolShape& pool, const PlanLimits& limits) {
  KVP_RETURN_IF_ERROR(validate_plan(plan, pool, limits));
  return check_plan_read_scope(plan, pool, limits);
}

std::vector<int32_t> lay_out_logit_rows(const BatchPlan& plan, int64_t vocab_size, StepOutput& out,
                                        std::vector<int32_t>& seq_of_token) {
  out.vocab_size = vocab_size;
  out.logit_row_start.assign(1, 0);
  std::vector<int32_t> logit_tokens;
  seq_of_token.resize(static_cast<std::size_t>(plan.num_tokens()));
  for (int64_t i = 0; i < plan.num_seqs(); ++i) {
    const int32_t start = plan.query_start[static_cast<std::size_t>(i)];
    const int32_t end = plan.query_start[static_cast<std::size_t>(i) + 1];
    for (int32_t t = start; t < end; ++t) seq_of_token[static_cast<std::size_t>(t)] = static_cast<int32_t>(i);
    const int32_t rows = logit_rows_for(plan, i);
    for (int32_t t = end - rows; t < end; ++t) logit_tokens.push_back(t);
    out.logit_row_start.push_back(out.logit_row_start.back() + rows);
  }
  out.logits.assign(logit_tokens.size() * static_cast<std::size_t>(vocab_size), 0.0f);
  return logit_tokens;
}

void apply_final_softcap(const ModelConfig& c, float* logits, int64_t n) {
  if (c.final_logit_softcapping <= 0.0) return;
  const auto cap = static_cast<float>(c.final_logit_softcapping);
  for (int64_t i = 0; i < n; ++i) logits[i] = kernels::soft_cap(logits[i], cap);
}

}  // namespace kvp
