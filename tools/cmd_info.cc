#include <cstdio>

#include <nlohmann/json.hpp>

#include "optimized/backends/backend_factory.h"
#include "tools/commands.h"
#include "tools/model_source.h"

namespace kvp::tools {

void add_info_command(CLI::App& app, int& exit_code) {
  struct Options {
    ModelSource source;
    bool json = false;
  };
  auto opt = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "info", "Show a model's parameters, tensor shapes and KV bytes per token, and which backends run here");
  opt->source.add_options(*cmd);
  cmd->add_flag("--json", opt->json, "print JSON");
  cmd->callback([opt, &exit_code] {
    auto model = opt->source.load();
    if (!model) {
      std::fprintf(stderr, "kvproof info: %s\n", model.status().message().c_str());
      exit_code = kExitBadInput;
      return;
    }
    const ModelConfig& c = model->config;
    nlohmann::json j;
    j["source"] = opt->source.describe();
    j["config"] = c.to_json();
    j["parameters"] = c.num_parameters();
    j["kv_bytes_per_token"] = {{"f32", c.kv_bytes_per_token(DType::kF32)},
                               {"f16", c.kv_bytes_per_token(DType::kF16)},
                               {"bf16", c.kv_bytes_per_token(DType::kBF16)},
                               {"fp8", c.kv_bytes_per_token(DType::kF8E4M3)}};
    nlohmann::json tensors = nlohmann::json::array();
    for (const auto& t : named_tensors(model->config, model->weights))
      tensors.push_back({{"name", t.name}, {"shape", t.shape}});
    j["tensors"] = tensors;
    // cpu and cuda-emu run anywhere; cuda needs this kvproof built with CUDA and a device.
    j["backends"] = nlohmann::json::object();
    for (const BackendKind b : kBackendKinds) {
      const Status runs = backend_runs_here(b);
      j["backends"][backend_name(b)] = runs ? std::string("runs here") : runs.message();
    }
    if (opt->json) {
      std::printf("%s\n", j.dump(2).c_str());
      return;
    }
    std::printf("model: %s\n", opt->source.describe().c_str());
    std::printf("  architecture        %s\n", architecture_class_name(c.architecture));
    std::printf("  parameters          %lld\n", static_cast<long long>(c.num_parameters()));
    std::printf("  vocab               %lld\n", static_cast<long long>(c.vocab_size));
    std::printf("  hidden / inter      %lld / %lld\n", static_cast<long long>(c.hidden_size),
                static_cast<long long>(c.intermediate_size));
    std::printf("  layers              %lld\n", static_cast<long long>(c.num_layers));
    std::printf("  heads / kv heads    %lld / %lld (group %lld)\n", static_cast<long long>(c.num_heads),
                static_cast<long long>(c.num_kv_heads), static_cast<long long>(c.group_size()));
    std::printf("  head_dim            %lld\n", static_cast<long long>(c.head_dim));
    std::printf("  rope_theta / eps    %g / %g\n", c.rope_theta, c.rms_norm_eps);
    std::printf("  rope_scaling        %s\n", j["config"]["rope_scaling"].dump().c_str());
    std::printf("  biases              q/k/v %s, o %s, mlp %s\n", c.qkv_bias ? "yes" : "no", c.o_bias ? "yes" : "no",
                c.mlp_bias ? "yes" : "no");
    std::printf("  max positions       %lld\n", static_cast<long long>(c.max_position_embeddings));
    if (c.sliding_window > 0 && c.sliding_layers.empty()) {
      std::printf("  sliding window      %lld positions, every layer\n", static_cast<long long>(c.sliding_window));
    } else if (c.sliding_window > 0) {
      std::string layers;
      for (int64_t l = 0; l < c.num_layers; ++l)
        if (c.layer_window(l) > 0) layers += (layers.empty() ? "" : ", ") + std::to_string(l);
      std::printf("  sliding window      %lld positions, layers %s of %lld (the others attend to everything)\n",
                  static_cast<long long>(c.sliding_window), layers.c_str(), static_cast<long long>(c.num_layers));
    } else {
      std::printf("  sliding window      none\n");
    }
    if (c.gemma()) {
      const auto cap = [](double v) { return v > 0 ? std::to_string(v) : std::string("none"); };
      std::printf(
          "  gemma               embed x %g, scores x %g (query_pre_attn_scalar %g), caps attn %s / final %s%s\n",
          static_cast<double>(c.embed_scale()), static_cast<double>(c.attention_scale()), c.query_pre_attn_scalar,
          cap(c.attn_logit_softcapping).c_str(), cap(c.final_logit_softcapping).c_str(),
          c.qk_norm() ? ", q/k norms" : "");
      if (c.rope_local_base_freq > 0)
        std::printf("  local rope_theta    %g (sliding layers)\n", c.rope_local_base_freq);
    }
    std::string eos;
    for (int32_t id : c.eos_token_ids) eos += (eos.empty() ? "" : ", ") + std::to_string(id);
    std::printf("  stop tokens (eos)   %s\n", eos.empty() ? "none" : eos.c_str());
    std::printf("  lm_head             %s\n", c.tie_word_embeddings ? "tied to embed_tokens" : "separate");
    std::printf("  KV bytes per token  f32 %lld, f16 %lld, bf16 %lld, fp8 %lld\n",
                static_cast<long long>(c.kv_bytes_per_token(DType::kF32)),
                static_cast<long long>(c.kv_bytes_per_token(DType::kF16)),
                static_cast<long long>(c.kv_bytes_per_token(DType::kBF16)),
                static_cast<long long>(c.kv_bytes_per_token(DType::kF8E4M3)));
    std::printf("backends:\n");
    for (const BackendKind b : kBackendKinds)
      std::printf("  %-9s %s\n", backend_name(b), j["backends"][backend_name(b)].get<std::string>().c_str());
    std::printf("tensors:\n");
    for (const auto& t : tensors)
      std::printf("  %-48s %s\n", t["name"].get<std::string>().c_str(), t["shape"].dump().c_str());
  });
}

}  // namespace kvp::tools
