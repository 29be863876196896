//! kvc's model loading before the engine starts: a `--model ORG/NAME`
//! fetched from the Hugging Face hub into the standard hub cache
//! ([`hub::resolve`]: the environment read as the Python hub client reads
//! it, the repository's files listed; [`hub_file`]: each file's transfer,
//! byte-exact resume, size and hash checks, a lock per blob), and the
//! progress of long start-up work ([`progress::Progress`]: a bar on a
//! terminal, log lines otherwise) that the download and the engine's
//! weight loading report through. No model and no KV here: `kvc-engine`'s
//! model source resolves a hub id with it, then reads the snapshot.

pub mod error;
pub mod hub;
pub mod hub_file;
pub mod progress;

pub use error::LoadError;
