// kvproof simulate's speed: token-steps (one token computed in one step) simulated per
// second of wall time, for the engine's scheduler and KV-cache manager on the cost-model
// backend. BM_SimulateChat: a synthetic chat shape; BM_SimulateAzureHour: the whole Azure
// conversation trace (Llama-3-8B on one H200), when ../shared/traces is present.
#include <filesystem>

#include <benchmark/benchmark.h>

#include "simulate/simulate.h"
#include "simulate/traffic.h"

#ifndef KVPROOF_SHARED_TRACES_DIR
#define KVPROOF_SHARED_TRACES_DIR "../shared/traces"
#endif

namespace {

void run(benchmark::State& state, const kvp::sim::SimOptions& o, const kvp::Traffic& t) {
  int64_t token_steps = 0;
  for (auto _ : state) {
    auto r = kvp::sim::simulate(o, t);
    if (!r) {
      state.SkipWithError(r.status().message().c_str());
      return;
    }
    token_steps += r->token_steps;
    benchmark::DoNotOptimize(r->finished);
  }
  state.counters["token_steps/s"] = benchmark::Counter(static_cast<double>(token_steps), benchmark::Counter::kIsRate);
}

void BM_SimulateChat(benchmark::State& state) {
  kvp::sim::SimOptions o;
  o.block_size = static_cast<int32_t>(state.range(0));
  const kvp::Traffic t = kvp::generate_traffic(*kvp::builtin_traffic("chat", 8, 1000, 0, 1));
  run(state, o, t);
}
BENCHMARK(BM_SimulateChat)->Arg(16)->Arg(128)->Unit(benchmark::kMillisecond);

void BM_SimulateAzureHour(benchmark::State& state) {
  const auto path = std::filesystem::path(KVPROOF_SHARED_TRACES_DIR) / "azure_llm_2023_conv.csv";
  auto t = kvp::load_traffic(path);
  if (!t) {
    state.SkipWithError(("the Azure trace is absent: " + path.string()).c_str());
    return;
  }
  run(state, kvp::sim::SimOptions{}, *t);
}
BENCHMARK(BM_SimulateAzureHour)->Unit(benchmark::kSecond)->Iterations(1);

}  // namespace

BENCHMARK_MAIN();
