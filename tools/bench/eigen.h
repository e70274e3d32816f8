// tools/bench/eigen.h — the one way Loom's code includes Eigen (today only the matmul benchmark,
// which compares OpenBLAS with it). Must not hold anything but the include and its guard.
//
// Note [Third-party headers and -Werror] (CMakeLists.txt) in practice: GCC 12.0–12.2's
// avx512fintrin.h builds its "undefined" vectors by self-initialisation (`__m512 __Y = __Y;`),
// and when Eigen's AVX-512 kernels (-march=native on an AVX-512 CPU, or -march=x86-64-v4) are
// compiled, those compilers report -Wmaybe-uninitialized at that line of their own header even
// though it and Eigen arrive through -isystem, failing a -Werror build. The warning is turned
// off for the lines of Eigen's headers (and the intrinsic headers they include) only: the
// project's own code keeps every warning. GCC 12.3 fixed the header, so other compilers see a
// plain include.
#pragma once

#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12 && __GNUC_MINOR__ < 3
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <Eigen/Dense>
#pragma GCC diagnostic pop
#else
#include <Eigen/Dense>
#endif
