// The SIMT emulation layer turns each kind of GPU bug into a report. Every test plants one
// bug in a test kernel (kernels/simt/test_kernels.cu, selected by a Bug argument) and checks
// that the layer, or the sanitizer of the preset it runs under, reports it by name:
//   1. out-of-bounds global / shared access   ASan (asan preset), death test naming the kernel
//   2. missing __syncthreads (racecheck)      TSan (tsan preset), death test naming the kernel;
//                                             in the fiber flavour it shows as NaN results
//   3. barrier not every thread reaches       launch error naming kernel, block and threads
//   4. shuffle / vote mask naming an absent lane  launch error naming the lane
//   5. read of memory never written           NaN in the results (allocations start as sNaN)
//   6. plain read-modify-write of one global word by every block
//                                             TSan (tsan preset), death test naming the kernel
// Tests of 1, 2 and 6 skip outside their sanitizer.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/dtype.h"
#include "kernels/simt/runtime.h"
#include "kernels/simt/test_kernels.h"

namespace kvp::simt::test {
namespace {

using ::testing::HasSubstr;

std::vector<float> ramp(std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(i % 7) - 3.0f;
  return v;
}

// ---- 1. out-of-bounds access: ASan ----

#if defined(KVP_SIMT_ASAN)
constexpr bool kAsan = true;
#else
constexpr bool kAsan = false;
#endif
#if defined(KVP_SIMT_THREADS)
constexpr bool kThreadFlavour = true;
#else
constexpr bool kThreadFlavour = false;
#endif

TEST(SimtPlantedBugDeathTest, OutOfBoundsGlobalReadIsReportedByAsanNamingTheKernel) {
  if (!kAsan) GTEST_SKIP() << "needs AddressSanitizer (asan preset)";
  const std::vector<float> in = ramp(3 * 64);
  std::vector<float> out;
  EXPECT_DEATH(block_reverse(in, {3}, 64, Bug::kOobGlobalRead, &out),
               "heap-buffer-overflow.*block_reverse_kernel.*fault in kernel block_reverse_kernel, block \\(2,0,0\\), "
               "thread \\(63,0,0\\)");
}

TEST(SimtPlantedBugDeathTest, OutOfBoundsDynamicSharedReadIsReportedByAsanNamingTheKernel) {
  if (!kAsan) GTEST_SKIP() << "needs AddressSanitizer (asan preset)";
  const std::vector<float> in = ramp(2 * 32);
  std::vector<float> out;
  EXPECT_DEATH(block_reverse(in, {2}, 32, Bug::kOobDynamicSharedRead, &out),
               "heap-buffer-overflow.*block_reverse_kernel.*fault in kernel block_reverse_kernel");
}

TEST(SimtPlantedBugDeathTest, OutOfBoundsStaticSharedWriteIsReportedByAsanNamingTheKernel) {
  if (!kAsan) GTEST_SKIP() << "needs AddressSanitizer (asan preset)";
  std::vector<unsigned> in(256);
  for (unsigned i = 0; i < in.size(); ++i) in[i] = i;  // includes values in bin 63
  Histogram out;
  EXPECT_DEATH(histogram(in, {2}, 64, Bug::kOobSharedWrite, &out),
               "heap-buffer-overflow.*histogram_kernel.*fault in kernel histogram_kernel");
}

// ---- 2. missing barrier: TSan (thread flavour); NaN results (fiber flavour) ----

TEST(SimtPlantedBugDeathTest, MissingBarrierIsReportedByTsanAsADataRaceInTheKernel) {
  if (!kThreadFlavour) GTEST_SKIP() << "needs ThreadSanitizer (tsan preset)";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::vector<float> in = ramp(64);
  std::vector<float> out;
  EXPECT_DEATH(block_reduce(in, {1}, {64}, Bug::kMissingBarrier, &out), "data race.*block_reduce_kernel");
}

TEST(SimtPlantedBug, MissingBarrierShowsAsNanInTheFiberFlavour) {
  if (kThreadFlavour) GTEST_SKIP() << "the thread flavour reports it through TSan instead";
  // Fibers run thread 0 up to its next barrier first, so it reads partials not yet written:
  // shared memory starts as the NaN pattern.
  const std::vector<float> in = ramp(128);
  std::vector<float> out;
  const KernelRun run = block_reduce(in, {1}, {64}, Bug::kMissingBarrier, &out);
  ASSERT_TRUE(run.ok) << run.error;
  EXPECT_TRUE(std::isnan(out[0])) << out[0];
  ASSERT_TRUE(block_reduce(in, {1}, {64}, Bug::kNone, &out).ok);
  EXPECT_FALSE(std::isnan(out[0]));
}

// ---- 3. divergent barriers ----

TEST(SimtPlantedBug, BarrierInsideABranchFailsTheLaunchNamingKernelAndBlock) {
  const std::vector<float> in = ramp(3 * 128);
  std::vector<float> out;
  const KernelRun run = block_reduce(in, {3}, {64}, Bug::kBarrierInBranch, &out);
  ASSERT_FALSE(run.ok);
  EXPECT_THAT(run.error, HasSubstr("unspecified launch failure")) << run.error;
  EXPECT_THAT(run.error, HasSubstr("kernel block_reduce_kernel, block (0,0,0): divergent barrier")) << run.error;
  EXPECT_THAT(run.error, HasSubstr("waits at __syncthreads (test_kernels.cu:")) << run.error;
}

TEST(SimtPlantedBug, ThreadReturningBeforeABarrierFailsTheLaunchNamingTheThread) {
  const std::vector<float> in = ramp(2 * 96);
  std::vector<float> out;
  const KernelRun run = block_reduce(in, {2, 1, 1}, {32, 3}, Bug::kEarlyReturn, &out);
  ASSERT_FALSE(run.ok);
  EXPECT_THAT(run.error, HasSubstr("kernel block_reduce_kernel, block (0,0,0): divergent barrier")) << run.error;
  EXPECT_THAT(run.error, HasSubstr("thread (31,2,0) [warp 2 lane 31]")) << run.error;
  EXPECT_THAT(run.error, HasSubstr("exited")) << run.error;
}

TEST(SimtPlantedBug, NextLaunchAfterAFailedOneSucceeds) {
  const std::vector<float> in = ramp(128);
  std::vector<float> out;
  ASSERT_FALSE(block_reduce(in, {1}, {64}, Bug::kEarlyReturn, &out).ok);
  const KernelRun run = block_reduce(in, {1}, {64}, Bug::kNone, &out);
  EXPECT_TRUE(run.ok) << run.error;
}

// ---- 4. shuffle and vote masks ----

TEST(SimtPlantedBug, ShuffleWhoseMaskNamesALaneThatSkippedItFailsNamingTheLane) {
  const std::vector<float> in = ramp(2 * 64);
  WarpResults out;
  const KernelRun run = warp_reduce(in, {2}, {64}, Bug::kShuffleSkipped, &out);
  ASSERT_FALSE(run.ok);
  EXPECT_THAT(run.error, HasSubstr("kernel warp_reduce_kernel, block (0,0,0): __shfl_xor_sync mask 0xffffffff "
                                   "names lane 3, which does not take part"))
      << run.error;
  EXPECT_THAT(run.error, HasSubstr("thread (3,0,0) [warp 0 lane 3] waits at __ballot_sync")) << run.error;
}

TEST(SimtPlantedBug, FullMaskVoteInAPartialWarpFailsNamingTheMissingLanes) {
  const std::vector<float> in = ramp(48);
  WarpResults out;
  const KernelRun run = warp_reduce(in, {1}, {48}, Bug::kVoteMaskBeyondWarp, &out);
  ASSERT_FALSE(run.ok);
  EXPECT_THAT(run.error, HasSubstr("kernel warp_reduce_kernel, block (0,0,0): __ballot_sync(test_kernels.cu:"))
      << run.error;
  EXPECT_THAT(run.error, HasSubstr("mask 0xffffffff names lanes beyond the block: warp 1 has only 16 threads"))
      << run.error;
}

// ---- 5. uninitialised reads ----

TEST(SimtPlantedBug, ReadOfDeviceMemoryNeverWrittenShowsAsNan) {
  const std::vector<float> in = ramp(3 * 64);
  std::vector<float> out;
  const KernelRun run = block_reduce(in, {3}, {32}, Bug::kUninitialisedInput, &out);
  ASSERT_TRUE(run.ok) << run.error;
  EXPECT_FALSE(std::isnan(out[0]));
  EXPECT_FALSE(std::isnan(out[1]));
  EXPECT_TRUE(std::isnan(out[2])) << "the block that reads the element never copied";
}

TEST(SimtRuntime, DeviceAllocationsStartAsSignallingNanForFloatsHalvesAndBfloat16) {
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 64), cudaSuccess);
  std::vector<unsigned char> bytes(64);
  ASSERT_EQ(cudaMemcpy(bytes.data(), p, 64, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaFree(p), cudaSuccess);
  uint32_t word;
  std::memcpy(&word, bytes.data(), 4);
  EXPECT_EQ(word, 0x7FA07FA0u);
  const float f = bits_float(word);
  EXPECT_TRUE(std::isnan(f));
  EXPECT_EQ(word & 0x00400000u, 0u) << "quiet bit clear: a signalling NaN";
  EXPECT_TRUE(std::isnan(f16_to_float(static_cast<uint16_t>(word))));
  EXPECT_TRUE(std::isnan(bf16_to_float(static_cast<uint16_t>(word >> 16))));
}

// ---- 6. races between blocks: TSan (the thread flavour runs up to four blocks at once) ----

TEST(SimtPlantedBugDeathTest, PlainReadModifyWriteOfOneGlobalWordByEveryBlockIsReportedByTsan) {
  if (!kThreadFlavour) GTEST_SKIP() << "needs ThreadSanitizer (tsan preset)";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  // The child exits with TSan's exit code 66 after the report: at once with halt_on_error=1
  // (as CI runs), at std::exit otherwise; without a report it exits with 0.
  EXPECT_EXIT(
      {
        unsigned count = 0;
        grid_count({8}, 32, Bug::kPlainGlobalAdd, &count);
        std::exit(0);
      },
      ::testing::ExitedWithCode(66), "ThreadSanitizer: data race.*grid_count_kernel");
}

TEST(SimtRaceBetweenBlocks, AtomicAddIntoOneGlobalWordFromEveryBlockIsExactAndNotReported) {
  // Under TSan a report here ends the run (CI: halt_on_error=1). 32-thread blocks run four
  // at a time there, 512-thread blocks two at a time.
  unsigned count = 0;
  ASSERT_TRUE(grid_count({64}, 32, Bug::kNone, &count).ok);
  EXPECT_EQ(count, 64u * 32u);
  ASSERT_TRUE(grid_count({5}, 512, Bug::kNone, &count).ok);
  EXPECT_EQ(count, 5u * 512u);
}

// ---- the launch itself ----

TEST(SimtRuntime, ResultsDoNotDependOnTheNumberOfHostThreads) {
  const std::vector<float> in = ramp(7 * 100 + 5);
  std::vector<float> one, four;
  set_host_threads(1);
  ASSERT_TRUE(block_reduce(in, {7}, {100}, Bug::kNone, &one).ok);
  set_host_threads(4);
  ASSERT_TRUE(block_reduce(in, {7}, {100}, Bug::kNone, &four).ok);
  set_host_threads(1);
  Histogram h1, h4;
  std::vector<unsigned> values(3000);
  for (unsigned i = 0; i < values.size(); ++i) values[i] = i * 2654435761u;
  ASSERT_TRUE(histogram(values, {5}, 64, Bug::kNone, &h1).ok);
  set_host_threads(4);
  ASSERT_TRUE(histogram(values, {5}, 64, Bug::kNone, &h4).ok);
  set_host_threads(0);  // back to the default
  EXPECT_EQ(one, four);
  EXPECT_EQ(h1.bins, h4.bins);
}

// The fiber flavour keeps its host threads across launches (runtime.cc, BlockPool): launches
// from several host threads at once, and a launch in a forked child of a process whose pool
// has threads, each give the single-threaded result and return.
TEST(SimtRuntime, LaunchesFromManyHostThreadsAndFromAForkedChildGiveTheSameResult) {
  // The thread flavour's slot pools (threads.cc) serve one launch at a time and are not
  // rebuilt in a forked child; nothing launches that way under TSan.
  if (kThreadFlavour) GTEST_SKIP() << "the fiber flavour's pool only";
  const std::vector<float> in = ramp(9 * 100 + 3);
  std::vector<float> want;
  set_host_threads(1);
  ASSERT_TRUE(block_reduce(in, {9}, {100}, Bug::kNone, &want).ok);
  set_host_threads(3);
  std::vector<std::vector<float>> got(4);
  std::vector<char> ok(got.size(), 0);
  {
    std::vector<std::thread> launchers;
    for (std::size_t i = 0; i < got.size(); ++i)
      launchers.emplace_back([&, i] {
        for (int r = 0; r < 20; ++r) ok[i] = block_reduce(in, {9}, {100}, Bug::kNone, &got[i]).ok;
      });
    for (auto& t : launchers) t.join();
  }
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(ok[i]) << "launcher " << i;
    EXPECT_EQ(got[i], want) << "launcher " << i;
  }
  // The pool has threads now; the child has none of them.
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    alarm(30);  // a hang ends the child by SIGALRM: reported below, not a stuck test
    std::vector<float> mine;
    const bool child_ok = block_reduce(in, {9}, {100}, Bug::kNone, &mine).ok && mine == want;
    _exit(child_ok ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  set_host_threads(0);
  ASSERT_TRUE(WIFEXITED(status)) << "the forked child did not exit (status " << status << ")";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the forked child's launch gave a different result";
}

TEST(SimtRuntime, OversizedBlockIsAnInvalidConfigurationNamingTheKernel) {
  const std::vector<float> in = ramp(2000);
  std::vector<float> out;
  const KernelRun run = block_reduce(in, {1}, {1025}, Bug::kNone, &out);
  ASSERT_FALSE(run.ok);
  EXPECT_THAT(run.error, HasSubstr("kernel block_reduce_kernel: invalid launch configuration")) << run.error;
}

TEST(SimtRuntime, EventsMeasureElapsedTimeAndStreamsSynchronize) {
  cudaStream_t stream;
  cudaEvent_t start, end;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&start), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&end), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(start, stream), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(end, stream), cudaSuccess);
  ASSERT_EQ(cudaEventSynchronize(end), cudaSuccess);
  float ms = -1;
  ASSERT_EQ(cudaEventElapsedTime(&ms, start, end), cudaSuccess);
  EXPECT_GE(ms, 0.0f);
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(cudaEventDestroy(start), cudaSuccess);
  EXPECT_EQ(cudaEventDestroy(end), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

// cp.async (__pipeline_memcpy_async): a double-buffered sum gives the exact sums, and each
// misuse shows: a stage read before its wait reads NaN, a copy never waited for and a
// misaligned copy fail the launch naming the thread or the copy.
std::vector<float> expected_pipelined_sums(const std::vector<float>& in) {
  std::vector<float> sums(32, 0.0f);
  for (std::size_t i = 0; i < in.size() / 128; ++i)
    for (std::size_t t = 0; t < 32; ++t) sums[t] += in[i * 128 + (4 * t + 5) % 128];
  return sums;
}

TEST(SimtAsyncCopy, DoubleBufferedCopiesGiveTheExactSums) {
  const std::vector<float> in = ramp(5 * 128);
  std::vector<float> out;
  const KernelRun run = pipelined_sum(in, Bug::kNone, &out);
  ASSERT_TRUE(run.ok) << run.error;
  EXPECT_EQ(out, expected_pipelined_sums(in));
}

TEST(SimtAsyncCopy, AStageReadBeforeItsWaitReadsNan) {
  std::vector<float> out;
  const KernelRun run = pipelined_sum(ramp(5 * 128), Bug::kReadBeforeAsyncWait, &out);
  ASSERT_TRUE(run.ok) << run.error;
  ASSERT_EQ(out.size(), 32u);
  for (const float x : out) EXPECT_TRUE(std::isnan(x));
}

TEST(SimtAsyncCopy, ACopyNeverWaitedForFailsTheLaunchNamingTheThread) {
  std::vector<float> out;
  const KernelRun run = pipelined_sum(ramp(3 * 128), Bug::kAsyncCopyNeverWaited, &out);
  ASSERT_FALSE(run.ok);
  EXPECT_THAT(run.error, HasSubstr("kernel pipelined_sum_kernel, block (0,0,0)"));
  EXPECT_THAT(run.error, HasSubstr("exited with 1 cp.async copies (__pipeline_memcpy_async) never waited for"));
}

TEST(SimtAsyncCopy, AMisalignedCopyFailsTheLaunchNamingTheCopy) {
  std::vector<float> out;
  const KernelRun run = pipelined_sum(ramp(2 * 128), Bug::kMisalignedAsyncCopy, &out);
  ASSERT_FALSE(run.ok);
  EXPECT_THAT(run.error, HasSubstr("__pipeline_memcpy_async of 16 bytes"));
  EXPECT_THAT(run.error, HasSubstr("aligned to it"));
}

// Stream capture and graphs (runtime.h): a replay runs what the capture recorded, on the
// buffers' contents at replay time and with the kernel parameters of capture time.
TEST(SimtGraphs, ReplayRunsTheCapturedKernelAndCopyOnEachNewInputWithTheCapturedParameters) {
  const std::vector<std::vector<float>> inputs = {ramp(300), std::vector<float>(300, -1.5f), ramp(300)};
  std::vector<std::vector<float>> out;
  const KernelRun run = graph_replay(inputs, 2.0f, Bug::kNone, &out);
  ASSERT_TRUE(run.ok) << run.error;
  ASSERT_EQ(out.size(), inputs.size());
  for (std::size_t r = 0; r < inputs.size(); ++r) {
    ASSERT_EQ(out[r].size(), inputs[r].size());
    for (std::size_t i = 0; i < inputs[r].size(); ++i)
      ASSERT_EQ(out[r][i], 2.0f * inputs[r][i]) << "replay " << r << ", element " << i;
  }
}

TEST(SimtGraphs, ALaunchOnTheLegacyStreamDuringACaptureInvalidatesItNamingTheKernel) {
  std::vector<std::vector<float>> out;
  const KernelRun run = graph_replay({ramp(64)}, 2.0f, Bug::kLegacyStreamInCapture, &out);
  ASSERT_FALSE(run.ok);
  EXPECT_THAT(run.error, HasSubstr("invalidated by launch of kernel scale_kernel on the legacy stream"));
}

TEST(SimtGraphs, ASynchronousCopyDuringACaptureInvalidatesItNamingTheCall) {
  std::vector<std::vector<float>> out;
  const KernelRun run = graph_replay({ramp(64)}, 2.0f, Bug::kSyncCopyInCapture, &out);
  ASSERT_FALSE(run.ok);
  EXPECT_THAT(run.error, HasSubstr("invalidated by cudaMemcpy"));
}

// A capture in thread-local mode ignores other threads' unsafe calls, but work on the legacy
// stream from any thread still conflicts with a capture of a blocking stream (the legacy
// stream synchronises with every blocking stream): a backend capturing while another thread
// uploads must capture on a non-blocking stream (kernels/cuda/model_kernels.cu).
TEST(SimtGraphs, AnotherThreadsLegacyStreamCopyInvalidatesACaptureOfABlockingStreamOnly) {
  for (const bool non_blocking : {true, false}) {
    SCOPED_TRACE(non_blocking ? "non-blocking stream" : "blocking stream");
    cudaStream_t stream = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, non_blocking ? cudaStreamNonBlocking : cudaStreamDefault),
              cudaSuccess);
    void* a = nullptr;
    void* b = nullptr;
    ASSERT_EQ(cudaMalloc(&a, 64), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&b, 64), cudaSuccess);
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    ASSERT_EQ(cudaMemsetAsync(a, 0, 64, stream), cudaSuccess);
    cudaError_t other = cudaSuccess;
    std::thread([&] {
      const std::vector<char> host(64, 1);
      other = cudaMemcpy(b, host.data(), 64, cudaMemcpyHostToDevice);
    }).join();
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
    if (non_blocking) {
      EXPECT_EQ(other, cudaSuccess);
      EXPECT_EQ(ended, cudaSuccess);
    } else {
      EXPECT_EQ(other, cudaErrorStreamCaptureImplicit);
      EXPECT_EQ(ended, cudaErrorStreamCaptureInvalidated);
      EXPECT_THAT(last_error_message(), HasSubstr("invalidated by cudaMemcpy"));
      EXPECT_EQ(cudaGetLastError(), cudaErrorStreamCaptureInvalidated);  // read: the next test starts clean
    }
    EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
    EXPECT_EQ(cudaFree(a), cudaSuccess);
    EXPECT_EQ(cudaFree(b), cudaSuccess);
    EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
  }
}

}  // namespace
}  // namespace kvp::simt::test
