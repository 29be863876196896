//! Where a request's reused KV came from ([`ReusePath`]), and its
//! correspondence with the reuse decision's sources.

use kvc_policy::reuse::ReuseSource;

/// Where a request's reused KV came from: the cache's own answers, and
/// (set by a prefill worker's engine) its snapshot store. Strings only at
/// the JSON edge ([`Self::as_str`], serde: the same names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReusePath {
    /// Nothing reused.
    #[default]
    Cold,
    /// The session's own KV.
    SessionHit,
    /// Blocks of the prefix index.
    PrefixHit,
    /// A prefill worker's snapshot of the session (prefill bypass).
    Bypass,
}

impl ReusePath {
    pub fn as_str(self) -> &'static str {
        match self {
            ReusePath::Cold => "cold",
            ReusePath::SessionHit => "session_hit",
            ReusePath::PrefixHit => "prefix_hit",
            ReusePath::Bypass => "bypass",
        }
    }
}

/// The reuse decision's sources ([`kvc_policy::reuse`]) are these paths.
impl From<ReuseSource> for ReusePath {
    fn from(s: ReuseSource) -> Self {
        match s {
            ReuseSource::Cold => ReusePath::Cold,
            ReuseSource::SessionHit => ReusePath::SessionHit,
            ReuseSource::PrefixHit => ReusePath::PrefixHit,
            ReuseSource::Bypass => ReusePath::Bypass,
        }
    }
}

impl From<ReusePath> for ReuseSource {
    fn from(p: ReusePath) -> Self {
        match p {
            ReusePath::Cold => ReuseSource::Cold,
            ReusePath::SessionHit => ReuseSource::SessionHit,
            ReusePath::PrefixHit => ReuseSource::PrefixHit,
            ReusePath::Bypass => ReuseSource::Bypass,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reuse_paths_and_the_reuse_decisions_sources_are_one_set_of_names() {
        for p in [ReusePath::Cold, ReusePath::SessionHit, ReusePath::PrefixHit, ReusePath::Bypass] {
            let s = ReuseSource::from(p);
            assert_eq!((s.as_str(), ReusePath::from(s)), (p.as_str(), p));
        }
    }
}
