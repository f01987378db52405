// Each kernel's, memcpy's and memset's start and end on the GPU, and the host's CUDA runtime calls,
// recorded by CUPTI's activity API during a real run (not Nsight Compute's replay, one kernel at a
// time), for scripts/step_trace.py. A CUDA injection library: the driver loads it when the program
// starts CUDA, so the program needs no change:
//   CUDA_INJECTION64_PATH=$PWD/scripts/kernel_trace.so KERNEL_TRACE_FILE=trace.tsv ./train_gpt --device cuda ...
// Everything from CUDA's start to the program's exit is recorded; each cudaProfilerStart ...
// cudaProfilerStop pair of the program (train_gpt brackets its last step so) is written as a window,
// which the analysis reads. Recording stays on the whole run, so that kernels of CUDA graphs
// instantiated before a window are traced too.
//
// The file (tab-separated; times in ns on CUPTI's clock), written as FILE.partial and renamed to FILE
// at the program's exit:
//   window  N  START  END            a cudaProfilerStart..cudaProfilerStop pair, N counting from 1
//   kernel  START  END  STREAM  NAME  (demangled)
//   memcpy  START  END  STREAM  memcpy HtoD|DtoH|DtoD|... BYTES B
//   memset  START  END  STREAM  memset BYTES B
//   api     START  END  THREAD  NAME  a CUDA runtime call on the host (cudaStreamSynchronize_v3020, ...)
//   dropped N                       records CUPTI could not keep (its buffers were full)
// Any failure to start says so in one line and ends the program (exit 2): a traced run that
// records nothing must not pass for one that does.
#include <cupti.h>
#include <cxxabi.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <unordered_map>

namespace {

constexpr size_t kBufferBytes = 8 << 20;  // CUPTI fills one, hands it back, asks for the next
constexpr size_t kBufferAlign = 8;        // CUPTI's requirement for activity buffers

struct Trace {
    std::mutex mutex;  // CUPTI's worker thread writes records, the program's threads the windows
    FILE* file = nullptr;
    std::string path, partial_path;
    std::unordered_map<const char*, std::string> demangled;  // CUPTI shares one name per kernel
    bool window_open = false;
    uint64_t window_start = 0;
    int windows = 0;
    size_t records = 0, dropped = 0;
};
Trace trace;

[[noreturn]] void fail(const char* what, const char* why) {
    fflush(stdout);
    fprintf(stderr, "kernel_trace: %s: %s\n", what, why);
    _exit(2);  // not exit(): this may run inside the driver's initialisation, whose atexit handlers would wait on it
}

void check(CUptiResult result, const char* call) {
    if (result == CUPTI_SUCCESS) return;
    const char* why = nullptr;
    cuptiGetResultString(result, &why);
    fail(call, why != nullptr ? why : "unknown CUPTI error");
}
#define CUPTI_CHECK(call) check((call), #call)

const std::string& demangled_name(const char* name) {
    auto found = trace.demangled.find(name);
    if (found != trace.demangled.end()) return found->second;
    int status = 0;
    char* plain = abi::__cxa_demangle(name, nullptr, nullptr, &status);
    std::string& kept = trace.demangled[name];
    kept = status == 0 && plain != nullptr ? plain : name;  // extern "C" kernels (cuBLAS's nvjet_*) are not mangled
    free(plain);
    return kept;
}

const char* copy_kind(uint8_t kind) {
    switch (kind) {
        case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "HtoD";
        case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "DtoH";
        case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "DtoD";
        case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH: return "HtoH";
        case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP: return "PtoP";
        default: return "other";
    }
}

void write_record(const CUpti_Activity* record) {
    using ull = unsigned long long;
    switch (record->kind) {
        case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
            const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
            fprintf(trace.file, "kernel\t%llu\t%llu\t%u\t%s\n", (ull)k->start, (ull)k->end, k->streamId, demangled_name(k->name).c_str());
            break;
        }
        case CUPTI_ACTIVITY_KIND_MEMCPY: {
            const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
            fprintf(trace.file, "memcpy\t%llu\t%llu\t%u\tmemcpy %s %llu B\n", (ull)m->start, (ull)m->end, m->streamId, copy_kind(m->copyKind),
                    (ull)m->bytes);
            break;
        }
        case CUPTI_ACTIVITY_KIND_MEMSET: {
            const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
            fprintf(trace.file, "memset\t%llu\t%llu\t%u\tmemset %llu B\n", (ull)m->start, (ull)m->end, m->streamId, (ull)m->bytes);
            break;
        }
        case CUPTI_ACTIVITY_KIND_RUNTIME: {
            const auto* a = reinterpret_cast<const CUpti_ActivityAPI*>(record);
            const char* name = nullptr;
            if (cuptiGetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API, a->cbid, &name) != CUPTI_SUCCESS || name == nullptr) name = "unknown runtime call";
            fprintf(trace.file, "api\t%llu\t%llu\t%u\t%s\n", (ull)a->start, (ull)a->end, a->threadId, name);
            break;
        }
        default: return;  // only the kinds enabled below arrive
    }
    trace.records++;
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
    *buffer = static_cast<uint8_t*>(aligned_alloc(kBufferAlign, kBufferBytes));
    *size = *buffer != nullptr ? kBufferBytes : 0;  // none: CUPTI drops records, counted at the end
    *max_records = 0;                               // as many as fit
}

