//! Validation of the OpenAI sampling fields and their mapping onto the
//! engine's [`SamplingParams`].

use kvc_engine::SamplingParams;

use crate::error::ApiError;
use crate::openai_types::SamplingFields;
use crate::sse::StreamUsage;

/// OpenAI's limit on the number of stop strings.
pub const MAX_STOP_STRINGS: usize = 4;

/// Most choices per request (OpenAI's limit for `n`).
pub const MAX_N: i64 = 128;

/// Most entries in `logit_bias` / `stop_token_ids` (each is checked on
/// every generated token).
pub const MAX_TOKEN_LIST: usize = 1024;

/// What `max_tokens` means when the request leaves it out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DefaultMaxTokens {
    /// The rest of the context (vLLM's chat default).
    RestOfContext,
    /// A fixed count (OpenAI's and vLLM's completions default is 16).
    Fixed(usize),
}

/// Validated sampling fields of one request; `max_tokens` is settled once
/// the prompt length is known ([`SamplingPlan::params_for`]).
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingPlan {
    params: SamplingParams,
    max_tokens: Option<usize>,
    /// Choices to generate (`n`).
    pub n: usize,
    pub stream: bool,
    /// Which chunks of a stream carry `usage` (`stream_options`).
    pub include_usage: StreamUsage,
}

impl SamplingPlan {
    /// Checks every field (the error names the offending one) and maps them.
    /// `max_tokens` is the already-chosen limit field: `(value, field name)`.
    pub fn new(f: &SamplingFields, max_tokens: Option<(i64, &str)>, vocab_size: usize) -> Result<Self, ApiError> {
        let n = match f.n {
            None => 1,
            Some(n) if (1..=MAX_N).contains(&n) => n as usize,
            Some(n) => return Err(ApiError::bad_request(format!("n must be between 1 and {MAX_N}, got {n}"), Some("n"))),
        };
        let max_tokens = match max_tokens {
            None => None,
            Some((v, name)) if v < 1 => return Err(ApiError::bad_request(format!("{name} must be at least 1, got {v}"), Some(name))),
            Some((v, name)) => Some(usize::try_from(v).map_err(|_| ApiError::bad_request(format!("{name} is too large"), Some(name)))?),
        };
        let top_k = match f.top_k {
            None | Some(-1) | Some(0) => 0,
            Some(k) if k < -1 => {
                return Err(ApiError::bad_request(format!("top_k must be -1 (disable) or at least 1, got {k}"), Some("top_k")))
            }
            Some(k) => usize::try_from(k).unwrap_or(usize::MAX),
        };
        let stop: Vec<String> = f.stop.clone().map(|s| s.into_vec()).unwrap_or_default().into_iter().filter(|s| !s.is_empty()).collect();
        if stop.len() > MAX_STOP_STRINGS {
            return Err(ApiError::bad_request(
                format!("at most {MAX_STOP_STRINGS} stop strings are allowed, got {}", stop.len()),
                Some("stop"),
            ));
        }
        let stop_token_ids = f.stop_token_ids.clone().unwrap_or_default();
        if stop_token_ids.len() > MAX_TOKEN_LIST {
            return Err(ApiError::bad_request(
                format!("at most {MAX_TOKEN_LIST} stop_token_ids are allowed, got {}", stop_token_ids.len()),
                Some("stop_token_ids"),
            ));
        }
        if let Some(&t) = stop_token_ids.iter().find(|&&t| t as usize >= vocab_size) {
            return Err(ApiError::bad_request(
                format!("stop token id {t} is out of range: the model's vocabulary has {vocab_size} tokens"),
                Some("stop_token_ids"),
            ));
        }
        let logit_bias = parse_logit_bias(f, vocab_size)?;
        let stream = f.stream.unwrap_or(false);
        if f.stream_options.is_some() && !stream {
            return Err(ApiError::bad_request("stream_options is only allowed when stream is true", Some("stream_options")));
        }
        let include_usage = match &f.stream_options {
            Some(o) if o.include_usage == Some(true) && o.continuous_usage_stats == Some(true) => StreamUsage::Continuous,
            Some(o) if o.include_usage == Some(true) => StreamUsage::Final,
            _ => StreamUsage::Off,
        };
        let min_tokens = match f.min_tokens {
            None => 0,
            Some(m) if m < 0 => return Err(ApiError::bad_request(format!("min_tokens must be at least 0, got {m}"), Some("min_tokens"))),
            Some(m) => usize::try_from(m).unwrap_or(usize::MAX),
        };
        let defaults = SamplingParams::default();
        let params = SamplingParams {
            temperature: f.temperature.unwrap_or(defaults.temperature),
            top_p: f.top_p.unwrap_or(defaults.top_p),
            top_k,
            min_p: f.min_p.unwrap_or(defaults.min_p),
            seed: f.seed.map(|s| s as u64),
            frequency_penalty: f.frequency_penalty.unwrap_or(defaults.frequency_penalty),
            presence_penalty: f.presence_penalty.unwrap_or(defaults.presence_penalty),
            repetition_penalty: f.repetition_penalty.unwrap_or(defaults.repetition_penalty),
            // Without an explicit limit min_tokens is checked against the
            // one settled with the prompt (by the engine).
            max_tokens: max_tokens.unwrap_or(min_tokens.max(1)),
            min_tokens,
            stop_token_ids,
            stop,
            ignore_eos: f.ignore_eos.unwrap_or(false),
            logprobs: None,
            prompt_logprobs: None,
            logit_bias,
            skip_special_tokens: f.skip_special_tokens.unwrap_or(true),
            constraint: None,
        };
        params.validate().map_err(|e| ApiError::BadRequest { message: e.message, param: Some(e.param) })?;
        Ok(Self { params, max_tokens, n, stream, include_usage })
    }

