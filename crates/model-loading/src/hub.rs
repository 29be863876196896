//! `--model ORG/NAME`: the model's config, tokenizer files and safetensors
//! shards fetched from the Hugging Face hub into the standard hub cache
//! (`models--ORG--NAME/{blobs,snapshots/<commit>,refs/<revision>}`, the
//! layout huggingface_hub and hf-hub share), then served from there.
//!
//! The environment is read as the Python hub client reads it: `HF_ENDPOINT`
//! (a mirror), `HF_TOKEN` (else `HUGGING_FACE_HUB_TOKEN`, else the token
//! file `huggingface-cli login` wrote), `HF_HUB_OFFLINE` (no network: the
//! cache only), `HF_HUB_CACHE` / `HF_HOME` (where the cache is;
//! `--download-dir` overrides both).
//!
//! hf-hub gives the cache layout and the token file. Its transfer code is
//! not used: it checks no hash, resumes only whole 10 MB chunks it buffers
//! in memory (in a part-file format of its own), drops the hub's error codes
//! (a gated repository reads as a bare HTTP error) and ignores `HF_TOKEN`,
//! `HF_HUB_OFFLINE` and `HF_HUB_CACHE`. [`crate::hub_file`] does the
//! transfer with reqwest instead: byte-exact resume from huggingface_hub's
//! own `blobs/<hash>.incomplete` files, size and hash checks against what
//! the hub reports, a lock per blob so that several workers on one host can
//! start on the same model at once.

use std::path::{Path, PathBuf};

use crate::hub_api::{client, header, unreachable_hub, RepoInfo};
pub use crate::hub_api::{refusal, HubEnv, LfsInfo, Sibling, DEFAULT_ENDPOINT};
use crate::hub_file::{self, FileMeta};
use crate::LoadError;

fn dl_err(msg: impl Into<String>) -> LoadError {
    LoadError::download(msg)
}

/// What to fetch, beside the repository id.
#[derive(Debug, Clone, Default)]
pub struct HubOptions {
    /// Branch, tag or commit (default `main`).
    pub revision: Option<String>,
    /// Cache directory (`--download-dir`); default from the environment.
    pub cache_dir: Option<PathBuf>,
    /// False (`--load-format dummy`): config and tokenizer only, no weights.
    pub weights: bool,
}

