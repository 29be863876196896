//! sampler (stub)
