//! Who may call what.
//!
//! - `--api-key` (repeatable) / `--api-key-file`: every `/v1/*` route needs
//!   `Authorization: Bearer <key>` with one of the keys
//!   (what the `openai` client sends). Without it, or with another key:
//!   401 with OpenAI's error JSON (`code: invalid_api_key`, as OpenAI
//!   answers; vLLM answers a bare `{"error": "Unauthorized"}`, which the
//!   `openai` client cannot read as an error object). `/health*` and
//!   `/metrics` stay open for probes and scrapers. The matched key's
//!   namespace ([`crate::tenant::Tenant`]) goes with the request.
//! - `--cluster-token`: the worker-to-worker router (`/internal/*`, P/D)
//!   needs header `x-kvc-cluster-token: <token>`; without a configured token
//!   those routes are off (403), so a worker is never open by accident.
//!
//! Keys are compared in constant time.

use axum::extract::{Request, State};
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::cluster_token::CLUSTER_TOKEN_HEADER;
use crate::error::ApiError;
use crate::state::AppState;
use crate::tenant::Tenant;

/// Equal-length inputs take the same time whatever they hold.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The key of an `Authorization: Bearer <key>` header.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(axum::http::header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, key) = value.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| key.trim())
}

/// The API-key decision alone (unit-testable without a server): which of
/// `keys` the request carries (None when no key is required).
pub fn check_api_key(keys: &[String], headers: &HeaderMap) -> Result<Option<usize>, ApiError> {
    if keys.is_empty() {
        return Ok(None);
    }
    let unauthorized = |message: &str| Err(ApiError::Unauthorized { message: message.to_string(), code: "invalid_api_key" });
    let Some(given) = bearer(headers) else {
        return unauthorized("You didn't provide an API key. Send it as `Authorization: Bearer <key>`.");
    };
    // Every key is compared (no early exit on a match).
    let matched =
        keys.iter().enumerate().fold(None, |m, (i, k)| if constant_time_eq(given.as_bytes(), k.as_bytes()) { Some(i) } else { m });
    match matched {
        Some(i) => Ok(Some(i)),
        None => unauthorized("Incorrect API key provided."),
    }
}

/// The cluster-token decision alone.
pub fn check_cluster_token(expected: Option<&str>, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(expected) = expected else {
        return Err(ApiError::Forbidden("internal endpoints are off: start the server with --cluster-token".into()));
    };
    let given = headers.get(CLUSTER_TOKEN_HEADER).and_then(|v| v.to_str().ok());
    match given {
        Some(t) if constant_time_eq(t.as_bytes(), expected.as_bytes()) => Ok(()),
        _ => Err(ApiError::Unauthorized { message: format!("missing or wrong {CLUSTER_TOKEN_HEADER}"), code: "invalid_cluster_token" }),
    }
}

/// Middleware for the `/v1/*` routes.
pub async fn require_api_key(State(state): State<AppState>, req: Request, next: Next) -> Response {
    admit_api_key(&state.config.api_keys, req, next).await
}

/// The `--api-key` middleware's work, on a worker and on the router alike:
/// a request with a valid key (or any, without keys) goes on with the
/// key's [`Tenant`]; else the 401.
pub async fn admit_api_key(api_keys: &[String], mut req: Request, next: Next) -> Response {
    match check_api_key(api_keys, req.headers()) {
        Ok(matched) => {
            let tenant = matched.map(|i| Tenant::of_key(api_keys, i)).unwrap_or_default();
            req.extensions_mut().insert(tenant);
            next.run(req).await
        }
        Err(e) => e.into_response(),
    }
}

/// Middleware for the worker-to-worker routes (`/internal/*`).
pub async fn require_cluster_token(State(state): State<AppState>, req: Request, next: Next) -> Response {
    match check_cluster_token(state.config.cluster_token.as_deref(), req.headers()) {
        Ok(()) => {
            // A peer that proved the token may connect to this worker's KV
            // transport from the address it called from.
            if state.backend.disagg().is_some() {
                if let Some(axum::extract::ConnectInfo(addr)) = req.extensions().get::<axum::extract::ConnectInfo<std::net::SocketAddr>>() {
                    kvc_disagg::transport::allow_peer(addr.ip());
                }
            }
            next.run(req).await
        }
        Err(e) => e.into_response(),
    }
}

