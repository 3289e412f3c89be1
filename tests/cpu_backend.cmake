# Tests of the CPU paged backend; included from tests/CMakeLists.txt. The reference model
# is the oracle here (tests may link it; the backend never does).
kvproof_add_test(cpu_backend_test LABEL unit
  SOURCES cpu_backend_test.cc
  LIBS kvp_cpu_backend kvp_reference Threads::Threads)
