//! Whose a request is: its API key's namespace and its `cache_salt`,
//! which scope its session and its prefix-cache blocks.
//!
//! - **Keys.** With several API keys (`--api-key` repeated, or
//!   `--api-key-file`), each key is a namespace, named by a hash of the key
//!   (never the key). Sessions are kept per namespace: another key's
//!   session of the same id is a different session, and the session
//!   endpoints answer 404 for it. `--isolate-cache-per-key` also keeps
//!   each key's prefix-cache blocks apart. With one key or none, every
//!   client shares one namespace, as before.
//! - **`cache_salt`** (vLLM's request field): the prompt's blocks are
//!   hashed under the salt, so requests with different salts never share
//!   cached KV (no cached-token or timing side channel across salts), and
//!   sessions are kept per salt too.
//!
//! The scoped session id format lives in `kvc_session_cache::namespace`
//! (through the engine: `kvc_engine::scoped_session_id`).

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::Extensions;
use kvc_engine::{is_valid_client_part, scoped_session_id};

use crate::error::ApiError;

/// Longest accepted `cache_salt`.
pub const MAX_CACHE_SALT_LEN: usize = 1024;

/// The caller's API-key namespace, set by the API-key middleware (empty
/// when keys are not told apart).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tenant {
    pub key: String,
}

/// A handler's caller: the tenant the middleware set, or the shared
/// namespace where none ran.
impl<S: Send + Sync> FromRequestParts<S> for Tenant {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        Ok(Tenant::of_request(&parts.extensions))
    }
}

impl Tenant {
    /// The tenant a request's extensions hold (the API-key middleware's),
    /// else the shared namespace.
    pub fn of_request(extensions: &Extensions) -> Self {
        extensions.get::<Tenant>().cloned().unwrap_or_default()
    }

    /// The namespace of the `index`-th of `keys` (empty when there is only
    /// one key or none: nothing to tell apart).
    pub fn of_key(keys: &[String], index: usize) -> Self {
        if keys.len() < 2 {
            return Self::default();
        }
        let hash = blake3::hash(keys[index].as_bytes()).to_hex();
        Self { key: hash[..16].to_string() }
    }

    /// The id the engine keeps the client's session `id` under (with this
    /// request's salt).
    pub fn session(&self, salt: Option<&str>, id: &str) -> String {
        scoped_session_id(&self.key, salt, id)
    }

    /// The salt the prompt's blocks are hashed under: the request's salt
    /// and, with `isolate` (`--isolate-cache-per-key`), the key's namespace.
    pub fn cache_salt(&self, isolate: bool, salt: Option<&str>) -> Option<String> {
        let key = if isolate { self.key.as_str() } else { "" };
        match (key, salt) {
            ("", None) => None,
            (key, salt) => Some(format!("{key}\u{1f}{}", salt.unwrap_or(""))),
        }
    }
}

/// A request's `cache_salt`, checked: a non-empty string of at most
/// [`MAX_CACHE_SALT_LEN`] bytes without control characters (as vLLM, which
/// refuses an empty one).
pub fn check_cache_salt(salt: Option<&str>) -> Result<Option<&str>, ApiError> {
    match salt {
        None => Ok(None),
        Some(s) if s.is_empty() || s.len() > MAX_CACHE_SALT_LEN || !is_valid_client_part(s) => Err(ApiError::bad_request(
            format!("cache_salt must be a non-empty string of at most {MAX_CACHE_SALT_LEN} bytes without control characters"),
            Some("cache_salt"),
        )),
        Some(s) => Ok(Some(s)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_namespaces_only_when_there_are_several() {
        let one = vec!["k1".to_string()];
        let two = vec!["k1".to_string(), "k2".to_string()];
        assert_eq!(Tenant::of_key(&one, 0), Tenant::default());
        let (a, b) = (Tenant::of_key(&two, 0), Tenant::of_key(&two, 1));
        assert_ne!(a, b);
        assert!(!a.key.contains("k1"), "the namespace never shows the key");
        assert_eq!(a, Tenant::of_key(&["x".to_string(), "k1".to_string()], 1), "named by the key, not its position");
        assert_ne!(a.session(None, "s"), b.session(None, "s"));
        assert_ne!(a.session(Some("x"), "s"), a.session(None, "s"));
        assert_eq!(Tenant::default().session(None, "s"), "s");
    }

    #[test]
    fn the_cache_salt_combines_the_request_salt_and_an_isolated_key() {
        let t = Tenant { key: "abc".into() };
        assert_eq!(t.cache_salt(false, None), None);
        assert_eq!(Tenant::default().cache_salt(true, None), None);
        let salts = [t.cache_salt(true, None), t.cache_salt(false, Some("s")), t.cache_salt(true, Some("s"))];
        assert!(salts.iter().all(Option::is_some));
        assert!(salts[0] != salts[1] && salts[1] != salts[2] && salts[0] != salts[2]);
        assert_eq!(
            t.cache_salt(false, Some("s")),
            Tenant::default().cache_salt(true, Some("s")),
            "without isolation the key plays no part"
        );
    }

    #[test]
    fn cache_salts_are_checked() {
        assert_eq!(check_cache_salt(None).unwrap(), None);
        assert_eq!(check_cache_salt(Some("tenant-1")).unwrap(), Some("tenant-1"));
        for bad in ["", "a\u{1f}b", &"x".repeat(MAX_CACHE_SALT_LEN + 1)] {
            assert!(check_cache_salt(Some(bad)).is_err(), "{bad:?}");
        }
    }
}
