// Memory an object owns, released with it: what alloc() (backend memory, zeroed) and
// alloc_pinned() (host memory the backend transfers from and to on its own, zeroed) hand out goes
// when the Allocations do, in the order it came, and its bytes are added to the tally the caller
// names (the categories of the memory line each rank prints).
#pragma once
#include <cstddef>
#include <vector>

template <class Backend>
class Allocations {
public:
    Allocations() = default;
    ~Allocations() {
        for (const Held& h : held_) (h.pinned ? Backend::release_pinned : Backend::release)(h.p);
    }
    Allocations(const Allocations&) = delete;
    Allocations& operator=(const Allocations&) = delete;

    // *p = n elements of backend memory
    template <class T>
    void alloc(T** p, size_t n, size_t* tally) {
        *p = (T*)Backend::alloc(n * sizeof(T));
        hold(*p, false, n * sizeof(T), tally);
    }
    // *p = n elements of pinned host memory; false (and *p null) when there is not enough
    template <class T>
    bool alloc_pinned(T** p, size_t n, size_t* tally) {
        *p = (T*)Backend::alloc_pinned(n * sizeof(T));
        if (*p != nullptr) hold(*p, true, n * sizeof(T), tally);
        return *p != nullptr;
    }

private:
    struct Held {
        void* p;
        bool pinned;
    };
    void hold(void* p, bool pinned, size_t bytes, size_t* tally) {
        held_.push_back({p, pinned});
        *tally += bytes;
    }
    std::vector<Held> held_;
};
