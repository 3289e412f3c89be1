# Tests of the paged KV-cache core (issue 3): included from tests/CMakeLists.txt.
kvproof_add_test(kv_core_test LABEL unit
  SOURCES kv_index_test.cc kv_block_allocator_test.cc kv_prefix_cache_test.cc
          kv_cache_manager_test.cc kv_invariants_test.cc kv_event_log_replay_test.cc
  LIBS kvp_optimized)
