/* Recording the backend stream's work as a CUDA graph and replaying it (ops.h graph_begin ..
 * graph_free). The recording is thread-local, so a checkpoint writer or exporter thread
 * calling CUDA meanwhile neither joins nor breaks it. */
#include "kernels/cuda/cuda_common.cuh"

extern "C" void shlm_cuda_graph_begin(void) {
    CUDA_CHECK(cudaStreamBeginCapture(shlm_cuda_stream(), cudaStreamCaptureModeThreadLocal));
}

extern "C" void *shlm_cuda_graph_end(void) {
    cudaGraph_t graph = NULL;
    cudaError_t e = cudaStreamEndCapture(shlm_cuda_stream(), &graph);
    if (e == cudaErrorStreamCaptureInvalidated || e == cudaErrorStreamCaptureUnsupported) {
        (void)cudaGetLastError(); /* the recording failed; the stream is usable again */
        if (graph) cudaGraphDestroy(graph);
        return NULL;
    }
    CUDA_CHECK(e);
    cudaGraphExec_t exec;
    e = cudaGraphInstantiate(&exec, graph, 0);
    CUDA_CHECK(cudaGraphDestroy(graph));
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return (void *)exec;
}

extern "C" void shlm_cuda_graph_launch(void *graph) {
    CUDA_CHECK(cudaGraphLaunch((cudaGraphExec_t)graph, shlm_cuda_stream()));
}

extern "C" void shlm_cuda_graph_free(void *graph) {
    if (graph) CUDA_CHECK(cudaGraphExecDestroy((cudaGraphExec_t)graph));
}
