# Properties of the serving engine (non-interference, scheduler contract); included from
# properties/CMakeLists.txt.
if(TARGET kvp_engine AND TARGET kvp_cpu_backend)
  kvproof_add_test(engine_property_test LABEL property PROPERTY
    SOURCES engine_property.cc LIBS kvp_engine kvp_cpu_backend kvp_model_io)
  target_include_directories(engine_property_test PRIVATE ${PROJECT_SOURCE_DIR})
  add_test(NAME engine_property_test.slow COMMAND engine_property_test)
  set_tests_properties(engine_property_test.slow PROPERTIES LABELS slow
    ENVIRONMENT "RC_PARAMS=max_success=10000 seed=1 verbose_progress=0" TIMEOUT 3600)
endif()