    /// Asks the engine for logprobs with `top` alternatives per token.
    pub fn set_logprobs(&mut self, top: Option<usize>) {
        self.params.logprobs = top;
    }

    /// `max_tokens: 0` (completions with `echo`): the prompt is computed
    /// and scored, nothing generated. The caller has checked the field.
    pub fn set_score_only(&mut self) {
        self.max_tokens = Some(0);
    }

    /// The engine's parameters for a prompt of `prompt_len` tokens. Without
    /// an explicit `max_tokens`, the default is capped to the context left;
    /// a prompt that fills the context keeps 1 so that the engine reports
    /// it as too long.
    pub fn params_for(&self, prompt_len: usize, max_model_len: usize, default: DefaultMaxTokens) -> SamplingParams {
        let rest = max_model_len.saturating_sub(prompt_len).max(1);
        let max_tokens = match (self.max_tokens, default) {
            (Some(m), _) => m,
            (None, DefaultMaxTokens::RestOfContext) => rest,
            (None, DefaultMaxTokens::Fixed(n)) => n.min(rest),
        };
        SamplingParams { max_tokens, ..self.params.clone() }
    }
}

fn parse_logit_bias(f: &SamplingFields, vocab_size: usize) -> Result<Vec<(u32, f32)>, ApiError> {
    let Some(map) = &f.logit_bias else {
        return Ok(Vec::new());
    };
    let bad = |msg: String| ApiError::bad_request(msg, Some("logit_bias"));
    if map.len() > MAX_TOKEN_LIST {
        return Err(bad(format!("logit_bias may hold at most {MAX_TOKEN_LIST} tokens, got {}", map.len())));
    }
    map.iter()
        .map(|(k, v)| {
            let id: u32 = k.trim().parse().map_err(|_| bad(format!("logit_bias key {k:?} is not a token id")))?;
            if id as usize >= vocab_size {
                return Err(bad(format!("logit_bias token id {id} is out of range: the vocabulary has {vocab_size} tokens")));
            }
            let bias = v.as_f64().ok_or_else(|| bad(format!("logit_bias value for {id} is not a number")))?;
            if !(-100.0..=100.0).contains(&bias) {
                return Err(bad(format!("logit_bias values must be in [-100, 100], got {bias}")));
            }
            Ok((id, bias as f32))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::error_response;
    use serde_json::json;

    const VOCAB: usize = 1000;

    fn fields(v: serde_json::Value) -> SamplingFields {
        serde_json::from_value(v).unwrap()
    }

    fn plan(v: serde_json::Value) -> Result<SamplingPlan, ApiError> {
        let f = fields(v);
        let mt = f.max_tokens.map(|m| (m, "max_tokens"));
        SamplingPlan::new(&f, mt, VOCAB)
    }

    fn rejected_param(v: serde_json::Value) -> String {
        let err = plan(v.clone()).expect_err(&format!("{v} should be rejected"));
        let (status, body) = error_response(&err);
        assert_eq!(status.as_u16(), 400, "{v}");
        body.error.param.unwrap_or_default()
    }

    #[test]
    fn fields_map_onto_engine_params() {
        let p = plan(json!({
            "temperature": 0.5, "top_p": 0.9, "top_k": 40, "min_p": 0.1, "seed": 42,
            "frequency_penalty": 0.5, "presence_penalty": -0.5, "repetition_penalty": 1.1,
            "stop": ["a", ""], "stop_token_ids": [7], "ignore_eos": true, "max_tokens": 9,
            "logit_bias": {"5": -100}, "skip_special_tokens": false
        }))
        .unwrap();
        let s = p.params_for(10, 100, DefaultMaxTokens::RestOfContext);
        assert_eq!(s.temperature, 0.5);
        assert_eq!(s.top_p, 0.9);
        assert_eq!(s.top_k, 40);
        assert_eq!(s.seed, Some(42));
        assert_eq!(s.stop, vec!["a".to_string()]);
        assert_eq!(s.stop_token_ids, vec![7]);
        assert!(s.ignore_eos);
        assert!(!s.skip_special_tokens);
        assert_eq!(s.max_tokens, 9);
        assert_eq!(s.logit_bias, vec![(5, -100.0)]);
    }

    #[test]
    fn missing_max_tokens_defaults_to_rest_of_context_or_fixed() {
        let p = plan(json!({})).unwrap();
        assert_eq!(p.params_for(30, 100, DefaultMaxTokens::RestOfContext).max_tokens, 70);
        assert_eq!(p.params_for(30, 100, DefaultMaxTokens::Fixed(16)).max_tokens, 16);
        assert_eq!(p.params_for(95, 100, DefaultMaxTokens::Fixed(16)).max_tokens, 5);
        // A prompt that fills the context keeps 1 so the engine reports it.
        assert_eq!(p.params_for(100, 100, DefaultMaxTokens::RestOfContext).max_tokens, 1);
        assert_eq!(p.params_for(10, 100, DefaultMaxTokens::RestOfContext).temperature, 1.0);
    }

    #[test]
    fn non_positive_max_tokens_is_rejected_naming_the_field() {
        assert_eq!(rejected_param(json!({"max_tokens": 0})), "max_tokens");
        assert_eq!(rejected_param(json!({"max_tokens": -5})), "max_tokens");
        let f = fields(json!({}));
        let err = SamplingPlan::new(&f, Some((0, "max_completion_tokens")), VOCAB).unwrap_err();
        assert_eq!(error_response(&err).1.error.param.as_deref(), Some("max_completion_tokens"));
    }

    #[test]
    fn out_of_range_sampling_values_are_rejected() {
        // OpenAI's range, [0, 2].
        assert_eq!(rejected_param(json!({"temperature": -0.1})), "temperature");
        assert_eq!(rejected_param(json!({"temperature": 2.5})), "temperature");
        let msg = error_response(&plan(json!({"temperature": 1e308})).unwrap_err()).1.error.message;
        assert!(msg.contains("[0, 2]"), "{msg}");
        assert!(plan(json!({"temperature": 2})).is_ok() && plan(json!({"temperature": 0})).is_ok());
        assert_eq!(rejected_param(json!({"top_p": 0})), "top_p");
        assert_eq!(rejected_param(json!({"top_p": 1.5})), "top_p");
        assert_eq!(rejected_param(json!({"top_k": -2})), "top_k");
        assert_eq!(rejected_param(json!({"min_p": 2})), "min_p");
        assert_eq!(rejected_param(json!({"presence_penalty": 3})), "presence_penalty");
        assert_eq!(rejected_param(json!({"repetition_penalty": 0})), "repetition_penalty");
        assert_eq!(rejected_param(json!({"stop_token_ids": [VOCAB]})), "stop_token_ids");
        assert_eq!(rejected_param(json!({"logit_bias": {"x": 1}})), "logit_bias");
        assert_eq!(rejected_param(json!({"logit_bias": {"3": 101}})), "logit_bias");
    }

    #[test]
    fn top_k_minus_one_and_zero_disable_it() {
        for k in [-1, 0] {
            assert_eq!(plan(json!({"top_k": k})).unwrap().params_for(1, 10, DefaultMaxTokens::Fixed(1)).top_k, 0);
        }
    }

    #[test]
    fn more_than_four_stop_strings_are_rejected() {
        assert!(plan(json!({"stop": ["a", "b", "c", "d"]})).is_ok());
        assert_eq!(rejected_param(json!({"stop": ["a", "b", "c", "d", "e"]})), "stop");
    }

    #[test]
    fn n_is_bounded_to_one_to_128() {
        assert_eq!(plan(json!({})).unwrap().n, 1);
        assert_eq!(plan(json!({"n": 3})).unwrap().n, 3);
        assert_eq!(plan(json!({"n": 128})).unwrap().n, 128);
        for bad in [0, -1, 129, 1_000_000_000] {
            assert_eq!(rejected_param(json!({"n": bad})), "n");
        }
    }

    #[test]
    fn token_lists_are_bounded() {
        let ids: Vec<u32> = (0..(MAX_TOKEN_LIST as u32 + 1)).map(|i| i % VOCAB as u32).collect();
        assert_eq!(rejected_param(json!({"stop_token_ids": ids})), "stop_token_ids");
        let bias: serde_json::Map<String, serde_json::Value> = (0..=MAX_TOKEN_LIST).map(|i| (i.to_string(), json!(1))).collect();
        let mut f = fields(json!({}));
        f.logit_bias = Some(bias);
        let err = SamplingPlan::new(&f, None, 1 << 20).unwrap_err();
        assert_eq!(error_response(&err).1.error.param.as_deref(), Some("logit_bias"));
    }

    #[test]
    fn stream_options_need_stream() {
        assert_eq!(rejected_param(json!({"stream_options": {"include_usage": true}})), "stream_options");
        let p = plan(json!({"stream": true, "stream_options": {"include_usage": true}})).unwrap();
        assert!(p.stream && p.include_usage == StreamUsage::Final);
        let p = plan(json!({"stream": true})).unwrap();
        assert!(p.stream && p.include_usage == StreamUsage::Off);
        // Like vLLM, continuous usage only with include_usage.
        let p = plan(json!({"stream": true, "stream_options": {"include_usage": true, "continuous_usage_stats": true}})).unwrap();
        assert_eq!(p.include_usage, StreamUsage::Continuous);
        let p = plan(json!({"stream": true, "stream_options": {"continuous_usage_stats": true}})).unwrap();
        assert_eq!(p.include_usage, StreamUsage::Off);
    }

    #[test]
    fn min_tokens_maps_and_may_not_exceed_max_tokens() {
        let p = plan(json!({"min_tokens": 4, "max_tokens": 4})).unwrap();
        assert_eq!(p.params_for(1, 100, DefaultMaxTokens::Fixed(16)).min_tokens, 4);
        assert_eq!(rejected_param(json!({"min_tokens": 5, "max_tokens": 4})), "min_tokens");
        assert_eq!(rejected_param(json!({"min_tokens": -1})), "min_tokens");
        // Without max_tokens the limit is settled with the prompt; the
        // engine checks min_tokens against it.
        let p = plan(json!({"min_tokens": 20})).unwrap().params_for(1, 100, DefaultMaxTokens::Fixed(16));
        assert_eq!(p.validate().unwrap_err().param, "min_tokens");
    }
}
