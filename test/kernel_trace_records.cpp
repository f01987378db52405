// scripts/kernel_trace.cpp's lines as it writes them, from activity records made here (no GPU needed),
// on stdout: test/test_step_trace.py checks them and reads them with scripts/step_trace.py.
#include "scripts/kernel_trace.cpp"

int main() {
    trace.file = stdout;
    CUpti_ActivityKernel10 kernel{};
    kernel.kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
    kernel.start = 1000, kernel.end = 5000, kernel.streamId = 7;
    kernel.name = "_Z16attention_kernelILi64EEvPKfi";  // void attention_kernel<64>(float const*, int)
    write_record(reinterpret_cast<const CUpti_Activity*>(&kernel));
    kernel.start = 9000, kernel.end = 9500, kernel.streamId = 8;
    kernel.name = "nvjet_sm90_tst_256x128_64x4_2x1_v_bz_coopB_TNT";  // extern "C": as it is
    write_record(reinterpret_cast<const CUpti_Activity*>(&kernel));
    CUpti_ActivityMemcpy6 copy{};
    copy.kind = CUPTI_ACTIVITY_KIND_MEMCPY;
    copy.copyKind = CUPTI_ACTIVITY_MEMCPY_KIND_HTOD, copy.bytes = 4096, copy.start = 5500, copy.end = 6000, copy.streamId = 7;
    write_record(reinterpret_cast<const CUpti_Activity*>(&copy));
    CUpti_ActivityMemset4 fill{};
    fill.kind = CUPTI_ACTIVITY_KIND_MEMSET;
    fill.bytes = 256, fill.start = 6000, fill.end = 6100, fill.streamId = 7;
    write_record(reinterpret_cast<const CUpti_Activity*>(&fill));
    CUpti_ActivityAPI call{};
    call.kind = CUPTI_ACTIVITY_KIND_RUNTIME;
    call.cbid = CUPTI_RUNTIME_TRACE_CBID_cudaStreamSynchronize_v3020, call.start = 6200, call.end = 8900, call.threadId = 42;
    write_record(reinterpret_cast<const CUpti_Activity*>(&call));
    return trace.records == 5 ? 0 : 1;
}
