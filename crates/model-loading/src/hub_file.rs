//! One file from the hub into the cache: a lock per blob, the transfer into
//! `blobs/<hash>.incomplete` (resumed byte-exactly from what an earlier,
//! interrupted run or huggingface_hub left there), the size and hash check
//! against what the hub reported (sha256 for LFS files, the git blob sha1
//! for the others), then `blobs/<hash>` and the snapshot's relative link.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use sha1::Digest as _;

use crate::hub_api::{header, refusal, unreachable_hub, HubEnv, Sibling};
use crate::progress::Progress;
use crate::LoadError;

/// Tries of one file before giving up (each resumes where the last stopped).
pub const ATTEMPTS: u32 = 5;
/// A transfer that delivers nothing for this long is dropped and resumed.
pub const STALL_TIMEOUT: Duration = Duration::from_secs(60);

/// A file as the hub's listing describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileMeta {
    pub name: String,
    pub size: Option<u64>,
    /// LFS files: the content's sha256 (also its blob name in the cache).
    pub sha256: Option<String>,
    /// Other files: the git blob sha1 (also its blob name).
    pub git_sha1: Option<String>,
}

impl FileMeta {
    pub fn from_sibling(s: &Sibling) -> Self {
        match &s.lfs {
            Some(lfs) => {
                Self { name: s.rfilename.clone(), size: Some(lfs.size), sha256: Some(lfs.sha256.to_ascii_lowercase()), git_sha1: None }
            }
            None => {
                Self { name: s.rfilename.clone(), size: s.size, sha256: None, git_sha1: s.blob_id.as_ref().map(|b| b.to_ascii_lowercase()) }
            }
        }
    }

    /// The blob's name in the cache: the hash huggingface_hub names it by
    /// (its etag), or, when the hub reported none, one derived from the name.
    pub fn blob_key(&self) -> String {
        match (&self.sha256, &self.git_sha1) {
            (Some(h), _) | (None, Some(h)) if h.len() >= 40 && h.chars().all(|c| c.is_ascii_hexdigit()) => h.clone(),
            _ => format!("unverified-{}", self.name.replace(['/', '\\'], "_")),
        }
    }
}

fn dl_err(msg: impl Into<String>) -> LoadError {
    LoadError::download(msg)
}

/// The snapshot already links this file (whole, when its size is known).
pub fn linked(snapshot: &Path, file: &FileMeta) -> bool {
    std::fs::metadata(snapshot.join(&file.name)).is_ok_and(|m| m.is_file() && file.size.is_none_or(|s| m.len() == s))
}

fn partial_path(blobs: &Path, file: &FileMeta) -> PathBuf {
    blobs.join(format!("{}.incomplete", file.blob_key()))
}

/// Bytes of the file an interrupted transfer already left.
pub fn partial_len(blobs: &Path, file: &FileMeta) -> u64 {
    std::fs::metadata(partial_path(blobs, file)).map(|m| m.len()).unwrap_or(0)
}

fn free_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: statvfs writes only the struct it is given; `c` is a valid C string.
    (unsafe { libc::statvfs(c.as_ptr(), &mut s) } == 0).then(|| s.f_bavail as u64 * s.f_frsize as u64)
}

fn gb(bytes: u64) -> String {
    format!("{:.2} GB", bytes as f64 / 1e9)
}

/// Refuses up front a download that cannot fit on the cache's disk.
pub fn check_free_space(dir: &Path, needed: u64) -> Result<(), LoadError> {
    match free_bytes(dir) {
        Some(free) if free < needed => Err(dl_err(format!(
            "disk full: the model needs {} more but only {} are free in {}; free space, or pass --download-dir on a larger disk",
            gb(needed),
            gb(free),
            dir.display()
        ))),
        _ => Ok(()),
    }
}

/// An exclusive lock on one blob (flock), so that two workers starting on
/// the same model do not write the same file; released when dropped.
struct BlobLock(std::fs::File);

impl BlobLock {
    fn acquire(path: &Path, name: &str) -> Result<Self, LoadError> {
        use std::os::fd::AsRawFd;
        let f = std::fs::File::create(path).map_err(|e| dl_err(format!("cannot create the lock {}: {e}", path.display())))?;
        // SAFETY: flock on a file descriptor this function owns.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            tracing::info!(file = name, lock = %path.display(), "another process is downloading this file: waiting for it");
            // SAFETY: as above; blocks until the other holder is done.
            if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
                return Err(dl_err(format!("cannot lock {}: {}", path.display(), std::io::Error::last_os_error())));
            }
        }
        Ok(Self(f))
    }
}

