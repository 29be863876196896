//! What changed since a published copy was last brought up to date: the
//! ids a structure touched ([`crate::SessionAwareCache`]'s sessions,
//! [`crate::SnapshotStore`]'s entries), each read back with its current
//! view (None: gone), so that keeping the copy costs O(changes) per step.

use std::collections::HashSet;

/// Every id of `changed` with its view now (`view`: None when it is gone).
pub(crate) fn views_of<T>(changed: HashSet<String>, view: impl Fn(&str) -> Option<T>) -> Vec<(String, Option<T>)> {
    changed
        .into_iter()
        .map(|id| {
            let v = view(&id);
            (id, v)
        })
        .collect()
}

/// `changes` applied to a mirror of the views (the tests' published copy).
#[cfg(test)]
pub(crate) fn apply<T>(mirror: &mut std::collections::HashMap<String, T>, changes: Vec<(String, Option<T>)>) {
    for (id, v) in changes {
        match v {
            Some(v) => mirror.insert(id, v),
            None => mirror.remove(&id),
        };
    }
}
