//! JSON Lines files: written whole (atomically), appended a row at a time
//! while a run goes on, and read back.
//!
//! A row is appended with one `write` of the whole line, newline included,
//! on an unbuffered file: once [`Appender::append`] returns, the row is in
//! the kernel's hands and survives a `kill -9` of the process. A process
//! killed in the middle of that write can leave a truncated last line;
//! [`read_jsonl`] skips such a line (with a warning) rather than refuse the
//! file.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::error::{ReplayError, Result};

/// Writes `rows` to `path`, replacing it atomically (a temporary file
/// renamed over it), so a kill during the write leaves the old file or the
/// new one, never half of either.
pub fn write_jsonl<T: Serialize>(path: &Path, rows: &[T]) -> Result<()> {
    let mut out = Vec::new();
    for r in rows {
        serde_json::to_writer(&mut out, r)?;
        out.push(b'\n');
    }
    write_atomic(path, &out)
}

/// `bytes` to `path` through a temporary file renamed over it.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, bytes).map_err(|e| ReplayError::io(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| ReplayError::io(path, e))
}

/// Rows of `path`, blank lines skipped. An unparseable last line is taken
/// for a row cut by a kill mid-write: skipped with a warning on stderr. An
/// unparseable line anywhere else is an error.
pub fn read_jsonl<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Vec<T>> {
    let text = std::fs::read_to_string(path).map_err(|e| ReplayError::io(path, e))?;
    let lines: Vec<(usize, &str)> = text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()).collect();
    let mut rows = Vec::with_capacity(lines.len());
    for (k, (i, line)) in lines.iter().enumerate() {
        match serde_json::from_str(line) {
            Ok(row) => rows.push(row),
            Err(e) if k + 1 == lines.len() => {
                eprintln!("kvc-replay: warning: {}:{}: skipping the unreadable last line (cut by a kill?): {e}", path.display(), i + 1);
            }
            Err(e) => return Err(ReplayError::trace(path, i + 1, e.to_string())),
        }
    }
    Ok(rows)
}

/// A JSON Lines file written a row at a time. The file is created (empty,
/// replacing any earlier one) at the first row, or at once with
/// [`Appender::create`].
#[derive(Debug)]
pub struct Appender {
    path: PathBuf,
    file: Option<File>,
}

impl Appender {
    /// Nothing is created until the first row.
    pub fn lazy(path: &Path) -> Appender {
        Appender { path: path.to_path_buf(), file: None }
    }

    /// Creates (or empties) the file now.
    pub fn create(path: &Path) -> Result<Appender> {
        let mut a = Appender::lazy(path);
        a.open()?;
        Ok(a)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn open(&mut self) -> Result<&mut File> {
        if self.file.is_none() {
            self.file = Some(File::create(&self.path).map_err(|e| ReplayError::io(&self.path, e))?);
        }
        Ok(self.file.as_mut().expect("opened above"))
    }

    /// One line, written with a single `write_all` on the unbuffered file.
    pub fn append<T: Serialize>(&mut self, row: &T) -> Result<()> {
        let mut line = serde_json::to_vec(row)?;
        line.push(b'\n');
        let path = self.path.clone();
        self.open()?.write_all(&line).map_err(|e| ReplayError::io(&path, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("kvc-replay-unit-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn appended_rows_read_back_and_a_truncated_last_line_is_skipped() {
        let dir = scratch("jsonl-truncated");
        let path = dir.join("rows.jsonl");
        let mut a = Appender::create(&path).unwrap();
        a.append(&json!({"n": 1})).unwrap();
        a.append(&json!({"n": 2})).unwrap();
        assert_eq!(read_jsonl::<Value>(&path).unwrap(), vec![json!({"n": 1}), json!({"n": 2})]);
        // A kill in the middle of the third row's write.
        std::fs::OpenOptions::new().append(true).open(&path).unwrap().write_all(br#"{"n": 3, "na"#).unwrap();
        assert_eq!(read_jsonl::<Value>(&path).unwrap(), vec![json!({"n": 1}), json!({"n": 2})]);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn an_unreadable_line_before_the_last_is_an_error() {
        let dir = scratch("jsonl-corrupt");
        let path = dir.join("rows.jsonl");
        std::fs::write(&path, "{\"n\": 1}\n{\"n\": \n{\"n\": 3}\n\n").unwrap();
        let err = read_jsonl::<Value>(&path).unwrap_err().to_string();
        assert!(err.contains("rows.jsonl:2:"), "{err}");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_lazy_appender_creates_nothing_until_its_first_row_and_writes_replace_atomically() {
        let dir = scratch("jsonl-lazy");
        let path = dir.join("scrape.jsonl");
        let mut a = Appender::lazy(&path);
        assert!(!path.exists());
        a.append(&json!({"t": 0})).unwrap();
        assert!(path.exists());
        write_jsonl(&path, &[json!({"t": 1})]).unwrap();
        assert_eq!(read_jsonl::<Value>(&path).unwrap(), vec![json!({"t": 1})]);
        assert!(!dir.join("scrape.jsonl.tmp").exists());
        std::fs::remove_dir_all(&dir).ok();
    }
}
