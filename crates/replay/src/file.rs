//! Writing a whole file at once, its path in the error.

use std::path::Path;

use crate::error::{ReplayError, Result};

pub fn write_file(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(|e| ReplayError::io(path, e))
}
