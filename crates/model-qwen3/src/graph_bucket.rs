//! Which batch size a decode step's CUDA graph is captured for (the CUDA
//! path's graphs, cuda/graph.rs; here so that CPU builds test it).

/// The batch size a graph is captured for that runs `n` decodes: vLLM's
/// default capture sizes (1, 2, 4, then every multiple of 8), at most
/// `max_batch` (itself a bucket); None past it.
pub fn graph_bucket(n: usize, max_batch: usize) -> Option<usize> {
    if n == 0 || n > max_batch {
        return None;
    }
    let b = match n {
        1 | 2 => n,
        3 | 4 => 4,
        _ => n.div_ceil(8) * 8,
    };
    Some(b.min(max_batch))
}

#[cfg(test)]
mod tests {
    use super::graph_bucket;

    #[test]
    fn buckets_are_vllms_capture_sizes_up_to_the_limit() {
        let b = |n| graph_bucket(n, 256);
        assert_eq!([b(1), b(2), b(3), b(4), b(5), b(8), b(9), b(16), b(17)], [1, 2, 4, 4, 8, 8, 16, 16, 24].map(Some));
        assert_eq!((b(0), b(256), b(257)), (None, Some(256), None));
        // A limit that is no bucket of its own is the last one.
        assert_eq!((graph_bucket(13, 13), graph_bucket(10, 13), graph_bucket(3, 3)), (Some(13), Some(13), Some(3)));
        // Every batch fits its bucket, and padding stays under 8 rows.
        for n in 1..=256 {
            let r = b(n).unwrap();
            assert!(r >= n && r - n < 8, "{n} -> {r}");
        }
    }
}
