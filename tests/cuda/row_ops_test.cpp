// tests/cuda/row_ops_test.cpp — the differentiable front-ends over the CUDA row kernels
// (ops::layer_norm, rms_norm, residual_layer_norm, softmax, rope) on GPU tensors, forward and
// backward through autograd, against the same ops on the CPU: checks the wiring (statistics
// dtype, saved tensors, gradients reaching every input). Backward is seeded with random output
// gradients (autograd::backward(outputs, grads)), so no other CUDA op is needed. f32 against the
// CPU on the same values (1e-5), bf16 against the CPU on the values widened to f32 (1e-2), as
// relative errors. Fresh random inputs each run (the seed is printed on failure). Skips without
// a GPU.
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/ops/norm.h"
#include "core/ops/rope.h"
#include "core/ops/softmax.h"
#include "tests/cuda/cuda_test_util.h"

namespace loom {
namespace {

using namespace cuda_test;  // NOLINT(build/namespaces): the shared test helpers
using CudaRowOpsTest = CudaTest;

// The op under test: inputs → outputs (all differentiable inputs are leaves requiring grad).
using MultiOp = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

// Runs op on the GPU copies of `inputs` (dtype dt) and on the CPU copies (f32), seeds backward
// with the same random output gradients, and compares outputs and input gradients. Inputs at
// indices in `constant` (integer positions) get no gradient and keep their dtype.
void compare_op(const MultiOp& op, const std::vector<Tensor>& inputs, DType dt, Generator& gen,
                const std::string& what, const std::vector<size_t>& constant = {}) {
  SCOPED_TRACE(what + " " + dtype_name(dt));
  const double tol = dt == DType::kF32 ? 1e-5 : 1e-2;
  auto is_constant = [&](size_t i) {
    for (size_t c : constant) {
      if (c == i) return true;
    }
    return false;
  };
  std::vector<Tensor> gpu, cpu;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (is_constant(i)) {
      gpu.push_back(inputs[i].to(Device::cuda()));
      cpu.push_back(inputs[i]);
      continue;
    }
    const Tensor stored = inputs[i].to(dt);  // the values both sides see
    gpu.push_back(stored.to(Device::cuda()).set_requires_grad(true));
    cpu.push_back(stored.to(DType::kF32).set_requires_grad(true));
  }
  const std::vector<Tensor> out_gpu = op(gpu), out_cpu = op(cpu);
  ASSERT_EQ(out_gpu.size(), out_cpu.size());
  std::vector<Tensor> seeds_gpu, seeds_cpu;
  for (size_t k = 0; k < out_cpu.size(); ++k) {
    EXPECT_LT(rel_error(out_cpu[k], out_gpu[k]), tol) << "output " << k;
    const Tensor seed = random_tensor(out_cpu[k].shape(), dt, gen);
    seeds_gpu.push_back(seed.to(Device::cuda()));
    seeds_cpu.push_back(seed.to(DType::kF32));
  }
  autograd::backward(out_gpu, seeds_gpu);
  autograd::backward(out_cpu, seeds_cpu);
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (is_constant(i)) continue;
    ASSERT_TRUE(gpu[i].grad().defined()) << "input " << i << " got no gradient on the GPU";
    EXPECT_EQ(gpu[i].grad().device(), Device::cuda()) << "input " << i;
    EXPECT_LT(rel_error(cpu[i].grad(), gpu[i].grad()), tol) << "gradient of input " << i;
  }
}

TEST_F(CudaRowOpsTest, NormOpsMatchCpu) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Generator gen(seed);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const int64_t c = 771;
    const Tensor x = random_tensor({3, 5, c}, DType::kF32, gen);
    const Tensor r = random_tensor({3, 5, c}, DType::kF32, gen);
    const Tensor w = random_tensor({c}, DType::kF32, gen), b = random_tensor({c}, DType::kF32, gen);
    compare_op(
        [](const std::vector<Tensor>& in) {
          return std::vector<Tensor>{ops::layer_norm(in[0], in[1], in[2])};
        },
        {x, w, b}, dt, gen, "layer_norm");
    compare_op(
        [](const std::vector<Tensor>& in) {
          return std::vector<Tensor>{ops::rms_norm(in[0], in[1], 1e-6)};
        },
        {x, w}, dt, gen, "rms_norm");
    compare_op(
        [](const std::vector<Tensor>& in) {
          const ops::ResidualLayerNorm out = ops::residual_layer_norm(in[0], in[1], in[2], in[3]);
          return std::vector<Tensor>{out.sum, out.normalized};
        },
        {x, r, w, b}, dt, gen, "residual_layer_norm");
  }
}

TEST_F(CudaRowOpsTest, SoftmaxAndRopeOpsMatchCpu) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Generator gen(seed);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const Tensor x = random_tensor({4, 7, 129}, DType::kF32, gen);
    compare_op(
        [](const std::vector<Tensor>& in) { return std::vector<Tensor>{ops::softmax(in[0])}; }, {x},
        dt, gen, "softmax");
    const Tensor q = random_tensor({2, 9, 3, 64}, DType::kF32, gen);
    const Tensor pos = randint({9}, 100, 4000, gen, DType::kI64);
    compare_op(
        [](const std::vector<Tensor>& in) {
          return std::vector<Tensor>{ops::rope(in[0], in[1], 10000.0)};
        },
        {q, pos}, dt, gen, "rope", {1});
  }
}

}  // namespace
}  // namespace loom
