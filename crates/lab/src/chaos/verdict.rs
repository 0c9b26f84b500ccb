//! What the suite concludes: each checked expectation (expected, measured, held or not) and the
//! notes that explain the figures, printed as they come.

/// One checked expectation.
#[derive(Debug)]
pub(super) struct Check {
    pub(super) scenario: &'static str,
    pub(super) what: String,
    pub(super) expected: String,
    pub(super) measured: String,
    pub(super) ok: bool,
}

#[derive(Debug, Default)]
pub(super) struct Report {
    pub(super) checks: Vec<Check>,
    pub(super) notes: Vec<String>,
}

impl Report {
    pub(super) fn check(&mut self, scenario: &'static str, what: &str, expected: &str, measured: String, ok: bool) {
        println!("  [{}] {what}: expected {expected}; measured {measured}", if ok { "ok" } else { "FAIL" });
        self.checks.push(Check { scenario, what: what.into(), expected: expected.into(), measured, ok });
    }

    pub(super) fn note(&mut self, text: String) {
        println!("  note: {text}");
        self.notes.push(text);
    }
}
