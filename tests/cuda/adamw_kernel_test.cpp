// tests/cuda/adamw_kernel_test.cpp — the CUDA AdamW kernels against the CPU kernels over several
// steps on fresh random parameters, gradients and (non-zero) moments: adamw_step per tensor
// (f32, f64, odd sizes, a misaligned view), adamw_multi_step over a list mixing sizes that cross
// chunk boundaries and per-parameter decays, and its bf16 copies (to nearest: exactly the
// device's rounding of the updated f32 param; stochastic: the floor or ceiling of it, rounded
// with the Philox bits of Note [bf16 stochastic rounding]), and the gradient factor read on the
// device. Tolerances: f32 1e-6, f64 1e-12
// relative (tests/cuda/cpu_reference.h). Skips without a GPU.
#include <bit>
#include <cmath>
#include <limits>

#include "kernels/adamw.h"
#include "tests/cuda/cpu_reference.h"

namespace loom {
namespace {

using namespace cuda_test;  // NOLINT(build/namespaces): the shared test helpers
using CudaAdamWTest = CudaTest;

// One parameter's four tensors on the CPU and on the GPU, all random; exp_avg_sq positive.
struct State {
  Pair p, g, m, v;
};

State random_state(const Shape& shape, DType dt, Generator& gen) {
  State s{
      random_pair(shape, dt, gen), random_pair(shape, dt, gen), random_pair(shape, dt, gen), {}};
  const Tensor v = rand(shape, gen, dt, 0.01, 2.0);
  s.v = {v.clone(), v.to(Device::cuda())};
  return s;
}

void expect_state_close(const State& s, DType dt, const std::string& what) {
  expect_close(s.p.cpu, s.p.gpu, dt, what + " param");
  expect_close(s.m.cpu, s.m.gpu, dt, what + " exp_avg");
  expect_close(s.v.cpu, s.v.gpu, dt, what + " exp_avg_sq");
}

TEST_F(CudaAdamWTest, StepMatchesCpuOverSeveralSteps) {
  Generator gen(601);
  for (DType dt : {DType::kF32, DType::kF64}) {
    for (int64_t n : kOddSizes) {
      State s = random_state({n}, dt, gen);
      for (int64_t step = 1; step <= 3; ++step) {
        const double lr = 1e-3 * static_cast<double>(step), wd = step == 2 ? 0.0 : 0.1;
        kernels::call_kernel<kernels::adamw_step_k>(s.p.gpu, s.g.gpu, s.m.gpu, s.v.gpu, lr, 0.9,
                                                    0.95, 1e-8, wd, step);
        kernels::call_kernel<kernels::adamw_step_k>(s.p.cpu, s.g.cpu, s.m.cpu, s.v.cpu, lr, 0.9,
                                                    0.95, 1e-8, wd, step);
      }
      expect_state_close(s, dt, label("adamw_step", dt, n));
    }
  }
}

// The list of entries (CPU or GPU side) for adamw_multi_step.
std::vector<kernels::AdamWParam> entries(std::vector<State>& states, bool gpu,
                                         const std::vector<Tensor>& copies) {
  std::vector<kernels::AdamWParam> list;
  for (size_t i = 0; i < states.size(); ++i) {
    State& s = states[i];
    const double wd = i % 2 == 0 ? 0.1 : 0.0;
    list.push_back({gpu ? s.p.gpu : s.p.cpu, gpu ? s.g.gpu : s.g.cpu, gpu ? s.m.gpu : s.m.cpu,
                    gpu ? s.v.gpu : s.v.cpu, wd, copies.empty() ? Tensor() : copies[i]});
  }
  return list;
}

// Sizes crossing the kernel's 16384-element chunks, tiny ones, and a misaligned view.
std::vector<State> random_list(DType dt, Generator& gen) {
  std::vector<State> states;
  for (int64_t n :
       {int64_t{1}, int64_t{3}, int64_t{16385}, int64_t{65}, int64_t{1000003}, int64_t{17}}) {
    states.push_back(random_state({n}, dt, gen));
  }
  State mis = random_state({4097}, dt, gen);
  for (Pair* q : {&mis.p, &mis.g, &mis.m, &mis.v}) {
    *q = {q->cpu.narrow(0, 1, 4096), q->gpu.narrow(0, 1, 4096)};
  }
  states.push_back(mis);
  return states;
}

TEST_F(CudaAdamWTest, MultiStepMatchesCpu) {
  Generator gen(602);
  for (DType dt : {DType::kF32, DType::kF64}) {
    std::vector<State> states = random_list(dt, gen);
    for (int64_t step = 1; step <= 3; ++step) {
      kernels::AdamWOptions o;
      o.lr = 2e-3;
      o.beta1 = 0.9;
      o.beta2 = 0.999;
      o.eps = 1e-8;
      o.step = step;
      kernels::find_kernel<kernels::adamw_multi_step_k>(DeviceType::kCuda)(
          entries(states, true, {}), o);
      kernels::find_kernel<kernels::adamw_multi_step_k>(DeviceType::kCpu)(
          entries(states, false, {}), o);
    }
    for (size_t i = 0; i < states.size(); ++i) {
      expect_state_close(states[i], dt, label("adamw_multi_step", dt, states[i].p.cpu.numel()));
    }
  }
}

// A gradient factor read on the device (AdamWOptions::grad_scale, the device step's clipping):
// the same update as the CPU kernel given the factor, a different factor at each step (Adam is
// invariant to a constant one up to eps), and the gradients left as they were.
TEST_F(CudaAdamWTest, MultiStepWithGradScaleMatchesCpu) {
  Generator gen(605);
  for (DType dt : {DType::kF32, DType::kF64}) {
    std::vector<State> states = random_list(dt, gen);
    std::vector<Tensor> grads_before;
    for (const State& s : states) grads_before.push_back(s.g.gpu.to(Device::cpu()));
    int64_t step = 0;
    for (const double factor : {0.37, 1.0, 0.05}) {
      kernels::AdamWOptions o;
      o.lr = 2e-3;
      o.step = ++step;
      o.grad_scale = Tensor::scalar(factor, DType::kF64, Device::cuda());
      kernels::find_kernel<kernels::adamw_multi_step_k>(DeviceType::kCuda)(
          entries(states, true, {}), o);
      o.grad_scale = Tensor::scalar(factor, DType::kF64);
      kernels::find_kernel<kernels::adamw_multi_step_k>(DeviceType::kCpu)(
          entries(states, false, {}), o);
    }
    for (size_t i = 0; i < states.size(); ++i) {
      const std::string what = label("adamw_multi_step grad_scale", dt, states[i].p.cpu.numel());
      expect_state_close(states[i], dt, what);
      expect_same_bits(grads_before[i], states[i].g.gpu, what + " gradient untouched");
    }
  }
  kernels::AdamWOptions o;
  o.grad_scale = Tensor::scalar(0.5, DType::kF64);  // on the host: refused
  std::vector<State> states = {random_state({5}, DType::kF32, gen)};
  EXPECT_THROW(kernels::find_kernel<kernels::adamw_multi_step_k>(DeviceType::kCuda)(
                   entries(states, true, {}), o),
               Error);
}

// The step count on the device (AdamWOptions::step_count, f16 loss scaling): t read where it
// lies (its scalars derived by each thread with the device's pow: within the tolerance of the
// CPU's), a NaN or infinite factor skipping the update (the GPU state keeps its bits) without
// advancing the count, and the count advanced once per made update — after every launch of a
// list longer than one launch's slots (50 entries plus random_list's) has read it.
TEST_F(CudaAdamWTest, DeviceStepCountAndSkipsMatchCpu) {
  Generator gen(606);
  for (DType dt : {DType::kF32, DType::kF64}) {
    std::vector<State> states = random_list(dt, gen);
    for (int k = 0; k < 50; ++k) states.push_back(random_state({3 + k}, dt, gen));
    Tensor count_gpu = Tensor::scalar(3.0, DType::kF64, Device::cuda()),
           count_cpu = Tensor::scalar(3.0, DType::kF64);
    for (const double factor :
         {0.5, std::nan(""), std::numeric_limits<double>::infinity(), 0.8, 1.0}) {
      const std::vector<double> before = states[2].p.gpu.to(Device::cpu()).to_vector();
      kernels::AdamWOptions o;
      o.lr = 2e-3;
      o.step = 1;  // ignored: the counts rule
      o.step_count = count_gpu;
      o.grad_scale = Tensor::scalar(factor, DType::kF64, Device::cuda());
      kernels::find_kernel<kernels::adamw_multi_step_k>(DeviceType::kCuda)(
          entries(states, true, {}), o);
      o.step_count = count_cpu;
      o.grad_scale = Tensor::scalar(factor, DType::kF64);
      kernels::find_kernel<kernels::adamw_multi_step_k>(DeviceType::kCpu)(
          entries(states, false, {}), o);
      if (!std::isfinite(factor)) {
        EXPECT_EQ(states[2].p.gpu.to(Device::cpu()).to_vector(), before) << "factor " << factor;
      }
      EXPECT_EQ(count_gpu.item(), count_cpu.item()) << "factor " << factor;
    }
    EXPECT_EQ(count_gpu.item(), 6.0);
    for (size_t i = 0; i < states.size(); ++i) {
      expect_state_close(states[i], dt,
                         label("adamw_multi_step step_count", dt, states[i].p.cpu.numel()));
    }
  }
}

// copy's bits are param rounded down or up (in magnitude) to bf16.
void expect_floor_or_ceil(const Tensor& param_gpu, const Tensor& copy_gpu,
                          const std::string& what) {
  const Tensor p = param_gpu.to(Device::cpu()).contiguous();
  const Tensor c = copy_gpu.to(Device::cpu()).contiguous();
  const float* pp = p.data<float>();
  const BFloat16* pc = c.data<BFloat16>();
  for (int64_t i = 0; i < p.numel(); ++i) {
    const uint32_t down = std::bit_cast<uint32_t>(pp[i]) >> 16;
    if (pc[i].bits != down && pc[i].bits != down + 1) {
      ADD_FAILURE() << what << ": element " << i << " copy bits " << pc[i].bits << " are neither "
                    << down << " nor " << down + 1;
      return;
    }
  }
}

TEST_F(CudaAdamWTest, MultiStepBf16CopiesNearestAndStochastic) {
  Generator gen(603);
  for (bool stochastic : {false, true}) {
    std::vector<State> states = random_list(DType::kF32, gen);
    std::vector<Tensor> gpu_copies, cpu_copies;
    for (const State& s : states) {
      gpu_copies.push_back(poisoned_cuda(s.p.cpu.shape(), DType::kBF16));
      cpu_copies.push_back(Tensor::empty(s.p.cpu.shape(), DType::kBF16));
    }
    kernels::AdamWOptions o;
    o.lr = 1e-2;
    o.step = 4;
    o.stochastic_rounding = stochastic;
    o.seed = 4242;
    o.offset = 17;
    kernels::find_kernel<kernels::adamw_multi_step_k>(DeviceType::kCuda)(
        entries(states, true, gpu_copies), o);
    kernels::find_kernel<kernels::adamw_multi_step_k>(DeviceType::kCpu)(
        entries(states, false, cpu_copies), o);
    uint64_t base = 0;  // Philox counters of the entries before entry i
    for (size_t i = 0; i < states.size(); ++i, base += (states[i - 1].p.cpu.numel() + 3) / 4) {
      const std::string what = label(stochastic ? "stochastic bf16 copy" : "nearest bf16 copy",
                                     DType::kBF16, states[i].p.cpu.numel());
      expect_state_close(states[i], DType::kF32, what);
      expect_close(cpu_copies[i], gpu_copies[i], DType::kBF16, what);
      if (!stochastic) {
        expect_same_bits(states[i].p.gpu.to(DType::kBF16).to(Device::cpu()), gpu_copies[i], what);
        continue;
      }
      expect_floor_or_ceil(states[i].p.gpu, gpu_copies[i], what);
      // The random bits follow Note [bf16 stochastic rounding]: recompute each element from the
      // GPU's own f32 result (the CPU build may contract into FMAs, so its f32 bits can differ).
      const Tensor pg = states[i].p.gpu.to(Device::cpu()).contiguous();
      const Tensor cg = gpu_copies[i].to(Device::cpu());
      for (int64_t j = 0; j < pg.numel(); ++j) {
        const uint32_t r = philox_bits(o.seed, o.offset + base, static_cast<uint64_t>(j));
        const uint16_t want =
            kernels::bf16_bits_stochastic(std::bit_cast<uint32_t>(pg.data<float>()[j]), r);
        ASSERT_EQ(cg.data<BFloat16>()[j].bits, want) << what << ": element " << j;
      }
    }
  }
}

TEST_F(CudaAdamWTest, MultiStepRejectsMixedDTypes) {
  Generator gen(604);
  std::vector<State> states = {random_state({5}, DType::kF32, gen),
                               random_state({5}, DType::kF64, gen)};
  kernels::AdamWOptions o;
  o.lr = 1e-3;
  EXPECT_THROW(kernels::find_kernel<kernels::adamw_multi_step_k>(DeviceType::kCuda)(
                   entries(states, true, {}), o),
               Error);
}

}  // namespace
}  // namespace loom
