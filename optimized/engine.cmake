# The serving engine: scheduler, engine loop, metrics, workloads. Never includes reference/
# math; it runs whatever Backend it is given.
add_library(kvp_engine STATIC scheduler.cc engine.cc metrics.cc workload.cc)
target_link_libraries(kvp_engine PUBLIC kvp_optimized kvp_common nlohmann_json::nlohmann_json)
kvproof_warnings(kvp_engine)
