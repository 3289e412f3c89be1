# The CPU paged backend (the engine's model executor); included from optimized/CMakeLists.txt.
# Links the model's data (kvp_model_io) but never the oracle's math (kvp_reference).
add_library(kvp_cpu_backend STATIC cpu_backend.cc)
target_link_libraries(kvp_cpu_backend PUBLIC kvp_common kvp_kernels kvp_model_io Threads::Threads)
kvproof_warnings(kvp_cpu_backend)