impl Drop for BlobLock {
    fn drop(&mut self) {
        use std::os::fd::AsRawFd;
        // SAFETY: unlocks the descriptor this value owns.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

/// Downloads `file` from `url` (unless another process just did), checks
/// it and links it into `snapshot`.
pub async fn fetch(
    client: &reqwest::Client,
    env: &HubEnv,
    url: &str,
    file: &FileMeta,
    blobs: &Path,
    snapshot: &Path,
) -> Result<(), LoadError> {
    let key = file.blob_key();
    let blob = blobs.join(&key);
    let _lock = BlobLock::acquire(&blobs.join(format!("{key}.lock")), &file.name)?;
    if linked(snapshot, file) {
        // Another process fetched and linked it while this one waited.
        return Ok(());
    }
    let whole = std::fs::metadata(&blob).is_ok_and(|m| file.size.is_none_or(|s| m.len() == s));
    if !whole {
        let partial = partial_path(blobs, file);
        let mut attempt = 1;
        loop {
            match transfer(client, env, url, file, &partial).await {
                Ok(()) => break,
                Err(Failure::Transient(e)) if attempt < ATTEMPTS => {
                    let wait = Duration::from_secs(1 << attempt.min(4));
                    tracing::warn!(file = %file.name, attempt, error = %e, "download interrupted: resuming in {}s", wait.as_secs());
                    tokio::time::sleep(wait).await;
                    attempt += 1;
                }
                Err(Failure::Transient(e) | Failure::Fatal(e)) => return Err(e),
            }
        }
        std::fs::rename(&partial, &blob).map_err(|e| dl_err(format!("cannot move {} into place: {e}", partial.display())))?;
    }
    link(&blob, &snapshot.join(&file.name))
}

/// Points `at` to the blob: a relative link made beside it, then renamed
/// over it, so that a reader never finds the name missing.
fn link(blob: &Path, at: &Path) -> Result<(), LoadError> {
    let target = Path::new("../../blobs").join(blob.file_name().unwrap_or_default());
    let fresh = at.with_extension(format!("link-{}", std::process::id()));
    let _ = std::fs::remove_file(&fresh);
    #[cfg(unix)]
    let made = std::os::unix::fs::symlink(&target, &fresh);
    #[cfg(not(unix))]
    let made = std::fs::hard_link(blob, &fresh);
    made.and_then(|()| std::fs::rename(&fresh, at))
        .map_err(|e| dl_err(format!("cannot link {} to {}: {e}", at.display(), target.display())))
}

enum Failure {
    /// Worth resuming (connection lost, stalled, server error).
    Transient(LoadError),
    /// Not (refused, corrupt, disk full).
    Fatal(LoadError),
}

/// The content hash the hub reported, computed as bytes arrive.
enum Hasher {
    Sha256(sha2::Sha256, String),
    GitSha1(sha1::Sha1, String),
    None,
}

impl Hasher {
    fn new(file: &FileMeta) -> Self {
        match (&file.sha256, &file.git_sha1, file.size) {
            (Some(h), _, _) => Hasher::Sha256(sha2::Sha256::new(), h.clone()),
            (None, Some(h), Some(size)) => {
                let mut s = sha1::Sha1::new();
                s.update(format!("blob {size}\0").as_bytes());
                Hasher::GitSha1(s, h.clone())
            }
            _ => Hasher::None,
        }
    }

    fn update(&mut self, bytes: &[u8]) {
        match self {
            Hasher::Sha256(h, _) => h.update(bytes),
            Hasher::GitSha1(h, _) => h.update(bytes),
            Hasher::None => {}
        }
    }

    /// (kind, expected, got) when the content does not match.
    fn mismatch(self) -> Option<(&'static str, String, String)> {
        let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
        match self {
            Hasher::Sha256(h, want) => Some(("sha256", hex(&h.finalize()), want)),
            Hasher::GitSha1(h, want) => Some(("git sha1", hex(&h.finalize()), want)),
            Hasher::None => None,
        }
        .and_then(|(kind, got, want)| (got != want).then_some((kind, want, got)))
    }
}

fn io_failure(e: std::io::Error, path: &Path, file: &FileMeta) -> Failure {
    if e.kind() == std::io::ErrorKind::StorageFull {
        Failure::Fatal(dl_err(format!(
            "disk full while writing {} ({} of {}): free space, or pass --download-dir on a larger disk; \
             the part already downloaded is kept and resumed next time",
            path.display(),
            file.name,
            file.size.map(gb).unwrap_or_else(|| "unknown size".into())
        )))
    } else {
        Failure::Fatal(dl_err(format!("cannot write {}: {e}", path.display())))
    }
}

/// One try: resume from the partial file's length, stream the rest to it,
/// then check size and hash.
async fn transfer(client: &reqwest::Client, env: &HubEnv, url: &str, file: &FileMeta, partial: &Path) -> Result<(), Failure> {
    let mut have = std::fs::metadata(partial).map(|m| m.len()).unwrap_or(0);
    if file.size.is_some_and(|s| have > s) {
        have = 0;
    }
    let mut hasher = Hasher::new(file);
    if have > 0 {
        // The hash covers the whole file: feed it what is already there.
        let mut f = std::fs::File::open(partial).map_err(|e| io_failure(e, partial, file))?;
        let mut buf = vec![0u8; 8 << 20];
        let mut left = have;
        while left > 0 {
            let want = left.min(buf.len() as u64) as usize;
            let n = f.read(&mut buf[..want]).map_err(|e| io_failure(e, partial, file))?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            left -= n as u64;
        }
    }
    let mut req = client.get(url);
    if have > 0 {
        req = req.header(reqwest::header::RANGE, format!("bytes={have}-"));
    }
    let mut resp = req.send().await.map_err(|e| Failure::Transient(unreachable_hub(env, &e)))?;
    let status = resp.status().as_u16();
    let append = match status {
        206 if have > 0 => true,
        200 => false,
        416 if Some(have) == file.size => true,
        s if s >= 500 || s == 429 => return Err(Failure::Transient(dl_err(format!("the hub answered HTTP {s} for {url}")))),
        s => {
            let (code, msg) = (header(&resp, "x-error-code"), header(&resp, "x-error-message"));
            let why = refusal(&file.name, "", s, code.as_deref(), msg.as_deref(), env.token.is_some());
            return Err(Failure::Fatal(dl_err(format!("cannot download {url}: {why}"))));
        }
    };
    if !append {
        have = 0;
        hasher = Hasher::new(file);
    }
    let total = file.size.or_else(|| resp.content_length().map(|l| l + have)).unwrap_or(0);
    let out = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .append(append)
        .truncate(!append)
        .open(partial)
        .map_err(|e| io_failure(e, partial, file))?;
    let mut out = std::io::BufWriter::with_capacity(4 << 20, out);
    let mut progress = Progress::start("download", &file.name, total, have);
    let mut got = have;
    // 416: the partial file already holds every byte; nothing to read.
    if status != 416 {
        loop {
            let chunk = match tokio::time::timeout(STALL_TIMEOUT, resp.chunk()).await {
                Ok(Ok(Some(chunk))) => chunk,
                Ok(Ok(None)) => break,
                Ok(Err(e)) => {
                    progress.abandon();
                    let _ = out.flush();
                    return Err(Failure::Transient(dl_err(format!("transfer of {} broke off after {got} bytes: {e}", file.name))));
                }
                Err(_) => {
                    progress.abandon();
                    let _ = out.flush();
                    return Err(Failure::Transient(dl_err(format!("transfer of {} stalled for {}s", file.name, STALL_TIMEOUT.as_secs()))));
                }
            };
            if let Err(e) = out.write_all(&chunk) {
                progress.abandon();
                return Err(io_failure(e, partial, file));
            }
            hasher.update(&chunk);
            got += chunk.len() as u64;
            progress.inc(chunk.len() as u64);
        }
    }
    if let Err(e) = out.flush().and_then(|()| out.get_ref().sync_all()) {
        progress.abandon();
        return Err(io_failure(e, partial, file));
    }
    if let Some(size) = file.size.filter(|s| *s != got) {
        progress.abandon();
        if got < size {
            return Err(Failure::Transient(dl_err(format!("transfer of {} ended at {got} of {size} bytes", file.name))));
        }
        let _ = std::fs::remove_file(partial);
        return Err(Failure::Fatal(dl_err(format!("{} has {got} bytes but the hub reported {size}: removed", file.name))));
    }
    if let Some((kind, want, got)) = hasher.mismatch() {
        progress.abandon();
        let _ = std::fs::remove_file(partial);
        return Err(Failure::Fatal(dl_err(format!(
            "{} is corrupt: its {kind} is {got} but the hub reported {want}; the download was removed, start again",
            file.name
        ))));
    }
    progress.finish();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn git_blob_sha1_matches_git() {
        // `printf 'hello\n' | git hash-object --stdin`
        let file =
            FileMeta { name: "x".into(), size: Some(6), sha256: None, git_sha1: Some("ce013625030ba8dba906f756967f9e9ca394464a".into()) };
        let mut h = Hasher::new(&file);
        h.update(b"hello\n");
        assert!(h.mismatch().is_none());
        let mut h = Hasher::new(&file);
        h.update(b"hellO\n");
        assert!(h.mismatch().is_some());
    }

    #[test]
    fn lfs_files_are_named_and_checked_by_sha256() {
        // sha256("abc"), FIPS 180-2's example.
        let want = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        let s: Sibling = serde_json::from_value(serde_json::json!({
            "rfilename": "model.safetensors", "size": 3, "blobId": "0000000000000000000000000000000000000000",
            "lfs": {"sha256": want, "size": 3}
        }))
        .unwrap();
        let file = FileMeta::from_sibling(&s);
        assert_eq!(file.blob_key(), want);
        let mut h = Hasher::new(&file);
        h.update(b"abc");
        assert!(h.mismatch().is_none());
        let plain = FileMeta { name: "a/b".into(), size: None, sha256: None, git_sha1: None };
        assert_eq!(plain.blob_key(), "unverified-a_b");
    }

    #[test]
    fn a_download_larger_than_the_free_space_is_refused_up_front() {
        let err = check_free_space(&std::env::temp_dir(), u64::MAX).unwrap_err().to_string();
        assert!(err.contains("disk full") && err.contains("--download-dir"), "{err}");
        assert!(check_free_space(&std::env::temp_dir(), 1).is_ok());
    }
}
