// Which execution flavour the SIMT emulation layer runs in, chosen from the sanitizer the
// translation unit is built with. Every file of one build agrees, because the sanitizer is
// applied to the whole build (see KVPROOF_SANITIZE in the top-level CMakeLists.txt).
//
//   KVP_SIMT_THREADS  one OS thread per CUDA thread, barriers as real barriers, and up to
//                     four blocks of a launch at once, unordered with each other: the
//                     flavour for ThreadSanitizer, which then reports a missing
//                     __syncthreads as a data race on shared memory, and a global word two
//                     blocks write without an atomic as a data race between blocks.
//   (otherwise)       cooperative fibers (ucontext), one block at a time per host thread:
//                     the flavour for the default and ASan builds, fast and deterministic.
//   KVP_SIMT_ASAN     AddressSanitizer is on: fiber switches are annotated for it.
#pragma once

#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define KVP_SIMT_THREADS 1
#endif
#if __has_feature(address_sanitizer)
#define KVP_SIMT_ASAN 1
#endif
#endif
#if defined(__SANITIZE_THREAD__) && !defined(KVP_SIMT_THREADS)
#define KVP_SIMT_THREADS 1
#endif
#if defined(__SANITIZE_ADDRESS__) && !defined(KVP_SIMT_ASAN)
#define KVP_SIMT_ASAN 1
#endif
