# SIMT emulation layer (issue 8): included from tests/CMakeLists.txt.
# simt_test: the test kernels emulated on the CPU, and every planted bug caught (label kernel).
kvproof_add_test(simt_test LABEL kernel
  SOURCES simt_test.cc simt_kernels_test.cc
  LIBS kvp_simt_test_kernels)
# simt_gpu_test: the same kernels built by nvcc, on a GPU (label gpu; skips without a device).
if(TARGET kvp_simt_test_kernels_cuda)
  kvproof_add_test(simt_gpu_test LABEL gpu
    SOURCES simt_kernels_test.cc
    LIBS kvp_simt_test_kernels_cuda)
  target_compile_definitions(simt_gpu_test PRIVATE KVP_SIMT_GPU_TEST=1)
endif()