/// A hub repository id: `NAME` or `ORG/NAME`, letters, digits, `-`, `_`, `.`.
pub fn is_repo_id(id: &str) -> bool {
    let parts: Vec<&str> = id.split('/').collect();
    let part_ok = |p: &&str| {
        !p.is_empty()
            && !p.starts_with(['.', '-'])
            && !p.ends_with('.')
            && !p.contains("..")
            && p.len() <= 96
            && p.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    (1..=2).contains(&parts.len()) && parts.iter().all(part_ok)
}

/// The files kvc needs from a repository: at its top level, the configs
/// and tokenizer files (`*.json`, `*.jinja`, `*.txt`, `tokenizer.model`,
/// `*.tiktoken`) and, with `weights`, the `*.safetensors` shards. Other
/// weight formats (`.bin`, `.pt`, `.gguf`, ...) and sub-folders are left.
pub fn wanted(name: &str, weights: bool) -> bool {
    if name.contains('/') {
        return false;
    }
    let ext = name.rsplit_once('.').map(|(_, e)| e).unwrap_or("");
    match ext {
        "json" | "jinja" | "txt" | "tiktoken" => true,
        "model" => name == "tokenizer.model",
        "safetensors" => weights,
        _ => false,
    }
}

fn repo_dir(cache_dir: &Path, id: &str) -> PathBuf {
    cache_dir.join(hf_hub::Repo::model(id.to_string()).folder_name())
}

/// A revision's snapshot already in the cache (refs/REV names its commit,
/// or REV is a commit), with config.json in it.
pub fn cached_snapshot(cache_dir: &Path, id: &str, revision: &str) -> Option<PathBuf> {
    let dir = repo_dir(cache_dir, id);
    let commit =
        std::fs::read_to_string(dir.join("refs").join(revision)).map(|s| s.trim().to_string()).unwrap_or_else(|_| revision.to_string());
    let snapshot = dir.join("snapshots").join(commit);
    snapshot.join("config.json").is_file().then_some(snapshot)
}

/// Resolves `id` to a local snapshot directory, downloading what is missing
/// (unless offline). Blocks: runs its own small async runtime, so call it
/// from a plain thread, not from inside a tokio runtime.
pub fn resolve(id: &str, options: &HubOptions, env: &HubEnv) -> Result<PathBuf, LoadError> {
    if !is_repo_id(id) {
        return Err(dl_err(format!(
            "model {id:?} is neither an existing directory nor a Hugging Face hub id (ORG/NAME of letters, digits, '-', '_', '.')"
        )));
    }
    let revision = options.revision.as_deref().unwrap_or("main");
    let cache_dir = options.cache_dir.clone().unwrap_or_else(|| env.cache_dir.clone());
    if env.offline {
        return cached_snapshot(&cache_dir, id, revision).ok_or_else(|| {
            dl_err(format!(
                "HF_HUB_OFFLINE is set and {id} (revision {revision}) is not in the hub cache at {}: \
                 download it once without HF_HUB_OFFLINE, or pass a local directory",
                cache_dir.display()
            ))
        });
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| dl_err(format!("cannot start the download runtime: {e}")))?;
    runtime.block_on(download(id, revision, &cache_dir, options.weights, env))
}

async fn repo_info(client: &reqwest::Client, env: &HubEnv, id: &str, revision: &str) -> Result<RepoInfo, LoadError> {
    let url = format!("{}/api/models/{id}/revision/{}?blobs=true", env.endpoint, revision.replace('/', "%2F"));
    let resp = client.get(&url).send().await.map_err(|e| unreachable_hub(env, &e))?;
    let status = resp.status().as_u16();
    if !resp.status().is_success() {
        let (code, msg) = (header(&resp, "x-error-code"), header(&resp, "x-error-message"));
        return Err(dl_err(refusal(id, revision, status, code.as_deref(), msg.as_deref(), env.token.is_some())));
    }
    resp.json::<RepoInfo>().await.map_err(|e| dl_err(format!("the hub's file listing for {id} at {url} is not what kvc expects: {e}")))
}

async fn download(id: &str, revision: &str, cache_dir: &Path, weights: bool, env: &HubEnv) -> Result<PathBuf, LoadError> {
    let client = client(env)?;
    let info = match repo_info(&client, env, id, revision).await {
        Ok(info) => info,
        // No network, but the revision is cached: use it (as huggingface_hub does).
        Err(e) if matches!(&e, LoadError::Download(m) if m.starts_with("cannot reach")) => {
            if let Some(snapshot) = cached_snapshot(cache_dir, id, revision) {
                tracing::warn!(model = id, revision, error = %e, snapshot = %snapshot.display(), "hub unreachable: using the cached snapshot");
                return Ok(snapshot);
            }
            return Err(e);
        }
        Err(e) => return Err(e),
    };
    if !info.sha.chars().all(|c| c.is_ascii_hexdigit()) || info.sha.is_empty() {
        return Err(dl_err(format!("the hub reported a malformed commit {:?} for {id}", info.sha)));
    }
    let files: Vec<FileMeta> = info.siblings.iter().filter(|s| wanted(&s.rfilename, weights)).map(FileMeta::from_sibling).collect();
    if !files.iter().any(|f| f.name == "config.json") {
        return Err(dl_err(format!("{id} (revision {revision}) has no config.json: not a transformers model repository")));
    }
    if weights && !files.iter().any(|f| f.name.ends_with(".safetensors")) {
        return Err(dl_err(format!(
            "{id} (revision {revision}) has no .safetensors weights (kvc reads only safetensors); \
             use --load-format dummy to serve its config with random weights"
        )));
    }
    let repo = repo_dir(cache_dir, id);
    let snapshot = repo.join("snapshots").join(&info.sha);
    let blobs = repo.join("blobs");
    for dir in [&snapshot, &blobs, &repo.join("refs")] {
        std::fs::create_dir_all(dir).map_err(|e| dl_err(format!("cannot create {}: {e}", dir.display())))?;
    }
    let missing: Vec<&FileMeta> = files.iter().filter(|f| !hub_file::linked(&snapshot, f)).collect();
    let needed: u64 = missing.iter().map(|f| f.size.unwrap_or(0).saturating_sub(hub_file::partial_len(&blobs, f))).sum();
    hub_file::check_free_space(&blobs, needed)?;
    tracing::info!(
        model = id, revision, commit = %info.sha, files = files.len(), to_download = missing.len(), bytes = needed,
        cache = %cache_dir.display(), "hub: resolving model"
    );
    for file in missing {
        let url = format!("{}/{id}/resolve/{}/{}", env.endpoint, info.sha, file.name);
        hub_file::fetch(&client, env, &url, file, &blobs, &snapshot).await?;
    }
    if revision != info.sha {
        let path = repo.join("refs").join(revision);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| dl_err(format!("cannot create {}: {e}", parent.display())))?;
        }
        std::fs::write(&path, &info.sha).map_err(|e| dl_err(format!("cannot write {}: {e}", path.display())))?;
    }
    Ok(snapshot)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_ids_are_told_from_paths_and_garbage() {
        for ok in ["Qwen/Qwen3-30B-A3B", "gpt2", "org_x/model.v2-1"] {
            assert!(is_repo_id(ok), "{ok}");
        }
        for bad in ["", "/abs/path", "./rel", "a/b/c", "Qwen/", "../x", "a b/c", "org/..", "org/-x"] {
            assert!(!is_repo_id(bad), "{bad}");
        }
    }

    #[test]
    fn only_configs_tokenizers_and_safetensors_are_wanted() {
        for name in [
            "config.json",
            "tokenizer.json",
            "tokenizer_config.json",
            "generation_config.json",
            "chat_template.jinja",
            "merges.txt",
            "tokenizer.model",
        ] {
            assert!(wanted(name, true) && wanted(name, false), "{name}");
        }
        assert!(wanted("model-00001-of-00002.safetensors", true));
        assert!(!wanted("model-00001-of-00002.safetensors", false));
        for name in ["pytorch_model.bin", "model.gguf", "original/consolidated.safetensors", "README.md", ".gitattributes", "x.model"] {
            assert!(!wanted(name, true), "{name}");
        }
    }

    #[test]
    fn refusals_say_what_to_do() {
        assert!(refusal("o/m", "main", 401, Some("GatedRepo"), None, false).contains("HF_TOKEN"));
        assert!(refusal("o/m", "main", 403, Some("GatedRepo"), None, true).contains("no access"));
        assert!(refusal("o/m", "main", 401, Some("RepoNotFound"), Some("Repository not found"), false).contains("not found"));
        assert!(refusal("o/m", "v9", 404, Some("RevisionNotFound"), None, false).contains("\"v9\""));
        assert!(refusal("o/m", "main", 401, None, None, true).contains("rejected"));
        assert!(refusal("o/m", "main", 500, None, None, false).contains("500"));
    }

    #[test]
    fn offline_resolution_follows_refs_and_commits() {
        let dir = std::env::temp_dir().join(format!("kvc-hub-offline-{}", std::process::id()));
        let repo = repo_dir(&dir, "o/m");
        let commit = "0123456789abcdef0123456789abcdef01234567";
        std::fs::create_dir_all(repo.join("snapshots").join(commit)).unwrap();
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        std::fs::write(repo.join("refs/main"), commit).unwrap();
        assert!(cached_snapshot(&dir, "o/m", "main").is_none(), "no config.json yet");
        std::fs::write(repo.join("snapshots").join(commit).join("config.json"), "{}").unwrap();
        assert_eq!(cached_snapshot(&dir, "o/m", "main"), Some(repo.join("snapshots").join(commit)));
        assert_eq!(cached_snapshot(&dir, "o/m", commit), Some(repo.join("snapshots").join(commit)));
        assert!(cached_snapshot(&dir, "o/m", "v2").is_none());
        let env = HubEnv { offline: true, cache_dir: dir.clone(), ..HubEnv::default() };
        let err = resolve("o/other", &HubOptions::default(), &env).unwrap_err().to_string();
        assert!(err.contains("HF_HUB_OFFLINE"), "{err}");
        assert!(resolve("o/m", &HubOptions::default(), &env).is_ok());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
