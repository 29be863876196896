//! kvc's text front: what turns a request's text into token ids and token
//! ids back into text, and what constrains which tokens may come.
//!
//! [`TextTokenizer`] (the model's tokenizer, its special tokens and EOS
//! ids; the real Qwen3 one embedded), [`ChatTemplate`] (the model's chat
//! template, rendered as transformers renders it; its `tojson` and Python
//! `str()` formatting in `template_json` and `template_python`),
//! [`IncrementalDecoder`](detokenizer::IncrementalDecoder) (streamed
//! detokenization), [`StopMatcher`](stop::StopMatcher) (stop strings
//! across token boundaries), and structured outputs: [`GrammarCompiler`]
//! and [`CompiledGrammar`] (llguidance) with the per-request state that
//! advances them and masks the logits ([`constrained`]). No model, no
//! KV, no loop: `kvc-engine` runs these beside its forward pass and the
//! server's handlers call them before a request reaches it.

pub mod chat_template;
pub mod constrained;
pub mod detokenizer;
pub mod error;
pub mod grammar;
pub mod stop;
mod template_json;
mod template_python;
pub mod tokenizer;

pub use chat_template::ChatTemplate;
pub use error::TextFrontError;
pub use grammar::{CompiledGrammar, GrammarCompiler};
pub use tokenizer::TextTokenizer;
