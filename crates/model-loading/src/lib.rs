//! kvc's model loading before the engine starts: a `--model ORG/NAME`
//! fetched from the Hugging Face hub into the standard hub cache
//! ([`hub::resolve`]: the environment read as the Python hub client reads
//! it, the repository's files listed; [`hub_file`]: each file's transfer,
//! byte-exact resume, size and hash checks, a lock per blob), and the
//! progress of long start-up work ([`progress::Progress`]: a bar on a
//! terminal, log lines otherwise) that the download and the engine's
//! weight loading report through; and where a model comes from
//! ([`model_source`]: embedded, a directory or a hub id, resolved into a
//! checkpoint directory and its config.json). No model weights and no KV
//! here: `kvc-engine` reads the checkpoint it resolves.

pub mod error;
pub mod hub;
pub mod hub_api;
pub mod hub_file;
pub mod model_source;
pub mod progress;

pub use error::LoadError;