void CUPTIAPI buffer_completed(CUcontext context, uint32_t stream_id, uint8_t* buffer, size_t, size_t valid_size) {
    {
        std::lock_guard<std::mutex> lock(trace.mutex);
        CUpti_Activity* record = nullptr;
        while (cuptiActivityGetNextRecord(buffer, valid_size, &record) == CUPTI_SUCCESS) write_record(record);
        size_t dropped = 0;
        if (cuptiActivityGetNumDroppedRecords(context, stream_id, &dropped) == CUPTI_SUCCESS) trace.dropped += dropped;
    }
    free(buffer);
}

// A window opens when cudaProfilerStart (or the driver's cuProfilerStart) returns and closes
// when cudaProfilerStop is entered. The runtime's call makes the driver's inside it: whichever
// comes first opens or closes, the other finds the window already so.
void CUPTIAPI on_profiler_call(void*, CUpti_CallbackDomain domain, CUpti_CallbackId id, const void* data) {
    const auto* call = static_cast<const CUpti_CallbackData*>(data);
    const bool start = domain == CUPTI_CB_DOMAIN_RUNTIME_API ? id == CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStart_v4000
                                                             : id == CUPTI_DRIVER_TRACE_CBID_cuProfilerStart;
    uint64_t now = 0;
    cuptiGetTimestamp(&now);
    std::lock_guard<std::mutex> lock(trace.mutex);
    if (start && call->callbackSite == CUPTI_API_EXIT && !trace.window_open) {
        trace.window_open = true;
        trace.window_start = now;
    } else if (!start && call->callbackSite == CUPTI_API_ENTER && trace.window_open) {
        trace.window_open = false;
        fprintf(trace.file, "window\t%d\t%llu\t%llu\n", ++trace.windows, (unsigned long long)trace.window_start, (unsigned long long)now);
    }
}

void write_file_at_exit() {
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    std::lock_guard<std::mutex> lock(trace.mutex);
    if (trace.window_open) {  // started, never stopped: the window ends with the program
        uint64_t now = 0;
        cuptiGetTimestamp(&now);
        fprintf(trace.file, "window\t%d\t%llu\t%llu\n", ++trace.windows, (unsigned long long)trace.window_start, (unsigned long long)now);
    }
    if (trace.dropped > 0) fprintf(trace.file, "dropped\t%zu\n", trace.dropped);
    const bool written = !ferror(trace.file);
    if (fclose(trace.file) != 0 || !written) {
        fprintf(stderr, "kernel_trace: writing %s failed (disk full?): no trace\n", trace.partial_path.c_str());
        remove(trace.partial_path.c_str());
        return;
    }
    if (rename(trace.partial_path.c_str(), trace.path.c_str()) != 0) {
        fprintf(stderr, "kernel_trace: cannot rename %s to %s\n", trace.partial_path.c_str(), trace.path.c_str());
        return;
    }
    fprintf(stderr, "kernel_trace: %zu records, %d window%s, %zu dropped, in %s\n", trace.records, trace.windows,
            trace.windows == 1 ? "" : "s", trace.dropped, trace.path.c_str());
}

}  // namespace

// The CUDA driver calls this once, at its start, in a library named by CUDA_INJECTION64_PATH.
// Returns 1: started.
extern "C" __attribute__((visibility("default"))) int InitializeInjection() {
    const char* path = getenv("KERNEL_TRACE_FILE");
    if (path == nullptr || *path == '\0') fail("KERNEL_TRACE_FILE is not set", "set it to the file the trace goes to");
    trace.path = path;
    trace.partial_path = trace.path + ".partial";
    CUPTI_CHECK(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed));
    CUpti_SubscriberHandle subscriber;
    CUPTI_CHECK(cuptiSubscribe(&subscriber, on_profiler_call, nullptr));
    CUPTI_CHECK(cuptiEnableCallback(1, subscriber, CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStart_v4000));
    CUPTI_CHECK(cuptiEnableCallback(1, subscriber, CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStop_v4000));
    CUPTI_CHECK(cuptiEnableCallback(1, subscriber, CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuProfilerStart));
    CUPTI_CHECK(cuptiEnableCallback(1, subscriber, CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuProfilerStop));
    // CONCURRENT_KERNEL, not KERNEL: the latter serialises kernels, changing what is measured
    CUPTI_CHECK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
    CUPTI_CHECK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY));
    CUPTI_CHECK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET));
    CUPTI_CHECK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME));
    // opened last, so that a start that fails leaves no file; no record arrives before this returns
    trace.file = fopen(trace.partial_path.c_str(), "w");
    if (trace.file == nullptr) fail(trace.partial_path.c_str(), "cannot be written");
    fprintf(trace.file, "# kernel_trace: kind start_ns end_ns stream|thread name (scripts/kernel_trace.cpp)\n");
    if (atexit(write_file_at_exit) != 0) fail("atexit", "cannot register the write at exit");
    return 1;
}
