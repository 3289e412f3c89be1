# Runs ctest tests under Valgrind memcheck and FAILS on any defect. (Plain
# `ctest -T memcheck` reports defects but exits 0; ctest_memcheck's DEFECT_COUNT does not.)
#
#   ctest -DBUILD_DIR=build -DLABELS="unit|property" -S sanitizers/memcheck.cmake
cmake_minimum_required(VERSION 3.25)
if(NOT BUILD_DIR)
  set(BUILD_DIR build)
endif()
if(NOT LABELS)
  set(LABELS "unit|property")
endif()
get_filename_component(CTEST_SOURCE_DIRECTORY "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)
get_filename_component(CTEST_BINARY_DIRECTORY "${BUILD_DIR}" ABSOLUTE)
set(CTEST_SITE "local")
set(CTEST_BUILD_NAME "memcheck")
set(CTEST_MEMORYCHECK_TYPE Valgrind)
find_program(CTEST_MEMORYCHECK_COMMAND valgrind REQUIRED)
set(CTEST_MEMORYCHECK_COMMAND_OPTIONS
    "--error-exitcode=1 --leak-check=full --show-leak-kinds=definite,indirect --errors-for-leak-kinds=definite,indirect --track-origins=yes --num-callers=30 --gen-suppressions=all")
set(CTEST_MEMORYCHECK_SUPPRESSIONS_FILE "${CTEST_SOURCE_DIRECTORY}/sanitizers/valgrind.supp")
# Valgrind is ~30x slower: run properties with fewer cases (CI's default build runs 500).
set(ENV{RC_PARAMS} "max_success=50 seed=1 verbose_progress=0")
# ... and simulate_test's --check run over the real trace with its first 5 s only.
set(ENV{KVPROOF_SIM_CHECK_SECONDS} "5")
ctest_start(Experimental)
# The emulated CUDA kernels (the CudaEmu conformance tests) run each CUDA thread on its own
# fiber stack, switched by hand; Valgrind does not follow those switches and reports every
# fiber's stack accesses as invalid. ASan (fiber-annotated) and TSan cover them instead; so
# for CudaWeights (the bf16-weight tests of the CUDA backend, emulated kernels too) and
# CudaGraphs (decode graphs, replayed by the emulated kernels).
# The tests whose point is that the thread count changes no bit (the GEMM over every ISA and
# thread count, the CPU backend's and the oracle's thread sweeps) cost the most there, because
# Valgrind runs a process's threads one at a time: the first three took 110 of memcheck's 760
# test-seconds. Their code runs under memcheck single-threaded in every other test, and
# threaded under ASan and TSan. The oracle's
# 600-position bitwise test runs the same code as its shorter ones, at Valgrind's cost for
# every fused multiply-add (emulated): ASan runs it. So does the safetensors chunking test
# (three dtypes of a 8M-element tensor through the same conversion loops the other
# checkpoint tests run on small tensors), and the KV-event decoder's payload-size and
# array-length limits (16 MiB and 4M-element payloads through the decoder the other KV-event
# tests run on small ones; 25 s under memcheck without --track-origins). And four that took
# 154 of memcheck's 1,033 test-seconds (2026-12-05): the oracle's batched-against-sequential and
# fp32-against-fp64 sweeps (45 and 43 s; the same forward passes run under memcheck in the
# oracle's other tests), and the CPU backend's long-context and block-size conformance (33 s
# each; the same attention and block-table code runs under memcheck in the other conformance
# tests). ASan runs all four.
ctest_memcheck(INCLUDE_LABEL "${LABELS}"
               EXCLUDE "CudaEmu|CudaWeights|CudaGraphs|BatchedAgreesWithSequential|Fp32AgreesWithFp64WithinMeasuredBound|Cpu/BackendConformance[.](LongContextAcrossPartitionsMatchesReference|BlockSizeDoesNotChangeLogitsBitwise)|EveryGemmIsaAndThreadCount|ThreadedAttentionGivesTheSameLogitBits|ThreadCountDoesNotChangeLogitsBitwise|ThreadsDoNotChangeABit|LongContextPrefillEqualsDecodesBitwise|ATensorLargerThanAChunkConvertsEveryElement|PayloadSizeLimitAcceptsItsLimit|ArrayLengthLimitAcceptsItsLimit"
               PARALLEL_LEVEL 2 RETURN_VALUE rv DEFECT_COUNT defects)
message(STATUS "valgrind memcheck over labels '${LABELS}': ${defects} defects, ctest returned ${rv}")
if(NOT rv EQUAL 0 OR defects GREATER 0)
  message(FATAL_ERROR "valgrind memcheck failed: ${defects} defects (details in ${CTEST_BINARY_DIRECTORY}/Testing/Temporary/MemoryChecker.*.log)")
endif()
