//! Session endpoints: `GET/DELETE /v1/sessions/{id}`, the admission probe
//! `POST /v1/admission`, and vLLM's `POST /reset_prefix_cache`.
//! Reads come from the engine's published snapshot; only DELETE and reset
//! enter the step loop (as commands).

use axum::extract::{FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use kvc_engine::{AdmissionDecision, AdmissionQuery, SessionInfo};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::extract::{parse_json, JsonBody, OpenAiJson};
use crate::state::AppState;
use crate::tenant::{check_cache_salt, Tenant};
use kvc_engine::{client_session_id, is_valid_client_part};

/// The header naming a request's session when the body does not.
pub const SESSION_HEADER: &str = "x-session-id";

/// Longest accepted session id.
pub const MAX_SESSION_ID_LEN: usize = 256;

/// The session of a request: the body's `session_id`, else the
/// `x-session-id` header; matched exactly, never by prefix.
pub fn session_id(body: Option<&str>, headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let from_header = headers.get(SESSION_HEADER).map(|v| {
        v.to_str().map(str::to_string).map_err(|_| ApiError::bad_request("x-session-id must be visible ASCII", Some("session_id")))
    });
    let id = match (body, from_header) {
        (Some(b), _) => Some(b.to_string()),
        (None, Some(h)) => Some(h?),
        (None, None) => None,
    };
    match id {
        Some(id) if id.is_empty() || id.len() > MAX_SESSION_ID_LEN || !is_valid_client_part(&id) => Err(ApiError::bad_request(
            format!("session_id must be 1 to {MAX_SESSION_ID_LEN} bytes long, without control characters"),
            Some("session_id"),
        )),
        other => Ok(other),
    }
}

/// A request's session (the engine's id for it: [`session_id`] scoped by
/// the caller's key and salt) and the salt its prompt's cached blocks are
/// hashed under; the session is dropped when the server keeps no session
/// KV (`--no-enable-session-cache`).
pub fn request_scope(
    state: &AppState,
    tenant: &Tenant,
    body: Option<&str>,
    salt: Option<&str>,
    headers: &HeaderMap,
) -> Result<(Option<String>, Option<String>), ApiError> {
    let salt = check_cache_salt(salt)?;
    let id = session_id(body, headers)?.filter(|_| state.config.enable_session_cache);
    Ok((id.map(|id| tenant.session(salt, &id)), tenant.cache_salt(state.config.isolate_cache_per_key, salt)))
}

/// The engine's id of the caller's session `id` (404 for a malformed one:
/// no such session can exist). The router keys sessions by the same id, so
/// that it finds them in the workers' published state.
pub fn scoped(tenant: &Tenant, salt: Option<&str>, id: &str) -> Result<String, ApiError> {
    let salt = check_cache_salt(salt)?;
    if !is_valid_client_part(id) {
        return Err(not_found(id));
    }
    Ok(tenant.session(salt, id))
}

/// `?cache_salt=` on the session endpoints: the salt the session was kept under.
#[derive(Debug, Default, Deserialize)]
pub struct SaltQuery {
    pub cache_salt: Option<String>,
}

/// The caller's session that a session endpoint's path names
/// (`/v1/sessions/{id}`, `?cache_salt=`), with the key the engine and the
/// router keep it under ([`scoped`]: a malformed id is a 404).
#[derive(Debug, Clone)]
pub struct SessionPath {
    /// The id as the client wrote it.
    pub id: String,
    pub salt: Option<String>,
    pub key: String,
}

impl<S: Send + Sync> FromRequestParts<S> for SessionPath {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Response> {
        let Path(id) = Path::<String>::from_request_parts(parts, state).await.map_err(IntoResponse::into_response)?;
        let Query(q) = Query::<SaltQuery>::from_request_parts(parts, state).await.map_err(IntoResponse::into_response)?;
        let key = scoped(&Tenant::of_request(&parts.extensions), q.cache_salt.as_deref(), &id).map_err(IntoResponse::into_response)?;
        Ok(Self { id, salt: q.cache_salt, key })
    }
}

fn not_found(id: &str) -> ApiError {
    ApiError::SessionNotFound { id: id.to_string() }
}

fn session_json(s: &SessionInfo) -> Value {
    json!({
        "id": client_session_id(&s.id),
        "object": "session",
        "resident_tokens": s.resident_tokens,
        "tier": s.tier,
        "device_blocks": s.device_blocks,
        "host_blocks": s.host_blocks,
        "turns": s.turns,
        "last_used_s_ago": s.idle_s(),
        "busy": s.busy,
    })
}

pub async fn get_session(State(state): State<AppState>, session: SessionPath) -> Result<Json<Value>, ApiError> {
    let snap = state.engine.snapshot();
    snap.sessions.get(&session.key).map(|s| Json(session_json(s))).ok_or_else(|| not_found(&session.id))
}

pub async fn delete_session(State(state): State<AppState>, session: SessionPath) -> Result<Json<Value>, ApiError> {
    let SessionPath { id, key, .. } = session;
    let deleted = state.engine.delete_session(&key).await.map_err(|e| ApiError::Unavailable(e.to_string()))?;
    if deleted {
        Ok(Json(json!({"id": id, "object": "session", "deleted": true})))
    } else {
        Err(not_found(&id))
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdmissionRequest {
    #[serde(default)]
    pub session_id: Option<String>,
    /// The salt the session was kept under.
    #[serde(default)]
    pub cache_salt: Option<String>,
    /// The prompt's token ids ...
    #[serde(default)]
    pub prompt_token_ids: Option<Vec<u32>>,
    /// ... or only their number.
    #[serde(default)]
    pub prompt_tokens: Option<usize>,
}

impl JsonBody for AdmissionRequest {
    fn parse(bytes: &[u8]) -> Result<Self, ApiError> {
        parse_json(bytes)
    }
}

pub async fn admission(
    State(state): State<AppState>,
    tenant: Tenant,
    OpenAiJson(req): OpenAiJson<AdmissionRequest>,
) -> Result<Json<AdmissionDecision>, ApiError> {
    let session = req.session_id.as_deref().map(|id| scoped(&tenant, req.cache_salt.as_deref(), id)).transpose()?;
    let prompt_tokens = match (&req.prompt_token_ids, req.prompt_tokens) {
        (Some(ids), _) => ids.len(),
        (None, Some(n)) => n,
        (None, None) => return Err(ApiError::bad_request("give prompt_token_ids or prompt_tokens", Some("prompt_tokens"))),
    };
    if prompt_tokens == 0 {
        return Err(ApiError::bad_request("the prompt must have at least one token", Some("prompt_tokens")));
    }
    // A session the caller's key does not hold is a 404, as to GET: the
    // same answer whether another key holds that id or nobody does, so the
    // probe reveals no other tenant's session. A first turn is probed
    // without `session_id` (nothing of it is resident yet).
    if let (Some(key), Some(id)) = (session.as_deref(), req.session_id.as_deref()) {
        if !state.engine.snapshot().sessions.contains_key(key) {
            return Err(not_found(id));
        }
    }
    let decision = state.engine.admission(&AdmissionQuery { session_id: session.as_deref(), prompt_tokens });
    tracing::info!(event = "admission", session = ?req.session_id, prompt_tokens, can_admit = decision.can_admit, reason = decision.reason.as_str());
    Ok(Json(decision))
}

/// `POST /reset_prefix_cache`. It flushes every tenant's cached prefixes
/// and reports the cache's size: with several API keys (tenants) it is an
/// operator's call and needs the cluster token as well; with one key or
/// none it is open as in vLLM.
pub async fn reset_prefix_cache(State(state): State<AppState>, headers: HeaderMap) -> Result<Json<Value>, ApiError> {
    if state.config.api_keys.len() > 1 {
        crate::auth::check_cluster_token(state.config.cluster_token.as_deref(), &headers).map_err(|_| {
            ApiError::Forbidden(format!(
                "with several API keys, /reset_prefix_cache flushes every tenant's cache: it needs the cluster token \
                 ({}) too",
                crate::cluster_token::CLUSTER_TOKEN_HEADER
            ))
        })?;
    }
    let r = state.engine.reset_prefix_cache().await.map_err(|e| ApiError::Unavailable(e.to_string()))?;
    let mut body = json!({
        "reset": true,
        "blocks_released": r.freed_blocks,
        "index_blocks_dropped": r.index_blocks,
        "snapshot_blocks_kept": r.snapshot_blocks,
    });
    if r.snapshot_blocks > 0 {
        body["note"] = json!("the snapshot store keeps its blocks; DELETE /v1/sessions/{id} removes a session's snapshot");
    }
    Ok(Json(body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_session_id_wins_over_the_header_and_ids_are_kept_verbatim() {
        let mut h = HeaderMap::new();
        h.insert(SESSION_HEADER, "from-header".parse().unwrap());
        assert_eq!(session_id(Some("session-1"), &h).unwrap().as_deref(), Some("session-1"));
        assert_eq!(session_id(None, &h).unwrap().as_deref(), Some("from-header"));
        assert_eq!(session_id(None, &HeaderMap::new()).unwrap(), None);
        assert!(session_id(Some(""), &h).is_err());
        assert!(session_id(Some(&"x".repeat(300)), &h).is_err());
    }
}
