//! The least squares behind the step-time model ([`super::StepModel`]):
//! normal equations solved with every coefficient kept non-negative.

/// Coefficients of the step-time model.
pub(super) const N: usize = 7;

/// The minimum of `x'Mx/2 - v'x` over `x >= 0` (`M` symmetric positive
/// definite: normal equations), by Lawson and Hanson's active-set method:
/// coefficients enter while the objective's slope favours them and leave
/// when the step towards the free subproblem's solution takes them to 0.
/// Clamping the unconstrained solution instead keeps the other
/// coefficients as fitted beside a negative one, and with features that
/// move together (a step's weights and its tokens) the prediction then
/// overshoots: on an H200 load run's steps (the test
/// `predictions_of_a_real_h200_run_are_unbiased`, in step_model.rs), the clamped fit
/// predicted mixed steps +57 % at the median (+856 % at p90), this one
/// -2 % (+44 %).
pub(super) fn solve_nonnegative(m: &[[f64; N]; N], v: &[f64; N]) -> Option<[f64; N]> {
    let scale = v.iter().map(|a| a.abs()).fold(0.0, f64::max);
    if scale == 0.0 {
        return Some([0.0; N]);
    }
    let tol = 1e-12 * scale;
    let mut x = [0.0; N];
    let mut free = [false; N];
    for _ in 0..4 * N {
        // The objective's slope downhill at x.
        let w: [f64; N] = std::array::from_fn(|i| v[i] - (0..N).map(|j| m[i][j] * x[j]).sum::<f64>());
        let Some(enter) = (0..N).filter(|&i| !free[i] && w[i] > tol).max_by(|&a, &b| w[a].total_cmp(&w[b])) else {
            return Some(x);
        };
        free[enter] = true;
        for _ in 0..N {
            let z = solve_free(m, v, &free)?;
            if (0..N).all(|i| !free[i] || z[i] > 0.0) {
                x = z;
                break;
            }
            // As far towards z as keeps x >= 0; whatever reaches 0 leaves.
            let (mut alpha, mut leave) = (f64::INFINITY, enter);
            for i in (0..N).filter(|&i| free[i] && z[i] <= 0.0) {
                let a = x[i] / (x[i] - z[i]);
                if a < alpha {
                    (alpha, leave) = (a, i);
                }
            }
            for i in 0..N {
                x[i] += alpha * (z[i] - x[i]);
                if free[i] && (i == leave || x[i] <= 0.0) {
                    free[i] = false;
                    x[i] = 0.0;
                }
            }
        }
    }
    Some(x)
}

/// The unconstrained minimum over the `free` coefficients, the others 0.
fn solve_free(m: &[[f64; N]; N], v: &[f64; N], free: &[bool; N]) -> Option<[f64; N]> {
    let mut m = *m;
    let mut v = *v;
    for i in (0..N).filter(|&i| !free[i]) {
        for j in 0..N {
            m[i][j] = 0.0;
            m[j][i] = 0.0;
        }
        m[i][i] = 1.0;
        v[i] = 0.0;
    }
    solve(m, v)
}

/// Gaussian elimination with partial pivoting; None when singular.
fn solve(mut m: [[f64; N]; N], mut v: [f64; N]) -> Option<[f64; N]> {
    for col in 0..N {
        let p = (col..N).max_by(|&a, &b| m[a][col].abs().total_cmp(&m[b][col].abs()))?;
        if m[p][col].abs() < 1e-300 {
            return None;
        }
        m.swap(col, p);
        v.swap(col, p);
        let pivot = m[col];
        for row in col + 1..N {
            let f = m[row][col] / pivot[col];
            for (x, p) in m[row].iter_mut().zip(pivot).skip(col) {
                *x -= f * p;
            }
            v[row] -= f * v[col];
        }
    }
    let mut x = [0.0; N];
    for row in (0..N).rev() {
        let s: f64 = (row + 1..N).map(|k| m[row][k] * x[k]).sum();
        x[row] = (v[row] - s) / m[row][row];
    }
    x.iter().all(|c| c.is_finite()).then_some(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic pseudo-random numbers in [0, 1).
    fn lcg(state: &mut u64) -> f64 {
        *state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (*state >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Optimality (Karush-Kuhn-Tucker) of the non-negative solution on
    /// random problems: x >= 0, the slope is 0 where x > 0 and uphill
    /// where x = 0.
    #[test]
    fn the_nonnegative_solution_is_optimal() {
        let mut rng = 7u64;
        for _ in 0..500 {
            let a: Vec<[f64; N]> = (0..10).map(|_| std::array::from_fn(|_| lcg(&mut rng) * 2.0 - 1.0)).collect();
            let mut m = [[0.0; N]; N];
            for i in 0..N {
                for j in 0..N {
                    m[i][j] = a.iter().map(|r| r[i] * r[j]).sum::<f64>() + if i == j { 1e-3 } else { 0.0 };
                }
            }
            let v: [f64; N] = std::array::from_fn(|_| lcg(&mut rng) * 2.0 - 1.0);
            let x = solve_nonnegative(&m, &v).unwrap();
            for i in 0..N {
                let g = (0..N).map(|j| m[i][j] * x[j]).sum::<f64>() - v[i];
                assert!(x[i] >= 0.0, "{x:?}");
                if x[i] > 0.0 {
                    assert!(g.abs() < 1e-9, "slope {g} at a free coefficient: {x:?}");
                } else {
                    assert!(g > -1e-9, "slope {g} downhill at a coefficient held at 0: {x:?}");
                }
            }
        }
    }
}
