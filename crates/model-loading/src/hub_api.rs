//! How kvc talks to the Hugging Face hub: the environment the Python hub
//! client reads ([`HubEnv`]), the HTTP client it sends with, the repository
//! listing it answers with ([`RepoInfo`], [`Sibling`]), and the reading of
//! its refusals and failures into messages that say what to do. Used by
//! [`crate::hub`] (the listing) and [`crate::hub_file`] (each transfer).

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::LoadError;

fn dl_err(msg: impl Into<String>) -> LoadError {
    LoadError::download(msg)
}

pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// The environment variables of the Python hub client.
#[derive(Clone, Default)]
pub struct HubEnv {
    pub endpoint: String,
    pub token: Option<String>,
    pub offline: bool,
    pub cache_dir: PathBuf,
}

impl std::fmt::Debug for HubEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HubEnv")
            .field("endpoint", &self.endpoint)
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .field("offline", &self.offline)
            .field("cache_dir", &self.cache_dir)
            .finish()
    }
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().map(|v| v.trim().to_string()).filter(|v| !v.is_empty())
}

/// huggingface_hub's truthy spellings of a boolean variable.
fn truthy(v: Option<String>) -> bool {
    v.is_some_and(|v| matches!(v.to_ascii_uppercase().as_str(), "1" | "ON" | "YES" | "TRUE"))
}

impl HubEnv {
    pub fn from_env() -> Self {
        let hf = hf_hub::Cache::from_env();
        let cache_dir =
            env("HF_HUB_CACHE").or_else(|| env("HUGGINGFACE_HUB_CACHE")).map(PathBuf::from).unwrap_or_else(|| hf.path().clone());
        Self {
            endpoint: env("HF_ENDPOINT").unwrap_or_else(|| DEFAULT_ENDPOINT.to_string()).trim_end_matches('/').to_string(),
            token: env("HF_TOKEN").or_else(|| env("HUGGING_FACE_HUB_TOKEN")).or_else(|| hf.token()),
            offline: truthy(env("HF_HUB_OFFLINE")),
            cache_dir,
        }
    }
}

/// One file of the repository listing (`/api/models/ID/revision/REV?blobs=true`).
#[derive(Debug, Clone, Deserialize)]
pub struct Sibling {
    pub rfilename: String,
    #[serde(default)]
    pub size: Option<u64>,
    /// Git blob sha1 of the file (of its LFS pointer for LFS files).
    #[serde(default, rename = "blobId")]
    pub blob_id: Option<String>,
    #[serde(default)]
    pub lfs: Option<LfsInfo>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct LfsInfo {
    pub sha256: String,
    pub size: u64,
}

#[derive(Debug, Clone, Deserialize)]
pub struct RepoInfo {
    pub sha: String,
    #[serde(default)]
    pub siblings: Vec<Sibling>,
}

pub(crate) fn client(env: &HubEnv) -> Result<reqwest::Client, LoadError> {
    let mut headers = reqwest::header::HeaderMap::new();
    if let Some(token) = &env.token {
        let value = reqwest::header::HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|_| dl_err("HF_TOKEN holds characters that cannot go in an HTTP header"))?;
        headers.insert(reqwest::header::AUTHORIZATION, value);
    }
    reqwest::Client::builder()
        .user_agent(concat!("kvc/", env!("CARGO_PKG_VERSION"), "; hf_hub/compatible"))
        .default_headers(headers)
        .connect_timeout(Duration::from_secs(15))
        .build()
        .map_err(|e| dl_err(format!("cannot build the HTTP client: {e}")))
}

/// Why the hub refused: huggingface_hub's reading of `X-Error-Code` and the
/// status, as one message naming what to do.
pub fn refusal(id: &str, revision: &str, status: u16, error_code: Option<&str>, hub_message: Option<&str>, has_token: bool) -> String {
    let detail = hub_message.map(|m| format!(" (hub: {m})")).unwrap_or_default();
    match (error_code, status) {
        (Some("GatedRepo"), _) if has_token => format!(
            "{id} is a gated repository and your HF_TOKEN has no access to it: accept its conditions on its hub page with \
             the account of that token{detail}"
        ),
        (Some("GatedRepo"), _) => format!(
            "{id} is a gated repository: accept its conditions on its hub page, then set HF_TOKEN to a token of that account \
             (or run `huggingface-cli login`){detail}"
        ),
        (Some("EntryNotFound"), _) => format!("{id} is not in the repository{detail}"),
        (Some("RevisionNotFound"), _) => format!("revision {revision:?} of {id} does not exist on the hub{detail}"),
        (Some("RepoNotFound"), _) | (_, 404) | (None, 401) if !has_token => {
            format!("repository {id} was not found on the hub (a typo, or a private repository: set HF_TOKEN){detail}")
        }
        (Some("RepoNotFound"), _) | (_, 404) => {
            format!("repository {id} was not found on the hub, or your HF_TOKEN cannot see it{detail}")
        }
        (_, 401) => format!("the hub rejected HF_TOKEN (401): check the token{detail}"),
        (_, 403) => format!("the hub refused access to {id} (403): your HF_TOKEN lacks the permission{detail}"),
        (_, 429) => format!("the hub is rate-limiting this host (429): retry later, or set HF_TOKEN{detail}"),
        _ => format!("the hub answered HTTP {status} for {id}{detail}"),
    }
}

pub(crate) fn header(resp: &reqwest::Response, name: &str) -> Option<String> {
    resp.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_string)
}

pub(crate) fn unreachable_hub(env: &HubEnv, e: &reqwest::Error) -> LoadError {
    let mut cause = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        cause = format!("{cause}: {s}");
        source = s.source();
    }
    dl_err(format!(
        "cannot reach the hub at {} ({cause}); check the network, proxy or HF_ENDPOINT, \
         or set HF_HUB_OFFLINE=1 to use only models already in the cache",
        env.endpoint
    ))
}
