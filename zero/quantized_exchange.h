// ZeRO++'s int8 collectives for zero/zero.h (docs/quantized_collectives.md): stage 3's gathers
// (--quantize-weights int8, qwZ) and the gradients' reductions (--quantize-grads int8, qgZ),
// inside the shard group and across groups. This class plans how each piece travels as int8
// rows (kernels/quantize_blocks.h), sizes a slot's buffers for them, and does the int8 half of
// each collective: quantize and start what is sent, dequantize what arrived. Zero decides when a
// collective starts and waits for it before calling the half that reads its result.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "../kernels/allocations.h"
#include "../kernels/quantize_blocks.h"
#include "comm.h"
#include "pieces.h"

// The smallest piece (or part across groups) that travels as int8: a smaller one (a final
// layernorm's piece on many ranks) goes as it is, its scales costing more than they save
constexpr size_t kQuantMinValues = 2 * kQuantBlock;

// A slot's int8 buffers (null where not needed): a gather's row of this rank and every rank's;
// a reduction's rows sent and received inside the group; across groups a row per replica sent
// and received, the all-gather reusing them
struct QuantizedBuffers {
    uint8_t *gather_mine = nullptr, *gather_all = nullptr;
    uint8_t *reduce_send = nullptr, *reduce_recv = nullptr;
    uint8_t *across_send = nullptr, *across_recv = nullptr;
};

template <class Backend>
class QuantizedExchange {
public:
    using floatX = typename Backend::floatX;
    using Ticket = Communicator::Ticket;

    // weights, grads: whether stage 3's gathers and the reductions go as int8, where the stage
    // and the ranks allow it (neither: nothing is planned); group: the shard group's ranks;
    // replicas: the ranks holding this rank's shard in the other groups (null: none). The
    // rows' blocks are allocated from `owned`, their bytes added to *tally.
    QuantizedExchange(const Pieces<Backend>& pieces, Communicator& group, Communicator* replicas, bool weights, bool grads,
                      Allocations<Backend>& owned, size_t* tally)
        : pieces_(pieces), group_(group), replicas_(replicas), weights_(weights), grads_(grads) {
        if (weights_ || grads_) plan_rows(owned, tally);
    }
    QuantizedExchange(const QuantizedExchange&) = delete;
    QuantizedExchange& operator=(const QuantizedExchange&) = delete;

    // whether piece p goes as int8 in stage 3's gather, in a reduction inside the group, in the
    // all-reduce across groups
    bool gathers_int8(const Piece& p) const { return weights_ && row_int8(p); }
    bool reduces_int8(const Piece& p) const { return grads_ && group_.world() > 1 && row_int8(p); }
    bool across_int8(const Piece& p) const { return grads_ && !quant(p).parts.empty(); }

    // int8 buffers for a slot that serves these groups, sized by their largest rows
    QuantizedBuffers alloc_buffers(const std::vector<int>& groups, Allocations<Backend>& owned, size_t* tally) const {
        if (quant_.empty()) return {};
        size_t row = 0, part = 0;
        for (int g : groups)
            for (const PieceQuant& q : quant_[g]) {
                if (q.whole.blocks > 0) row = std::max(row, q.whole.row_bytes());
                if (!q.parts.empty()) part = std::max(part, q.parts[0].row_stride());
            }
        const size_t N = group_.world(), R = replicas_ ? replicas_->world() : 1;
        QuantizedBuffers b;
        if (weights_ && row > 0) {
            owned.alloc(&b.gather_mine, row, tally);
            owned.alloc(&b.gather_all, N * row, tally);
        }
        if (grads_ && N > 1 && row > 0) {
            owned.alloc(&b.reduce_send, N * row, tally);
            owned.alloc(&b.reduce_recv, N * row, tally);
        }
        if (part > 0) {
            owned.alloc(&b.across_send, R * part, tally);
            owned.alloc(&b.across_recv, R * part, tally);
        }
        return b;
    }

    // Stage 3's gather: this rank's piece quantized and all-gathered; once waited for, every
    // rank's row dequantized into `gathered`, this rank's too, so that all compute with the same
    Ticket start_gather(QuantizedBuffers& b, const floatX* mine, const Piece& p) {
        const QuantRows& rows = quant(p).whole;
        Backend::quantize_int8(b.gather_mine, mine, rows, 1);
        return group_.all_gather_async(b.gather_mine, b.gather_all, rows.row_bytes(), DType::I8);
    }
    void finish_gather(floatX* gathered, const QuantizedBuffers& b, const Piece& p) const {
        Backend::dequantize_int8(gathered, b.gather_all, quant(p).whole, group_.world());
    }

    // A reduction inside the group, as an all-to-all: row r of `rank_major` quantized and sent to
    // rank r; once waited for, the rows received dequantized and summed in fp32 into `mine`
    Ticket start_reduce(QuantizedBuffers& b, const floatX* rank_major, const Piece& p) {
        const QuantRows& rows = quant(p).whole;
        Backend::quantize_int8(b.reduce_send, rank_major, rows, group_.world());
        return group_.all_to_all_async(b.reduce_send, b.reduce_recv, rows.row_bytes(), DType::I8);
    }
    void finish_reduce(floatX* mine, const QuantizedBuffers& b, const Piece& p) const {
        Backend::dequantize_sum_int8(mine, b.reduce_recv, quant(p).whole, group_.world());
    }

