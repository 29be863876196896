//! How many tools one request may define: checked on the raw body before
//! its full parse ([`crate::openai_types`]) and again on the parsed tools
//! ([`crate::chat_messages::tool_mode`]).

use crate::error::ApiError;

/// Most tools one request may define (OpenAI's own limit).
pub const MAX_TOOLS: usize = 128;

/// At most [`MAX_TOOLS`]: each tool is rendered into the prompt and may
/// become a grammar (223K of them cost ~380 MB and a second of CPU).
pub fn check_tool_count(n: usize) -> Result<(), ApiError> {
    if n > MAX_TOOLS {
        return Err(ApiError::bad_request(format!("{n} tools given; at most {MAX_TOOLS} are accepted (OpenAI's limit)"), Some("tools")));
    }
    Ok(())
}
