// train_gpt's run on the CPU backend, with one rank made to fail on purpose, for
// test/test_watchdog.sh. It takes train_gpt's flags and these:
//   --fault-rank R --fault-during ACTIVITY --fault stall|exit|delay [--fault-seconds S]
//   [--disk-bytes-per-second D]
// Rank R, at its first collective or host exchange while the run is in ACTIVITY (the start of
// the watchdog's activity: "step 3", "the checkpoint", "the evaluations"; common/watchdog.h),
// stops there for good (stall: as a process stopped, or hung in a driver), ends at once
// without a word (exit: as one that crashed), or goes on after S seconds (delay: as one slow at
// its work, a checkpoint's part on a slow disk). D: the slowest disk the checkpoint's allowance
// assumes (train/sharded_checkpoint.h), so that a test can make the allowance a few seconds.
#define TESTING
#include <mpi.h>

#include "train_gpt.cu"
#include "forwarding_comm.h"
#include "zero/comm_mpi.h"

struct Fault {
    int rank = -1;
    std::string during, kind;
    double seconds = 0;
};

class FaultyComm : public ForwardingComm {
public:
    FaultyComm(Communicator& inner, Fault fault) : ForwardingComm(inner), fault_(std::move(fault)) {}
    double all_reduce_host(double x) override {
        fault_point();
        return ForwardingComm::all_reduce_host(x);
    }
    void wait(Ticket ticket) override {
        fault_point();
        ForwardingComm::wait(ticket);
    }
    void barrier(double allowance) override {
        fault_point();
        ForwardingComm::barrier(allowance);
    }
    void gather_host(const void* send, void* recv, size_t bytes, int root) override {
        fault_point();
        ForwardingComm::gather_host(send, recv, bytes, root);
    }
    std::unique_ptr<Communicator> split(int first, int count, int stride) override {
        return owning<FaultyComm>(inner_.split(first, count, stride), fault_);
    }

protected:
    Ticket start_all_reduce(void* buf, size_t n, DType t) override {
        fault_point();
        return ForwardingComm::start_all_reduce(buf, n, t);
    }
    Ticket start_reduce_scatter(const void* send, void* recv, size_t n, DType t) override {
        fault_point();
        return ForwardingComm::start_reduce_scatter(send, recv, n, t);
    }
    Ticket start_all_gather(const void* send, void* recv, size_t n, DType t) override {
        fault_point();
        return ForwardingComm::start_all_gather(send, recv, n, t);
    }
    Ticket start_all_to_all(const void* send, void* recv, size_t n, DType t) override {
        fault_point();
        return ForwardingComm::start_all_to_all(send, recv, n, t);
    }
    void do_broadcast_host(void* buf, size_t bytes, int root) override {
        fault_point();
        ForwardingComm::do_broadcast_host(buf, bytes, root);
    }

private:
    void fault_point() {
        if (world_rank() != fault_.rank) return;
        if (watchdog().activity().compare(0, fault_.during.size(), fault_.during) != 0) return;
        if (fault_.kind == "exit") _exit(9);
        if (fault_.kind == "delay") {
            fault_.rank = -1;  // once
            std::this_thread::sleep_for(std::chrono::duration<double>(fault_.seconds));
            return;
        }
        for (;;) pause();  // stall
    }
    static int world_rank() {
        int r = 0;
        MPI_Comm_rank(MPI_COMM_WORLD, &r);
        return r;
    }
    Fault fault_;
};

int main(int argc, char** argv) {
    Fault fault;
    std::vector<char*> rest = {argv[0]};
    for (int i = 1; i < argc; i++) {
        const std::string a = argv[i];
        if ((a == "--fault-rank" || a == "--fault-during" || a == "--fault" || a == "--fault-seconds" || a == "--disk-bytes-per-second") && i + 1 < argc) {
            const char* v = argv[++i];
            if (a == "--fault-rank") fault.rank = atoi(v);
            else if (a == "--fault-during") fault.during = v;
            else if (a == "--fault-seconds") fault.seconds = atof(v);
            else if (a == "--disk-bytes-per-second") g_slowest_disk_bytes_per_second = atof(v);
            else fault.kind = v;
        } else {
            rest.push_back(argv[i]);
        }
    }
    if (fault.rank < 0 || fault.during.empty() || (fault.kind != "stall" && fault.kind != "exit" && fault.kind != "delay") ||
        g_slowest_disk_bytes_per_second <= 0)
        fatal(2, "usage: fault_job --fault-rank R --fault-during ACTIVITY --fault stall|exit|delay [--fault-seconds S] [--disk-bytes-per-second D] "
                 "[train_gpt flags]");
    TrainConfig cfg = parse_args((int)rest.size(), rest.data());
    MPI_Init(&argc, &argv);
    g_fatal_hook = abort_all_ranks;
    int status = 0;
    {
        MpiComm world(MPI_COMM_WORLD);
        FaultyComm comm(world, fault);
        status = exit_status(train<CpuBackend>(cfg, comm));
    }
    MPI_Finalize();
    return status;
}