    // The all-reduce across groups of `values` (piece p), in two halves. First part j of the piece
    // quantized and sent to replica j (an all-to-all); ...
    Ticket start_across(QuantizedBuffers& b, const floatX* values, const Piece& p) {
        const PieceQuant& q = quant(p);
        const size_t stride = q.parts[0].row_stride();
        for (size_t j = 0; j < q.parts.size(); j++)
            Backend::quantize_int8(b.across_send + j * stride, values + j * q.part_values, q.parts[j], 1);
        return replicas_->all_to_all_async(b.across_send, b.across_recv, stride, DType::I8);
    }
    // ... once that is waited for, this replica's part summed in fp32 from every replica's,
    // quantized again and all-gathered; ...
    Ticket gather_across(QuantizedBuffers& b, floatX* values, const Piece& p) {
        const PieceQuant& q = quant(p);
        const int k = replicas_->rank();
        floatX* mine = values + k * q.part_values;
        Backend::dequantize_sum_int8(mine, b.across_recv, q.parts[k], replicas_->world());
        Backend::quantize_int8(b.across_send, mine, q.parts[k], 1);
        return replicas_->all_gather_async(b.across_send, b.across_recv, q.parts[0].row_stride(), DType::I8);
    }
    // ... and once that is waited for, every replica's summed part dequantized into `values`,
    // this replica's too, so that the replicas hold the same
    void finish_across(floatX* values, const QuantizedBuffers& b, const Piece& p) const {
        const PieceQuant& q = quant(p);
        const size_t stride = q.parts[0].row_stride();
        for (size_t j = 0; j < q.parts.size(); j++)
            Backend::dequantize_int8(values + j * q.part_values, b.across_recv + j * stride, q.parts[j], 1);
    }

private:
    // How a piece travels as int8: a rank's row of it inside the group (whole; blocks == 0: as it
    // is), and across groups part j of part_values values for replica j (none: as it is)
    struct PieceQuant {
        QuantRows whole;
        std::vector<QuantRows> parts;
        size_t part_values = 0;
    };

    const PieceQuant& quant(const Piece& p) const { return quant_[p.group][pieces_.index(p)]; }
    bool row_int8(const Piece& p) const { return !quant_.empty() && quant(p).whole.blocks > 0; }

    // every piece's rows, whole and in parts across groups, their blocks in host and backend memory
    void plan_rows(Allocations<Backend>& owned, size_t* tally) {
        const int R = replicas_ ? replicas_->world() : 1;
        std::vector<std::vector<QuantBlock>> blocks;  // of every QuantRows below, in for_each_rows' order
        for (int g = 0; g < pieces_.plan().num_groups(); g++) {
            quant_.emplace_back();
            pieces_.for_each(g, [&](const Piece& p) {
                PieceQuant q;
                if (p.size() >= kQuantMinValues) q.whole = rows_of(p, &blocks);
                q.part_values = (p.size() + R - 1) / R;
                if (grads_ && replicas_ && q.part_values >= kQuantMinValues) {
                    size_t stride = 0;
                    for (int j = 0; j < R; j++) {
                        const size_t a = std::min(p.hi, p.lo + j * q.part_values), b = std::min(p.hi, a + q.part_values);
                        q.parts.push_back(rows_of(Piece{g, a, b}, &blocks));
                        stride = std::max(stride, q.parts.back().row_bytes());
                    }
                    for (QuantRows& part : q.parts) part.stride = stride;  // one message size for the all-to-all
                }
                quant_.back().push_back(q);
            });
        }
        size_t count = 0;
        for (const auto& b : blocks) count += b.size();
        QuantBlock* device = nullptr;
        owned.alloc(&device, count, tally);
        blocks_.reserve(count);
        size_t next = 0;
        for_each_rows([&](QuantRows& rows) {
            rows.host = blocks_.data() + blocks_.size();
            rows.device = device + blocks_.size();
            blocks_.insert(blocks_.end(), blocks[next].begin(), blocks[next].end());
            next++;
        });
        Backend::from_host(device, blocks_.data(), count * sizeof(QuantBlock));
    }
    // the rows of the values of piece p: blocks of its tensor pieces (appended to *blocks; the
    // rows' pointers are set once all are known)
    QuantRows rows_of(const Piece& p, std::vector<std::vector<QuantBlock>>* blocks) const {
        std::vector<size_t> tensor_pieces;
        pieces_.for_each_tensor(p, [&](const PartitionPlan::Tensor&, size_t, size_t, size_t len) { tensor_pieces.push_back(len); });
        blocks->push_back(quant_blocks(tensor_pieces));
        QuantRows rows;
        rows.blocks = (int)blocks->back().size();
        rows.values = p.size();
        return rows;
    }
    // f(rows) for every piece's rows that have blocks: whole, then its parts, piece after piece
    template <class F>
    void for_each_rows(F f) {
        for (auto& pieces : quant_)
            for (PieceQuant& q : pieces) {
                if (q.whole.values > 0) f(q.whole);  // made by rows_of
                for (QuantRows& part : q.parts) f(part);
            }
    }

    const Pieces<Backend>& pieces_;
    Communicator& group_;
    Communicator* replicas_;
    bool weights_, grads_;
    std::vector<std::vector<PieceQuant>> quant_;  // [group][piece]; empty: nothing planned
    std::vector<QuantBlock> blocks_;              // the blocks of every QuantRows above, in host memory
};
