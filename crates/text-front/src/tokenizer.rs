//! Text <-> token ids, with the model's special tokens and EOS ids.
//!
//! A [`TextTokenizer`] wraps a Hugging Face `tokenizers::Tokenizer` plus the
//! bits of metadata that live next to `tokenizer.json` in a model directory:
//!
//! * `tokenizer_config.json`: `eos_token` / `bos_token` (a string, or an
//!   object `{"content": ...}`) and `chat_template` (a string, or a list of
//!   `{name, template}` of which the one named `"default"` is taken);
//! * `chat_template.jinja` (the newer HF layout; wins over the config's
//!   `chat_template` when present);
//! * `generation_config.json`: `eos_token_id` (an int or a list of ints).
//!
//! The real Qwen3 tokenizer is also shipped inside the binary
//! ([`TextTokenizer::embedded_qwen3`]).

use std::collections::HashSet;
use std::io::Read;
use std::path::Path;

use serde_json::Value;

use crate::TextFrontError;

/// gzip -9 of Qwen3's `tokenizer.json`.
static QWEN3_TOKENIZER_JSON_GZ: &[u8] = include_bytes!("../assets/qwen3/tokenizer.json.gz");
/// Qwen3's `tokenizer_config.json`, as shipped (it holds the chat template).
static QWEN3_TOKENIZER_CONFIG: &str = include_str!("../assets/qwen3/tokenizer_config.json");
/// What Qwen3 models' `generation_config.json` says about EOS: `<|im_end|>`
/// (151645) and `<|endoftext|>` (151643). Only these two keys matter here,
/// so the file itself is not shipped.
static QWEN3_GENERATION_CONFIG: &str = r#"{"eos_token_id": [151645, 151643]}"#;

pub struct TextTokenizer {
    inner: tokenizers::Tokenizer,
    /// Ids of added tokens marked `special`.
    special_ids: HashSet<u32>,
    /// generation_config's `eos_token_id`s, then tokenizer_config's
    /// `eos_token`; deduplicated.
    eos_ids: Vec<u32>,
    bos_token: Option<String>,
    eos_token: Option<String>,
    chat_template: Option<String>,
}

impl std::fmt::Debug for TextTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextTokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("eos_ids", &self.eos_ids)
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .field("has_chat_template", &self.chat_template.is_some())
            .finish()
    }
}

fn tok_err(what: &str, e: impl std::fmt::Display) -> TextFrontError {
    TextFrontError::Tokenizer(format!("{what}: {e}"))
}

fn read_optional(path: &Path) -> Result<Option<String>, TextFrontError> {
    match std::fs::read_to_string(path) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(tok_err(&path.display().to_string(), e)),
    }
}

/// `"<|im_end|>"` or `{"content": "<|im_end|>", ...}` (AddedToken form).
fn token_string(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content").and_then(Value::as_str).map(str::to_string),
        _ => None,
    }
}

/// `chat_template` is a string, or a list of `{name, template}` (take
/// `"default"`).
fn chat_template_from_config(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Array(list) => list.iter().find_map(|entry| {
            (entry.get("name").and_then(Value::as_str) == Some("default"))
                .then(|| entry.get("template").and_then(Value::as_str).map(str::to_string))
                .flatten()
        }),
        _ => None,
    }
}

/// `eos_token_id`: an int or a list of ints.
fn eos_ids_from_generation_config(v: Option<&Value>) -> Vec<u32> {
    match v {
        Some(Value::Number(n)) => n.as_u64().and_then(|n| u32::try_from(n).ok()).into_iter().collect(),
        Some(Value::Array(list)) => list.iter().filter_map(|n| n.as_u64().and_then(|n| u32::try_from(n).ok())).collect(),
        _ => Vec::new(),
    }
}

impl TextTokenizer {
    /// Loads `tokenizer.json` (and `tokenizer_config.json` /
    /// `chat_template.jinja` / `generation_config.json` when present) from a
    /// model directory.
    pub fn from_dir(dir: &Path) -> Result<Self, TextFrontError> {
        let path = dir.join("tokenizer.json");
        let inner = tokenizers::Tokenizer::from_file(&path).map_err(|e| tok_err(&path.display().to_string(), e))?;
        let tokenizer_config = read_optional(&dir.join("tokenizer_config.json"))?;
        let chat_template_jinja = read_optional(&dir.join("chat_template.jinja"))?;
        let generation_config = read_optional(&dir.join("generation_config.json"))?;
        Self::from_parts(inner, tokenizer_config.as_deref(), chat_template_jinja, generation_config.as_deref())
    }

    /// The real Qwen3 tokenizer shipped inside the binary (with its
    /// tokenizer_config.json, so chat template and EOS tokens too; the EOS
    /// ids are those of Qwen3's generation_config.json: [151645, 151643]).
    pub fn embedded_qwen3() -> Result<Self, TextFrontError> {
        let mut json = Vec::with_capacity(12 << 20);
        flate2::read::GzDecoder::new(QWEN3_TOKENIZER_JSON_GZ)
            .read_to_end(&mut json)
            .map_err(|e| tok_err("embedded tokenizer.json.gz", e))?;
        let inner = tokenizers::Tokenizer::from_bytes(&json).map_err(|e| tok_err("embedded tokenizer.json", e))?;
        Self::from_parts(inner, Some(QWEN3_TOKENIZER_CONFIG), None, Some(QWEN3_GENERATION_CONFIG))
    }

