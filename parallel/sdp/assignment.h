// parallel/sdp/assignment.h — which worker holds which part of the model under SDP (subnetwork
// data parallelism, arXiv 2507.09029; docs/parallel.md, "SDP"): each layer's units (MLP hidden
// units, or attention heads) or the transformer blocks, covered by the N workers so that every
// unit is held by exactly k = C·N of them. Pure, deterministic functions of (N, C, seed, sizes):
// nothing here communicates, builds a model or keeps state, so every rule is unit-tested in one
// process. The holder sets it returns are what the gradient sync builds one communicator for.
//
// Note [SDP cover]: a layer of U units is cut into N contiguous slices, slice s being units
// [⌊s·U/N⌋, ⌊(s+1)·U/N⌋) (sizes ⌊U/N⌋ or ⌈U/N⌉, spread evenly). Worker w holds the k slices
// of a cyclic window, {w + r, …, w + r + k − 1} mod N, where r (the layer's rotation, drawn
// from the seed) makes layers differ; so slice s is held by the k workers
// {s − r − k + 1, …, s − r} mod N, exactly k, and a worker holds ⌊k·U/N⌋ or ⌈k·U/N⌉ units of
// every layer (any k cyclically consecutive slices of an even spread hold one of those two
// counts), as at most two contiguous ranges of units (one, unless the window wraps).
// Because the rotation only relabels which window is whose, the holder sets of every layer are
// the same N cyclic windows of consecutive ranks (one set when k = N): the sync needs N
// communicators in all, k on each worker, whatever the number of layers, and with ranks laid
// out by node a holder set spans as few nodes as a window can. A per-layer permutation of the
// workers would give up to min(C(N, k), N·n_layer) sets; we chose rotations.
//
// Note [SDP block cover]: the block level is the same cover of the n_layer blocks taken as the
// units of one layer, after a permutation of the blocks drawn from the seed (so a worker's
// blocks are spread over the depth, not a contiguous run): every block is held by exactly k
// workers, and every worker holds exactly C·n_layer blocks (k cyclically consecutive slices
// hold ⌊k·n/N⌋ or ⌈k·n/N⌉ blocks, and k·n/N = C·n_layer must be whole, else a ConfigError).
// With n_layer < N some slices are empty; an empty slice has no holder set.
//
// Note [SDP holder graph]: workers are adjacent when they hold a common (non-empty) slice. The
// graph must be connected, else the model splits into parts that never exchange a gradient
// (each part's copy of the replicated parameters would still be averaged, but the parts train
// different units on disjoint data and nothing ties them). With the windows above it is
// connected exactly when a connected cover exists at all: neuron level, k ≥ 2 (or N = 1);
// block level, k ≥ 2 and C·n_layer ≥ 2, or C = 1 (one block per worker splits the workers by
// block).
// Each failure is a ConfigError naming parallel.sdp.coverage and parallel.dp (and
// model.n_layer at the block level).
//
// Randomness: Philox (core/philox.h) on the seed, so a layout depends only on (N, C, seed,
// sizes), never on the platform's std:: distributions.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace loom::parallel::sdp {

// parallel.sdp.level: what a worker's subnetwork is made of.
enum class Level { kNeuron, kBlock };
Level parse_level(const std::string& s);  // "neuron" | "block"; ConfigError naming the key
std::string level_name(Level level);

// The cover's parameters: N workers (the SDP group's size, parallel.dp), the coverage C
// (parallel.sdp.coverage, the fraction of each layer a worker holds) and the seed
// (parallel.sdp.seed).
struct CoverOptions {
  int workers = 1;
  double coverage = 1.0;
  uint64_t seed = 0;
};

// k = C·N, the number of holders of every unit. ConfigError naming parallel.dp when N < 1, and
// parallel.sdp.coverage when C is outside (0, 1] or C·N is not a whole number (within 1e-6·N,
// so that a coverage written with six digits, 0.333333, is taken as 1/3).
int replication(int workers, double coverage);

// One slice of a layer: units [begin, end) (at the block level, positions in block_order) and
// its holders, ascending.
struct UnitSlice {
  int64_t begin = 0;
  int64_t end = 0;
  std::vector<int> holders;

  int64_t size() const { return end - begin; }
};

// The cover of one layer's units: N slices, contiguous and in order, covering [0, units).
struct LayerCover {
  int64_t units = 0;
  int rotation = 0;  // r of Note [SDP cover]
  std::vector<UnitSlice> slices;

  // The slices `worker` holds, ascending.
  std::vector<int> slices_of(int worker) const;
  bool holds(int worker, int slice) const;
  // The units `worker` holds, ascending (what packing copies), and the same as merged
  // [begin, end) ranges (at most two).
  std::vector<int64_t> owned_units(int worker) const;
  std::vector<std::pair<int64_t, int64_t>> owned_ranges(int worker) const;
  int64_t owned_count(int worker) const;
};

// Neuron level: one cover per layer (e.g. each block's ffn_hidden MLP units; attention heads,
// with their own call). The global id of slice s of layer l is l·N + s: the sync's fixed order.
struct NeuronAssignment {
  int workers = 1;
  int replication = 1;  // k
  double coverage = 1.0;
  uint64_t seed = 0;
  std::vector<LayerCover> layers;

  std::vector<int64_t> owned_units(int worker, int layer) const;
  // The distinct holder sets of all non-empty slices, each ascending, in lexicographic order:
  // the communicators the sync creates, in the order every rank creates them.
  std::vector<std::vector<int>> holder_sets() const;
};

// Covers the layers' units (units[l] for layer l, each >= N so that no slice is empty;
// ConfigError naming `units_key` otherwise). Checks the holder graph (Note [SDP holder graph]).
NeuronAssignment assign_neurons(const CoverOptions& options, const std::vector<int64_t>& units,
                                const std::string& units_key = "model.ffn_hidden");

// Block level (Note [SDP block cover]).
struct BlockAssignment {
  int workers = 1;
  int replication = 1;  // k
  double coverage = 1.0;
  uint64_t seed = 0;
  int64_t n_layer = 0;
  std::vector<int64_t> block_order;       // the seeded permutation: position p holds block_order[p]
  LayerCover cover;                       // over positions in block_order
  std::vector<std::vector<int>> holders;  // per block, ascending (k each)

  bool holds(int worker, int64_t block) const;
  std::vector<int64_t> owned_blocks(int worker) const;  // ascending, C·n_layer of them
  // The slice of `block` (its global slice id, for the sync's order).
  int slice_of(int64_t block) const;
  std::vector<std::vector<int>> holder_sets() const;  // as NeuronAssignment::holder_sets
};

// Covers the n_layer blocks. ConfigError naming parallel.sdp.coverage and model.n_layer when
// C·n_layer is not whole; checks the holder graph.
BlockAssignment assign_blocks(const CoverOptions& options, int64_t n_layer);

// The holder sets, ascending each, without repeats, in lexicographic order.
std::vector<std::vector<int>> distinct_holder_sets(std::vector<std::vector<int>> sets);
// The connected components of the holder graph over workers 0…N−1 (workers adjacent when some
// set holds both), each ascending, ordered by their lowest worker.
std::vector<std::vector<int>> holder_components(int workers,
                                                const std::vector<std::vector<int>>& sets);
// Throws ConfigError naming parallel.sdp.coverage and parallel.dp (and `extra_keys`, e.g.
// "model.n_layer") with the components when the holder graph is not connected.
void check_holder_graph(int workers, const std::vector<std::vector<int>>& sets,
                        const std::string& extra_keys = "");

}  // namespace loom::parallel::sdp