/// The warning a server listening on `addr` without an API key deserves:
/// on any address but loopback, every route (generation, `DELETE
/// /v1/sessions/*`, `/reset_prefix_cache`) is open to whoever reaches it.
/// vLLM binds 0.0.0.0 by default too; the warning is the point.
pub fn exposure_warning(addr: &std::net::SocketAddr, api_key: bool) -> Option<String> {
    (!api_key && !addr.ip().is_loopback()).then(|| {
        format!(
            "listening on {} without --api-key: anyone who can reach this address can generate, read and delete \
             sessions and reset the prefix cache; pass --api-key (or KVC_API_KEY) or --host 127.0.0.1",
            addr.ip()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::error_response;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    fn status<T>(r: Result<T, ApiError>) -> u16 {
        r.map(|_| 200).unwrap_or_else(|e| error_response(&e).0.as_u16())
    }

    #[test]
    fn without_a_configured_key_everything_passes() {
        assert_eq!(check_api_key(&[], &headers(&[])).unwrap(), None);
    }

    #[test]
    fn api_key_needs_the_exact_bearer_key() {
        let key = &["s3cret".to_string()];
        assert_eq!(status(check_api_key(key, &headers(&[("authorization", "Bearer s3cret")]))), 200);
        assert_eq!(status(check_api_key(key, &headers(&[("authorization", "bearer  s3cret ")]))), 200);
        for bad in ["Bearer wrong", "Bearer s3cret2", "Basic s3cret", "s3cret", "Bearer "] {
            assert_eq!(status(check_api_key(key, &headers(&[("authorization", bad)]))), 401, "{bad}");
        }
        let err = check_api_key(key, &headers(&[])).unwrap_err();
        let (_, body) = error_response(&err);
        assert_eq!(body.error.code.as_deref(), Some("invalid_api_key"));
        assert!(body.error.message.contains("didn't provide"));
    }

    #[test]
    fn several_keys_each_pass_and_say_which_they_are() {
        let keys = ["k-one".to_string(), "k-two".to_string()];
        assert_eq!(check_api_key(&keys, &headers(&[("authorization", "Bearer k-one")])).unwrap(), Some(0));
        assert_eq!(check_api_key(&keys, &headers(&[("authorization", "Bearer k-two")])).unwrap(), Some(1));
        assert_eq!(status(check_api_key(&keys, &headers(&[("authorization", "Bearer k-three")]))), 401);
    }

    #[test]
    fn cluster_routes_are_off_without_a_token_and_need_it_when_set() {
        assert_eq!(status(check_cluster_token(None, &headers(&[(CLUSTER_TOKEN_HEADER, "x")]))), 403);
        let t = Some("tok");
        assert_eq!(status(check_cluster_token(t, &headers(&[(CLUSTER_TOKEN_HEADER, "tok")]))), 200);
        assert_eq!(status(check_cluster_token(t, &headers(&[(CLUSTER_TOKEN_HEADER, "tok2")]))), 401);
        assert_eq!(status(check_cluster_token(t, &headers(&[("authorization", "Bearer tok")]))), 401);
    }

    #[test]
    fn constant_time_eq_compares_content_and_length() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
        assert!(constant_time_eq(b"", b""));
    }

    #[test]
    fn only_a_non_loopback_address_without_a_key_is_warned_about() {
        let addr = |s: &str| s.parse::<std::net::SocketAddr>().unwrap();
        assert!(exposure_warning(&addr("0.0.0.0:8000"), false).is_some_and(|w| w.contains("--api-key")));
        assert!(exposure_warning(&addr("[::]:8000"), false).is_some());
        assert!(exposure_warning(&addr("10.1.2.3:8000"), false).is_some());
        assert!(exposure_warning(&addr("0.0.0.0:8000"), true).is_none());
        assert!(exposure_warning(&addr("127.0.0.1:8000"), false).is_none());
        assert!(exposure_warning(&addr("[::1]:8000"), false).is_none());
    }
}