    /// Builds from an already loaded tokenizer plus the contents of the
    /// optional side files (`tokenizer_config.json`, `chat_template.jinja`,
    /// `generation_config.json`).
    pub fn from_parts(
        inner: tokenizers::Tokenizer,
        tokenizer_config: Option<&str>,
        chat_template_jinja: Option<String>,
        generation_config: Option<&str>,
    ) -> Result<Self, TextFrontError> {
        let tokenizer_config: Option<Value> =
            tokenizer_config.map(serde_json::from_str).transpose().map_err(|e| tok_err("tokenizer_config.json", e))?;
        let generation_config: Option<Value> =
            generation_config.map(serde_json::from_str).transpose().map_err(|e| tok_err("generation_config.json", e))?;

        let special_ids: HashSet<u32> =
            inner.get_added_tokens_decoder().into_iter().filter(|(_, tok)| tok.special).map(|(id, _)| id).collect();

        let cfg = tokenizer_config.as_ref();
        let eos_token = token_string(cfg.and_then(|c| c.get("eos_token")));
        let bos_token = token_string(cfg.and_then(|c| c.get("bos_token")));
        let chat_template = chat_template_jinja.or_else(|| chat_template_from_config(cfg.and_then(|c| c.get("chat_template"))));

        let mut eos_ids = eos_ids_from_generation_config(generation_config.as_ref().and_then(|g| g.get("eos_token_id")));
        if let Some(id) = eos_token.as_deref().and_then(|t| inner.token_to_id(t)) {
            eos_ids.push(id);
        }
        let mut seen = HashSet::new();
        eos_ids.retain(|id| seen.insert(*id));

        Ok(Self { inner, special_ids, eos_ids, bos_token, eos_token, chat_template })
    }

