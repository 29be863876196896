//! Session namespaces: whose a session is.
//!
//! A server with several API keys, or requests with a `cache_salt`, keeps
//! sessions apart by scoping their ids: `\x1e<key>\x1f<salt>\x1f<id>`
//! ([`scoped_session_id`]). Client ids never hold control characters (the
//! server refuses them), so a scoped id never equals a client's own id, and
//! the parts split back unambiguously. An unscoped id belongs to the key
//! `""` (a server with one key or none).

const START: char = '\u{1e}';
const SEP: char = '\u{1f}';

/// The id under which a session of `key` (its API key's namespace; empty
/// when keys are not told apart) and `salt` is kept. Without either, the
/// client's id as it is.
pub fn scoped_session_id(key: &str, salt: Option<&str>, id: &str) -> String {
    match (key, salt) {
        ("", None) => id.to_string(),
        (key, salt) => format!("{START}{key}{SEP}{}{SEP}{id}", salt.unwrap_or("")),
    }
}

/// The client's id of a kept session.
pub fn client_session_id(scoped: &str) -> &str {
    match scoped.strip_prefix(START) {
        Some(rest) => rest.rsplit_once(SEP).map_or(rest, |(_, id)| id),
        None => scoped,
    }
}

/// The API-key namespace a kept session counts against.
pub fn session_key(scoped: &str) -> &str {
    match scoped.strip_prefix(START) {
        Some(rest) => rest.split_once(SEP).map_or("", |(key, _)| key),
        None => "",
    }
}

/// Whether a client may use `s` as a session id or salt (no control
/// characters: they delimit scoped ids).
pub fn is_valid_client_part(s: &str) -> bool {
    !s.chars().any(char::is_control)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scoped_ids_split_back_and_never_collide_with_client_ids() {
        assert_eq!(scoped_session_id("", None, "s1"), "s1");
        let a = scoped_session_id("k1", None, "s1");
        let b = scoped_session_id("k2", None, "s1");
        let c = scoped_session_id("k1", Some("salt"), "s1");
        let d = scoped_session_id("", Some("salt"), "s1");
        let all = [&a, &b, &c, &d];
        for (i, x) in all.iter().enumerate() {
            assert_eq!(client_session_id(x), "s1");
            assert!(!is_valid_client_part(x), "a scoped id is never a client id");
            for y in &all[i + 1..] {
                assert_ne!(x, y);
            }
        }
        assert_eq!((session_key(&a), session_key(&b), session_key(&c), session_key(&d)), ("k1", "k2", "k1", ""));
        assert_eq!((client_session_id("plain"), session_key("plain")), ("plain", ""));
        // A salt holding the separator still splits at the id (ids hold none).
        let odd = scoped_session_id("k", Some("a\u{1f}b"), "id");
        assert_eq!((client_session_id(&odd), session_key(&odd)), ("id", "k"));
    }
}
