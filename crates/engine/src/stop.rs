//! Stop strings: finds them across token boundaries and holds back text
//! that might be the start of one.
//! (stub: to be filled in)

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StopOutcome {
    /// Text safe to emit now.
    pub emit: String,
    /// The stop string that matched; generation ends, and the text from the
    /// match on is dropped.
    pub matched: Option<String>,
}

#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> Self {
        Self { stops, held: String::new() }
    }

    /// Feed the next text delta.
    pub fn push(&mut self, _text: &str) -> StopOutcome {
        let _ = (&self.stops, &self.held);
        todo!()
    }

    /// Generation ended without a stop string: release what was held back.
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}
