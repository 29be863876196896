//! CPU products whose rows do not depend on the batch: a token's result is
//! bitwise the same whatever other tokens share the product, so a
//! sequence's logits do not depend on what else is batched with it or on
//! how its prompt was cut into chunks (a cached prefix is one such cut).
//! That is what makes a seeded request reproduce on the CPU.
//!
//! candle's CPU matmul is the `gemm` crate (0.19), which picks a kernel by
//! shape, and each kernel sums a row's products in its own order: a
//! matrix-vector kernel for one row, a dot-product kernel when rows x
//! columns <= 256, a blocked kernel with a depth block of 512 when both
//! sides are <= 64, and otherwise the blocked kernel with a depth block set
//! by the depth `k` alone. [`matmul_rows`] pads a product with too few rows
//! for the last kernel with zero rows, so every row count takes it: two
//! rows for any layer wider than 256 outputs (a decode of one sequence
//! computes one padding row), more only for narrow products (the MoE
//! router). `products_of_every_row_count_agree_bitwise` below checks the
//! claim against the linked `gemm`, so an upgrade that changes its choice
//! fails there.
//!
//! Attention is computed a query row at a time ([`crate::attention`]).

use candle_core::{Module, Result, Tensor};
use candle_nn::Linear;

/// Fewest rows for which `[rows, k] x [k, n]` takes gemm's blocked kernel
/// with a depth block that depends only on `k`.
pub fn min_rows(n: usize, k: usize) -> usize {
    // One row: matrix-vector. rows * n <= 256: dot products.
    let mut rows = 2.max(256 / n.max(1) + 1);
    if k > 512 && n <= 64 {
        // Both sides <= 64: a depth block of 512 instead of k's own.
        rows = rows.max(65);
    }
    rows
}

/// `x [m, k]` through `f` (a product with `n` output columns), with `x`
/// padded by zero rows to [`min_rows`] on the CPU; returns `f`'s first `m`
/// rows. Other devices run `f(x)` as is.
pub fn with_min_rows(x: &Tensor, n: usize, f: impl FnOnce(&Tensor) -> Result<Tensor>) -> Result<Tensor> {
    let (m, k) = x.dims2()?;
    let need = min_rows(n, k);
    if !x.device().is_cpu() || m >= need {
        return f(x);
    }
    let padded = Tensor::cat(&[x, &Tensor::zeros((need - m, k), x.dtype(), x.device())?], 0)?;
    f(&padded)?.narrow(0, 0, m)
}

/// `x [m, k] x w_t [k, n]`, each row independent of the others.
pub fn matmul_rows(x: &Tensor, w_t: &Tensor) -> Result<Tensor> {
    let n = w_t.dim(1)?;
    with_min_rows(x, n, |x| x.matmul(w_t))
}

/// A linear layer over `x [m, in]`, each row independent of the others.
pub fn linear_rows(layer: &Linear, x: &Tensor) -> Result<Tensor> {
    let n = layer.weight().dim(0)?;
    with_min_rows(x, n, |x| layer.forward(x))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Tensor};

    /// Every row count from 1 to 80 against the same rows of one 80-row
    /// product, for the shapes of the embedded model (hidden 128, KV 64,
    /// router 8, experts 256 and 128, a 151,936 vocabulary cut to 4,096
    /// columns here) and a deep narrow one (k > 512, n <= 64).
    #[test]
    fn products_of_every_row_count_agree_bitwise() {
        let dev = Device::Cpu;
        for (n, k) in [(128, 128), (64, 128), (8, 128), (256, 128), (128, 256), (4096, 128), (32, 768), (96, 1024)] {
            let x = Tensor::randn(0f32, 1.0, (80, k), &dev).unwrap();
            let w = Tensor::randn(0f32, 1.0, (n, k), &dev).unwrap();
            let all = matmul_rows(&x, &w.t().unwrap()).unwrap().to_vec2::<f32>().unwrap();
            for m in 1..=80 {
                let some = matmul_rows(&x.narrow(0, 80 - m, m).unwrap(), &w.t().unwrap()).unwrap().to_vec2::<f32>().unwrap();
                for (i, row) in some.iter().enumerate() {
                    let same = row.iter().zip(&all[80 - m + i]).all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "n {n} k {k}: row {} of {m} rows differs from the same row among 80", 80 - m + i);
                }
            }
        }
    }

    #[test]
    fn min_rows_avoids_the_small_product_kernels() {
        assert_eq!(min_rows(151_936, 128), 2);
        assert_eq!(min_rows(128, 2048), 3);
        assert_eq!(min_rows(8, 128), 33);
        assert_eq!(min_rows(8, 1024), 65);
    }
}
