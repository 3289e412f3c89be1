# Tests of the scheduler, engine loop and workloads (model-free backend), and the
# differential tests of the engine against the reference (label differential).
kvproof_add_test(engine_test LABEL unit SOURCES engine_test.cc LIBS kvp_engine)
target_include_directories(engine_test PRIVATE ${PROJECT_SOURCE_DIR})
if(TARGET kvp_verify)
  kvproof_add_test(differential_test LABEL differential SOURCES differential_test.cc LIBS kvp_verify)
  target_include_directories(differential_test PRIVATE ${PROJECT_SOURCE_DIR})
endif()
