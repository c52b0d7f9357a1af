// SPDX-License-Identifier: Apache-2.0
// Part of depot: the memory layer for host, CUDA and HIP tensor data.
//
// tools/capture-rules.cu: which CUDA calls invalidate a graph capture in global mode, made
// from the capturing thread and from another one (the calls the caching allocator avoids
// while a capture is under way). Build and run on a GPU machine:
//   nvcc -std=c++17 -o capture-rules tools/capture-rules.cu && ./capture-rules
// Output on an H200, CUDA 13, driver 580.159.04: BENCHMARKS.md, "Graph capture".
#include <cuda_runtime.h>
#include <cstdio>
#include <thread>
static const char* nm(cudaError_t e) { return cudaGetErrorName(e); }
template <class F> void one(const char* what, bool other_thread, F f)
{
  cudaStream_t s, side; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking); cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);
  cudaEvent_t e; cudaEventCreateWithFlags(&e, cudaEventDisableTiming); cudaEventRecord(e, side); cudaStreamSynchronize(side);
  void* buf; cudaMalloc(&buf, 1 << 20);
  cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
  cudaMemsetAsync(buf, 1, 1 << 20, s);
  cudaError_t r;
  if (other_thread) { std::thread t([&] { r = f(s, side, e); }); t.join(); } else r = f(s, side, e);
  cudaGraph_t g = nullptr; cudaError_t end = cudaStreamEndCapture(s, &g);
  std::printf("%-44s %-6s call: %-34s end capture: %s\n", what, other_thread ? "other" : "same", nm(r), nm(end));
  (void)cudaGetLastError(); if (g) cudaGraphDestroy(g);
  cudaFree(buf); cudaEventDestroy(e); cudaStreamDestroy(s); cudaStreamDestroy(side); (void)cudaGetLastError();
}
int main()
{
  cudaFree(0);
  for (bool o : {false, true}) {
    one("cudaEventQuery (event recorded before)", o, [](cudaStream_t, cudaStream_t, cudaEvent_t e) { return cudaEventQuery(e); });
    one("cudaEventRecord on another stream", o, [](cudaStream_t, cudaStream_t side, cudaEvent_t e) { return cudaEventRecord(e, side); });
    one("cudaStreamWaitEvent(capturing, outside event)", o, [](cudaStream_t s, cudaStream_t, cudaEvent_t e) { return cudaStreamWaitEvent(s, e, 0); });
    one("cudaMalloc", o, [](cudaStream_t, cudaStream_t, cudaEvent_t) { void* p; auto r = cudaMalloc(&p, 4 << 20); if (!r) cudaFree(p); return r; });
    one("cudaMalloc in relaxed mode", o, [](cudaStream_t, cudaStream_t, cudaEvent_t) { cudaStreamCaptureMode m = cudaStreamCaptureModeRelaxed; cudaThreadExchangeStreamCaptureMode(&m); void* p; auto r = cudaMalloc(&p, 4 << 20); cudaThreadExchangeStreamCaptureMode(&m); return r; });
    one("cudaFree", o, [](cudaStream_t, cudaStream_t, cudaEvent_t) { void* p = nullptr; cudaStreamCaptureMode m = cudaStreamCaptureModeRelaxed; cudaThreadExchangeStreamCaptureMode(&m); cudaMalloc(&p, 4 << 20); cudaThreadExchangeStreamCaptureMode(&m); return cudaFree(p); });
    one("cudaMallocHost in relaxed mode", o, [](cudaStream_t, cudaStream_t, cudaEvent_t) { cudaStreamCaptureMode m = cudaStreamCaptureModeRelaxed; cudaThreadExchangeStreamCaptureMode(&m); void* p; auto r = cudaMallocHost(&p, 4 << 20); cudaThreadExchangeStreamCaptureMode(&m); return r; });
    one("cudaMallocHost", o, [](cudaStream_t, cudaStream_t, cudaEvent_t) { void* p; return cudaMallocHost(&p, 4 << 20); });
    one("cudaDeviceSynchronize", o, [](cudaStream_t, cudaStream_t, cudaEvent_t) { return cudaDeviceSynchronize(); });
    one("cudaEventSynchronize", o, [](cudaStream_t, cudaStream_t, cudaEvent_t e) { return cudaEventSynchronize(e); });
  }
}