    /// The tokenizer as `tokenizer.json` text would parse (for libraries
    /// that read the vocabulary from it, such as the grammar compiler).
    pub fn to_json(&self) -> Result<Value, TextFrontError> {
        let text = self.inner.to_string(false).map_err(|e| TextFrontError::Tokenizer(e.to_string()))?;
        serde_json::from_str(&text).map_err(|e| TextFrontError::Tokenizer(e.to_string()))
    }

    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TextFrontError> {
        let enc = self.inner.encode(text, add_special_tokens).map_err(|e| TextFrontError::Tokenizer(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, TextFrontError> {
        self.inner.decode(ids, skip_special_tokens).map_err(|e| TextFrontError::Tokenizer(e.to_string()))
    }

    /// Number of ids the tokenizer knows (including added tokens).
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// True for added special tokens such as `<|im_end|>` (for Qwen3 not
    /// `<think>` or `<tool_call>`, which are added but not special).
    pub fn is_special(&self, id: u32) -> bool {
        self.special_ids.contains(&id)
    }

    /// EOS ids named by the tokenizer files: `eos_token_id` of
    /// generation_config.json first, then `eos_token` of
    /// tokenizer_config.json; deduplicated. For Qwen3: [151645, 151643].
    pub fn eos_token_ids(&self) -> Vec<u32> {
        self.eos_ids.clone()
    }

    /// The `chat_template` from tokenizer_config.json (or chat_template.jinja),
    /// or the one that replaced it ([`Self::with_chat_template`]).
    pub fn chat_template_source(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// This tokenizer with `source` as its chat template instead of the
    /// model's (`--chat-template`).
    pub fn with_chat_template(mut self, source: String) -> Self {
        self.chat_template = Some(source);
        self
    }

    /// tokenizer_config.json's `bos_token` (None for Qwen3).
    pub fn bos_token(&self) -> Option<&str> {
        self.bos_token.as_deref()
    }

    /// tokenizer_config.json's `eos_token` (`<|im_end|>` for Qwen3).
    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }

    /// The wrapped `tokenizers::Tokenizer`.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;
    use std::sync::OnceLock;

    fn qwen3() -> &'static TextTokenizer {
        static TOK: OnceLock<TextTokenizer> = OnceLock::new();
        TOK.get_or_init(|| TextTokenizer::embedded_qwen3().expect("embedded tokenizer loads"))
    }

    /// A tiny WordLevel tokenizer: "<eos>" is special, "<tool>" is added but not special.
    const TINY_TOKENIZER_JSON: &str = r#"{
      "version": "1.0", "truncation": null, "padding": null,
      "added_tokens": [
        {"id": 3, "content": "<eos>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
        {"id": 4, "content": "<tool>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": false},
        {"id": 5, "content": "<pad>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}
      ],
      "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null, "decoder": null,
      "model": {"type": "WordLevel", "vocab": {"a": 0, "b": 1, "<unk>": 2, "<eos>": 3, "<tool>": 4, "<pad>": 5}, "unk_token": "<unk>"}
    }"#;

    struct TempDir(PathBuf);
    impl TempDir {
        fn new(tag: &str) -> Self {
            static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
            let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let p = std::env::temp_dir().join(format!("kvc-tok-{tag}-{}-{n}", std::process::id()));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).unwrap();
            std::fs::write(p.join("tokenizer.json"), TINY_TOKENIZER_JSON).unwrap();
            TempDir(p)
        }
        fn write(&self, name: &str, body: &str) {
            std::fs::write(self.0.join(name), body).unwrap();
        }
    }
    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn embedded_qwen3_has_im_end_then_endoftext_as_eos() {
        let tok = qwen3();
        assert_eq!(tok.token_to_id("<|im_end|>"), Some(151645));
        assert_eq!(tok.token_to_id("<|endoftext|>"), Some(151643));
        assert_eq!(tok.eos_token_ids(), vec![151645, 151643]);
        assert_eq!(tok.eos_token(), Some("<|im_end|>"));
        assert_eq!(tok.bos_token(), None);
    }

    #[test]
    fn embedded_qwen3_special_flags_follow_added_tokens() {
        let tok = qwen3();
        assert!(tok.is_special(151643)); // <|endoftext|>
        assert!(tok.is_special(151644)); // <|im_start|>
        assert!(tok.is_special(151645)); // <|im_end|>
        assert!(!tok.is_special(151667)); // <think> is added but not special
        assert!(!tok.is_special(151657)); // <tool_call>
        let hello = tok.encode("hello", false).unwrap();
        assert!(hello.iter().all(|&id| !tok.is_special(id)));
    }

    #[test]
    fn embedded_qwen3_carries_its_chat_template() {
        let src = qwen3().chat_template_source().expect("template");
        assert!(src.contains("<|im_start|>"));
        assert!(src.contains("enable_thinking"));
    }

    #[test]
    fn embedded_qwen3_encode_decode_round_trips() {
        let tok = qwen3();
        assert_eq!(tok.vocab_size(), 151669);
        for s in ["Hello, world!", "fn main() {\n    println!(\"hi\");\n}", "你好，世界 🦀", "<think>\nx\n</think>"] {
            let ids = tok.encode(s, false).unwrap();
            assert_eq!(tok.decode(&ids, false).unwrap(), s);
        }
        let ids = tok.encode("<|im_start|>user\nhi<|im_end|>", false).unwrap();
        assert_eq!(ids[0], 151644);
        assert_eq!(*ids.last().unwrap(), 151645);
        assert_eq!(tok.decode(&ids, true).unwrap(), "user\nhi");
    }

    #[test]
    fn from_dir_without_side_files_has_no_eos_and_no_template() {
        let dir = TempDir::new("bare");
        let tok = TextTokenizer::from_dir(&dir.0).unwrap();
        assert!(tok.eos_token_ids().is_empty());
        assert!(tok.chat_template_source().is_none());
        assert!(tok.is_special(3));
        assert!(!tok.is_special(4));
        assert!(!tok.is_special(0));
    }

    #[test]
    fn from_dir_eos_is_generation_config_then_tokenizer_config_deduplicated() {
        let dir = TempDir::new("eos");
        dir.write("tokenizer_config.json", r#"{"eos_token": {"content": "<eos>", "special": true}, "chat_template": "T"}"#);
        dir.write("generation_config.json", r#"{"eos_token_id": [5, 3, 5]}"#);
        let tok = TextTokenizer::from_dir(&dir.0).unwrap();
        assert_eq!(tok.eos_token_ids(), vec![5, 3]);
        assert_eq!(tok.eos_token(), Some("<eos>"));

        let dir = TempDir::new("eos-int");
        dir.write("tokenizer_config.json", r#"{"eos_token": "<eos>"}"#);
        dir.write("generation_config.json", r#"{"eos_token_id": 5}"#);
        let tok = TextTokenizer::from_dir(&dir.0).unwrap();
        assert_eq!(tok.eos_token_ids(), vec![5, 3]);
    }

    #[test]
    fn from_dir_chat_template_list_takes_default() {
        let dir = TempDir::new("list");
        dir.write(
            "tokenizer_config.json",
            r#"{"chat_template": [{"name": "tool_use", "template": "TOOLS"}, {"name": "default", "template": "DEFAULT"}]}"#,
        );
        let tok = TextTokenizer::from_dir(&dir.0).unwrap();
        assert_eq!(tok.chat_template_source(), Some("DEFAULT"));
    }

    #[test]
    fn from_dir_chat_template_jinja_file_wins_over_config() {
        let dir = TempDir::new("jinja");
        dir.write("tokenizer_config.json", r#"{"chat_template": "FROM CONFIG"}"#);
        dir.write("chat_template.jinja", "FROM FILE");
        let tok = TextTokenizer::from_dir(&dir.0).unwrap();
        assert_eq!(tok.chat_template_source(), Some("FROM FILE"));
    }

    #[test]
    fn from_dir_malformed_side_file_is_an_error() {
        let dir = TempDir::new("bad");
        dir.write("generation_config.json", "{not json");
        assert!(matches!(TextTokenizer::from_dir(&dir.0), Err(TextFrontError::Tokenizer(_))));
    }
}
